"""Speed of the emulator against MPI's own collectives (issue 13): every collective and algorithm at
every size, as one table per fabric shape.

    python tests/benchmarks/speed.py [--shapes 4,8,2x4] [-b 1K] [-e 64M] [-f 16] [--collectives ...]

For each shape (G: G GPUs behind one switch rank, `dgx-h100`; NxG: N nodes of G GPUs,
`superpod-h100-nvlink`, a leaf rank per node and the spines) and each collective and algorithm the
fabric runs, one `nvlink-emu bench` job sweeps the sizes. A cell is the emulator's wall time per call
divided by MPI's own collective over the same GPU ranks, measured in the same job (bench's wall_us and
native_wall_us). A second table per shape (bench --cpu) gives the emulator's CPU time per call, every
rank's, the cores it kept busy, and that CPU over what this machine's cores give in 3x MPI's own wall
time. A last job per shape runs with tracing and gives the cost of trace records (bench
times traced and untraced calls alternately). A figure of this machine, not a test: nothing is asserted.
"""

import argparse
import json
import os
import sys
import tempfile

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.tuner import ALL2ALL, IMPLEMENTS, allowed

from nvlink_emu.launch.sweeps import COLLECTIVES, busy_cores, tracing_cpu_cost
from nvlink_emu.launch.units import format_bytes, parse_size

from scaling import NODES, SINGLE, bench_rows  # this folder's (run as a script: its folder is on sys.path)

TARGET = 3.0  # the issue's: every cell within 3x of MPI's own


def shape_of(text: str) -> tuple[str, int, int]:
    """'8' -> (dgx-h100, 1 node, 8 GPUs); '2x4' -> (superpod-h100-nvlink, 2 nodes, 4 GPUs each)."""
    try:
        nodes, gpus = (int(x) for x in text.lower().split("x")) if "x" in text.lower() else (1, int(text))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is neither G nor NxG") from None
    if nodes < 1 or gpus < 2 and nodes == 1:
        raise SystemExit(f"--shapes: {text!r}: at least 2 GPUs, at least 1 node")
    return (SINGLE if nodes == 1 else NODES), nodes, gpus


def algorithms(collective: str, name: str, nodes: int, gpus: int) -> list[str]:
    """The algorithms `nvlink-emu bench COLLECTIVE --algorithm A` runs on that fabric."""
    if collective == "all2all":
        return list(ALL2ALL) if nodes > 1 else ["direct"]
    config = preset(name, gpus=nodes * gpus) if nodes == 1 else preset(name, nodes=nodes, gpus=nodes * gpus)
    return [a for a in allowed(config, nodes, collective) if collective in IMPLEMENTS[a]]


def _head(sizes) -> str:
    return ("| collective | algorithm | " + " | ".join(format_bytes(s) for s in sizes) + " |\n"
            "| --- | --- |" + " --- |" * len(sizes))


def _cpu_need(row: dict, cores: int) -> float | None:
    """The emulator's CPU per call over what `cores` cores give in TARGET x MPI's own wall time (above 1,
    the target needs less CPU per call); None where either was not measured."""
    if row.get("cpu_us") is None or not row["native_wall_us"]:
        return None
    return row["cpu_us"] / (TARGET * row["native_wall_us"] * cores)


def _cpu_cell(row: dict, cores: int) -> str:
    """A CPU table cell: the emulator's CPU per call (ms), the cores it kept busy, and _cpu_need."""
    need = _cpu_need(row, cores)
    if need is None:
        return "n/a"
    busy = busy_cores(row)
    return f"{row['cpu_us'] / 1e3:.3g} ms, {float('nan') if busy is None else busy:.1f}, {need:.1f}x"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/benchmarks/speed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="4,8,2x4", help="G (one switch) or NxG (nodes), comma-separated "
                                                           "(default 4,8,2x4)")
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1 << 10, help="smallest size (default 1K)")
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    parser.add_argument("-f", "--factor", type=int, default=16, help="size multiplier per column (default 16)")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated (default: all)")
    parser.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (default: bench's)")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of every wait in the jobs, s")
    parser.add_argument("--json", action="store_true", help="one JSON object per bench row, with its shape")
    args = parser.parse_args(argv)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= args.factor
    cells, within, over_budget, measured_cells = [], 0, 0, 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for text in args.shapes.split(","):
        name, nodes, gpus = shape_of(text.strip())
        label = f"{gpus} GPUs, one switch ({name})" if nodes == 1 else f"{nodes} nodes x {gpus} GPUs ({name})"
        if not args.json:
            print(f"\n### {label}: emulator wall time / MPI's own, per call\n", flush=True)
            print(_head(sizes), flush=True)
        sweep = ["-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor), "--cpu"]
        measured = []  # (collective, algorithm, rows) for the CPU table
        for collective in args.collectives.split(","):
            for algorithm in algorithms(collective, name, nodes, gpus):
                rows = bench_rows(collective, name, nodes * gpus, None if nodes == 1 else gpus, sweep, args.iters,
                                  args.timeout, algorithm)
                measured.append((collective, algorithm, rows))
                ratios = []
                for row in rows:
                    ratio = row["wall_us"] / row["native_wall_us"] if row["native_wall_us"] else float("nan")
                    ratios.append(ratio)
                    cells.append((ratio, label, collective, algorithm, row["size_bytes"]))
                    within += ratio <= TARGET
                    need = _cpu_need(row, cores)
                    if need is not None:
                        measured_cells += 1
                        over_budget += need > 1
                    if args.json:
                        print(json.dumps({"shape": text, "fabric": name, "collective": collective, **row}), flush=True)
                if not args.json:
                    print(f"| {collective} | {algorithm} | " + " | ".join(
                        f"{r:.1f}x ({row['wall_us'] / 1e3:.3g} ms)" for r, row in zip(ratios, rows)) + " |", flush=True)
        if not args.json:
            print(f"\n{label}: the emulator's CPU per call (every rank, bench --cpu), the cores it kept busy, and "
                  f"that CPU over what {cores} cores give in {TARGET:g}x MPI's own wall time\n")
            print(_head(sizes))
            for collective, algorithm, rows in measured:
                print(f"| {collective} | {algorithm} | " + " | ".join(_cpu_cell(row, cores) for row in rows) + " |",
                      flush=True)
        with tempfile.TemporaryDirectory(prefix="nvlink-emu-speed-") as traces:
            rows = bench_rows("allreduce", name, nodes * gpus, None if nodes == 1 else gpus,
                              ["-b", str(args.min_bytes), "-e", str(min(args.max_bytes, 1 << 20)), "-f", "32", "--cpu"],
                              args.iters, args.timeout, "auto", ["--trace-dir", traces])
        if not args.json:
            print()
        for row in rows:
            cost = 100 * (row["traced_wall_us"] / row["untraced_wall_us"] - 1)
            line = (f"tracing, allreduce {row['algorithm']} {format_bytes(row['size_bytes'])}: {cost:+.1f}% wall "
                    f"({row['traced_wall_us']:.0f} us traced, {row['untraced_wall_us']:.0f} us not)")
            cpu_cost = tracing_cpu_cost(row)
            if cpu_cost is not None:
                line += (f", {cpu_cost:+.1f}% CPU "
                         f"({row['traced_cpu_us']:.0f} us traced, {row['untraced_cpu_us']:.0f} us not)")
            print(json.dumps({"shape": text, "tracing": line}) if args.json else line, flush=True)
    if not args.json and cells:
        worst = max(cells)
        print(f"\n{within} of {len(cells)} cells within {TARGET:g}x of MPI's own; the slowest: {worst[0]:.1f}x, "
              f"{worst[2]} {worst[3]} {format_bytes(worst[4])} on {worst[1]}; "
              + (f"in {over_budget} of them the emulator needs more CPU per call than {cores} cores give in "
                 f"{TARGET:g}x MPI's own wall time" if measured_cells else "CPU time not measured (no /proc)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
