"""CPU cost of a plan's generic layers at scale (issue 26): for each algorithm, the call's plan as
fabric.plans.catalog.call_plan builds it, in three phases, one after the other in this process:

  build     the registry's builder (ALGORITHMS[name], the validator stubbed out)
  validate  fabric.plans.validate.validate on that plan
  walk      fabric.plans.format.walk with a visitor that does nothing (the symbolic run every timing
            table and the validator share)

    python tests/benchmarks/plan_phases.py [--only ring,hier] [--size 1G]

Cases: allreduce on superpod-h100-nvlink's grid, 32 nodes x 8 GPUs, 1 GiB (ring, hier, sharp, tree,
direct), and nvls on 8 x 8 at 256 MiB (`nvlink-emu model`'s issue-26 figures). Seconds of process CPU
(time.process_time) and the plan's operations. A figure of this machine, not a test: nothing is asserted.
"""

import argparse
import gc
import time
from typing import Any

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.plans import catalog, registry
from nvlink_emu.fabric.plans.format import Op, Plan, walk
from nvlink_emu.fabric.plans.validate import validate
from nvlink_emu.launch.units import parse_size

# (algorithm, nodes, GPUs a node, default bytes): the issue's `model` runs
CASES = [("ring", 32, 8, "1G"), ("hier", 32, 8, "1G"), ("sharp", 32, 8, "1G"), ("tree", 32, 8, "1G"),
         ("direct", 32, 8, "1G"), ("nvls", 8, 8, "256M")]


def unvalidated(algorithm: str, nodes: int, gpus: int, nbytes: int) -> Plan:
    """call_plan's plan for allreduce, its validation skipped (registry.validate stubbed, its cache emptied)."""
    config = preset("superpod-h100-nvlink", nodes=nodes, gpus=nodes * gpus)
    registry._kept.clear()
    kept = registry.validate
    registry.validate = lambda plan: plan  # type: ignore[assignment]  # the build phase alone
    try:
        plan, _ = catalog.call_plan("allreduce", algorithm, nodes, gpus, nbytes, config)
    finally:
        registry.validate = kept
        registry._kept.clear()
    return plan


def nothing(g: int, step: int, op: Op, message: Any) -> None:
    return None


def measure(algorithm: str, nodes: int, gpus: int, nbytes: int) -> dict[str, float]:
    gc.collect()
    t0 = time.process_time()
    plan = unvalidated(algorithm, nodes, gpus, nbytes)
    t1 = time.process_time()
    validate(plan)
    t2 = time.process_time()
    walk(plan, nothing)
    t3 = time.process_time()
    ops = sum(len(p.ops) for p in plan.programs)
    return {"build": t1 - t0, "validate": t2 - t1, "walk": t3 - t2, "ops": ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="algorithms, comma-separated (default: every case)")
    parser.add_argument("--size", default="", help="bytes of every case (default: the case's)")
    args = parser.parse_args()
    only = {a for a in args.only.split(",") if a}
    print(f"{'algorithm':10} {'grid':>6} {'bytes':>6} {'ops':>10} {'build s':>8} {'validate s':>10} {'walk s':>7}")
    for algorithm, nodes, gpus, size in CASES:
        if only and algorithm not in only:
            continue
        size = args.size or size
        row = measure(algorithm, nodes, gpus, parse_size(size))
        print(f"{algorithm:10} {f'{nodes}x{gpus}':>6} {size:>6} {int(row['ops']):>10,} {row['build']:8.2f} "
              f"{row['validate']:10.2f} {row['walk']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
