"""`nvlink-emu bench COLLECTIVE`: an nccl-tests-like sweep run on the ranks (launch/bench.py is its workload),
on one fabric or several presets side by side."""

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from nvlink_emu.fabric.errors import ConfigError

from ..sweeps import (available_host_bytes, bench_arguments, check_host_memory, closing, config_toml, format_row,
                      header, plot_busbw, sized_config)
from ..sweeps import check as check_bench
from ..sweeps import sizes as bench_sizes
from ..jobs import LAUNCHER_HELP, Progress, file_part, launch_script
from ..options import fabric_arguments, fabric_of
from ..plotting import check_plot
from ..units import format_bytes

BENCH = str(Path(__file__).parents[1] / "bench.py")


def add_to(sub) -> None:
    """Add the `bench` command to the subparsers `sub`."""
    bench = sub.add_parser("bench", help="nccl-tests-like sweep of one collective, with MPI's native one as reference",
                           epilog=LAUNCHER_HELP)
    bench_arguments(bench)
    fabric_arguments(bench)
    bench.add_argument("--compare", metavar="P1,P2,...", help="run the sweep on each preset and print them side "
                       "by side, with each one's modeled time relative to the first")
    bench.add_argument("--plot", metavar="FILE.png", help="draw busbw against size, a line per algorithm (per "
                       "preset with --compare), into FILE (PNG; .svg and .pdf also work)")
    bench.set_defaults(handler=cmd_bench)


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
        by_preset, status = sweep_presets(args, configs)
        if status:
            return status
        print_comparison(args.collective, presets, by_preset, args.json)
        series = {f"{name} ({', '.join(dict.fromkeys(r['algorithm'] for r in by_preset[name]))})": by_preset[name]
                  for name in presets}
        title = f"{args.collective} on {next(iter(configs.values())).gpus} GPUs per preset: modeled bus bandwidth"
    else:
        rows: list[dict] = []
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
    rows: dict[str, list] = {}
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
