"""Weak-scaling benchmark of the emulator itself: wall time per call against MPI's own collective in the
same run, one switch rank for every GPU against a leaf switch rank per node (issue 10).

    python tests/benchmarks/scaling.py [--gpus 8,16,32] [--gpus-per-node 8] [--size 1M] [-n 5]

For each GPU count and collective (All2All of SIZE per GPU, AllReduce of SIZE) it runs
`nvlink-emu bench` twice: on `dgx-h100` with all the GPUs behind one switch rank, and on
`superpod-h100-nvlink` with GPU count / gpus-per-node nodes (a leaf rank each, and the spines), and
prints wall us per call of the emulator and of MPI's native collective over the GPU ranks (measured
in the same job, alternating), their ratio, and the largest rank's peak resident memory. A figure of
this machine, not a test: nothing is asserted.
"""

import argparse
import json
import subprocess
import sys
import time

from nvlink_emu.launch.units import parse_size

SINGLE, NODES = "dgx-h100", "superpod-h100-nvlink"
# runs a command and says the peak resident memory of its largest descendant (the ranks: ru_maxrss of
# RUSAGE_CHILDREN counts every descendant waited for, KiB on Linux), so each job is measured alone
MEASURED = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(f'peak_rss_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr); "
            "sys.exit(code)")


def bench_rows(collective: str, preset: str, gpus: int, gpus_per_node: int | None, sweep: list[str], iters: int,
               timeout_s: float, algorithm: str = "auto", extra: tuple | list = ()) -> list[dict]:
    """The rows of one `nvlink-emu bench` job (its --json keys; `sweep`: its size flags, `extra`: more of
    its options), each with the job's wall s and the largest rank's peak RSS (MiB); a failed job raises
    RuntimeError with its output's tail."""
    sizing = ["--gpus", str(gpus)] if gpus_per_node is None else ["--nodes", str(gpus // gpus_per_node),
                                                                   "--gpus-per-node", str(gpus_per_node)]
    cmd = [sys.executable, "-c", MEASURED, sys.executable, "-c", "from nvlink_emu.launch.cli import main; main()",
           "bench", collective, "--preset", preset, *sizing, *sweep, "-n", str(iters), "--algorithm", algorithm,
           "--json", "--timeout", str(timeout_s), *extra]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30 * timeout_s)
    wall = time.monotonic() - start
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not rows:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
    peak = [int(line.split("=")[1]) for line in done.stderr.splitlines() if line.startswith("peak_rss_kib=")]
    return [{**row, "job_wall_s": wall, "peak_rss_mib": peak[-1] / 1024 if peak else float("nan")} for row in rows]


def bench_row(collective: str, preset: str, gpus: int, gpus_per_node: int | None, size: int, iters: int,
              timeout_s: float, algorithm: str = "auto") -> dict:
    """bench_rows of one size."""
    return bench_rows(collective, preset, gpus, gpus_per_node, ["-b", str(size), "-e", str(size)], iters, timeout_s,
                      algorithm)[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/benchmarks/scaling.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="8,16,32", help="GPU counts, comma-separated (default 8,16,32)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node of the multi-node fabric")
    parser.add_argument("--size", type=parse_size, default=1 << 20, help="bytes per call (All2All: per GPU)")
    parser.add_argument("--collectives", default="all2all,allreduce", help="comma-separated (default all2all,allreduce)")
    parser.add_argument("--algorithm", default="auto", help="the bench's --algorithm (default auto: each fabric's choice)")
    parser.add_argument("-n", "--iters", type=int, default=5, help="timed calls per job (default 5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline of every wait in the jobs, s")
    args = parser.parse_args(argv)
    print(f"# weak scaling, {args.size} bytes per call, wall us per call (emulator vs MPI's own, same job); "
          f"one switch: {SINGLE}; nodes: {NODES} with {args.gpus_per_node} GPUs per node", flush=True)
    print(f"{'collective':<11}{'GPUs':>6}{'fabric':>22}{'ranks':>7}{'algorithm':>10}{'emu us':>12}{'native us':>12}"
          f"{'ratio':>8}{'job s':>8}{'peak RSS MiB':>14}", flush=True)
    for collective in args.collectives.split(","):
        for gpus in (int(g) for g in args.gpus.split(",")):
            shapes = [("1 switch", SINGLE, None)]
            if gpus % args.gpus_per_node == 0 and gpus // args.gpus_per_node > 1:
                shapes.append((f"{gpus // args.gpus_per_node} nodes x {args.gpus_per_node}", NODES, args.gpus_per_node))
            for label, preset, per_node in shapes:
                row = bench_row(collective, preset, gpus, per_node, args.size, args.iters, args.timeout,
                                "auto" if collective == "all2all" else args.algorithm)
                nodes = 1 if per_node is None else gpus // per_node
                ranks = gpus + 1 if per_node is None else gpus + nodes + per_node  # default spines: one per local index
                print(f"{collective:<11}{gpus:>6}{label:>22}{ranks:>7}{row['algorithm']:>10}{row['wall_us']:>12.0f}"
                      f"{row['native_wall_us']:>12.0f}"
                      f"{row['wall_us'] / row['native_wall_us']:>8.2f}{row['job_wall_s']:>8.1f}{row['peak_rss_mib']:>14.0f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
