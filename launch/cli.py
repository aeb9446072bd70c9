"""The `nvlink-emu` command: run a workload script, or the demo, under mpiexec with the right world size."""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from nvlink_emu.fabric.config import resolve
from nvlink_emu.fabric.errors import ConfigError, UnsupportedOperation
from nvlink_emu.fabric.trace import read_directory
from nvlink_emu.ranks.session import FAILURE_DIR_ENV, INTERRUPTED_STATUS

from .bench import bench_arguments
from .bench import check as check_bench
from .report import trace_report
from .traces import merge
from .runner import fabric_arguments, prepare_trace_dir, split_script_args

EXAMPLES = Path(__file__).parent / "examples"
INTERRUPT_GRACE_S = 10.0  # s, for mpiexec to end its ranks after Ctrl-C before it is killed


def mpiexec_command() -> list[str]:
    """The MPI launcher: $NVLINK_EMU_MPIEXEC (e.g. "srun" or "mpiexec --oversubscribe"), else the
    mpiexec installed beside this Python (the mpich wheel), else the first mpiexec on PATH."""
    override = os.environ.get("NVLINK_EMU_MPIEXEC")
    if override:
        return shlex.split(override)
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("mpiexec")
    if found is None:
        raise ConfigError("no mpiexec found: install the mpich wheel (pip install mpich) or set NVLINK_EMU_MPIEXEC")
    return [found]


def launch_script(script: str, args: argparse.Namespace, script_args: list[str], world_size: int,
                  capture: bool = False):
    """Run `python -m nvlink_emu.launch SCRIPT` on `world_size` ranks; returns mpiexec's exit status (and, with
    capture, its standard output)."""
    cmd = [*mpiexec_command(), "-n", str(world_size), sys.executable, "-m", "nvlink_emu.launch", script,
           "--timeout", str(args.timeout)]
    for flag in ("preset", "config", "gpus", "trace_dir"):
        value = getattr(args, flag, None)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if script_args:
        cmd += ["--", *script_args]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if getattr(args, "trace_dir", None) is not None:
        prepare_trace_dir(args.trace_dir)  # a bad one is one line here, not a traceback from every rank
    with tempfile.TemporaryDirectory(prefix="nvlink-emu-failures-") as failures:
        env[FAILURE_DIR_ENV] = failures  # failing ranks leave their tracebacks here (ranks.session)
        try:
            with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if capture else None, text=True) as job:
                try:
                    out, _ = job.communicate()
                except KeyboardInterrupt:
                    stop_interrupted(job)
                    raise
        finally:  # even when interrupted: a rank's traceback is the one thing worth keeping
            for report in sorted(Path(failures).glob("rank-*.txt")):
                sys.stderr.write(report.read_text())
    return (job.returncode, out) if capture else job.returncode


def stop_interrupted(job: subprocess.Popen) -> None:
    """End mpiexec after Ctrl-C. A terminal's Ctrl-C reached it too, and it passes SIGINT on to every
    rank, which then ends at once; a SIGINT sent to this command alone did not, so pass it on. Kill
    mpiexec if the job has not ended within INTERRUPT_GRACE_S, or at a second Ctrl-C."""
    try:
        try:
            job.wait(timeout=1.0)  # a second SIGINT would make mpiexec kill the ranks mid-report
            return
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGINT)
        job.wait(timeout=INTERRUPT_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        job.kill()
        job.wait()


def cmd_run(args, script_args) -> int:
    config = resolve(args.preset, args.config, args.gpus)
    return launch_script(args.script, args, script_args, config.world_size)


def cmd_demo(args, script_args) -> int:
    """The demo on NVLink Network (dgx-h100 unless told otherwise), then the same on classic NVLink."""
    network = resolve(args.preset, args.config, args.gpus)
    classic_args = argparse.Namespace(**{**vars(args), "preset": "dgx-a100", "config": None})
    classic = resolve("dgx-a100", None, args.gpus)
    demo = str(EXAMPLES / "demo.py")
    if args.trace_dir:  # one trace directory per part
        args = argparse.Namespace(**{**vars(args), "trace_dir": str(Path(args.trace_dir) / f"part1-{network.name}")})
        classic_args.trace_dir = str(Path(classic_args.trace_dir) / f"part2-{classic.name}")
    print(f"=== part 1: NVLink Network ({network.name}) ===", flush=True)
    status = launch_script(demo, args, script_args, network.world_size)
    if status:
        return status
    print(f"\n=== part 2: classic NVLink ({classic.name}), the same workload ===", flush=True)
    status = launch_script(demo, classic_args, script_args, classic.world_size)
    if status:
        return status
    presets = ["dgx-a100", "dgx-h100", "h100-ib"]
    print(f"\n=== part 3: the same AllReduce (float32 sum, algorithm auto) on {', '.join(presets)} ===", flush=True)
    bench_args = ["allreduce", "--min-bytes", "64K", "--max-bytes", "16M", "--factor", "16", "--iters", "1", "--json"]
    rows = {}
    for name in presets:
        config = resolve(name, None, args.gpus)
        status, out = launch_script(str(Path(__file__).parent / "bench.py"),
                                    argparse.Namespace(**{**vars(args), "preset": name, "config": None,
                                                          "trace_dir": None}),
                                    bench_args, config.world_size, capture=True)
        if status:
            return status
        rows[name] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print_comparison("allreduce", presets, rows, as_json=False)
    return 0


def cmd_bench(args, script_args) -> int:
    bench_args = [args.collective, "--algorithm", args.algorithm, "--min-bytes", str(args.min_bytes),
                  "--max-bytes", str(args.max_bytes), "--factor", str(args.factor), "--dtype", args.dtype,
                  "--op", args.op, "--iters", str(args.iters)]
    script = str(Path(__file__).parent / "bench.py")
    if not args.compare:
        config = resolve(args.preset, args.config, args.gpus)
        check_bench(args, config)
        if not args.json:
            return launch_script(script, args, bench_args, config.world_size)
        status, out = launch_script(script, args, bench_args + ["--json"], config.world_size, capture=True)
        for line in out.splitlines():  # stdout stays pure JSON lines; the run's link table goes to stderr
            print(line, file=sys.stdout if line.startswith("{") else sys.stderr)
        return status
    presets = [name.strip() for name in args.compare.split(",") if name.strip()]
    if len(presets) < 2 or args.preset or args.config:
        raise ConfigError("--compare takes two or more presets, P1,P2,..., instead of --preset/--config")
    for name in presets:
        check_bench(args, resolve(name, None, args.gpus))
    rows = {}
    for name in presets:
        config = resolve(name, None, args.gpus)
        trace_dir = str(Path(args.trace_dir) / name) if args.trace_dir else None
        per_preset = argparse.Namespace(**{**vars(args), "preset": name, "trace_dir": trace_dir})
        status, out = launch_script(script, per_preset, bench_args + ["--json"], config.world_size, capture=True)
        if status:
            return status
        rows[name] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print_comparison(args.collective, presets, rows, args.json)
    return 0


def print_comparison(collective: str, presets: list[str], rows: dict, as_json: bool) -> None:
    """The same sweep on several presets side by side: modeled time, busbw, and the ratio of each
    preset's modeled time to the first's."""
    first = presets[0]
    if as_json:
        for name in presets:
            for row, ref in zip(rows[name], rows[first]):
                print(json.dumps({"preset": name, **row, "time_vs_first": _ratio(row["modeled_us"], ref["modeled_us"])}))
        return
    print(f"# {collective}: modeled time (us) and busbw (GB/s) per preset; x{first} = modeled time / {first}'s")
    head = f"{'size':>12}" + "".join(f"{name + ' alg':>16}{'us':>11}{'busbw':>9}{'x' + first:>{max(10, len(first) + 2)}}"
                                     for name in presets) + f"{'#wrong':>8}"
    print(head)
    for i, ref in enumerate(rows[first]):
        line = f"{ref['size_bytes']:>12}"
        wrong = 0
        for name in presets:
            row = rows[name][i]
            wrong += row["wrong"]
            ratio = _ratio(row["modeled_us"], ref["modeled_us"])
            line += (f"{row['algorithm']:>16}{row['modeled_us']:>11.3f}{_number(row['busbw_gbps']):>9}"
                     f"{_number(ratio):>{max(10, len(first) + 2)}}")
        print(line + f"{wrong:>8}")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def cmd_trace(args, script_args) -> int:
    """Merge a run's per-rank traces into one Chrome Trace Event JSON file."""
    traces, warnings = read_directory(args.trace_dir)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    merged = merge(traces, args.time)
    with open(args.output, "w") as out:
        json.dump(merged, out)
    print(f"wrote {args.output}: {len(merged['traceEvents'])} events from {len(traces)} ranks ({args.time} time); "
          f"open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def cmd_report(args, script_args) -> int:
    """Per-link table, per-collective summary and figures of a traced run."""
    traces, warnings = read_directory(args.trace_dir)
    text, figures = trace_report(traces, args.output or args.trace_dir)
    print(text)
    for warning in warnings:
        print(f"warning: {warning}")
    for path in figures:
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvlink-emu", description="Emulated NVLink / NVLink Network fabric "
                                     "on MPI: every rank a GPU or a switch, real bytes, counted per link.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run SCRIPT's main(gpu) on every GPU of a fabric")
    run.add_argument("script", help="Python file defining main(gpu)")
    fabric_arguments(run)
    run.set_defaults(handler=cmd_run)
    demo = sub.add_parser("demo", help="what NVLink Network changes compared with classic NVLink, with real traffic")
    fabric_arguments(demo)
    demo.set_defaults(handler=cmd_demo)
    bench = sub.add_parser("bench", help="nccl-tests-like sweep of one collective, with MPI's native one as reference")
    bench_arguments(bench)
    fabric_arguments(bench)
    bench.add_argument("--compare", metavar="P1,P2,...", help="run the sweep on each preset and print them side "
                       "by side, with each one's modeled time relative to the first")
    bench.set_defaults(handler=cmd_bench)
    trace = sub.add_parser("trace", help="merge per-rank trace files into Chrome/Perfetto trace JSON")
    trace.add_argument("trace_dir", metavar="DIR", help="the --trace-dir of a run")
    trace.add_argument("-o", "--output", default="trace.json", help="the JSON file to write (default trace.json)")
    trace.add_argument("--time", choices=("modeled", "wall"), default="modeled",
                       help="time axis: modeled fabric time (default) or this machine's wall time")
    trace.set_defaults(handler=cmd_trace)
    report = sub.add_parser("report", help="link table, collective summary and figures of a traced run")
    report.add_argument("trace_dir", metavar="DIR", help="the --trace-dir of a run")
    report.add_argument("-o", "--output", metavar="OUTDIR", help="where the PNG figures go (default: DIR)")
    report.set_defaults(handler=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    ours, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(ours)
    try:
        return args.handler(args, script_args)
    except KeyboardInterrupt:
        print("nvlink-emu: error: interrupted (Ctrl-C); the job was stopped", file=sys.stderr)
        return INTERRUPTED_STATUS
    except (ConfigError, FileNotFoundError) as exc:
        print(f"nvlink-emu: error: {exc}", file=sys.stderr)
        return 2
    except UnsupportedOperation as exc:
        print(f"nvlink-emu: error: UnsupportedOperation: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
