"""What a switch-process design's messages cost (issue 13): the message patterns of the emulator's `ring` and
`sharp` AllReduce in plain mpi4py, nothing emulated, every message through one relay rank, against MPI's
own Allreduce in the same job.

    python tests/benchmarks/floor.py [--gpus 4,8] [-b 1K] [-e 64M] [-f 16] [--chunk 4M] [-n N]

G GPU ranks and one relay rank (the last) per job, as a one-switch fabric of G GPUs runs; messages of at
most --chunk bytes (default dgx-h100's chunk_bytes, the emulator's message size). `relay ring`: 2(G-1)
steps; at each, every GPU sends one of G blocks to the relay, which passes each message on to the next
GPU as it comes; that GPU adds it (reduce-scatter), then copies it (all-gather): the emulator's ring
without its headers, TLB, credits, counters or modeled time. `relay sharp`: every GPU sends its buffer
to the relay chunk by chunk, the relay sums each chunk as the GPUs' come and sends every sum to every
GPU: sharp's pattern without its window and credits. A cell is the pattern's wall time per call over
MPI's own Allreduce (MPI_SUM, float32) of the GPU ranks, the three timed alternately, call by call, so
drift weighs on all alike. The ratio is what the design's messages cost on this machine, before any
Python of the emulator's own: where the emulator's ratio is near it, the design is what costs; where it is
well above, the emulator's work is. Not a proven lower bound: a relay written otherwise may do better
(this one allocates a buffer a message, waits as MPI's own wait does, polling, and yields the core
between polls; at 64 MiB the emulator's own ring beats its relay ring). Results are checked against
MPI's own (the inputs are small integers: exact in float32). Every wait has a deadline (--timeout); a
failing rank aborts the job.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from nvlink_emu.fabric.config import preset

from nvlink_emu.launch.mpiexec import mpiexec_command
from nvlink_emu.launch.units import format_bytes, parse_size

TAG_LIMIT = 32767  # the least MPI_TAG_UB the standard allows: destinations and chunks are tags
STOP = TAG_LIMIT  # tag of the relay's last message


def _wait(request, deadline: float, what: str):
    """Poll one request until done (MPI's own blocking wait polls too), yielding the core between polls, or
    raise at the deadline. Measured with 4 GPUs + the relay on 2 cores, 1 KiB: the relay ring 110 ms a call
    spinning, 19 ms yielding; MPI's own 11.8 and 6.1 ms beside a relay spinning and yielding."""
    while not request.Test():
        os.sched_yield()  # a runnable peer gets the core: more processes than cores here
        if time.monotonic() > deadline:
            raise TimeoutError(f"floor: {what} not done by its deadline")


def _relay(comm, gpus: int, timeout_s: float) -> None:
    """Pass every ring message on to the GPU its tag names (tag < gpus) at once; sum sharp's chunk k
    (tag gpus + 1 + k) over the GPUs as they come, and send each sum to every GPU once all came. Ends on
    a STOP from every GPU."""
    from mpi4py import MPI
    status, stopped, pending, sums, came = MPI.Status(), 0, [], {}, {}
    while stopped < gpus:
        deadline = time.monotonic() + timeout_s
        while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            pending = [(request, buf) for request, buf in pending if not request.Test()]
            os.sched_yield()
            if time.monotonic() > deadline:
                raise TimeoutError(f"floor: relay heard nothing for {timeout_s} s ({stopped} of {gpus} done)")
        count, tag, src = status.Get_count(MPI.FLOAT), status.Get_tag(), status.Get_source()
        buf = np.empty(count, np.float32)
        comm.Recv([buf, MPI.FLOAT], src, tag)
        if tag == STOP:
            stopped += 1
        elif tag < gpus:  # ring: on to the GPU the tag names, without waiting (it may not have asked yet)
            pending.append((comm.Isend([buf, MPI.FLOAT], tag, tag), buf))
        else:  # sharp's chunk tag - gpus - 1: summed in the order the GPUs' chunks come
            if tag in sums:
                sums[tag] += buf
                came[tag] += 1
            else:
                sums[tag], came[tag] = buf, 1
            if came[tag] == gpus:
                total = sums.pop(tag)
                del came[tag]
                pending.extend((comm.Isend([total, MPI.FLOAT], g, tag), total) for g in range(gpus))
    deadline = time.monotonic() + timeout_s
    for request, _ in pending:
        _wait(request, deadline, "relay's last sends")


def _pieces(a: int, b: int, chunk: int) -> list[tuple[int, int]]:
    """[a, b) in pieces of `chunk` elements (one empty piece for an empty range: every step sends)."""
    return [(x, min(x + chunk, b)) for x in range(a, b, chunk)] or [(a, a)]


def _ring(comm, gpus: int, array: np.ndarray, chunk: int, timeout_s: float) -> None:
    """In place: the relay ring AllReduce of `array` over the GPU ranks (blocks of np.array_split), each
    step's block in messages of `chunk` elements, as the emulator's ring sends chunk_bytes messages."""
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
        recvs = [comm.Irecv([scratch[x - c:y - c], MPI.FLOAT], relay, r) for x, y in _pieces(c, d, chunk)]
        sends = [comm.Isend([array[x:y], MPI.FLOAT], relay, (r + 1) % gpus) for x, y in _pieces(a, b, chunk)]
        for request in recvs + sends:
            _wait(request, deadline, f"GPU {r}'s ring step {step}")
        if reduce:
            array[c:d] += scratch[:d - c]
        else:
            array[c:d] = scratch[:d - c]


def _sharp(comm, gpus: int, array: np.ndarray, chunk: int, timeout_s: float) -> None:
    """In place: the relay sums every GPU's `array`, chunk by chunk, and sends each sum back."""
    from mpi4py import MPI
    r, deadline = comm.Get_rank(), time.monotonic() + timeout_s
    pieces = _pieces(0, array.size, chunk)
    if gpus + 1 + len(pieces) > STOP:
        raise ValueError(f"floor: {len(pieces)} chunks of {chunk * 4} B take more tags than MPI promises")
    mine = array.copy()
    recvs = [comm.Irecv([array[x:y], MPI.FLOAT], gpus, gpus + 1 + k) for k, (x, y) in enumerate(pieces)]
    sends = [comm.Isend([mine[x:y], MPI.FLOAT], gpus, gpus + 1 + k) for k, (x, y) in enumerate(pieces)]
    for request in sends + recvs:
        _wait(request, deadline, f"GPU {r}'s sharp chunks")


def _worker(sizes: list[int], chunk_bytes: int, iters: int, timeout_s: float) -> None:
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
                        _ring(world, gpus, array, chunk_bytes // 4, timeout_s)
                    elif name == "relay sharp":
                        _sharp(world, gpus, array, chunk_bytes // 4, timeout_s)
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
    parser = argparse.ArgumentParser(prog="python tests/benchmarks/floor.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="4,8", help="GPU counts, comma-separated (default 4,8)")
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1 << 10, help="smallest size (default 1K)")
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    parser.add_argument("-f", "--factor", type=int, default=16, help="size multiplier per column (default 16)")
    parser.add_argument("--chunk", type=parse_size, default=preset("dgx-h100").chunk_bytes,
                        help="bytes a message, as the emulator's chunk_bytes (default dgx-h100's)")
    parser.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (default: bench's rule)")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of every wait, s")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a rank of the job
    args = parser.parse_args(argv)
    if args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2 or args.iters < 0 or args.chunk < 4:
        raise SystemExit("floor: need 0 < -b <= -e, -f >= 2, -n >= 0 and --chunk >= 4")
    sizes = [args.min_bytes]
    while sizes[-1] * args.factor <= args.max_bytes:
        sizes.append(sizes[-1] * args.factor)
    if args.worker:
        _worker(sizes, args.chunk, args.iters, args.timeout)
        return 0
    flags = ["--chunk", str(args.chunk), "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor), "-n", str(args.iters),
             "--timeout", str(args.timeout)]
    for text in args.gpus.split(","):
        gpus = int(text)
        if gpus < 2:
            raise SystemExit(f"--gpus: {gpus}: at least 2")
        cmd = [*mpiexec_command(), "-n", str(gpus + 1), sys.executable, os.path.abspath(__file__), "--worker",
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
