"""Multi-rank: plans (fabric.plans) run by ranks/collectives/plan.py with real data, against numpy and
the replay (modeled time equal exactly), and a member passing a different plan refused on every member."""

from pathlib import Path

import numpy as np
import pytest

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import CollectiveMismatch
from nvlink_emu.fabric.topology import Topology

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=5)

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "plans"


def _data(rank, count):
    return np.random.default_rng(7 + rank).integers(-1000, 1000, count).astype(np.float64)


@pytest.mark.parametrize("source", ["ring_allreduce_4.xml", "recursive_doubling"])
def test_a_plan_allreduces_real_data_in_the_replays_time(source):
    if gpus() != 4:
        pytest.fail(f"this test needs 4 GPUs (mpiexec -n 5), has {gpus()}")
    plan = plans.load(FIXTURES / source) if source.endswith(".xml") else plans.build(source, 4, "allreduce")
    count = 3 * 1024 + 5  # uneven chunks

    def main(gpu):
        x = _data(gpu.rank, count)
        gpu.world.barrier()  # every member starts at the same modeled time
        start = gpu.now_ns
        gpu.world.allreduce(x, algorithm=plan)
        return x, max(gpu.world.allgather_object(gpu.now_ns - start))

    result = run(main, base="dgx-h100")
    if result.role == "gpu":
        x, elapsed = result.value
        want = sum(_data(r, count) for r in range(4))  # small integers: exact in any order
        assert np.array_equal(x, want)
        config = preset("dgx-h100", gpus=4)
        assert elapsed == plans.plan_ns(plan, Topology.single(config), count * 8, config, 8)


def test_members_passing_different_plans_all_fail():
    if gpus() != 4:
        pytest.fail(f"this test needs 4 GPUs (mpiexec -n 5), has {gpus()}")
    ring, rd = plans.build("ring", 4, "allreduce"), plans.build("recursive_doubling", 4, "allreduce")

    def main(gpu):
        with pytest.raises(CollectiveMismatch, match="members called different collectives"):
            gpu.world.allreduce(np.ones(64), algorithm=rd if gpu.rank == 2 else ring)
        return True

    run(main, base="dgx-h100")
