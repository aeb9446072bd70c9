"""The floor of a switch-process design (issue 13): the same AllReduce patterns as the emulator's `ring`
and `sharp`, in plain mpi4py with nothing emulated, every message through one relay rank, against MPI's
own Allreduce in the same job.

    python -m nvlink_emu.launch.floor [--gpus 4,8] [-b 1K] [-e 64M] [-f 16] [-n N]

G GPU ranks and one relay rank (the last) per job, as a one-switch fabric of G GPUs runs. `relay ring`:
2(G-1) steps, each GPU sends one of G blocks to the relay, which passes it to the next GPU, which adds it
(reduce-scatter, then all-gather) - the emulator's ring without its packets, TLB, counters or modeled
time. `relay sharp`: every GPU sends its whole buffer to the relay, which sums them and sends the sum to
each - sharp's pattern without its chunks and credits. A cell is the pattern's wall time per call over
MPI's own Allreduce (MPI_SUM, float32) of the GPU ranks, the three timed alternately, call by call, so
drift weighs on all alike. What no emulator whose messages pass a switch process can beat on this
machine, whatever its Python costs: where the floor is above a target, the target is out of reach of
the design. Results are checked against MPI's own (the inputs are small integers: exact in float32).
Every wait has a deadline (--timeout); a failing rank aborts the job.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from .bench import _size, format_bytes
from .mpiexec import mpiexec_command

STOP = 1 << 20  # tag of the relay's last message
TAG_LIMIT = 32767  # the least MPI_TAG_UB the standard allows: destinations are tags


def _wait(request, deadline: float, what: str):
    """Poll one request until done (MPI's own blocking wait polls too), yielding the core between polls, or
    raise at the deadline. Measured with 4 GPUs + the relay on 2 cores, 1 KiB: the relay ring 110 ms a call
    spinning, 19 ms yielding; MPI's own 11.8 and 6.1 ms beside a relay spinning and yielding."""
    while not request.Test():
        os.sched_yield()  # a runnable peer gets the core: more processes than cores here
        if time.monotonic() > deadline:
            raise TimeoutError(f"floor: {what} not done by its deadline")


def _relay(comm, gpus: int, timeout_s: float) -> None:
    """Pass every message on to the GPU its tag names; for tag gpus (sharp) sum one buffer from every GPU
    and send the sum to each. Ends on a STOP from every GPU."""
    from mpi4py import MPI
    status, stopped, buffers, pending = MPI.Status(), 0, {}, []
    while stopped < gpus:
        deadline = time.monotonic() + timeout_s
        while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            pending = [(request, buf) for request, buf in pending if not request.Test()]
            os.sched_yield()
            if time.monotonic() > deadline:
                raise TimeoutError(f"floor: relay heard nothing for {timeout_s} s ({stopped} of {gpus} done)")
        count, tag, src = status.Get_count(MPI.FLOAT), status.Get_tag(), status.Get_source()
        if tag == STOP:
            comm.Recv([np.empty(0, np.float32), MPI.FLOAT], src, STOP)
            stopped += 1
            continue
        if tag < gpus:  # ring: on to the GPU the tag names, without waiting (it may not have asked yet)
            buf = np.empty(count, np.float32)
            comm.Recv([buf, MPI.FLOAT], src, tag)
            pending.append((comm.Isend([buf, MPI.FLOAT], tag, tag), buf))
            continue
        buf = buffers.get((count, src))
        if buf is None:
            buf = buffers[(count, src)] = np.empty(count, np.float32)
        comm.Recv([buf, MPI.FLOAT], src, tag)
        total = buf.copy()  # sharp: the others' buffers, in rank order after the first to arrive
        for other in range(gpus):
            if other != src:
                part = buffers.get((count, other))
                if part is None:
                    part = buffers[(count, other)] = np.empty(count, np.float32)
                _wait(comm.Irecv([part, MPI.FLOAT], other, gpus), time.monotonic() + timeout_s,
                      f"relay's sharp receive from GPU {other}")
                total += part
        requests = [comm.Isend([total, MPI.FLOAT], g, gpus) for g in range(gpus)]
        deadline = time.monotonic() + timeout_s
        for g, request in enumerate(requests):
            _wait(request, deadline, f"relay's sharp send to GPU {g}")
    deadline = time.monotonic() + timeout_s
    for request, _ in pending:
        _wait(request, deadline, "relay's last ring sends")


def _ring(comm, gpus: int, array: np.ndarray, timeout_s: float) -> None:
    """In place: the relay ring AllReduce of `array` over the GPU ranks (blocks of np.array_split)."""
    from mpi4py import MPI
    r, relay = comm.Get_rank(), gpus
    parts = np.array_split(np.arange(array.size), gpus)
    bounds = [(int(p[0]) if p.size else 0, int(p[-1]) + 1 if p.size else 0) for p in parts]
    scratch = np.empty(max(b - a for a, b in bounds), np.float32)
    deadline = time.monotonic() + timeout_s
    for step in range(2 * (gpus - 1)):
        reduce = step < gpus - 1
        k = step if reduce else step - (gpus - 1)
        a, b = bounds[(r - k + (0 if reduce else 1)) % gpus]  # the block this GPU sends at this step
        c, d = bounds[(r - k - 1 + (0 if reduce else 1)) % gpus]  # the block it receives
        recv = comm.Irecv([scratch[:d - c], MPI.FLOAT], relay, r)
        send = comm.Isend([array[a:b], MPI.FLOAT], relay, (r + 1) % gpus)
        _wait(recv, deadline, f"GPU {r}'s ring step {step} receive")
        _wait(send, deadline, f"GPU {r}'s ring step {step} send")
        if reduce:
            array[c:d] += scratch[:d - c]
        else:
            array[c:d] = scratch[:d - c]


def _sharp(comm, gpus: int, array: np.ndarray, timeout_s: float) -> None:
    """In place: the relay sums every GPU's `array` and sends the sum back."""
    from mpi4py import MPI
    deadline = time.monotonic() + timeout_s
    recv = comm.Irecv([array, MPI.FLOAT], gpus, gpus)
    _wait(comm.Isend([array.copy(), MPI.FLOAT], gpus, gpus), deadline, f"GPU {comm.Get_rank()}'s sharp send")
    _wait(recv, deadline, f"GPU {comm.Get_rank()}'s sharp receive")


def _worker(sizes: list[int], iters: int, timeout_s: float) -> None:
    """Under mpiexec: the last rank relays; the others time the patterns and MPI's own, rank 0 prints."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    gpus = world.Get_size() - 1
    if not 2 <= gpus < TAG_LIMIT:
        raise SystemExit(f"floor: needs 3 or more ranks (GPUs + a relay), got {world.Get_size()}")
    own = world.Split(0 if world.Get_rank() < gpus else MPI.UNDEFINED)
    try:
        if world.Get_rank() == gpus:
            _relay(world, gpus, timeout_s)
            return
        r = own.Get_rank()
        for size in sizes:
            count = max(1, size // 4)
            base = ((np.arange(count) + r) % 7).astype(np.float32)  # small integers: every order sums exactly
            expected = np.empty_like(base)
            own.Allreduce(base, expected)
            times = {"relay ring": 0.0, "relay sharp": 0.0, "MPI's own": 0.0}
            n = iters or max(2, min(20, (64 << 20) // (count * 4)))
            for i in range(n + 1):  # the first, a warm-up, untimed
                for name in times:
                    array = base.copy()
                    own.Barrier()
                    start = time.perf_counter()
                    if name == "relay ring":
                        _ring(world, gpus, array, timeout_s)
                    elif name == "relay sharp":
                        _sharp(world, gpus, array, timeout_s)
                    else:
                        out = np.empty_like(array)
                        own.Allreduce(array, out)
                        array = out
                    elapsed = own.allreduce(time.perf_counter() - start, op=MPI.MAX)
                    if i:
                        times[name] += elapsed / n
                    if not np.array_equal(array, expected):
                        raise AssertionError(f"floor: {name} on GPU {r} at {size} B differs from MPI's own")
            if r == 0:
                mpi = times["MPI's own"]
                print(f"{gpus} {size} " + " ".join(f"{times[k] / mpi:.2f}:{times[k] * 1e3:.3g}" for k in times),
                      flush=True)
        world.Send([np.empty(0, np.float32), MPI.FLOAT], gpus, STOP)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvlink_emu.launch.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="4,8", help="GPU counts, comma-separated (default 4,8)")
    parser.add_argument("-b", "--min-bytes", type=_size, default=1 << 10, help="smallest size (default 1K)")
    parser.add_argument("-e", "--max-bytes", type=_size, default=64 << 20, help="largest size (default 64M)")
    parser.add_argument("-f", "--factor", type=int, default=16, help="size multiplier per column (default 16)")
    parser.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (default: bench's rule)")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of every wait, s")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a rank of the job
    args = parser.parse_args(argv)
    if args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2 or args.iters < 0:
        raise SystemExit("floor: need 0 < -b <= -e, -f >= 2 and -n >= 0")
    sizes = [args.min_bytes]
    while sizes[-1] * args.factor <= args.max_bytes:
        sizes.append(sizes[-1] * args.factor)
    if args.worker:
        _worker(sizes, args.iters, args.timeout)
        return 0
    flags = ["-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor), "-n", str(args.iters),
             "--timeout", str(args.timeout)]
    for text in args.gpus.split(","):
        gpus = int(text)
        if gpus < 2:
            raise SystemExit(f"--gpus: {gpus}: at least 2")
        cmd = [*mpiexec_command(), "-n", str(gpus + 1), sys.executable, "-m", "nvlink_emu.launch.floor", "--worker",
               *flags]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30 * args.timeout)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
        rows = [line.split() for line in done.stdout.splitlines() if line[:1].isdigit()]
        print(f"\n### {gpus} GPUs + a relay rank: wall time / MPI's own Allreduce, per call\n")
        print("| pattern | " + " | ".join(format_bytes(int(row[1])) for row in rows) + " |")
        print("| --- |" + " --- |" * len(rows))
        for k, name in enumerate(("relay ring", "relay sharp", "MPI's own")):
            cells = [row[2 + k].split(":") for row in rows]
            print(f"| {name} | " + " | ".join(f"{ratio}x ({ms} ms)" for ratio, ms in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
