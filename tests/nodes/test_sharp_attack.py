"""Multi-rank, several nodes: attacks on sharp's two-level allreduce (fabric.switch, Spanning groups) by
a member of the group, and its honest edge cases. Partition 0 is GPU 0 and the first GPU of the last
node (a tenant spanning nodes, one GPU of it in each of two nodes); partition 1, every other GPU, runs
sharp allreduces meanwhile and must see right results and no refusal. World size 8 has two spines,
10 one (and three nodes)."""

import dataclasses
import time

import numpy as np
import pytest

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricTimeout
from nvlink_emu.fabric.packets import Kind, McastInfo, Packet, ReduceInfo
from nvlink_emu.fabric.budget import buffer_share_bytes, port_share_bytes
from nvlink_emu.ranks.transport import Transport

from nodes_helpers import config, contribution, run, shape, two_level
from trust_helpers import refusals

pytestmark = pytest.mark.mpi(min_size=7)


def tenants() -> tuple[tuple[int, ...], tuple[int, ...]]:
    nodes, per_node, _ = shape()
    pair = (0, (nodes - 1) * per_node)
    return pair, tuple(g for g in range(nodes * per_node) if g not in pair)


def victims_run(gpu, calls: int = 2) -> None:
    """Partition 1's sharp allreduces, checked against the sum."""
    x = np.arange(3000, dtype=np.float32)
    for _ in range(calls):
        y = x * gpu.rank
        gpu.partition.allreduce(y, algorithm="sharp")
        assert np.array_equal(y, x * sum(tenants()[1]))


def test_a_member_that_lies_about_its_op_ends_nobody_s_run():
    """GPU 0 makes the same allreduce call as its partner (the call check passes) but sends its leaf
    every chunk as a max, the partner a sum. GPU 0 is alone in its node's part of the group, so its
    leaf's partial goes up; the spine meets two partials that disagree. Before: CollectiveMismatch
    raised in the spine's rank, which ended every tenant's run. Now both members' allreduce raises
    CollectiveMismatch naming the spine and the group; partition 1 is untouched."""
    pair, _ = tenants()

    def main(gpu):
        if gpu.rank not in pair:
            victims_run(gpu)
            return "victim"
        if gpu.rank == 0:
            honest = gpu.switch_request

            def lying(kind, info, *args, **kwargs):
                if kind is Kind.REDUCE:
                    info = dataclasses.replace(info, op="max")
                return honest(kind, info, *args, **kwargs)
            gpu.switch_request = lying
        x = np.ones(3000, np.float32)
        with pytest.raises(CollectiveMismatch, match=r"spine \d+: group \d+ slot .*leaf \d+ sent (max|sum)"):
            gpu.partition.allreduce(x, algorithm="sharp")
        return "refused"

    result = run(main, partitions=tenants(), chunk_bytes=4096)
    if result.role == "gpu":
        assert result.value == ("refused" if result.rank in tenants()[0] else "victim")
    assert all(result.report["ports"][g]["refused"] == 0 for g in range(len(result.report["ports"])))


def test_a_contribution_without_a_chunk_number_is_refused_and_ends_nobody_s_run():
    """GPU 0 sends its leaf a contribution to its spanning group with an empty slot (whose last entry
    picks the spine). Before: IndexError in the leaf's rank, which ended the run. Now a ProtocolError
    NACK to GPU 0 alone; the pair's next allreduce and partition 1's are right."""
    pair, _ = tenants()

    def main(gpu):
        if gpu.rank not in pair:
            victims_run(gpu)
            return "victim"
        comm = gpu.partition
        gid = comm.group_id()
        if gpu.rank == 0:
            data = np.ones(16, np.float32)
            gpu.switch_request(Kind.REDUCE, ReduceInfo(gid, (), "sum", "float32", pair, (comm.name, "x")), data)
            (error,) = refusals(gpu, 1)
            assert type(error).__name__ == "ProtocolError" and "slot [] names no chunk" in str(error)
        comm.barrier()
        y = np.ones(3000, np.float32)
        comm.allreduce(y, algorithm="sharp")
        assert np.all(y == 2)
        return "pair"

    report = run(main, partitions=tenants(), chunk_bytes=4096).report
    assert report["ports"][0]["refused"] == report["ports"][0]["malformed"] == 1
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, len(report["ports"])))


def test_a_group_released_with_partials_at_the_spines_gives_back_its_share():
    """GPU 2 (its partner) pushes its leaf partials for slots GPU 0 never sends, until its leaf refuses
    one (the partition's partials in flight fill buffer share / nodes); then the pair releases the
    group and runs a sharp allreduce as large as the share on a new one. Before: the released
    partials' bytes stayed counted at the partner's leaf, and every later sharp allreduce of the
    partition was refused (ResourceExhausted). Now the release frees them."""
    pair, _ = tenants()

    def main(gpu):
        if gpu.rank not in pair:
            victims_run(gpu)
            return "victim"
        comm = gpu.partition
        gid = comm.group_id()
        if gpu.rank == pair[1]:
            share = buffer_share_bytes(gpu.config) // gpu.config.nodes
            data = np.ones(1024, np.float32)
            for c in range(share // data.nbytes + 1):
                gpu.switch_request(Kind.REDUCE, ReduceInfo(gid, (99, c), "sum", "float32", pair, (comm.name, 99, c)),
                                   data)
            (error,) = refusals(gpu, 1)
            assert "ResourceExhausted" in type(error).__name__ and "partials" in str(error)
        comm.barrier()
        comm.release_group()
        x = np.ones(buffer_share_bytes(gpu.config) // gpu.config.nodes // 4, np.float32)
        for _ in range(2):
            y = x.copy()
            comm.allreduce(y, algorithm="sharp")
            assert np.all(y == 2)
        return "pair"

    result = run(main, partitions=tenants(), chunk_bytes=4096, switch_buffer_bytes=1 << 17)
    if result.role == "gpu":
        assert result.value == ("pair" if result.rank in tenants()[0] else "victim")


@pytest.mark.both_sizes  # 'uneven nodes' needs 3 nodes: at 2 the groups are even
def test_concurrent_groups_from_different_leaves_uneven_nodes_and_mixed_dtypes():
    """Honest edge cases at once: two communicators created at the same time at different leaves (one
    whose first member is in the last node), one of them spanning a subset of the nodes with uneven
    members per node, each running allreduces of another dtype and op concurrently, every chunk c to
    spine c mod P; bitwise equal to the two-level oracle."""
    nodes, per_node, _ = shape()
    subset = tuple(range(per_node)) + ((nodes - 1) * per_node,)  # node 0 whole, the last node's first GPU

    def main(gpu):
        inside = gpu.rank in subset
        comm = gpu.world.split(0 if inside else 1, key=gpu.rank if inside else -gpu.rank)
        members = [comm.members[r] for r in range(comm.size)]
        name, op = ("float16", "sum") if inside else ("int32", "max")
        want = two_level(members, per_node, name, op, 5000)
        for _ in range(2):
            x = contribution(gpu.rank, name, op, 5000)
            comm.allreduce(x, op=op, algorithm="sharp")
            assert x.tobytes() == want.tobytes(), (members, name)
        return members[0] // per_node

    result = run(main, chunk_bytes=4096)
    if result.role == "gpu":  # the outside communicator's first member is in the last node
        assert result.value == (0 if result.rank in subset else nodes - 1)


def test_a_member_failing_mid_allreduce_ends_its_partner_s_wait_with_a_typed_error():
    """The partner (GPU 2 on 8 ranks) raises after its second chunk is in its leaf. GPU 0's allreduce
    ends with FabricTimeout at the run's deadline (its results never come); partition 1's collectives
    and the end of the run are unaffected."""
    pair, _ = tenants()

    def main(gpu):
        if gpu.rank not in pair:
            victims_run(gpu)
            return "victim"
        if gpu.rank == pair[1]:
            honest, sent = gpu.switch_request, []

            def failing(kind, *args, **kwargs):
                if kind is Kind.REDUCE and len(sent) == 2:
                    raise RuntimeError("GPU failed mid-collective")
                sent.append(kind)
                return honest(kind, *args, **kwargs)
            gpu.switch_request = failing
            with pytest.raises(RuntimeError, match="mid-collective"):
                gpu.partition.allreduce(np.ones(8192, np.float32), algorithm="sharp")
            return "failed"
        with pytest.raises(FabricTimeout):
            gpu.partition.allreduce(np.ones(8192, np.float32), algorithm="sharp")
        return "timed out"

    result = run(main, partitions=tenants(), chunk_bytes=4096, timeout_s=4.0)
    if result.role == "gpu":
        assert result.value == {0: "timed out", pair[1]: "failed"}.get(result.rank, "victim")


def test_a_member_s_stores_reach_members_only_and_a_member_that_stops_receiving_costs_the_other_leaf_its_credit(
        monkeypatch):
    """Multicast stores across nodes (sharp allgather's and broadcast's). GPU 0 stores through the pair's
    group: with a non-member's dst (the copies still go to the members only), then 64 x 64 KiB while
    its partner sleeps - its leaf holds GPU 0's stores once they took the partner's credit (the port's
    share over the other nodes), so the partner's leaf never keeps more than its port's share in flight
    to it, and every store arrives once it receives again. It sends a store with the partner's src
    straight to every spine and to the partner's leaf, as a leaf would (dropped unread), and, after the
    pair released its group, a store of that group (refused: no live group). Partition 1's sharp
    allgathers are right, and none of its packets was refused."""
    from mpi4py import MPI  # the leaf's figure reaches every rank (after the run), so the test fails alike

    nodes, per_node, spines = shape()
    pair, victims = tenants()
    partner, stores, size = pair[1], 64, 1 << 16
    peak = [0]
    keep = Transport._keep

    def counted(self, dest, requests, buffers):
        out = keep(self, dest, requests, buffers)
        if dest == partner:  # what this rank keeps in flight to the partner (its leaf is the rank that matters)
            peak[0] = max(peak[0], self.pending_bytes_to[dest])
        return out

    monkeypatch.setattr(Transport, "_keep", counted)

    def main(gpu):
        raw = gpu.raw_port()
        n = gpu.config.gpus
        if gpu.rank not in pair:
            comm = gpu.partition
            recv = np.empty(3000 * comm.size, np.float32)
            for _ in range(2):
                comm.allgather(np.full(3000, gpu.rank, np.float32), recv, algorithm="sharp")
                assert np.array_equal(recv, np.repeat(np.array(victims, np.float32), 3000))
            assert not [slot for slot in raw.mailbox if "forged" in slot[0]]
            return "victim"
        comm = gpu.partition
        gid = comm.group_id()
        keys = [(comm.name, "forged", c) for c in range(stores + 1)]
        outs = [np.empty(size, np.uint8) for _ in keys]
        for key, out in zip(keys, outs):
            gpu.post_receive(key, out, None, gid)
        comm.barrier()
        if gpu.rank == 0:
            data = np.full(size, 7, np.uint8)
            forged = Packet(Kind.MCAST, raw.addresses[0], raw.addresses[victims[0]], 0, size, info=McastInfo(gid, keys[0]))
            raw.send(forged, data)
            for key in keys[1:]:
                gpu.switch_request(Kind.MCAST, McastInfo(gid, key), data)
            spine_bound = Packet(Kind.MCAST, raw.addresses[partner], -1, 0, size, info=McastInfo(gid, (comm.name, "x", 0)))
            for rank in [n + k for k in range(nodes, nodes + spines)] + [n + partner // per_node]:
                raw.transport.send(rank, spine_bound, data)
        else:
            time.sleep(2.0)  # receives nothing meanwhile
        for key in keys:
            gpu.wait_receive(key, None, "the pair's stores", gid)
        assert all((out == 7).all() for out in outs)
        assert not [slot for slot in raw.mailbox if slot[0][1] == "x"]
        comm.barrier()
        comm.release_group()
        if gpu.rank == 0:
            gpu.switch_request(Kind.MCAST, McastInfo(gid, (comm.name, "late", 0)), np.ones(16, np.uint8))
            (error,) = refusals(gpu, 1)
            assert type(error).__name__ == "AccessViolation" and f"no live group {gid}" in str(error)
        return "pair"

    result = run(main, partitions=tenants(), chunk_bytes=4096, switch_buffer_bytes=1 << 22, timeout_s=60)
    if result.role == "gpu":
        assert result.value == ("pair" if result.rank in pair else "victim")
    most = MPI.COMM_WORLD.allreduce(peak[0], MPI.MAX)
    assert most <= max(port_share_bytes(config(switch_buffer_bytes=1 << 22)), size), \
        f"the partner's leaf held {most} bytes in flight to it"
    assert result.report["ports"][0]["refused"] == 1
    assert all(result.report["ports"][g]["refused"] == 0 for g in range(1, len(result.report["ports"])))
