"""Multi-rank, several nodes: an attacker's review of the notice "unserved" (a member that will not serve
a LOAD gives its request's place in the budget of load-reduces back), the spine's per-member down shares
and hier's node groups in the leaf. Partition 0 is GPU 0 and the first GPU of the last node (one GPU of
the tenant in each of two nodes), every other GPU is partition 1. The attacks shown in one process are
in tests/unit/test_switch_unserved_notices.py."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, Packet

from nodes_helpers import config, peak_in_flight, run, shape
from trust_helpers import Flag

pytestmark = pytest.mark.mpi(min_size=7)


def _tenants():
    nodes, per_node, _ = shape()
    pair = (0, (nodes - 1) * per_node)
    return pair, tuple(g for g in range(nodes * per_node) if g not in pair)


SMALL = dict(switch_buffer_bytes=4 << 20, chunk_bytes=1 << 20)  # partial_share_parts 2,048 (2 nodes), 1,365 (3)


@pytest.mark.parametrize("notices,overrides", [
    pytest.param(True, SMALL, id="own-notices"),
    pytest.param(False, {}, id="default-budget"),
    pytest.param(False, SMALL, id="small-budget")])
def test_load_reduces_do_not_pile_loads_up_at_another_node_s_leaf(monkeypatch, notices, overrides):
    """GPU 0 sends 4,000 header-only LOAD_REDUCEs of its pair's group (slot (k, 0, 0, 0), its rank second,
    as an honest one), each followed (own-notices) by its own notice "unserved" of that slot (it is a
    bound member, and the leaf sends it a LOAD of every slot: a refusal it may make), while its partner
    on the last node sleeps. Every request its leaf takes goes on through a spine to the partner's leaf,
    which takes whatever a spine passes down and sends the partner a LOAD. The bound the project holds a
    leaf to for a GPU that does not read (test_nodes_trust: 2 x 1,024 sends in flight) holds only while
    the leaf's budget of the partition's load-reduces (partial_share_parts) is at most that, and the
    notice frees a place at once (the requester's leaf is GPU 0's), so nothing is ever refused.
    Measured: own-notices, the partner's leaf kept 3,935 LOADs in flight to it at once (8 ranks; 3,564 at
    10; 2,936 of 3,000 requests: it grows with them), none refused; default-budget, 3,936 (none refused:
    the budget is 16,384); small-budget, the requests past the budget are refused (ResourceExhausted) and
    the bound holds. The smallest fix is not one line: a notice should free the requester's place only
    once every member's LOAD of the slot is accounted for (served or refused, each leaf telling the
    requester's), and a leaf should bound the LOADs it keeps unanswered per local GPU (answering the
    rest with "unserved" itself), which would also bound the default budget's. Now a leaf keeps at most
    max_loads LOADs unanswered to a local GPU of a spanning group - MAX_LOADS, 1,024, with these configs,
    whose honest nvls keeps at most 64 at 2 nodes, 42 at 3 (fabric.budget.honest_loads; 4 and 8 with
    SMALL) - and drops a request past it, telling the requester's leaf ("unserved"), and takes a member's
    notice only for a LOAD it sent that member unanswered: in all three cases GPU 0's own leaf (GPU 0 answers none of its LOADs) and the
    partner's stop at 1,024, and none is refused (the budget, 2,048 or 1,365, is never reached)."""
    from nvlink_emu.fabric.switch import SwitchLogic
    from nvlink_emu.ranks.switch.queues import MAX_UNREAD

    pair, _ = _tenants()
    partner, count = pair[1], 4000
    most = peak_in_flight(monkeypatch, partner)

    def main(gpu):
        raw = gpu.raw_port()
        gid = gpu.partition.group_id() if gpu.rank in pair else None
        flooded = Flag(gpu)
        gpu.world.barrier()
        leaf = SwitchLogic(gpu.config, 0)
        refused, budget = [], leaf.partial_share_parts
        # requests past the budget: ResourceExhausted, unless GPU 0's own max_loads unanswered LOADs (it
        # answers none) come first: its leaf drops the later ones silently, as a member's refusal would
        expected = 0 if notices or budget >= leaf.max_loads else max(0, count - budget)
        if gpu.rank == 0:
            name, key = gpu.partition.name, raw.addresses[0]
            for k in range(count):
                slot = (k, 0, 0, 0)
                info = LoadInfo(gid, slot, "sum", "float32", (0,), (name, "flood", k), (name, "src"))
                raw.send(Packet(Kind.LOAD_REDUCE, key, -1, 0, 64, req=k + 1, info=info))  # counted on its uplink
                if notices:
                    raw.transport.send(raw.switch, Packet(Kind.GROUP, key, -1,
                                                            info=GroupInfo("unserved", gid, slot, "")))
                gpu.poll()  # its own LOADs come back: read (filed), so that its leaf reads it on
                if k % 256 == 255:
                    raw.loads.clear()
            deadline = time.monotonic() + 10
            held, since = -1, time.monotonic()
            while time.monotonic() < deadline:  # every refusal back, and GPU 0's sends all taken by its leaf
                gpu.poll()                  # or the rest held there (none taken for 0.5 s)
                if raw.transport.in_flight != held:
                    held, since = raw.transport.in_flight, time.monotonic()
                if len(raw.refusals) >= expected and (not held or time.monotonic() - since > 0.5):
                    break
            flooded.raise_()  # the partner's leaf decided every request it got without the partner reading
            while (raw.transport.in_flight or len(raw.refusals) < expected) and \
                    time.monotonic() < deadline:
                gpu.poll()
            raw.loads.clear()
            refused = [type(e).__name__ for e in raw.refusals]
            raw.refusals.clear()
        if gpu.rank == partner:
            flooded.wait(gpu, "GPU 0's flood")  # receives nothing meanwhile
        gpu.world.barrier()
        if gpu.rank == partner:
            gpu.poll()
            raw.loads.clear()
        return gpu.world.allgather_object((refused, expected))[0]

    result = run(main, partitions=_tenants(), timeout_s=30.0, **overrides)
    if result.role == "gpu":
        refused, expected = result.value
        assert refused == ["ResourceExhausted"] * expected, (len(refused), expected, refused[:1])
    peak = most()
    assert peak <= 2 * MAX_UNREAD, f"the partner's leaf kept {peak} LOADs in flight to it"


def test_load_reduces_of_a_group_in_one_leaf_do_not_pile_loads_up_at_it(monkeypatch):
    """hier's node groups (comm.node_group_id) and every communicator within one node make a group in one
    leaf, which keeps no budget of load-reduces (fabric.switch: one switch keeps none). Partition 0 is
    GPUs 0 and 1 (node 0, one leaf), its communicator's group in that leaf; GPU 0 sends 4,000 header-only
    LOAD_REDUCEs of it (slot (k, 0)), reading the LOADs of its own, while GPU 1 sleeps. Already bounded:
    the leaf stops reading GPU 0 while a port its traffic goes to has more than MAX_UNREAD sends in
    flight, so it kept at most 1,025 LOADs in flight to GPU 1 (measured, 8 ranks), none refused; the
    requests wait at GPU 0. (Across nodes the other leaf cannot hold a spine back: the test above.)"""
    from nvlink_emu.ranks.switch.queues import MAX_UNREAD

    tenant = (0, 1)
    others = tuple(g for g in range(gpus_of_shape()) if g not in tenant)
    count, most = 4000, peak_in_flight(monkeypatch, 1)

    def main(gpu):
        raw = gpu.raw_port()
        gid = gpu.partition.group_id() if gpu.rank in tenant else None
        flooded = Flag(gpu)
        gpu.world.barrier()
        refused = []
        if gpu.rank == 0:
            name, key = gpu.partition.name, raw.addresses[0]
            for k in range(count):
                info = LoadInfo(gid, (k, 0), "sum", "float32", (0,), (name, "flood", k), (name, "src"))
                raw.send(Packet(Kind.LOAD_REDUCE, key, -1, 0, 64, req=k + 1, info=info))  # counted on its uplink
                gpu.poll()  # its own LOADs come back: read (filed), so that its leaf reads it on
                if k % 256 == 255:
                    raw.loads.clear()
            flooded.raise_()  # the rest waits at GPU 0 (its leaf stopped reading it) until GPU 1 receives
            deadline = time.monotonic() + 10
            while raw.transport.in_flight and time.monotonic() < deadline:
                gpu.poll()
            raw.loads.clear()
            refused = [type(e).__name__ for e in raw.refusals]
            raw.refusals.clear()
        if gpu.rank == 1:
            flooded.wait(gpu, "GPU 0's flood")  # receives nothing meanwhile
        gpu.world.barrier()
        if gpu.rank == 1:
            gpu.poll()
            raw.loads.clear()
        return gpu.world.allgather_object(refused)[0]

    result = run(main, partitions=(tenant, others), timeout_s=30.0)
    if result.role == "gpu":
        assert result.value == [], result.value[:1]
    peak = most()
    assert peak <= 2 * MAX_UNREAD, f"GPU 1's leaf kept {peak} LOADs in flight to it"


def gpus_of_shape() -> int:
    nodes, per_node, _ = shape()
    return nodes * per_node


def test_notices_unserved_of_no_load_do_not_cross_the_switches(monkeypatch):
    """The pair's two GPUs (one on node 0, one on the last node), bound members of their group, each send
    4,000 notices "unserved" naming a slot of the other's (slot (k, r, 0, 0), r the other's rank), though
    no LOAD was ever sent: each is taken (a bound member's), goes from its leaf to spine 0 (slot[-1] = 0)
    and on to the other's leaf, where it frees nothing. Nothing answers a notice, so the sender's port
    never has answers unread (what stops the switch reading a GPU), and no credit bounds a switch's
    packets to another switch: the relaying spine keeps whatever it cannot send yet, and every tenant's
    traffic from that spine to that leaf waits behind it (one queue per destination). Measured: every
    notice reached a spine (8,000 of 8,000); with 20,000 each, spine 0 kept 4,950, 8,568 and 5,290
    sends in flight to a leaf at once (8 ranks, three runs; 3,088 at 10), against the 2 x 1,024 a leaf
    may keep to a GPU. An honest member sends one notice per LOAD it was sent. The smallest fix: a leaf
    takes a member's notice only for a LOAD it sent that member and has not seen answered (per port and
    slot), so that notices are bounded by LOADs, which the budget bounds. Now so: each is refused at its
    leaf (AccessViolation: a NACK to its sender, counted) and none reaches a spine."""
    from nvlink_emu.fabric.switch import SpineLogic

    pair, others = _tenants()
    relayed, on_switch = [0], SpineLogic.on_switch

    def counting(self, leaf, packet, payload=None):
        if packet.kind is Kind.GROUP and packet.info.action == "unserved":
            relayed[0] += 1
        return on_switch(self, leaf, packet, payload)

    monkeypatch.setattr(SpineLogic, "on_switch", counting)

    def main(gpu):
        raw = gpu.raw_port()
        gid = gpu.partition.group_id() if gpu.rank in pair else None
        gpu.world.barrier()
        if gpu.rank in pair:
            other, key = 1 - gpu.partition.rank, raw.addresses[gpu.rank]
            for k in range(4000):
                notice = GroupInfo("unserved", gid, (k, other, 0, 0), "")
                raw.transport.send(raw.switch, Packet(Kind.GROUP, key, -1, info=notice))
                if k % 64 == 0:
                    gpu.poll()
            deadline = time.monotonic() + 20
            while (raw.transport.in_flight or len(raw.refusals) < 4000) and time.monotonic() < deadline:
                gpu.poll()
            refused = [type(e).__name__ for e in raw.refusals]
            raw.refusals.clear()
            return True, refused
        return False, []

    result = run(main, partitions=(pair, others), timeout_s=60.0)
    total = MPI.COMM_WORLD.allreduce(relayed[0], MPI.SUM)
    refused = sum(len(v) for v in MPI.COMM_WORLD.allgather(result.value[1] if result.role == "gpu" else []))
    assert total == 0, f"spines relayed {total} notices of no LOAD ({refused} refused at the leaves)"
    assert refused == 2 * 4000, refused
    if result.role == "gpu" and result.value[0]:
        assert result.value[1] == ["AccessViolation"] * 4000, (len(result.value[1]), result.value[1][:1])


# the ratio of a switch buffer 16 times the preset's (1 GiB) to the preset NVLS chunk (128 KiB), both 64 times
# smaller, so that the windows are as many chunks and the data 64 times less (fabric.budget.honest_loads: the same)
WIDE = dict(switch_buffer_bytes=16 * (64 << 20) // 64, nvls_chunk_bytes=(128 << 10) // 64)


def test_honest_nvls_and_hier_run_unrefused_with_a_16x_switch_buffer(monkeypatch):
    """Honest nvls keeps up to n x its window of LOADs unanswered to a GPU at its leaf (fabric.switch.
    honest_loads: about buffer share / (2 x nodes x nvls chunk)), which a fixed bound of 1,024 caps at 8 x
    the presets' share / chunk: with a 16x buffer (here its ratio, WIDE) a pair of GPUs in two nodes keeps
    up to 2 x 1,024 at 2 nodes (2 x 682 at 3), the world of 4 GPUs 4 x 341 (6 x 136 at 3 nodes). Each leaf
    now bounds it at max(1,024, 2 x honest_loads). The pair's nvls reduce_scatter (640 chunks a block, all
    in flight at once: up to 2 x 640 LOADs to each), the world's nvls allreduce and reduce_scatter (32
    chunks a block) and hier_nvls's (hier's node stages in the leaf: one leaf's group, whose LOADs the leaf does not
    count) run exact, nothing refused or dropped, and a leaf held more than 1,024 LOADs unanswered to one
    GPU at once, at most honest_loads. Measured: 1,276 at 8 and at 10 ranks; with the fixed bound (honest_loads taken as
    0) the run failed both times, a member of the pair waiting to its deadline for a result its request
    of chunk 385 (8 ranks; 388 at 10) never got, the other for that request's LOAD (FabricTimeout)."""
    from nvlink_emu.fabric.reduction import blocks
    from nvlink_emu.fabric.budget import honest_loads
    from nvlink_emu.fabric.switch import MAX_LOADS, SwitchLogic

    pair, _ = _tenants()
    logics, init = [], SwitchLogic.__init__

    def kept(self, *args, **kwargs):  # the switch rank's leaf logic, to read its peak after the run
        init(self, *args, **kwargs)
        logics.append(self)

    monkeypatch.setattr(SwitchLogic, "__init__", kept)

    def exact(comm, collective, count, algorithm):
        def data(rank):
            return np.random.default_rng(rank).integers(-1000, 1000, count).astype(np.int32)
        x, want = data(comm.rank), sum(data(r) for r in range(comm.size))  # int32: exact in any order
        if collective == "allreduce":
            comm.allreduce(x, algorithm=algorithm)
            return bool(np.array_equal(x, want))
        a, b = blocks(count, comm.size)[comm.rank]
        out = np.empty(b - a, np.int32)
        comm.reduce_scatter(x, out, algorithm=algorithm)
        return bool(np.array_equal(out, want[a:b]))

    def main(gpu):
        chunk, n = gpu.config.nvls_chunk_bytes // 4, gpu.world.size  # int32 elements a chunk
        sub = gpu.world.split(0 if gpu.rank in pair else 1)
        ok = [exact(sub, "reduce_scatter", 2 * 640 * chunk, "nvls")] if gpu.rank in pair else []
        for collective in ("allreduce", "reduce_scatter"):
            ok.append(exact(gpu.world, collective, n * 32 * chunk, "nvls"))
            ok.append(exact(gpu.world, collective, n * 4096, "hier_nvls"))
        return all(ok)

    result = run(main, timeout_s=60.0, **WIDE)
    if result.role == "gpu":
        assert result.value
    assert all(port["refused"] == 0 for port in result.report["ports"].values())
    leaves = [logic for logic in logics if logic.config.switch_buffer_bytes == WIDE["switch_buffer_bytes"]]
    peak = MPI.COMM_WORLD.allreduce(max((logic.peak_loads for logic in leaves), default=0), MPI.MAX)
    dropped = MPI.COMM_WORLD.allreduce(sum(logic.dropped_loads for logic in leaves), MPI.SUM)
    bound = honest_loads(config(**WIDE))
    assert dropped == 0 and MAX_LOADS < peak <= bound, (peak, dropped, bound)
