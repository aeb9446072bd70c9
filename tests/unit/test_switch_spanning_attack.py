"""Attacks on groups that span nodes, in one process (the leaf and spine SwitchLogics of
tests/unit/test_switch_spanning.py passing each other their Sends): what a member's packets can make
a leaf or a spine do. Every switch must keep serving: a SwitchLogic or SpineLogic that raises here
ends the switch rank, and with it everyone's run (ranks/switch/: switches trust each other)."""

import numpy as np
import pytest

from nvlink_emu.fabric.errors import AccessViolation, ProtocolError
from nvlink_emu.fabric.packets import GroupInfo, Kind, McastInfo, Packet, ReduceInfo

from switch_helpers import Fabric, nvlink


def _push(fabric, g, gid, slot, data, dest, key, op="sum"):
    """GPU g's REDUCE to its leaf: (the leaf, its sends), not passed on (to pass them later: a slow cable)."""
    info = ReduceInfo(gid, tuple(slot), op, data.dtype.name, tuple(dest), tuple(key))
    payload = data.view(np.uint8).ravel()
    leaf = g // fabric.config.gpus_per_node
    return leaf, fabric.switches[leaf].on_packet(
        g, Packet(Kind.REDUCE, 0, -1, 0, payload.nbytes, info=info, t_start=0.0, t_end=0.0), payload)


@pytest.mark.parametrize("what", ["count", "op", "dtype", "key", "dest", "replay"])
def test_partials_that_disagree_are_refused_to_every_member_and_the_spine_keeps_serving(what):
    """Node 1's members (GPU 2 and 3; one hostile GPU alone in a node does the same) send slot (0, 0)
    otherwise than node 0's: another count, op, dtype of the same width, result key or destinations -
    or node 1 replays the slot under a new key while its partial waits at the spine. Each leaf's
    check passes (its own members agree); the spine's meets two partials that disagree. It raised
    CollectiveMismatch out of SpineLogic.on_switch, which ends the spine's rank and everyone's run;
    now each member of the group gets a NACK (CollectiveMismatch naming the spine, the group and the
    slot; once until the group's release) and the spine goes on reducing the group's other slots."""
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 1, 2, 3))
    x = np.ones(8, np.float32)
    for g in (0, 1):
        assert fabric.reduce(g, gid, (0, 0), x, range(4), ("c", 0)) == []
    change = {"count": dict(data=np.ones(16, np.float32)), "op": dict(op="max"),
              "dtype": dict(data=np.ones(8, np.int32)), "key": dict(key=("c", 9)),
              "dest": dict(dest=(2, 3)), "replay": dict(key=("c", 5))}[what]
    args = dict(data=x, dest=range(4), key=("c", 0), op="sum") | change
    # replay: node 0's members send slot (0, 0) again under a new key while its partial waits at the spine
    senders, leaf = ((0, 1), 0) if what == "replay" else ((2, 3), 1)
    sent = [fabric.flow(*_push(fabric, g, gid, (0, 0), args["data"], args["dest"], args["key"], args["op"]))
            for g in senders]
    assert sent[0] == []
    nacks = sent[-1]
    assert sorted(s.port for s in nacks) == [0, 1, 2, 3]
    for send in nacks:
        assert send.packet.kind is Kind.NACK
        assert send.packet.info.error == "CollectiveMismatch"
        assert f"spine 2: group {gid} slot [0, 0]" in send.packet.info.message
        assert f"leaf {leaf} sent" in send.packet.info.message
    assert all(s.refused == [0] * 4 for s in fabric.switches[:2])  # no GPU's packet was refused: the two nodes' calls disagree
    # another refused slot of the group: the members know already (one NACK until the group's release)
    for g in (0, 1):
        fabric.reduce(g, gid, (2, 0), x, range(4), ("c", 20))
    assert fabric.reduce(2, gid, (2, 0), x, range(4), ("c", 20), op="max") == []
    assert fabric.reduce(3, gid, (2, 0), x, range(4), ("c", 20), op="max") == []
    # the spine serves the group's next slot as before
    got = []
    for g in range(4):
        got += fabric.reduce(g, gid, (1, 0), x * (g + 1), range(4), ("c", 10))
    assert sorted(s.port for s in got) == [0, 1, 2, 3]
    assert all(s.payload.view(np.float32).tolist() == [10.0] * 8 for s in got)


def test_a_slot_without_a_chunk_number_is_refused_at_the_leaf():
    """A member's REDUCE of a spanning group with an empty slot: slot[-1] picks the spine. It raised
    IndexError in the leaf (not a FabricError: the leaf's rank ended); now a typed refusal."""
    fabric = Fabric(nvlink(spines=2))
    gid = fabric.group((0, 2))
    (nack,) = fabric.reduce(0, gid, (), np.ones(4, np.float32), (0, 2), ("c", 0))
    assert nack.packet.kind is Kind.NACK and nack.port == 0
    assert nack.packet.info.error == "ProtocolError"
    assert f"group {gid} spans nodes" in nack.packet.info.message and "slot []" in nack.packet.info.message
    assert fabric.switches[0].refused[0] == 1


def test_a_release_racing_a_partial_and_a_result_ends_no_switch_and_leaks_no_share():
    """GPU 0 (node 0, the creator's leaf) releases the group while node 1's partial of slot (0, 0) is
    still on its cable to the spine and node 1's partial of slot (0, 1) has its result on the way down.
    The spine raised AccessViolation for the late partial ('a bug of a leaf', ending its rank), and
    node 1's leaf kept both partials' bytes as its partition's partials in flight forever (its share,
    buffer share / nodes, then refuses every later sharp allreduce of the partition). Now the late
    partial and the late result of a released group are dropped, and its partials' bytes are freed."""
    fabric = Fabric(nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    gid = fabric.group((0, 2))
    leaf1, spine = fabric.switches[1], fabric.switches[2]
    x = np.ones(1024, np.float32)
    # slot (0, 1): both partials reach the spine, its result is held back on the way down to node 1
    assert fabric.reduce(0, gid, (0, 1), x, (0, 2), ("c", 1)) == []
    _, up = _push(fabric, 2, gid, (0, 1), x, (0, 2), ("c", 1))
    (down,) = [s for s in spine.on_switch(1, up[0].packet, up[0].payload) if s.switch == 1]
    # slot (0, 0): node 1's partial leaves its leaf and is held back on the cable
    _, late = _push(fabric, 2, gid, (0, 0), x, (0, 2), ("c", 0))
    assert leaf1.spanning._partial_bytes[0] == 2 * x.nbytes and leaf1.spanning._partial_parts[0] == 2
    assert fabric.call(0, "release", gid) == {"group": gid}
    assert leaf1.spanning._partial_bytes[0] == leaf1.spanning._partial_parts[0] == 0 and not leaf1.spanning._partials
    assert spine.on_switch(1, late[0].packet, late[0].payload) == []
    assert leaf1.on_switch(2, down.packet, down.payload) == []
    # the partition's share is whole: a new group moves as many partials in flight as the first could
    gid2 = fabric.group((0, 2))
    share = leaf1.partial_share_bytes
    for c in range(share // x.nbytes):
        assert fabric.reduce(2, gid2, (0, c), x, (0, 2), ("c", c)) == []
    # a result for a live group and a partial for a group never created stay a switch's bug
    with pytest.raises(ProtocolError, match="for no partial this leaf sent"):
        leaf1.on_switch(2, Packet(Kind.MCAST, -1, -1, 0, 16, info=McastInfo(gid2, ("c", 99))), np.zeros(16, np.uint8))
    with pytest.raises(AccessViolation, match="no live group 998"):
        spine.on_switch(0, late[0].packet.but(info=ReduceInfo(998, (0, 0), "sum", "float32", (0,), ("c", 0))),
                        late[0].payload)


def test_a_refusal_from_the_spine_for_a_released_group_reaches_nobody():
    """The spine's refusal of a slot can cross the group's release on the way down: nothing to NACK."""
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    assert fabric.call(0, "release", gid) == {"group": gid}
    failed = Packet(Kind.GROUP, -1, -1, req=2, info=GroupInfo("failed", gid, (), "CollectiveMismatch: late"))
    assert fabric.switches[1].on_switch(2, failed) == []


def test_zero_byte_partials_in_flight_are_bounded_in_number():
    """GPU 0, alone in its node's part of the group, sends zero-byte contributions to ever new slots
    that GPU 2 never sends: each completes node 0's partial at once and goes up to wait at the spine.
    The leaf bounded its partials in flight in bytes only (`held and held + 0 > share` never holds):
    20,000 of them were held by the leaf (its table of partials awaiting a result) and by the spine
    (20,000 reductions) without a refusal. Now their number is bounded too, by the partition's share
    of held contributions / nodes, as one switch bounds held contributions (held_parts_share)."""
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    leaf0, spine = fabric.switches[0], fabric.switches[2]
    assert leaf0.partial_share_parts == leaf0.held_parts_share // 2  # 2 nodes
    most = leaf0.partial_share_parts = 64  # the same rule at a smaller share: a fast test
    empty = np.zeros(0, np.float32)
    for c in range(most):
        assert fabric.reduce(0, gid, (0, c), empty, (0, 2), ("c", c)) == []
    (nack,) = fabric.reduce(0, gid, (0, most), empty, (0, 2), ("c", most))
    assert nack.packet.info.error == "ResourceExhausted"
    assert f"switch 0 has {most} of partition 0's partials" in nack.packet.info.message
    assert len(leaf0.spanning._partials) == len(spine.groups.reductions) == most
    # a result coming back gives one back: GPU 2's slot 0 completes at the spine
    assert sorted(s.port for s in fabric.reduce(2, gid, (0, 0), empty, (0, 2), ("c", 0))) == [0, 2]
    assert fabric.reduce(0, gid, (1, 0), empty, (0, 2), ("c", "next")) == []


def test_a_refused_create_of_a_large_group_is_answered_in_a_header_that_decodes():
    """2 nodes x 800 GPUs, partition 0's share of groups full at leaf 1 (its own groups: any member can
    fill it). GPU 0 creates a group of all 1,600: leaf 1 refuses it, and its answer carried the whole
    message, which lists the members (8,624 characters): past a string field's 4,096, so the spine
    (and the creator's leaf) could not decode a switch's packet, which ends the run. Now the answer is
    cut to MAX_TEXT, every switch-to-switch header of the create decodes, and GPU 0 gets
    ResourceExhausted naming leaf 1."""
    fabric = Fabric(nvlink(nodes=2, per_node=800, spines=1))
    leaf1 = fabric.switches[1]
    members = tuple(range(1600))
    for k in range(leaf1.group_share):
        leaf1.groups.create(members, 800, f"x{k}", 0)
    reply = fabric.call(0, "create", members=members, name="c")
    assert reply["error"] == "ResourceExhausted" and "switch 1: cannot hold group" in reply["message"]
    answers = [p for _, _, p in fabric.hops if p.kind is Kind.GROUP and p.info.action == "refused"]
    assert len(answers) == 2  # leaf 1 -> the spine -> leaf 0
    for packet in (p for _, _, p in fabric.hops):
        assert Packet.from_wire(packet.to_wire()) == packet
    assert all(len(s.groups.groups) == n for s, n in zip(fabric.switches, (0, leaf1.group_share, 0)))


def test_two_groups_of_the_same_members_share_their_uplink_share():
    """GPU 0 and 2 in two groups; each pushes one 64 KiB chunk of each group at t = 0. Node 0's two
    partials cross the same share of its uplink to the spine: the second must end a chunk's time
    after the first, not with it. Found in review: a leaf's up clock was per (group, spine), so two
    spanning groups of the same members each took the members' whole share at once; now each member's
    part of a partial takes that member's share (U / (G P), shared by all its groups and its multicast
    stores), booked in its packet order (fabric.replay replays the same clocks)."""
    fabric = Fabric(nvlink(spines=1))
    g1, g2 = fabric.group((0, 2), "a"), fabric.group((0, 2), "b")
    data = np.ones(16384, np.float32)
    ends = []
    for gid, name in ((g1, "a"), (g2, "b")):
        _, (up,) = _push(fabric, 0, gid, (0, 0), data, (0, 2), (name, 0))
        ends.append(up.packet.t_end)
    share = fabric.switches[0].topology.share_gbytes_per_s  # GB/s = bytes/ns, the group's m x U / (G P), m = 1
    assert ends[1] - ends[0] >= data.nbytes / share * 0.99, ends


def _store(g, gid, key, nbytes=16):
    return Packet(Kind.MCAST, 0, -1, 0, nbytes, info=McastInfo(gid, tuple(key)), t_start=0.0, t_end=0.0)


def test_a_store_goes_only_to_members_and_each_switch_takes_one_only_from_where_it_may_come():
    """Multicast stores across nodes (fabric.switch, Spanning groups). Group (0, 2) spans nodes 0 and 1 of
    three: a member's store reaches GPUs 0 and 2 and no other, whatever dst it names, through spine
    (p + c) mod P; a key without a chunk number is refused at the leaf. A spine takes a store only from
    a leaf of the group's nodes and for a member in that leaf's node; a leaf only for a group that spans
    it, from a member of another node (anything else is a switch's bug: AccessViolation at a spine,
    ProtocolError at a leaf, which end the run)."""
    fabric = Fabric(nvlink(nodes=3, spines=2))
    gid = fabric.group((0, 2))
    leaf0, leaf1, leaf2, spine3 = fabric.switches[:4]
    data = np.arange(16, dtype=np.uint8)
    for c in range(2):
        forged = _store(0, gid, ("c", 0, c)).but(dst=leaf0.route_key(1))  # dst: a non-member (ignored)
        fabric.hops.clear()
        sends = fabric.gpu(0, forged, data)
        assert sorted(s.port for s in sends) == [0, 2] and all(s.payload.tolist() == data.tolist() for s in sends)
        assert [(frm, to) for frm, to, _ in fabric.hops] == [(0, 3 + c), (3 + c, 1)]  # member 0, chunk c: spine c
    (nack,) = fabric.gpu(0, _store(0, gid, ("c", 0, "x")), data)
    assert nack.packet.info.error == "ProtocolError" and "not a chunk number" in nack.packet.info.message
    up = lambda g: Packet(Kind.MCAST, leaf0.route_key(g), -1, 0, 16, info=McastInfo(gid, ("c", 1, 0)))
    with pytest.raises(AccessViolation, match="spine 3: .*leaf 2 is no leaf of the group's nodes"):
        spine3.on_switch(2, up(4), data)
    for g in (2, 1):  # a member of another node's, a non-member of this node's
        with pytest.raises(AccessViolation, match="spine 3: .*not a member of the group in node 0"):
            spine3.on_switch(0, up(g), data)
    with pytest.raises(ProtocolError, match="switch 2: a store of group .*no group spanning this leaf"):
        leaf2.on_switch(3, up(0), data)
    with pytest.raises(ProtocolError, match="switch 1: a store .*not a member of another node"):
        leaf1.on_switch(3, up(2), data)
    assert all(s.refused == [0] * 6 for s in fabric.switches[:3] if s is not leaf0)


def test_a_store_crossing_its_group_s_release_is_dropped_and_a_later_one_refused():
    """A store on its way up when its group is released is dropped at the spine, one on its way down at
    the leaf (whose members it was for stay known, so that ranks/switch returns the credit it took);
    a member's store after the release is refused at its leaf (AccessViolation: no live group)."""
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    leaf0, leaf1, spine = fabric.switches
    data = np.ones(16, np.uint8)
    *local, up = leaf0.on_packet(0, _store(0, gid, ("c", 0, 0)), data)
    assert [s.port for s in local] == [0] and up.switch == 2
    (down,) = spine.on_switch(0, up.packet, up.payload)  # a second store, held on its way down
    *_, up2 = leaf0.on_packet(0, _store(0, gid, ("c", 0, 1)), data)
    assert fabric.call(0, "release", gid) == {"group": gid}
    assert spine.on_switch(0, up2.packet, up2.payload) == [] and spine.late_stores == 1
    assert leaf1.on_switch(2, down.packet, down.payload) == []
    assert leaf1.store_targets(gid) == (2,)
    (nack,) = fabric.gpu(0, _store(0, gid, ("c", 0, 2)), data)
    assert nack.packet.info.error == "AccessViolation" and f"no live group {gid}" in nack.packet.info.message
