"""The `nvlink-emu` command: run a workload script, or the demo, under mpiexec with the right world size."""

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path


from nvlink_emu.fabric.errors import ConfigError, UnsupportedOperation
from nvlink_emu.ranks.status import FAILURE_DIR_ENV, INTERRUPTED_STATUS

from .plan_cmd import cmd_plan, plan_arguments
from .bench import (available_host_bytes, bench_arguments, check_host_memory, closing, config_toml, format_row,
                    header, plot_busbw, sized_config)
from .units import format_bytes
from .bench import check as check_bench
from . import hostcpu
from .compare import CompareError, compare_presets, run_compare
from .bench import sizes as bench_sizes
from .model import cmd_model, model_arguments
from .plotting import check_plot
from .mpiexec import ENV as MPIEXEC_ENV
from .labels import JobOutput
from .mpiexec import mpiexec_command, rank_labels
from .report import print_report
from .traces import merge, read_run, write_replacing
from .options import fabric_arguments, fabric_of, mpi4py_argument, prepare_trace_dir, split_script_args

EXAMPLES = Path(__file__).parent / "examples"
BENCH = str(Path(__file__).parent / "bench.py")
INTERRUPT_GRACE_S = 10.0  # s, for mpiexec to end its ranks after Ctrl-C before it is killed
LAUNCHER_HELP = (f"The MPI launcher: ${MPIEXEC_ENV} if set (e.g. srun, or \"mpiexec --oversubscribe\" for Open "
                 f"MPI), else the first mpiexec of the MPI library mpi4py uses, beside this Python (the mpich "
                 f"wheel's) or on PATH; with none, nvlink-emu stops before launching and says so.")


def launch_script(script: str, args: argparse.Namespace, script_args: list[str], world_size: int,
                  on_line=None, quiet: bool = False) -> int:
    """Run `python -m nvlink_emu.launch SCRIPT` on `world_size` ranks; returns mpiexec's exit status.
    With `on_line`, every line of the job's standard output goes to on_line(line) as it comes, instead
    of to ours; with `quiet`, its standard error (the link table) is shown only if the job fails.
    Each line is labelled here from the MPI launcher's label of the rank that wrote it (labels.JobOutput),
    and a failing rank's report printed only if that rank vouched for it."""
    labels = rank_labels()
    no_label = getattr(args, "no_label", False)
    output = JobOutput(labels, fabric_of(args), no_label)
    cmd = [*mpiexec_command(), *(labels.option if labels else ()), "-n", str(world_size), sys.executable, "-m",
           "nvlink_emu.launch", script, "--timeout", str(args.timeout)]
    for flag in ("preset", "config", "faults", "software", "gpus", "nodes", "gpus_per_node", "trace_dir", "report_json"):
        value = getattr(args, flag, None)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if no_label or labels is not None:  # with the launcher's labels, the ranks' lines come bare and are labelled here
        cmd.append("--no-label")
    if getattr(args, "mpi4py", False):
        cmd.append("--mpi4py")
    if script_args:
        cmd += ["--", *script_args]
    # the environment as it is: the ranks import the installed nvlink_emu, and nothing else of ours (the
    # repo's folders on PYTHONPATH would shadow a user's own `fabric`, `ranks` or `launch`)
    env = dict(os.environ)
    if getattr(args, "trace_dir", None) is not None:
        prepare_trace_dir(args.trace_dir)  # a bad one is one line here, not a traceback from every rank
    with tempfile.TemporaryDirectory(prefix="nvlink-emu-failures-") as failures:
        env[FAILURE_DIR_ENV] = failures  # failing ranks leave their tracebacks here (ranks.session)
        held, job = [], None  # held: the quiet job's standard error

        def errors():  # drained beside stdout, or a full pipe would stop the job
            def lines():
                for raw in job.stderr:
                    yield output.show(decoded(raw), "err")
                yield from output.held()  # after the job's last line: an empty line held back is shown

            for line in lines():
                if line is None:
                    continue
                if quiet:
                    held.append(line + "\n")
                else:
                    sys.stderr.write(line + "\n")
                    sys.stderr.flush()

        try:
            # bytes, split at b"\n" alone: text mode's universal newlines would split at a rank's bare "\r",
            # and what follows it would pass for a line of its own, the launcher's label of another rank and all
            with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as job:
                drain = threading.Thread(target=errors, daemon=True)
                drain.start()
                try:
                    for raw in job.stdout:
                        line = output.show(decoded(raw), "out")
                        if on_line is not None:
                            on_line(line)
                        else:
                            print(line, flush=True)
                    job.wait()
                    drain.join()
                except KeyboardInterrupt:
                    stop_interrupted(job)
                    raise
        finally:  # even when interrupted: a rank's traceback is the one thing worth keeping
            if quiet and job is not None and job.returncode != 0:  # None: interrupted
                sys.stderr.write("".join(held))
            reports, left_out = output.reports(failures)
            for report in reports:
                sys.stderr.write(report)
            if left_out:
                print(f"nvlink-emu: warning: {left_out} failure report(s) in the ranks' directory not printed: no "
                      f"rank vouched for them on its own output (any rank can write a file there)", file=sys.stderr)
    return job.returncode


def decoded(raw: bytes) -> str:
    """A line of the job's output as text: UTF-8 (a byte that is none shown as U+FFFD), its b"\n" cut."""
    return raw.decode("utf-8", "replace").removesuffix("\n")


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
        ranks = _descendants(job.pid)  # before mpiexec dies: then its ranks are reparented out of reach
        job.kill()
        job.wait()
        for pid in ranks:  # ranks that outlive mpiexec hold this command's output open: a caller waits for ever
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already, or not ours
                pass


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (mpiexec's proxies and ranks on this host), from /proc; [] where there
    is none (not Linux)."""
    children: dict[int, list[int]] = {}
    for child, parent in hostcpu.parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def cmd_run(args, script_args) -> int:
    """SCRIPT on one fabric, or with --compare once per preset and their step times side by side."""
    if args.compare:
        progress = Progress("run --compare", len(compare_presets(args.compare)))
        try:
            return run_compare(args, script_args, launch_script, progress)
        except CompareError as exc:
            print(f"nvlink-emu: error: {exc}", file=sys.stderr)
            return exc.status
    if args.plot is not None:
        raise ConfigError("--plot: draws the step times of --compare; give --compare P1,P2,... too")
    if args.project_nodes is not None:
        raise ConfigError("--project-nodes: projects the step times of --compare; give --compare P1,P2,... too")
    config = fabric_of(args)
    return launch_script(args.script, args, script_args, config.world_size)


def cmd_demo(args, script_args) -> int:
    """The demo on NVLink Network (dgx-h100 unless told otherwise), then the same on classic NVLink."""
    if getattr(args, "report_json", None) is not None:
        raise ConfigError("--report-json: the demo is several runs; write a run's report with nvlink-emu run")
    if args.plot is not None:
        check_plot(args.plot)
    network = fabric_of(args)
    classic_args = argparse.Namespace(**{**vars(args), "preset": "dgx-a100", "config": None})
    classic = fabric_of(args, "dgx-a100")
    demo = str(EXAMPLES / "demo.py")
    if args.trace_dir:  # one trace directory per part
        part1 = str(Path(args.trace_dir) / f"part1-{file_part(network.name)}")
        args = argparse.Namespace(**{**vars(args), "trace_dir": part1})
        classic_args.trace_dir = str(Path(classic_args.trace_dir) / f"part2-{file_part(classic.name)}")
    # GPU 0 tells the story: a [gpu 0] label on every line would say nothing
    args.no_label = classic_args.no_label = True
    from .superpod_demo import PRESETS, Prediction, part4
    prediction = Prediction()  # part 4's prediction, computed meanwhile
    try:
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
        sweep = argparse.Namespace(**{**vars(args), "collective": "allreduce", "algorithm": "auto",
                                      "min_bytes": 64 << 10, "max_bytes": 16 << 20, "factor": 16, "iters": 1,
                                      "dtype": "float32", "op": None, "trace_dir": None})
        rows, status = sweep_presets(sweep, {name: fabric_of(args, name) for name in presets})
        if status:
            return status
        print_comparison("allreduce", presets, rows, as_json=False)
        print(f"\n=== part 4: the NVLink Network across nodes: {', '.join(PRESETS)} ===", flush=True)
        return part4(args, launch_script, Progress("demo part 4", len(PRESETS)), str(EXAMPLES / "superpod_steps.py"),
                     prediction)
    except CompareError as exc:
        print(f"nvlink-emu: error: {exc}", file=sys.stderr)
        return exc.status
    finally:
        prediction.close()


def file_part(name: str) -> str:
    """A fabric's name as part of a file name: its letters, digits, '.', '-' and '_', each other
    character '_', at most 64, never "." or ".." (a name comes from a TOML file: it is never joined into a
    path as it is)."""
    part = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64]
    return part if part.strip(".") else "_" + part


class Progress:
    """Progress of work that prints nothing for a while: a line per step on stderr (whole lines, as
    the ranks' own lines - a link table after each job - share that stream)."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done = what, total, 0
        self.start = time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        print(f"nvlink-emu: {self.what}: {self.done}/{self.total} {text} ({time.monotonic() - self.start:.0f} s)",
              file=sys.stderr, flush=True)


def bench_row(line: str) -> dict | None:
    """The row on a line of a bench job's standard output (GPU 0's JSON, "[gpu 0] "-labelled or not), or None."""
    text = re.sub(r"^\[[^\]]*\] ?", "", line)
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def bench_arguments_for_ranks(args) -> list[str]:
    """The sweep's options as the bench workload on the ranks takes them."""
    return ([args.collective, "--algorithm", args.algorithm, "--min-bytes", str(args.min_bytes), "--max-bytes",
             str(args.max_bytes), "--factor", str(args.factor), "--dtype", args.dtype, "--iters", str(args.iters),
             "--json"] + (["--op", args.op] if args.op else [])
            + (["--plan", os.path.abspath(args.plan)] if getattr(args, "plan", None) else [])
            + (["--cpu"] if getattr(args, "cpu", False) else []))  # the demo's sweep has no --cpu


def bench_launch(args, config, workdir: str, on_row, other=None, quiet=False) -> int:
    """One bench job on `config`, GPU memory sized for the sweep; every row, as it comes, to on_row(row),
    other lines of its standard output to other(line) (default: dropped); `quiet`: see launch_script.
    Returns its exit status."""
    sized = sized_config(args, config)
    if sized is not config:  # the ranks build the fabric from a file: --preset cannot say what changed
        # a new file of the temporary directory's own naming: the fabric's name (a TOML file's `name`) is
        # never part of a path
        handle, path = tempfile.mkstemp(prefix="fabric-", suffix=".toml", dir=workdir)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(config_toml(sized))
        args = argparse.Namespace(**{**vars(args), "preset": None, "config": str(path), "gpus": None,
                                         "nodes": None, "gpus_per_node": None, "faults": None})  # the file has them
        print(f"nvlink-emu: bench: GPU memory on {config.name} raised from {config.memory_capacity_bytes} to "
              f"{sized.memory_capacity_bytes} bytes per GPU (memory_capacity_bytes) for the sweep's largest call",
              file=sys.stderr, flush=True)
    args = argparse.Namespace(**{**vars(args), "no_label": True})  # GPU 0's rows are parsed, not read

    def on_line(line: str) -> None:
        row = bench_row(line)
        if row is not None:
            on_row(row)
        elif other is not None:
            other(line)

    return launch_script(BENCH, args, bench_arguments_for_ranks(args), config.world_size, on_line, quiet)


def sweep_presets(args, configs: dict) -> tuple[dict, int]:
    """The same sweep on each of `configs` (name: FabricConfig), with progress on stderr: (rows per name,
    exit status of the first job that failed, or 0)."""
    progress = Progress(f"bench {args.collective}", len(bench_sizes(args)) * len(configs))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="nvlink-emu-bench-") as workdir:
        for name, config in configs.items():
            rows[name] = []
            trace_dir = str(Path(args.trace_dir) / file_part(name)) if args.trace_dir else None
            per_preset = argparse.Namespace(**{**vars(args), "preset": name, "config": None, "trace_dir": trace_dir})

            def on_row(row, name=name):
                rows[name].append(row)
                progress.step(f"{name}: {format_bytes(row['size_bytes'])} done")

            # each job's link table would come between the progress lines: the comparison is the result
            status = bench_launch(per_preset, config, workdir, on_row, quiet=True)
            if status:
                return rows, status
    return rows, 0


def cmd_bench(args, script_args) -> int:
    """The sweep on one fabric (rows as they come), or with --compare on several presets side by side."""
    if args.compare:
        presets = [name.strip() for name in args.compare.split(",") if name.strip()]
        if len(presets) < 2 or args.preset or args.config:
            raise ConfigError("--compare takes two or more presets, P1,P2,..., instead of --preset/--config")
        if getattr(args, "report_json", None) is not None:
            raise ConfigError("--report-json: one report per run, and --compare makes a run per preset")
        configs = {name: fabric_of(args, name) for name in presets}
    else:
        config = fabric_of(args)
        configs = {config.name: config}
    available = available_host_bytes()
    for config in configs.values():
        check_bench(args, config)
        check_host_memory(args, config, available)
    if args.plot is not None:
        check_plot(args.plot)
    if args.compare:
        rows, status = sweep_presets(args, configs)
        if status:
            return status
        print_comparison(args.collective, presets, rows, args.json)
        series = {f"{name} ({', '.join(dict.fromkeys(r['algorithm'] for r in rows[name]))})": rows[name]
                  for name in presets}
        title = f"{args.collective} on {next(iter(configs.values())).gpus} GPUs per preset: modeled bus bandwidth"
    else:
        rows = []
        expected = len(bench_sizes(args))

        def on_row(row):
            if not rows and not args.json:
                print(header(args.collective, config.name, config.gpus, config.link), flush=True)
            rows.append(row)
            print(json.dumps(row) if args.json else format_row(row), flush=True)
            if len(rows) == expected and not args.json:
                print(closing(rows), flush=True)

        with tempfile.TemporaryDirectory(prefix="nvlink-emu-bench-") as workdir:
            status = bench_launch(args, config, workdir, on_row,
                                  other=lambda line: print(line, file=sys.stderr if args.json else sys.stdout))
        if status:
            return status
        series = {}
        for row in rows:
            series.setdefault(row["algorithm"], []).append(row)
        title = f"{args.collective} on {config.name} ({config.gpus} GPUs, {config.link}): modeled bus bandwidth"
    if args.plot is not None:
        plot_busbw(args.plot, title, series)
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
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
    # column widths: a preset's name heads its algorithm column, the first's its ratio column
    alg = {name: max(16, len(name) + 6) for name in presets}
    ratio_width = max(10, len(first) + 3)
    head = f"{'size':>12}" + "".join(f"{name + ' alg':>{alg[name]}}{'us':>11}{'busbw':>9}{'x' + first:>{ratio_width}}"
                                     for name in presets) + f"{'#wrong':>8}"
    print(head)
    for i, ref in enumerate(rows[first]):
        line = f"{ref['size_bytes']:>12}"
        wrong = 0
        for name in presets:
            row = rows[name][i]
            wrong += row["wrong"]
            ratio = _ratio(row["modeled_us"], ref["modeled_us"])
            line += (f"{row['algorithm']:>{alg[name]}}{row['modeled_us']:>11.3f}{_number(row['busbw_gbps']):>9}"
                     f"{_number(ratio):>{ratio_width}}")
        print(line + f"{wrong:>8}")
    averages = []
    for name in presets:  # nccl-tests' closing line, per preset
        measured = [row["busbw_gbps"] for row in rows[name] if row["busbw_gbps"] is not None]
        averages.append(f"{name} {sum(measured) / len(measured):g}" if measured else f"{name} n/a")
    print(f"# Avg bus bandwidth    : {', '.join(averages)}")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def cmd_trace(args, script_args) -> int:
    """Merge a run's per-rank traces into one Chrome Trace Event JSON file."""
    traces, warnings = read_run(args.trace_dir)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    merged = merge(traces, args.time)
    try:  # never through a symbolic link planted where the file goes
        write_replacing(args.output, lambda out: _dump_json(merged, out))
    except OSError as exc:
        raise ConfigError(f"-o {args.output}: cannot write it: {exc.strerror or exc}") from None
    print(f"wrote {args.output}: {len(merged['traceEvents'])} events from {len(traces)} ranks ({args.time} time); "
          f"open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _dump_json(document, binary) -> None:
    """json.dump into a binary file, streamed (a merged trace can be large)."""
    text = io.TextIOWrapper(binary, encoding="utf-8")
    json.dump(document, text)
    text.flush()
    text.detach()  # the caller closes the file


def cmd_report(args, script_args) -> int:
    """Per-link table, per-collective summary and figures of each traced run in DIR (warnings on stderr)."""
    return print_report(args.trace_dir, args.output)


def package_version() -> str:
    try:
        return metadata.version("nvlink-emu")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvlink-emu", description="Emulated NVLink / NVLink Network fabric "
                                     "on MPI: every rank a GPU or a switch, real bytes, counted per link.",
                                     epilog=LAUNCHER_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run SCRIPT's main(gpu) on every GPU of a fabric",
                         usage="nvlink-emu run SCRIPT.py [options] [-- ARGS ...]",
                         epilog=f"ARGS: what follows -- reaches the script as sys.argv[1:]. {LAUNCHER_HELP}")
    run.add_argument("script", help="Python file defining main(gpu), or with --mpi4py an mpi4py program")
    fabric_arguments(run)
    mpi4py_argument(run)
    run.add_argument("--compare", metavar="P1,P2,...", help="run SCRIPT once per preset and print its modeled "
                     "step time (GPU 0's step_ns= lines), link bytes and time relative to the first preset")
    run.add_argument("--plot", metavar="FILE.png", help="with --compare: the bar chart of the step times (default "
                     "SCRIPT-compare.png in the current directory; .svg and .pdf also work)")
    run.add_argument("--project-nodes", type=int, metavar="N", help="with --compare: also each step "
                     "projected by the cost model to N nodes of the same GPUs per node (compute kept, GPU 0's "
                     "collective calls re-timed) with its communication share")
    run.set_defaults(handler=cmd_run)
    demo = sub.add_parser("demo", help="what NVLink Network changes compared with classic NVLink, with real traffic",
                          epilog=LAUNCHER_HELP)
    fabric_arguments(demo)
    demo.add_argument("--plot", metavar="FILE.png", help="draw part 4's modeled step times per SuperPOD preset "
                      "into FILE (PNG; .svg and .pdf also work)")
    demo.set_defaults(handler=cmd_demo)
    bench = sub.add_parser("bench", help="nccl-tests-like sweep of one collective, with MPI's native one as reference",
                           epilog=LAUNCHER_HELP)
    bench_arguments(bench)
    fabric_arguments(bench)
    bench.add_argument("--compare", metavar="P1,P2,...", help="run the sweep on each preset and print them side "
                       "by side, with each one's modeled time relative to the first")
    bench.add_argument("--plot", metavar="FILE.png", help="draw busbw against size, a line per algorithm (per "
                       "preset with --compare), into FILE (PNG; .svg and .pdf also work)")
    bench.set_defaults(handler=cmd_bench)
    model = sub.add_parser("model", help="the cost model's prediction of a bench sweep, on any shape (up to 32 "
                           "nodes x 8 GPUs): no rank is started; says which shapes emulation validated",
                           description="Modeled time, algbw and busbw of one collective per size on every GPU of "
                           "a fabric, as bench reports them, from the cost model the emulated runs are checked "
                           "against (fabric.cost on one node, fabric.cost_nodes on several), computed here.")
    model_arguments(model)
    model.set_defaults(handler=cmd_model)
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
    plan = sub.add_parser("plan", help="validate a collective plan (MSCCL-IR XML or a registry algorithm), print "
                          "its per-link bytes and modeled time; show: its operations per GPU")
    plan_arguments(plan)
    plan.set_defaults(handler=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    ours, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(ours)
    try:
        if script_args and args.command != "run":  # only a workload script has a use for them
            raise ConfigError(f"{args.command} takes no arguments after --, got {' '.join(script_args)!r} "
                              f"(only run passes them on, to its script)")
        if getattr(args, "no_label", False) and args.command in ("demo", "bench"):
            raise ConfigError(f"--no-label: {args.command}'s lines are never labelled (GPU 0 prints them all); "
                              f"it is an option of run")
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
