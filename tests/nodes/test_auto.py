"""Multi-rank, several nodes: `auto` runs the fastest algorithm. For a sweep of sizes on each multi-node
preset, every algorithm auto chooses among is emulated, and the one auto ran (its call's record) took the
least emulated time. Ties (emulated times within fabric.tuner.TIE, 1e-9 relative, of the least): auto runs
the first of them in its order (fabric.tuner.least, one rule for every collective), ALL2ALL's (direct, pxn)
for all2all, ALGORITHMS' (ring, direct, sharp, nvls, hier, hier_nvls, tree) for allreduce. A tie measured:
all2all of 4 MiB on 2 x 2 GPUs of superpod-h100-nvlink, direct and pxn 16204.8267 ns, equal but for the
last bits (no longer in the sweep). The candidates are fabric.tuner.allowed's: hier_nvls among them where
the leaves reduce."""

import numpy as np
import pytest

from nvlink_emu.fabric.tuner import ALL2ALL, TIE, allowed
from nvlink_emu.ranks.collectives import ALGORITHMS

from nodes_helpers import PRESETS, config, run

pytestmark = pytest.mark.mpi(min_size=7)

# bytes per GPU (S = this x GPUs), small to be quick: auto's choice changes inside the sweep (allreduce
# direct -> hier on 2 x 2 and 3 x 2 GPUs of the IB presets, sharp throughout on superpod-h100-nvlink; hier_nvls,
# emulated among the candidates on the H100 presets, loses to hier's rings with 2 GPUs a node: S + S/2 in the
# node against S; all2all direct -> pxn on 2 x 2 on IB)
PER_GPU = (256, 64 << 10, 256 << 10)
COLLECTIVES = ("allreduce", "all2all")


def candidates(collective: str, cfg) -> list[str]:
    """The algorithms auto chooses among for a call by every GPU of `cfg`."""
    if collective == "all2all":
        return list(ALL2ALL)
    return [name for name in allowed(cfg, cfg.nodes, collective) if hasattr(ALGORITHMS[name], collective)]


@pytest.mark.both_sizes  # the fastest algorithm changes with the node count and taper: auto's pick is shape-dependent
@pytest.mark.parametrize("base", PRESETS)
def test_auto_runs_the_fastest_emulated_algorithm(base):
    cfg = config(base)
    plan = [(c, per * cfg.gpus, a) for c in COLLECTIVES for per in PER_GPU for a in (*candidates(c, cfg), "auto")]

    def main(gpu):
        times = {}
        for collective, S, algorithm in plan:
            x = np.ones(S // 4, np.float32)
            gpu.world.barrier()  # every member starts at the latest clock, its links idle by then
            start = gpu.now_ns
            if collective == "allreduce":
                gpu.world.allreduce(x, algorithm=algorithm)
            else:
                gpu.world.all2all(x, np.empty_like(x), algorithm=algorithm)
            gpu.world.barrier()
            times[(collective, S, algorithm)] = gpu.now_ns - start
        return times

    result = run(main, base, timeout_s=120)
    if result.role != "gpu":
        return
    records = [r for r in result.report["collectives"][0] if r["collective"] in COLLECTIVES]
    assert len(records) == len(plan)
    ran = {key: record["algorithm"] for key, record in zip(plan, records) if key[2] == "auto"}
    times = result.value
    for (collective, S, _), algorithm in ran.items():
        emulated = {a: times[(collective, S, a)] for a in candidates(collective, cfg)}
        least = min(emulated.values())
        fastest = [a for a, t in emulated.items() if t <= least * (1 + TIE)]
        assert algorithm == fastest[0], (collective, S, emulated, algorithm)
        assert times[(collective, S, "auto")] == pytest.approx(least, rel=1e-9), (collective, S)
