"""`nvlink-emu bench`: an nccl-tests-like sweep of one collective, with MPI's native collective over
the GPU ranks timed in the same run as the reference. Runs as a workload script: main(gpu)."""

import argparse
import json
import sys
import time

import numpy as np

from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.reduction import DTYPES, OPS, blocks, check_dtype, reduce_in_order, switch_accumulator
from nvlink_emu.ranks.collectives import ALGORITHMS, choose

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all")
BUS_FACTOR_TEXT = {"allreduce": "2(n-1)/n", "reduce_scatter": "(n-1)/n", "allgather": "(n-1)/n",
                   "broadcast": "1", "all2all": "(n-1)/n"}
HEADER = (f"{'size':>12}{'count':>12}{'type':>10}{'redop':>7}{'algorithm':>10}{'modeled_us':>12}{'algbw':>9}"
          f"{'busbw':>9}{'wall_us':>12}{'native_us':>12}{'emu/native':>11}{'tx_B/gpu':>12}{'rx_B/gpu':>12}"
          f"{'#wrong':>8}")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: what a ring-optimal algorithm moves per GPU, over S."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    return 1.0 if collective == "broadcast" else (n - 1) / n
NATIVE_DTYPES = ("float32", "float64", "int32", "int64")  # MPI has no reduction on 16-bit floats


def bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("collective", choices=COLLECTIVES)
    parser.add_argument("--algorithm", default="auto", choices=("auto", *ALGORITHMS))
    parser.add_argument("--min-bytes", type=_size, default=1024, metavar="B", help="smallest size (default 1K)")
    parser.add_argument("--max-bytes", type=_size, default=16 << 20, metavar="B", help="largest size (default 16M)")
    parser.add_argument("--factor", type=int, default=4, metavar="F", help="size multiplier per row (default 4)")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    parser.add_argument("--op", default="sum", choices=OPS)
    parser.add_argument("--iters", type=int, default=0, metavar="N",
                        help="timed iterations per size (default: from 20 at small sizes down to 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")


def _size(text: str) -> int:
    """Bytes from '1024', '64K', '16M', '1G'."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    clean = text.strip().upper().removesuffix("B")
    try:
        if clean and clean[-1] in units:
            return int(float(clean[:-1]) * units[clean[-1]])
        return int(clean)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (like 1024, 64K, 16M, 1G)") from None


def check(args, config) -> None:
    """Refuse, before any rank starts, a sweep that cannot run on `config`."""
    sizes(args)
    if args.collective != "all2all":
        choose(args.collective, args.algorithm, config, args.min_bytes)


def sizes(args) -> list[int]:
    """The sweep's sizes in bytes; ConfigError for an empty or endless sweep."""
    if args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2 or args.iters < 0:
        raise ConfigError(f"bench: need 0 < --min-bytes <= --max-bytes, --factor >= 2 and --iters >= 0; got "
                          f"{args.min_bytes}, {args.max_bytes}, {args.factor}, {args.iters}")
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size *= args.factor
    return out


PERIOD = 33  # the data pattern repeats every 33 elements (lcm of 3 and 11)


def contribution(rank: int, lo: int, hi: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Elements lo..hi of member `rank`'s input: small integers, exact in every dtype and in any
    summation order (nccl-tests does the same), repeating every PERIOD elements."""
    i = np.arange(lo, hi, dtype=np.int64)
    values = (i + rank) % 3 - 1 if op == "prod" else (3 * i + rank) % 11 - 5
    return values.astype(dtype)


def main(gpu):
    parser = argparse.ArgumentParser(prog="nvlink-emu bench")
    bench_arguments(parser)
    args = parser.parse_args(sys.argv[1:])
    dtype = check_dtype(DTYPES[args.dtype])
    comm, n = gpu.world, gpu.size
    if gpu.rank == 0 and not args.json:
        print(f"# nvlink-emu bench {args.collective} on {gpu.config.name} ({n} GPUs, {gpu.config.link}); "
              f"modeled: time on the modeled fabric, algbw = size / time, busbw = algbw x {BUS_FACTOR_TEXT[args.collective]} "
              f"(GB/s); wall: this machine, native = MPI's own collective; tx/rx: GPU 0's link payload per call",
              flush=True)
        print(HEADER, flush=True)
    for size in sizes(args):
        row = run_size(gpu, comm, args, dtype, size)
        if gpu.rank == 0:
            print(json.dumps(row) if args.json else _format(row), flush=True)


def run_size(gpu, comm, args, dtype: np.dtype, size: int) -> dict:
    n, r, name = gpu.size, gpu.rank, args.collective
    count = max(size // dtype.itemsize, 1)
    if name in ("reduce_scatter", "allgather", "all2all"):
        count = max(count // n, 1) * n  # equal blocks: the byte formulas hold exactly
    algorithm = "direct" if name == "all2all" else choose(name, args.algorithm, gpu.config, count * dtype.itemsize)
    a, b = blocks(count, n)[r]
    inputs = contribution(r, 0, count, dtype, args.op)
    send = gpu.alloc(count, dtype)
    recv = gpu.alloc(count if name in ("allgather", "all2all", "broadcast", "allreduce") else b - a, dtype)

    def prepare():
        send[:] = inputs
        if name == "allgather":
            send[:b - a] = inputs[a:b]

    def once():
        if name == "allreduce":
            recv[:] = send
            t = _timed(lambda: comm.allreduce(recv, args.op, algorithm))
        elif name == "reduce_scatter":
            t = _timed(lambda: comm.reduce_scatter(send, recv, args.op, algorithm))
        elif name == "allgather":
            t = _timed(lambda: comm.allgather(send[:b - a], recv, algorithm))
        elif name == "broadcast":
            recv[:] = send
            t = _timed(lambda: comm.broadcast(recv, 0, algorithm))
        else:
            t = _timed(lambda: comm.all2all(send, recv))
        return t

    prepare()
    comm.barrier()  # every member starts at the same modeled time
    before, start_ns = gpu.link_counters(), gpu.now_ns
    once()  # warm-up, and the call whose bytes, data and modeled time are checked
    after = gpu.link_counters()
    modeled_ns = max(comm.allgather_object(gpu.now_ns - start_ns, "bench modeled time"))
    wrong = int(np.count_nonzero(recv != _expected(name, algorithm, args.op, dtype, count, n, r)))
    iters = args.iters or max(2, min(20, (64 << 20) // (count * dtype.itemsize)))
    wall = sum(_synchronised(comm, once) for _ in range(iters)) / iters
    tracing = {}
    if gpu.trace is not None:
        # the cost of tracing, measured in this run: the same calls with trace records off and on,
        # alternating, so that drift over the run (it is there: the later of two blocks of calls
        # tends to be slower) weighs on both alike
        tracing = {False: 0.0, True: 0.0}
        for _ in range(iters):
            for on in (False, True):
                gpu.set_tracing(on)
                tracing[on] += _synchronised(comm, once) / iters
    native = None
    if args.dtype in NATIVE_DTYPES:
        native_recv = np.empty(recv.size if name != "broadcast" else count, dtype)
        native_send = send if name != "allgather" else send[:b - a]
        if name == "broadcast":
            native_recv[:] = send
        op = args.op
        native = sum(_synchronised(comm, lambda: _timed(lambda: gpu.native(name, native_send, native_recv, op)))
                     for _ in range(iters)) / iters
    total_wrong = sum(comm.allgather_object(wrong, "bench #wrong"))
    gpu.free(send)
    gpu.free(recv)
    size_bytes = count * dtype.itemsize
    # bytes per ns = GB/s; a lone GPU moves nothing and takes no modeled time: no bandwidth to speak of
    algbw = size_bytes / modeled_ns if modeled_ns else None
    return {"size_bytes": size_bytes, "count": count, "dtype": args.dtype, "op": args.op,
            "algorithm": algorithm, "modeled_us": round(modeled_ns / 1e3, 4),
            "algbw_gbps": None if algbw is None else round(algbw, 3),
            "busbw_gbps": None if algbw is None else round(algbw * bus_factor(name, n), 3),
            "wall_us": round(wall * 1e6, 1),
            "native_wall_us": None if native is None else round(native * 1e6, 1),
            "tx_bytes_per_gpu": after["tx_bytes"] - before["tx_bytes"],
            "rx_bytes_per_gpu": after["rx_bytes"] - before["rx_bytes"], "wrong": total_wrong,
            **({"traced_wall_us": round(tracing[True] * 1e6, 1), "untraced_wall_us": round(tracing[False] * 1e6, 1)}
               if tracing else {})}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _synchronised(comm, once) -> float:
    """One call, started together after a barrier; the slowest member's time (seconds)."""
    comm.barrier()
    return max(comm.allgather_object(once(), "bench timing"))


def _expected(name, algorithm, op, dtype, count, n, r) -> np.ndarray:
    """This member's correct result: the inputs are small integers, so every order gives the same sum;
    the accumulator dtype (wider in the switch for 16-bit floats) still decides avg's rounding."""
    a, b = blocks(count, n)[r]
    if name == "allgather":
        return np.concatenate([contribution(m, *blocks(count, n)[m], dtype, op) for m in range(n)])
    if name == "broadcast":
        return contribution(0, 0, count, dtype, op)
    if name == "all2all":
        size = count // n
        return np.concatenate([contribution(m, r * size, (r + 1) * size, dtype, op) for m in range(n)])
    # one period of the reduction, tiled: the pattern repeats every PERIOD elements
    accumulate = switch_accumulator(dtype) if algorithm in ("sharp", "nvls") else dtype
    period = reduce_in_order([contribution(m, 0, PERIOD, dtype, op) for m in range(n)], op, accumulate, dtype)
    lo, hi = (0, count) if name == "allreduce" else (a, b)
    return np.take(period, np.arange(lo, hi) % PERIOD)


def _bw(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _format(row: dict) -> str:
    native = row["native_wall_us"]
    ratio = f"{row['wall_us'] / native:.2f}" if native else "n/a"
    return (f"{row['size_bytes']:>12}{row['count']:>12}{row['dtype']:>10}{row['op']:>7}{row['algorithm']:>10}"
            f"{row['modeled_us']:>12.3f}{_bw(row['algbw_gbps']):>9}{_bw(row['busbw_gbps']):>9}"
            f"{row['wall_us']:>12.1f}{native if native is not None else 'n/a':>12}{ratio:>11}"
            f"{row['tx_bytes_per_gpu']:>12}{row['rx_bytes_per_gpu']:>12}{row['wrong']:>8}"
            + (f"\n# tracing costs {100 * (row['traced_wall_us'] / row['untraced_wall_us'] - 1):+.1f}% wall time here "
               f"({row['traced_wall_us']:.1f} us traced, {row['untraced_wall_us']:.1f} us not)"
               if "traced_wall_us" in row else ""))
