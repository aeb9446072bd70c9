"""The workload of `nvlink-emu bench` (launch/commands/bench.py starts it: main(gpu) on every GPU): the
sweep of one collective (launch/sweeps.py), its results checked, with MPI's native collective over the GPU
ranks timed in the same run as the reference."""

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

from nvlink_emu.fabric.cost import bus_factor
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.reduction import DTYPES, blocks, check_dtype, reduce_in_order, switch_accumulator
from nvlink_emu.fabric.tuner import all2all_algorithm, choose

from nvlink_emu.launch import hostcpu
from nvlink_emu.launch.sweeps import (NATIVE_DTYPES, REDUCING, ROOT, bench_arguments, buffer_counts, closing,
                                      element_count, format_row, header, plan_of, sizes, sweep_gpu_bytes)

PERIOD = 33  # the data pattern repeats every 33 elements (lcm of 3 and 11)


def contribution(rank: int, lo: int, hi: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Elements lo..hi of member `rank`'s input: small integers, exact in every dtype and in any
    summation order (nccl-tests does the same), repeating every PERIOD elements."""
    i = np.arange(lo, hi, dtype=np.int64)
    values = (i + rank) % 3 - 1 if op == "prod" else (3 * i + rank) % 11 - 5
    return values.astype(dtype)


TILE = PERIOD * (1 << 15)  # elements written or checked at a time (~1M): no full-size temporaries


def fill(out: np.ndarray, rank: int, lo: int, op: str) -> None:
    """out[k] <- element lo + k of member `rank`'s input, a tile at a time."""
    tile = contribution(rank, lo, lo + min(TILE, out.size), out.dtype, op)
    for start in range(0, out.size, TILE):  # TILE is a whole number of periods: every tile is the same
        out[start:start + TILE] = tile[:out.size - start]


def count_wrong(actual: np.ndarray, segments) -> int:
    """Elements of `actual` that differ from the expected values, given as segments (start, length,
    one PERIOD of values, phase): actual[start + k] should be values[(phase + k) % PERIOD]."""
    wrong = 0
    for start, length, values, phase in segments:
        tile = np.take(values, (phase + np.arange(min(TILE, length))) % PERIOD)
        for at in range(0, length, TILE):
            part = actual[start + at:start + min(at + TILE, length)]
            wrong += int(np.count_nonzero(part != tile[:part.size]))
    return wrong


def main(gpu):
    parser = argparse.ArgumentParser(prog="nvlink-emu bench")
    bench_arguments(parser)
    args = parser.parse_args(sys.argv[1:])
    dtype = check_dtype(DTYPES[args.dtype])
    comm, n = gpu.world, gpu.size
    # under a launcher of one's own nothing sized the memory for the sweep: say which key to raise
    need = sweep_gpu_bytes(args, gpu.config)
    if need > gpu.config.memory_capacity_bytes:
        raise ConfigError(f"bench: the sweep's largest {args.collective} needs {need} bytes of memory on each GPU "
                          f"(send + receive buffers), more than memory_capacity_bytes = "
                          f"{gpu.config.memory_capacity_bytes}: raise it in a --config file (`nvlink-emu bench` "
                          f"does so itself)")
    if gpu.rank == 0 and not args.json:
        print(header(args.collective, gpu.config.name, n, gpu.config.link), flush=True)
    meter = CpuMeter(gpu, comm) if args.cpu else None
    plan = plan_of(args, gpu.config)  # every rank reads and validates the file: it is on the shared path
    rows = []
    for size in sizes(args):
        rows.append(run_size(gpu, comm, args, dtype, size, meter, plan))
        if gpu.rank == 0:
            print(json.dumps(rows[-1]) if args.json else format_row(rows[-1]), flush=True)
    if gpu.rank == 0 and not args.json:
        print(closing(rows), flush=True)


class CpuMeter:
    """CPU time of the job's ranks on GPU 0's host over a loop of calls (launch/hostcpu.py), read by GPU 0:
    all of them, and the switches' (the ranks that are no GPU's). Each timed loop also runs bench's barrier
    and timing exchange per call; their own cost, measured alone beside it (`sync`), is taken out, so that
    a figure is the collective's. Collective: every GPU constructs it."""

    def __init__(self, gpu, comm):
        host = socket.gethostname()
        # pids are per host: a GPU of another host may have a local switch's
        gpus = {pid for name, pid in comm.allgather_object((host, os.getpid()), "bench cpu pids") if name == host}
        self.comm = comm
        self.pids = hostcpu.job_pids() if gpu.rank == 0 else None
        self.switches = [p for p in self.pids if p not in gpus] if self.pids else []
        if gpu.rank == 0 and self.pids is None:
            print("# bench --cpu: no /proc on this host (Linux only): no CPU time is measured", file=sys.stderr,
                  flush=True)

    def snapshot(self) -> dict | None:
        return hostcpu.cpu_ns(self.pids) if self.pids else None

    def sync(self, iters: int) -> dict | None:
        """The loop's CPU and wall time per call of bench's barrier and timing exchange alone."""
        return self.loop(iters, lambda: _synchronised(self.comm, lambda: 0.0))[1]

    def loop(self, iters: int, once, sync: dict | None = None) -> tuple[float, dict | None]:
        """Sum of `once()` over `iters` calls, and (GPU 0, with /proc) per call: cpu_us of every rank,
        switch_cpu_us of the switches, wall_us of the loop, less `sync`'s (a sync() of the same loop)."""
        before, start = self.snapshot(), time.perf_counter()
        total = sum(once() for _ in range(iters))
        wall, after = time.perf_counter() - start, self.snapshot()
        used = self.per_call(before, after, iters, wall)
        if used is not None and sync is not None:
            used = {key: round(value - sync[key], 1) for key, value in used.items()}
        return total, used

    def per_call(self, before, after, iters: int, wall_s: float | None = None) -> dict | None:
        if before is None or after is None:
            return None
        used = {p: after[p] - before[p] for p in after if p in before}
        out = {"cpu_us": sum(used.values()) / iters / 1e3,
               "switch_cpu_us": sum(used.get(p, 0.0) for p in self.switches) / iters / 1e3}
        if wall_s is not None:
            out["wall_us"] = wall_s / iters * 1e6
        return {key: round(value, 1) for key, value in out.items()}


def run_size(gpu, comm, args, dtype: np.dtype, size: int, meter: CpuMeter | None = None, plan=None) -> dict:
    """One row of the sweep; `plan` (fabric.plans), if given, is the algorithm every call runs."""
    n, r, name = gpu.size, gpu.rank, args.collective
    op = args.op or ("sum" if name in REDUCING else "none")
    count = element_count(name, size, dtype.itemsize, n)
    if plan is not None:
        algorithm = plan
    elif name == "all2all":
        algorithm = all2all_algorithm(args.algorithm, gpu.config, count * dtype.itemsize, itemsize=dtype.itemsize)
    else:
        algorithm = choose(name, args.algorithm, gpu.config, count * dtype.itemsize)
    a, b = blocks(count, n)[r]
    send_count, recv_count = buffer_counts(name, count, n)
    send, recv = gpu.alloc(send_count, dtype), gpu.alloc(recv_count, dtype)
    # the input is written into the GPU's buffers in place: at 1 GiB a host copy would cost 1 GiB per rank
    fill(send, r, a if name == "allgather" else 0, op)  # allgather's send is this member's block

    def once():
        if name == "allreduce":
            recv[:] = send
            t = _timed(lambda: comm.allreduce(recv, op, algorithm))
        elif name == "reduce_scatter":
            t = _timed(lambda: comm.reduce_scatter(send, recv, op, algorithm))
        elif name == "allgather":
            t = _timed(lambda: comm.allgather(send, recv, algorithm))
        elif name == "broadcast":
            recv[:] = send
            t = _timed(lambda: comm.broadcast(recv, ROOT, algorithm))
        else:
            t = _timed(lambda: comm.all2all(send, recv, algorithm))
        return t

    comm.barrier()  # every member starts at the same modeled time
    before, start_ns = gpu.link_counters(), gpu.now_ns
    once()  # warm-up, and the call whose bytes, data and modeled time are checked
    after = gpu.link_counters()
    modeled_ns = max(comm.allgather_object(gpu.now_ns - start_ns, "bench modeled time"))
    wrong = count_wrong(recv, _expected(name, "plan" if plan is not None else algorithm, op, dtype, count, n, r))
    iters = args.iters or max(2, min(20, (64 << 20) // (count * dtype.itemsize)))
    cpu: dict[str, float] = {}
    sync = None
    if meter is None:
        wall = sum(_synchronised(comm, once) for _ in range(iters)) / iters
    else:
        sync = meter.sync(iters)
        wall, used = meter.loop(iters, lambda: _synchronised(comm, once), sync)
        wall /= iters
        if used is not None:
            cpu.update(cpu_us=used["cpu_us"], switch_cpu_us=used["switch_cpu_us"], cpu_wall_us=used["wall_us"],
                       sync_cpu_us=sync["cpu_us"], sync_wall_us=sync["wall_us"])  # type: ignore[index]  # None only where used is
    tracing = {}
    if gpu.trace is not None:
        # the cost of tracing, measured in this run: the same calls with trace records off and on,
        # alternating, so that drift over the run (it is there: the later of two blocks of calls
        # tends to be slower) weighs on both alike
        tracing, spent = {False: 0.0, True: 0.0}, {False: 0.0, True: 0.0}
        for _ in range(iters):
            for on in (False, True):
                gpu.set_tracing(on)
                cpu_before = meter.snapshot() if meter else None
                tracing[on] += _synchronised(comm, once) / iters
                used = meter.per_call(cpu_before, meter.snapshot(), iters) if meter else None
                spent[on] += used["cpu_us"] if used else 0.0
        if sync is not None:  # each call's CPU, less the barrier and timing exchange's
            cpu.update(traced_cpu_us=round(spent[True] - sync["cpu_us"], 1),
                       untraced_cpu_us=round(spent[False] - sync["cpu_us"], 1))
    native = None
    if args.dtype in NATIVE_DTYPES:
        # into the emulator's receive buffer, already checked: no third buffer of the call's size
        if name == "broadcast":
            recv[:] = send
        native = sum(_synchronised(comm, lambda: _timed(lambda: gpu.native(name, send, recv, op, ROOT)))
                     for _ in range(iters)) / iters
    total_wrong = sum(comm.allgather_object(wrong, "bench #wrong"))
    gpu.free(send)
    gpu.free(recv)
    size_bytes = count * dtype.itemsize
    # bytes per ns = GB/s; a lone GPU moves nothing and takes no modeled time: no bandwidth to speak of
    algbw = size_bytes / modeled_ns if modeled_ns else None
    return {"size_bytes": size_bytes, "count": count, "dtype": args.dtype, "op": op,
            "root": ROOT if name == "broadcast" else None,
            "algorithm": "plan" if plan is not None else algorithm, **({"plan": plan.name} if plan is not None else {}),
            "modeled_us": round(modeled_ns / 1e3, 4),
            "algbw_gbps": None if algbw is None else round(algbw, 3),
            "busbw_gbps": None if algbw is None else round(algbw * bus_factor(name, n), 3),
            "wall_us": round(wall * 1e6, 1),
            "native_wall_us": None if native is None else round(native * 1e6, 1),
            "tx_bytes_per_gpu": after["tx_bytes"] - before["tx_bytes"],
            "rx_bytes_per_gpu": after["rx_bytes"] - before["rx_bytes"], "wrong": total_wrong,
            **({"traced_wall_us": round(tracing[True] * 1e6, 1), "untraced_wall_us": round(tracing[False] * 1e6, 1)}
               if tracing else {}), **cpu}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _synchronised(comm, once) -> float:
    """One call, started together after a barrier; the slowest member's time (seconds)."""
    comm.barrier()
    return max(comm.allgather_object(once(), "bench timing"))


def _expected(name, algorithm, op, dtype, count, n, r) -> list[tuple]:
    """This member's correct result, as count_wrong's segments: the inputs are small integers, so every
    order gives the same sum; the accumulator dtype (wider in the switch for 16-bit floats) still
    decides avg's rounding."""
    parts = blocks(count, n)
    if name == "allgather":
        return [(a, b - a, contribution(m, 0, PERIOD, dtype, op), a % PERIOD) for m, (a, b) in enumerate(parts)]
    if name == "broadcast":
        return [(0, count, contribution(ROOT, 0, PERIOD, dtype, op), 0)]
    if name == "all2all":
        size = count // n
        return [(m * size, size, contribution(m, 0, PERIOD, dtype, op), r * size % PERIOD) for m in range(n)]
    # one period of the reduction: the pattern repeats every PERIOD elements
    accumulate = switch_accumulator(dtype) if algorithm in ("sharp", "nvls") else dtype
    period = reduce_in_order([contribution(m, 0, PERIOD, dtype, op) for m in range(n)], op, accumulate, dtype)
    a, b = (0, count) if name == "allreduce" else parts[r]
    return [(0, b - a, period, a % PERIOD)]
