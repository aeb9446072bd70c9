"""Multi-rank: plans (fabric.plans) run by ranks/collectives/plan.py with real data, against numpy and
the replay (modeled time equal exactly), and a member passing a different plan refused on every member."""

import dataclasses

import numpy as np
import pytest

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import CollectiveMismatch, UnsupportedOperation
from nvlink_emu.fabric.plans import catalog
from nvlink_emu.fabric.plans.format import Op
from nvlink_emu.fabric.topology import Topology

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)


def _data(rank, count):
    return np.random.default_rng(7 + rank).integers(-1000, 1000, count).astype(np.float64)


def msccl_ring(n: int) -> str:
    """An MSCCL-IR ring allreduce on n GPUs (tests/unit/plans/ring_allreduce_4.xml's shape): s, n-1 rrcs,
    n-2 rcs, r."""
    def step(s, kind, c):
        return (f'<step s="{s}" type="{kind}" srcbuf="i" srcoff="{c}" dstbuf="i" dstoff="{c}" cnt="1" '
                f'depid="-1" deps="-1" hasdep="0"/>')
    gpus_xml = []
    for p in range(n):
        kinds = [("s", (p - 1) % n)] + [("rrcs", (p - 1 - s) % n) for s in range(1, n)] + \
                [("rcs", (p - j) % n) for j in range(1, n - 1)] + [("r", (p + 1) % n)]
        steps = "".join(step(k, kind, c) for k, (kind, c) in enumerate(kinds))
        gpus_xml.append(f'<gpu id="{p}" i_chunks="{n}" o_chunks="0" s_chunks="0"><tb id="0" send="{(p + 1) % n}" '
                        f'recv="{(p - 1) % n}" chan="0">{steps}</tb></gpu>')
    return (f'<algo name="ring_{n}" nchannels="1" nchunksperloop="{n}" ngpus="{n}" coll="allreduce" inplace="1">'
            + "".join(gpus_xml) + "</algo>")


@pytest.mark.parametrize("source", ["msccl", "ring", "recursive_doubling"])
def test_a_plan_allreduces_real_data_in_the_replays_time(source):
    n = gpus()
    size = n if source != "recursive_doubling" else 1 << (n.bit_length() - 1)  # RD: the first 2^k members
    plan = plans.loads(msccl_ring(size)) if source == "msccl" else plans.build(source, size, "allreduce")
    count = 3 * 1024 + 5  # uneven chunks

    def main(gpu):
        comm = gpu.world.split(0 if gpu.rank < size else None)
        if comm is None:
            return None
        x = _data(gpu.rank, count)
        comm.barrier()  # every member starts at the same modeled time
        start = gpu.now_ns
        comm.allreduce(x, algorithm=plan)
        return x, max(comm.allgather_object(gpu.now_ns - start))

    result = run(main, base="dgx-h100")
    if result.role == "gpu" and result.value is not None:
        x, elapsed = result.value
        assert np.array_equal(x, sum(_data(r, count) for r in range(size)))  # small integers: exact in any order
        config = preset("dgx-h100", gpus=size)
        assert elapsed == plans.plan_ns(plan, Topology.single(config), count * 8, config, 8)


def test_members_passing_different_plans_all_fail():
    n = gpus()
    ring, other = plans.build("ring", n, "allreduce"), plans.loads(msccl_ring(n))

    def main(gpu):
        with pytest.raises(CollectiveMismatch, match="members called different collectives"):
            gpu.world.allreduce(np.ones(64), algorithm=other if gpu.rank == n - 1 else ring)
        return True

    run(main, base="dgx-h100")


@pytest.mark.both_sizes  # the leaf plan needs an even GPU count of at least 4 (the larger size, 8)
def test_a_plan_with_credits_or_other_leaves_is_refused_before_a_byte_moves():
    """Credits pace the registry's in-switch plans (sharp reduce); a plan a collective is given that sends more
    than a control box holds would leave its takers waiting out their deadline, so a given plan may hold none.
    A leaf plan (hier_nvls's) for another grouping of the members on leaves would send its in-switch operations
    to the wrong node groups. Both refused on every member, with the plan named (the review of issue 26)."""
    n = gpus()
    ring = plans.build("ring", n, "allreduce")
    first = dataclasses.replace(ring.programs[0], ops=(Op("credit"),) + ring.programs[0].ops)
    rest = [dataclasses.replace(p, ops=(Op("credit_wait", recv_from=0),) + p.ops) for p in ring.programs[1:]]
    credited = plans.validate(dataclasses.replace(ring, programs=(first, *rest)))  # a valid plan
    half = n // 2
    if n >= 4 and n % 2 == 0:  # two leaves of n / 2: not one node's
        config = preset("superpod-h100-nvlink", nodes=2, gpus=n)
        leaf, _ = catalog.call_plan("allreduce", "hier_nvls", 2, half, 4096, config)

    def main(gpu):
        with pytest.raises(UnsupportedOperation, match="holds credit operations"):
            gpu.world.allreduce(np.ones(64), algorithm=credited)
        if n >= 4 and n % 2 == 0:
            leaves = [list(range(half)), list(range(half, n))]
            with pytest.raises(UnsupportedOperation, match=rf"puts its GPUs on leaves {leaves}; ".replace("[", r"\[")
                               .replace("]", r"\]")):
                gpu.world.allreduce(np.ones(1024, np.float32), algorithm=leaf)
        x = np.ones(64)
        gpu.world.allreduce(x, algorithm=ring)  # the communicator still works
        assert (x == n).all()
        return True

    run(main, base="dgx-h100")
