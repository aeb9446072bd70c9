"""Multi-rank, several nodes: the emulated modeled time of every point-to-point algorithm (ring, direct,
all2all, hier, hier_nvls where the leaves reduce, pxn, tree) equals fabric.replay's (cost_nodes.modeled_ns),
on the three multi-node presets, for one chunk and for several (hier on the H100 presets: its node rings;
hier_nvls there: its node stages in the leaf)."""

import numpy as np
import pytest

from nodes_helpers import PRESETS, config, run
from nvlink_emu.fabric import cost_nodes, hier_plan, replay

pytestmark = pytest.mark.mpi(min_size=7)

CASES = [(c, a) for a, cs in replay.PROGRAMS.items() if a != "all2allv" for c in cs]


def call(gpu, collective: str, algorithm: str, nbytes: int) -> None:
    n = gpu.size
    x = np.ones(nbytes // 4, np.float32)
    if collective == "allreduce":
        gpu.world.allreduce(x, algorithm=algorithm)
    elif collective == "reduce_scatter":
        gpu.world.reduce_scatter(x, np.empty(x.size // n, np.float32), algorithm=algorithm)
    elif collective == "allgather":
        gpu.world.allgather(x[:x.size // n], np.empty(x.size // n * n, np.float32), algorithm=algorithm)
    elif collective == "all2all":
        gpu.world.all2all(x, np.empty_like(x), algorithm=algorithm)
    else:
        gpu.world.broadcast(x, 1, algorithm=algorithm)


@pytest.mark.both_sizes  # which flows meet on which leaf-spine link (2 spines vs 1) is the shape itself
@pytest.mark.parametrize("base", PRESETS)
def test_emulated_time_is_the_replayed_schedule_s(base):
    cfg = config(base, chunk_bytes=1 << 16)  # small chunks: several per block at a small size
    cases = [(c, a) for c, a in CASES if a != "hier_nvls" or hier_plan.in_leaf(cfg)]
    sizes = (cfg.gpus * 1024, cfg.gpus * (2 << 16) + cfg.gpus * 4096)  # one chunk a block; three, the last short

    def main(gpu):
        times = {}
        for collective, algorithm in cases:
            for nbytes in sizes:
                gpu.world.barrier()  # every member starts at the latest clock, its links idle by then
                start = gpu.now_ns
                call(gpu, collective, algorithm, nbytes)
                gpu.world.barrier()
                times[(collective, algorithm, nbytes)] = gpu.now_ns - start
        return times

    result = run(main, base, timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role == "gpu":
        for (collective, algorithm, nbytes), got in result.value.items():
            root = 1 if collective == "broadcast" else 0
            want = cost_nodes.modeled_ns(collective, algorithm, cfg.topology, nbytes, cfg, root=root)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-6), (collective, algorithm, nbytes)
