"""A bench sweep, nccl-tests-like, as the `bench` and `model` commands and the workload share it: its
options, its sizes and element counts, the GPU and host memory it needs, its rows and their format
(launch/bench.py is the workload that runs it on the ranks)."""

import argparse
import dataclasses
import json
import math

import numpy as np

from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.plans import load as load_plan
from nvlink_emu.fabric.reduction import DTYPES, OPS
from nvlink_emu.fabric.tuner import ALGORITHMS, ALL2ALL, choose

from nvlink_emu.launch.units import KiB, MiB, format_bytes, parse_size

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all")
REDUCING = ("allreduce", "reduce_scatter")  # the others' redop is "none", as nccl-tests prints it
ROOT = 0  # broadcast's root (nccl-tests' default, -r 0)
BUS_FACTOR_TEXT = {"allreduce": "2(n-1)/n", "reduce_scatter": "(n-1)/n", "allgather": "(n-1)/n",
                   "broadcast": "1", "all2all": "(n-1)/n"}
HEADER = (f"{'size':>12}{'count':>12}{'type':>10}{'redop':>7}{'root':>6}{'algorithm':>10}{'modeled_us':>12}"
          f"{'algbw':>9}{'busbw':>9}{'wall_us':>12}{'native_us':>12}{'emu/native':>11}{'tx_B/gpu':>12}"
          f"{'rx_B/gpu':>12}{'#wrong':>8}")
NATIVE_DTYPES = ("float32", "float64", "int32", "int64")  # MPI has no reduction on 16-bit floats


def sweep_arguments(parser: argparse.ArgumentParser, what: str = "sweep") -> None:
    """The collective, its algorithm, the sizes (nccl-tests' -b, -e, -f) and the element type: the
    options `nvlink-emu bench` and `nvlink-emu model` share."""
    parser.add_argument("collective", choices=COLLECTIVES, metavar="COLLECTIVE",
                        help=f"the collective to {what}: {', '.join(COLLECTIVES)}")
    names = tuple(dict.fromkeys((*ALGORITHMS, *ALL2ALL)))
    parser.add_argument("--algorithm", default="auto", choices=("auto", *names), metavar="A",
                        help=f"auto (default: the fastest the cost model names for the size and the fabric: "
                             f"fabric.cost on one node, fabric.cost_nodes on several), {', '.join(names)}; sharp "
                             f"and nvls need NVLink Network with a SHARP switch; all2all's are "
                             f"{', '.join(ALL2ALL)} (auto: the faster by fabric.cost_nodes on several nodes, "
                             f"direct on one)")
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1024, metavar="B", help="smallest size (default 1K)")
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=16 << 20, metavar="B",
                        help="largest size (default 16M" + ("; GPU memory is sized for it)" if what == "sweep" else ")"))
    parser.add_argument("-f", "--factor", type=int, default=4, metavar="F", help="size multiplier per row (default 4)")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES), metavar="D",
                        help=f"element type: {', '.join(DTYPES)} (default float32)")
    parser.add_argument("--plan", metavar="FILE.xml", help=f"run (bench) or time (model) this MSCCL-IR plan "
                        f"(fabric.plans, validated first) instead of an algorithm; its collective and GPU count "
                        f"must be the {what}'s")


def bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's options, shared by `nvlink-emu bench` and the bench workload on the ranks; the short
    flags are nccl-tests' (-b, -e, -f, -n)."""
    sweep_arguments(parser)
    parser.add_argument("--op", choices=OPS, metavar="OP",
                        help=f"reduction of allreduce and reduce_scatter: {', '.join(OPS)} (default sum); the "
                             f"other collectives reduce nothing")
    parser.add_argument("-n", "--iters", type=int, default=0, metavar="N",
                        help="timed iterations per size (default: from 20 at small sizes down to 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--cpu", action="store_true",
                        help="also the CPU time of the job's ranks on GPU 0's host per timed call, bench's own "
                             "barrier and timing exchange taken out (JSON keys cpu_us, switch_cpu_us, cpu_wall_us, "
                             "sync_cpu_us, sync_wall_us; with --trace-dir traced_cpu_us, untraced_cpu_us; Linux)")


def plan_of(args, config, command: str = "bench"):
    """The validated plan of --plan (None without it); ConfigError, naming the file, for a bad plan or one
    `config` or the sweep cannot run (another collective or GPU count, another fabric mode, broadcast's
    root not bench's)."""
    if not getattr(args, "plan", None):
        return None
    if args.algorithm != "auto":
        raise ConfigError(f"{command} --plan: the plan is the algorithm; --algorithm {args.algorithm} does not apply")
    try:
        plan = load_plan(args.plan)
    except (FabricError, OSError) as exc:
        raise ConfigError(f"{command} --plan: {type(exc).__name__}: {exc}") from None
    if plan.collective != args.collective or plan.gpus != config.gpus:
        raise ConfigError(f"{command} --plan: {args.plan} is a {plan.collective} plan for {plan.gpus} GPUs; asked for "
                          f"{args.collective} on {config.gpus} GPUs")
    if config.mode not in plan.fabrics:
        raise ConfigError(f"{command} --plan: {args.plan} runs on {', '.join(plan.fabrics)} fabrics, not on "
                          f"{config.name!r} ({config.mode} mode)")
    if plan.collective == "broadcast" and plan.root != ROOT:
        raise ConfigError(f"{command} --plan: {args.plan} broadcasts from root {plan.root}; {command} uses root {ROOT}")
    return plan


def check(args, config) -> None:
    """Refuse, before any rank starts, a sweep that cannot run on `config` or an option it would ignore."""
    sizes(args)
    if plan_of(args, config) is not None:  # the plan is the algorithm
        pass
    elif args.collective == "all2all":
        if args.algorithm != "auto" and args.algorithm not in ALL2ALL:
            raise ConfigError(f"bench all2all: --algorithm {args.algorithm} does not apply: all2all's algorithms "
                              f"are auto, {', '.join(ALL2ALL)}")
    else:
        choose(args.collective, args.algorithm, config, args.min_bytes)
    if args.op is not None and args.collective not in REDUCING:
        raise ConfigError(f"bench {args.collective}: --op {args.op} does not apply: {args.collective} reduces "
                          f"nothing (its redop is none); --op is for {' and '.join(REDUCING)}")


def sizes(args) -> list[int]:
    """The sweep's sizes in bytes; ConfigError for an empty or endless sweep."""
    if not hasattr(args, "iters"):  # `nvlink-emu model` times nothing
        if args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2:
            raise ConfigError(f"model: need 0 < --min-bytes <= --max-bytes and --factor >= 2; got "
                              f"{args.min_bytes}, {args.max_bytes}, {args.factor}")
    elif args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2 or args.iters < 0:
        raise ConfigError(f"bench: need 0 < --min-bytes <= --max-bytes, --factor >= 2 and --iters >= 0; got "
                          f"{args.min_bytes}, {args.max_bytes}, {args.factor}, {args.iters}")
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size *= args.factor
    return out


def element_count(collective: str, size: int, itemsize: int, n: int) -> int:
    """Elements of one call of `size` bytes; blocked collectives round to equal blocks on n GPUs, so
    that the byte formulas hold exactly."""
    count = max(size // itemsize, 1)
    if collective in ("reduce_scatter", "allgather", "all2all"):
        count = max(count // n, 1) * n
    return count


def buffer_counts(collective: str, count: int, n: int) -> tuple[int, int]:
    """(send, recv) elements a GPU allocates for one call of `count` elements (count a multiple of n
    where the collective has blocks)."""
    block = -(-count // n)
    if collective == "reduce_scatter":
        return count, block
    if collective == "allgather":
        return block, count
    return count, count


def gpu_memory_bytes(collective: str, max_bytes: int, dtype: np.dtype, n: int, alignment_bytes: int) -> int:
    """GPU memory (bytes) the sweep's largest call allocates on each GPU: its send and receive buffers,
    each rounded up as the allocator rounds (fabric.memory)."""
    count = element_count(collective, max_bytes, dtype.itemsize, n)
    return sum(max(-(-c * dtype.itemsize // alignment_bytes) * alignment_bytes, alignment_bytes)
               for c in buffer_counts(collective, count, n))


def sweep_gpu_bytes(args, config) -> int:
    """GPU memory (bytes) the sweep `args` allocates on each GPU of `config` at its largest size."""
    return gpu_memory_bytes(args.collective, sizes(args)[-1], np.dtype(DTYPES[args.dtype]), config.gpus,
                            config.alignment_bytes)


def sized_config(args, config):
    """`config`, with each GPU's memory raised (to a whole MiB) if the sweep's buffers do not fit it:
    memory is mapped lazily, so only what the sweep touches costs host memory."""
    need = sweep_gpu_bytes(args, config)
    if need <= config.memory_capacity_bytes:
        return config
    return dataclasses.replace(config, memory_capacity_bytes=-(-need // MiB) * MiB)


def available_host_bytes() -> int | None:
    """Host memory available for new processes (Linux's MemAvailable + SwapFree), or None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * KiB for line in meminfo if line.split()[1:]}
    except (OSError, ValueError):
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0) if "MemAvailable" in fields else None


def check_host_memory(args, config, available: int | None) -> None:
    """ConfigError, before any rank starts, if the sweep's buffers alone - the part of every GPU's
    memory it touches, which is host memory of that GPU's rank - exceed `available` host bytes."""
    per_gpu = sweep_gpu_bytes(args, config)
    if available is not None and config.gpus * per_gpu > available:
        raise ConfigError(f"bench: the sweep's largest {args.collective} holds at least "
                          f"{format_bytes(config.gpus * per_gpu)} of host memory ({config.gpus} GPU ranks x "
                          f"{format_bytes(per_gpu)} of send and receive buffers), more than the "
                          f"{format_bytes(available)} available here: lower --max-bytes (-e) or --gpus")


def config_toml(config) -> str:
    """`config` as a TOML file that load_toml reads back to an equal FabricConfig (every key set)."""
    lines = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is None:  # a timing key left to the link profile
            continue
        if field.name == "faults":  # [[faults]] tables as inline tables; none: left out (reads back as ())
            if value:
                tables = ("{" + ", ".join(f"{key} = {json.dumps(v) if isinstance(v, str) else repr(v)}"
                                          for key, v in fault.entry().items()) + "}" for fault in value)
                lines.append(f"faults = [{', '.join(tables)}]")
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
        elif isinstance(value, tuple):
            text = "[" + ", ".join("[" + ", ".join(map(str, part)) + "]" for part in value) + "]"
        else:
            text = repr(value)
        lines.append(f"{field.name} = {text}")
    return "\n".join(lines) + "\n"


def header(collective: str, fabric: str, n: int, link: str) -> str:
    """The table's comment line and column heads."""
    return (f"# nvlink-emu bench {collective} on {fabric} ({n} GPUs, {link}); modeled: time on the modeled fabric, "
            f"algbw = size / time, busbw = algbw x {BUS_FACTOR_TEXT[collective]} (GB/s); wall: this machine, "
            f"native = MPI's own collective; tx/rx: GPU 0's link payload per call\n{HEADER}")


def closing(rows: list[dict]) -> str:
    """nccl-tests' closing lines: elements wrong over the sweep, and busbw averaged over its sizes."""
    wrong = sum(row["wrong"] for row in rows)
    measured = [row["busbw_gbps"] for row in rows if row["busbw_gbps"] is not None]
    average = f"{sum(measured) / len(measured):g}" if measured else "n/a"
    return (f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}\n"
            f"# Avg bus bandwidth    : {average}")


def _bw(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def format_row(row: dict) -> str:
    """One table row, nccl-tests' columns first (root -1: the collective has none)."""
    native = row["native_wall_us"]
    ratio = f"{row['wall_us'] / native:.2f}" if native else "n/a"
    root = -1 if row.get("root") is None else row["root"]
    return (f"{row['size_bytes']:>12}{row['count']:>12}{row['dtype']:>10}{row['op']:>7}{root:>6}{row['algorithm']:>10}"
            f"{row['modeled_us']:>12.3f}{_bw(row['algbw_gbps']):>9}{_bw(row['busbw_gbps']):>9}"
            f"{row['wall_us']:>12.1f}{native if native is not None else 'n/a':>12}{ratio:>11}"
            f"{row['tx_bytes_per_gpu']:>12}{row['rx_bytes_per_gpu']:>12}{row['wrong']:>8}"
            + (f"\n# tracing costs {100 * (row['traced_wall_us'] / row['untraced_wall_us'] - 1):+.1f}% wall time here "
               f"({row['traced_wall_us']:.1f} us traced, {row['untraced_wall_us']:.1f} us not)"
               if "traced_wall_us" in row else "")
            + (f"\n# {cpu_text(row)}" if "cpu_us" in row else ""))


def busy_cores(row: dict) -> float | None:
    """How many cores a bench --cpu row's collective kept busy: its CPU over its loop's wall time (both less
    bench's barrier and timing exchange); None if that wall time is not positive."""
    return row["cpu_us"] / row["cpu_wall_us"] if row["cpu_wall_us"] > 0 else None


def tracing_cpu_cost(row: dict) -> float | None:
    """What tracing cost in CPU in a bench --cpu --trace-dir row, in percent; None where it was not
    measured or the untraced figure is not positive (noise past zero)."""
    if row.get("untraced_cpu_us", 0) <= 0:
        return None
    return 100 * (row["traced_cpu_us"] / row["untraced_cpu_us"] - 1)


def cpu_text(row: dict) -> str:
    """bench --cpu's figures of one row, in words: CPU per timed call of the ranks on GPU 0's host and the
    cores that kept busy (that CPU over the loop's wall time), bench's barrier and timing exchange (measured
    alone) taken out."""
    busy, tracing = busy_cores(row), tracing_cpu_cost(row)
    text = (f"cpu per call: {row['cpu_us']:.0f} us of all ranks ({row['switch_cpu_us']:.0f} us the switches), "
            f"{'n/a' if busy is None else f'{busy:.2f}'} cores busy")
    if tracing is not None:
        text += f"; tracing costs {tracing:+.1f}% CPU"
    return text + (f" (bench's barrier and timing exchange taken out: {row['sync_cpu_us']:.0f} us of CPU and "
                   f"{row['sync_wall_us']:.0f} us of wall time a call)")


def plot_busbw(path: str, title: str, series: dict[str, list[dict]]) -> None:
    """Draw busbw (GB/s) against size (log scale, ticks in KiB/MiB/GiB), one line per series of rows,
    into the image `path` (PNG unless its suffix names another format matplotlib writes)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, ax = plt.subplots(figsize=(8, 4.8))
    seen: set[int] = set()
    for label, rows in series.items():
        points = [(row["size_bytes"], row["busbw_gbps"]) for row in rows if row["busbw_gbps"] is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
            seen.update(size for size, _ in points)
    ax.set_xscale("log", base=2)
    ticks = sorted(seen)
    if ticks:
        step = math.ceil(len(ticks) / 10)  # at most about 10 labels, that do not overlap
        ax.set_xticks(ticks[::step], [format_bytes(t) for t in ticks[::step]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.legend()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("message size (log scale)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
