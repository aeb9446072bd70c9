"""Multi-rank, several nodes: an attacker's review of in-switch collectives across nodes (issue 11). A
member of a tenant spanning nodes sends what it likes; what it must not do is measured in a whole run.
Partition 0 is GPU 0 and the first GPU of the last node (one GPU of the tenant in each of two nodes);
partition 1, every other GPU, runs nvls reduce_scatters meanwhile and must see exact results. World size
8 has two spines, 10 one (and three nodes). The attacks shown in one process are in
tests/unit/test_switch_cross_node_attack.py."""

import dataclasses
import time

import numpy as np
import pytest

from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.packets import Kind
from nvlink_emu.ranks.collectives import blocks

from nodes_helpers import run, shape

pytestmark = pytest.mark.mpi(min_size=7)
TIMEOUT_S = 3.0  # the run's deadline of a wait, s


def _tenants():
    nodes, per_node, _ = shape()
    pair = (0, (nodes - 1) * per_node)
    return pair, tuple(g for g in range(nodes * per_node) if g not in pair)


def _exact(gpu, comm, count=5000):
    """comm's nvls reduce_scatter of count float32 elements, each GPU contributing (rank + 1) x arange;
    raises AssertionError if its block is not the sum."""
    lo, hi = blocks(count, comm.size)[comm.rank]
    out = np.empty(hi - lo, np.float32)
    comm.reduce_scatter(np.arange(count, dtype=np.float32) * (gpu.rank + 1), out, algorithm="nvls")
    members = [comm.members[r] for r in range(comm.size)]
    assert np.array_equal(out, np.arange(lo, hi, dtype=np.float32) * sum(m + 1 for m in members))


def test_a_member_cannot_take_over_its_partner_s_load_reduce():
    """GPU 0 enters the pair's nvls reduce_scatter; before its first request it waits for the LOAD of its
    partner's first slot (block 1, chunk 0) to reach it, then sends a LOAD_REDUCE of that slot, range and
    buffer under a key of its own, then goes on honestly. Its request goes up before its honest one, on
    the same path. Found by the attacker's review (8 and 10 ranks): every member filed the hostile LOAD
    before it served that slot, GPU 0 was sent the partner's reduced chunk (its report's unconsumed
    slots), and both pair members' reduce_scatters ended in FabricTimeout after the run's 3 s deadline;
    partition 1 was exact. Now a slot names its requester, and GPU 0's leaf refuses the request."""
    pair, victims = _tenants()

    def main(gpu):
        raw = gpu.raw_port()
        comm = gpu.partition
        seen = "exact"
        meet = time.monotonic() + 4 * TIMEOUT_S  # every rank serves on until then: the pair's waits run out first
        if gpu.rank in victims:
            for _ in range(2):
                _exact(gpu, comm)
        else:
            if gpu.rank == 0:
                honest, done = gpu.switch_request, []

                def hostile(kind, info, payload=None, address=0, nbytes=None, **kwargs):
                    if kind is Kind.LOAD_REDUCE and not done:
                        done.append(True)
                        deadline = time.monotonic() + 10
                        while not any(slot[1:3] == (1, 0) for _, _, slot in raw.loads):
                            assert time.monotonic() < deadline, "the partner's LOAD did not come"
                            gpu.poll()
                        (load, _), = [v for (_, _, slot), v in raw.loads.items() if slot[1:3] == (1, 0)]
                        mine = dataclasses.replace(load.info, dest=(0,), key=(comm.name, "hostile", *load.info.slot))
                        honest(Kind.LOAD_REDUCE, mine, None, load.address, load.nbytes,
                               stamp=gpu.reserve_uplink(0, gpu.now_ns))
                        end = time.monotonic() + 1.0  # a refusal, if the leaf refuses it (taken, not raised)
                        while time.monotonic() < end and not raw.refusals:
                            gpu.poll()
                        raw.refusals.clear()
                    return honest(kind, info, payload, address, nbytes, **kwargs)
                gpu.switch_request = hostile
            try:
                _exact(gpu, comm)
            except FabricError as exc:
                seen = type(exc).__name__
        while time.monotonic() < meet:
            gpu.poll()
            time.sleep(1e-3)
        return gpu.world.allgather_object((gpu.rank, seen))

    result = run(main, partitions=_tenants(), chunk_bytes=1024, timeout_s=TIMEOUT_S)
    # every rank (switches too) sees it in the report: the partner's reduced chunk went to GPU 0, unread
    taken = [k for k in result.report["unconsumed"].get(0, []) if "hostile" in k]
    assert not taken, f"GPU 0 was sent the result of its partner's slot {taken[0][2:-1]}"
    if result.role == "gpu":
        seen = dict(result.value)
        assert all(seen[g] == "exact" for g in victims), seen  # the other tenant: untouched either way
        assert seen[pair[1]] == "exact", f"the partner's reduce_scatter: {seen[pair[1]]}"
