"""flaky_link.py: data-parallel steps that survive a flapping GPU link by waiting for it and retrying.

Every GPU computes a gradient (a modeled kernel), then, before the step's AllReduce, the GPUs agree
on their links' state (gpu.link_status(), shared over the control plane): if any member's link is
down, the step is retried once that link is back up (the modeled wait is charged to every GPU, as a
job that holds its collective until the fabric recovers). A send on a down link raises LinkDown (a
FabricError naming the link, when it went down and when it comes back): the first step shows it
caught on the GPU whose link is down, at the first retry. The averaged gradient is checked against numpy every step;
GPU 0 prints each step's modeled time, the retries and the modeled time lost to the faults.

    nvlink-emu run launch/examples/flaky_link.py --config launch/examples/flaky_link.toml
"""

import argparse
import math
import sys

import numpy as np

from nvlink_emu.fabric.errors import LinkDown


def arguments():
    parser = argparse.ArgumentParser(prog="flaky_link.py")
    parser.add_argument("--steps", type=int, default=6, help="steps (default 6)")
    parser.add_argument("--count", type=int, default=1 << 18, help="float32 gradients per GPU (default 262144)")
    parser.add_argument("--compute-ns", type=float, default=20_000.0, help="modeled ns of each step's kernel")
    return parser.parse_args(sys.argv[1:])


def down_until(gpu) -> float:
    """When the last of this GPU's down links comes back (modeled ns), or 0 if every link is up."""
    return max((s["up_at_ns"] for s in gpu.link_status().values() if s["state"] == "down"), default=0.0)


def main(gpu):
    args = arguments()
    n, comm = gpu.size, gpu.world
    grads = gpu.alloc(args.count, "float32")
    retries, waited = 0, 0.0
    if gpu.rank == 0:
        print(f"flaky_link: {n} GPUs, {4 * args.count} B of gradients per AllReduce, {args.steps} steps on "
              f"{gpu.config.name}, {len(gpu.config.faults)} fault(s) in the plan")
    for step in range(args.steps):
        start = gpu.now_ns
        grads[:] = np.arange(args.count, dtype=np.float32) % 97 * (gpu.rank + 1)
        gpu.compute(args.compute_ns)
        while True:
            back = max(comm.allgather_object(down_until(gpu), "flaky_link link check"))
            if back == 0.0:
                break
            if math.isinf(back):
                raise LinkDown(f"step {step}: a member's link is down for good; no retry can help")
            if retries == 0 and down_until(gpu):  # what a send on the down link does: a typed, catchable error
                try:
                    gpu.world.send(grads[:1], (gpu.rank + 1) % n)
                except LinkDown as exc:
                    print(f"step {step}: caught LinkDown: {exc}")
            retries += 1
            lost = max(0.0, back - gpu.now_ns)
            waited += lost
            gpu.compute(lost)  # hold the step until the link is back, then retry
        comm.allreduce(grads, op="avg")
        expected = np.arange(args.count, dtype=np.float32) % 97 * ((n + 1) / 2)
        if not np.allclose(grads, expected, rtol=1e-6):
            raise AssertionError(f"GPU {gpu.rank}: step {step}: the averaged gradient is wrong")
        if gpu.rank == 0:
            print(f"step {step}: modeled {(gpu.now_ns - start) / 1e3:.3f} us, retries so far {retries}")
    total = max(comm.allgather_object(gpu.now_ns, "flaky_link end"))
    if gpu.rank == 0:
        print(f"flaky_link: {args.steps} steps in {total / 1e3:.3f} us modeled, {retries} retries, "
              f"{waited / 1e3:.3f} us of it waiting for links to come back")
