"""Groups that span nodes, in one process: leaf SwitchLogics and SpineLogics passing each other their
Sends (fabric.switch, Spanning groups) - creation through every switch, the two-level reduction and its
combine order, chunk c to spine c mod P, the 128-group limit per switch, and the trust boundary (a
spine takes partials only from the group's leaves, a leaf only from its own members; a GPU can forge
neither a partial nor a result)."""

import numpy as np
import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import AccessViolation, ProtocolError
from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, McastInfo, Packet, ReduceInfo

from switch_helpers import Fabric, nvlink


def test_a_group_across_nodes_lives_in_every_switch_it_spans_and_reduces_in_two_levels():
    fabric = Fabric(nvlink(nodes=3, spines=2))
    members = (5, 0, 1, 4)  # rank order: node 2's GPU 5 first; node 1 not in the group
    gid = fabric.group(members)
    assert gid % 3 == 2  # created at the first member's leaf, whose index its id carries
    for k, switch in enumerate(fabric.switches):
        group = switch.groups.groups.get(gid)
        assert (group is not None) == (k != 1), k
    assert fabric.switches[0].groups.groups[gid].inputs == (0, 1)   # the node's members, rank order
    assert fabric.switches[2].groups.groups[gid].inputs == (5, 4)
    assert fabric.switches[3].groups.groups[gid].inputs == (0, 2)   # a spine: the leaves, node order
    rng = np.random.default_rng(3)
    data = {g: (rng.standard_normal(64) * 100).astype(np.float16) for g in members}
    for chunk in (0, 1):  # chunk c to spine c mod 2
        delivered = []
        for g in members:
            delivered += fabric.reduce(g, gid, (0, chunk), data[g], members, ("c", 0, chunk))
        assert sorted(send.port for send in delivered) == sorted(members)
        partials = [(frm, to, p) for frm, to, p in fabric.hops if p.kind is Kind.REDUCE]
        assert {(frm, to) for frm, to, _ in partials} == {(0, 3 + chunk), (2, 3 + chunk)}
        assert all(p.nbytes == 64 * 4 for _, _, p in partials)  # float16's partial: float32
        fabric.hops.clear()
        wide = {g: data[g].astype(np.float32) for g in members}
        want = ((wide[0] + wide[1]) + (wide[5] + wide[4])).astype(np.float16)  # node 0, then node 2
        for send in delivered:
            assert send.packet.kind is Kind.MCAST and send.packet.info == McastInfo(gid, ("c", 0, chunk))
            assert send.payload.view(np.float16).tobytes() == want.tobytes()
    spine = fabric.switches[3].counters.snapshot()
    assert spine["sw0->sw3"]["payload_bytes"] == spine["sw2->sw3"]["payload_bytes"] == 256
    assert spine["sw3->sw0"]["payload_bytes"] == spine["sw3->sw2"]["payload_bytes"] == 128
    # released by its creator leaf for every switch
    assert fabric.call(5, "release", gid) == {"group": gid}
    assert all(gid not in s.groups.groups for s in fabric.switches)


def test_avg_divides_once_by_every_member_at_the_spine():
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 1, 2, 3))
    x = {g: np.full(8, 10 + g, np.int32) for g in range(4)}
    got = []
    for g in range(4):
        got += fabric.reduce(g, gid, (0, 0), x[g], range(4), ("c", 0), op="avg")
    assert [s.payload.view(np.int32)[0] for s in got] == [(10 + 11 + 12 + 13) // 4] * 4


def test_the_group_limit_holds_per_switch_and_a_refused_create_is_undone_everywhere():
    fabric = Fabric(nvlink(spines=2))
    spine = fabric.switches[3]
    for k in range(spine.groups.limit):  # fill spine 3 alone: the others keep room
        spine.groups.create((0, 2), -1, f"other{k}", 0, group_id=1000 + k, inputs=(0, 1), stage="spine")
    before = [len(s.groups.groups) for s in fabric.switches]
    reply = fabric.call(0, "create", members=(0, 2), name="c")
    assert reply["error"] == "ResourceExhausted"
    assert "spine 3" in reply["message"] and "GPU 0" in reply["message"] and "128" in reply["message"]
    assert [len(s.groups.groups) for s in fabric.switches] == before  # leaf 0, leaf 1, spine 2: undone
    assert fabric.switches[0].refused[0] == 1


def test_a_spine_takes_partials_only_from_the_leaves_of_the_group_s_nodes():
    fabric = Fabric(nvlink(nodes=3, spines=1))
    gid = fabric.group((0, 2))  # nodes 0 and 1
    spine = fabric.switches[3]
    forged = Packet(Kind.REDUCE, -1, -1, 0, 16, info=ReduceInfo(gid, (0, 0), "sum", "float32", (0, 2), ("c", 0)))
    with pytest.raises(AccessViolation, match=rf"spine 3: partial REDUCE of group {gid} slot \[0, 0\] from leaf 2: "
                                              r"leaf 2 is no leaf of the group's nodes \[0, 1\]"):
        spine.on_switch(2, forged, np.zeros(16, np.uint8))
    with pytest.raises(AccessViolation, match="spine 3: partial REDUCE of group 999.*no live group 999"):
        spine.on_switch(0, forged.but(info=ReduceInfo(999, (0, 0), "sum", "float32", (0,), ("c", 0))),
                        np.zeros(16, np.uint8))


def test_a_leaf_takes_contributions_only_from_its_own_members_and_a_gpu_forges_no_partial_or_result():
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    fabric.hops.clear()
    leaf0 = fabric.switches[0]
    data = np.ones(4, np.float32)
    # GPU 1 is attached to leaf 0 but no member: refused there, nothing goes up
    (nack,) = fabric.reduce(1, gid, (0, 0), data, (0, 2), ("c", 0))
    assert nack.packet.kind is Kind.NACK and nack.port == 1
    assert nack.packet.info.error == "AccessViolation" and f"GPU 1: not a member of group {gid}" in nack.packet.info.message
    assert not fabric.hops
    # a member's multicast store reaches the members only, through the spine; so does a load-reduce's LOAD
    store = Packet(Kind.MCAST, 0, -1, 0, 16, info=McastInfo(gid, ("c", 9)))
    assert sorted(s.port for s in fabric.gpu(0, store, np.zeros(16, np.uint8))) == [0, 2]
    fabric.hops.clear()
    load = Packet(Kind.LOAD_REDUCE, 0, -1, 0, 16, info=LoadInfo(gid, (0, 0, 1, 1), "sum", "float32", (0,), ("c", 10),
                                                                 ("c", 11)))
    loads = fabric.gpu(0, load)  # nvls across nodes: LOADs to every member, node 1's through the spine
    assert sorted(s.port for s in loads) == [0, 2] and all(s.packet.kind is Kind.LOAD for s in loads)
    assert [(frm, to, p.kind) for frm, to, p in fabric.hops] == [(0, 2, Kind.LOAD_REDUCE), (2, 1, Kind.LOAD_REDUCE)]
    fabric.hops.clear()
    # a result a spine did not send for a partial this leaf sent up: a bug of a switch, never delivered
    result = Packet(Kind.MCAST, -1, -1, 0, 16, info=McastInfo(gid, ("c", 0)))
    with pytest.raises(ProtocolError, match=f"switch 0: a result of group {gid}.*for no partial this leaf sent"):
        leaf0.on_switch(2, result, np.zeros(16, np.uint8))
    # GPU 0's own contribution completes node 0's partial: it goes up, and only its result comes back
    assert fabric.reduce(0, gid, (0, 0), data, (0, 2), ("c", 0)) == []
    assert [(frm, to, p.kind) for frm, to, p in fabric.hops] == [(0, 2, Kind.REDUCE)]
    delivered = fabric.reduce(2, gid, (0, 0), data * 2, (0, 2), ("c", 0))
    assert sorted(s.port for s in delivered) == [0, 2]
    assert all(s.payload.view(np.float32).tolist() == [3.0] * 4 for s in delivered)


def test_a_spanning_group_s_lifecycle_calls_are_checked():
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    reply = fabric.call(2, "release", gid)  # a member at another leaf than the creator's
    assert reply["error"] == "AccessViolation" and "created at node 0's switch" in reply["message"]
    reply = fabric.call(1, "create", members=(0, 2), name="x")  # must include its caller
    assert reply["error"] == "FabricError" and "include it" in reply["message"]
    ib = Fabric(preset("superpod-h100-ib", nodes=2, gpus=4, spines=1))  # InfiniBand spines do not reduce
    reply = ib.call(0, "create", members=(0, 2), name="c")
    assert reply["error"] == "UnsupportedOperation" and "spine_sharp false" in reply["message"]


def test_a_leaf_keeps_its_partials_in_flight_within_its_share():
    fabric = Fabric(nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    gid = fabric.group((0, 2))
    leaf0 = fabric.switches[0]
    share = leaf0.partial_share_bytes  # 64 KiB / 2 nodes
    data = np.ones(1024, np.float32)  # 4 KiB: GPU 0 alone completes node 0's partial each time
    for c in range(share // data.nbytes):
        assert fabric.reduce(0, gid, (0, c), data, (0, 2), ("c", c)) == []
    (nack,) = fabric.reduce(0, gid, (0, 99), data, (0, 2), ("c", 99))
    assert nack.packet.info.error == "ResourceExhausted"
    assert "switch 0 has 32768 bytes of partition 0's partials" in nack.packet.info.message


def test_a_result_for_one_member_goes_down_to_its_leaf_only_and_the_others_get_a_notice():
    """reduce_scatter across nodes: slot (0, j, c)'s result for member j only. The spine sends the bytes
    down to member j's leaf alone, which copies them to member j alone; every other leaf of the group
    gets a "reduced" notice (a control packet: no bytes on its cable) that frees its partial's share. A
    notice for no partial the leaf sent is a switch's bug."""
    fabric = Fabric(nvlink(nodes=3, spines=1))
    members = (0, 1, 2, 4)
    gid = fabric.group(members)
    leaves = fabric.switches[:3]
    data = np.ones(8, np.float32)
    for g in members[:-1]:
        assert fabric.reduce(g, gid, (0, 3, 0), data, (4,), ("c", 0, 3, 0)) == []
    assert leaves[0].spanning._partial_parts[0] == 1 and leaves[1].spanning._partial_parts[0] == 1
    fabric.hops.clear()
    (delivered,) = fabric.reduce(4, gid, (0, 3, 0), data, (4,), ("c", 0, 3, 0))
    assert delivered.port == 4 and delivered.payload.view(np.float32).tolist() == [4.0] * 8
    kinds = sorted((frm, to, p.kind.name, p.payload_bytes) for frm, to, p in fabric.hops)
    assert kinds == [(2, 3, "REDUCE", 32), (3, 0, "GROUP", 0), (3, 1, "GROUP", 0), (3, 2, "MCAST", 32)]
    assert all(leaf.spanning._partial_parts[0] == 0 and leaf.spanning._partial_bytes[0] == 0 for leaf in leaves)
    assert "sw3->sw0" not in leaves[0].counters.snapshot()  # no bytes down to a leaf without the result
    with pytest.raises(ProtocolError, match="switch 0: spine 3 reduced slot .* for no partial this leaf sent"):
        leaves[0].on_switch(3, Packet(Kind.GROUP, -1, -1, req=3, info=GroupInfo("reduced", gid, (0, 3, 0), "")))
