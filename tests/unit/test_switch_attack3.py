"""An attacker's review (attack3) of the notice "unserved" and the refusal of a second request of an
awaited slot, in one process: every switch of a two-node fabric driven directly (test_switch_spanning's
Fabric). The whole-run attacks are in tests/nodes/test_attack3.py."""

import pytest

from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, Packet

from test_switch_spanning import Fabric, nvlink


def _unserved(gid, slot):
    """A member's notice that it will not serve the LOAD of `slot` (header-only, answered by nothing)."""
    return Packet(Kind.GROUP, 0, -1, req=9, info=GroupInfo("unserved", gid, tuple(slot), ""))


def _ask(fabric, gid, k, gpu=0, name="c"):
    """GPU `gpu`'s header-only LOAD_REDUCE of slot (k, 0, 0, 0) (its rank 0 second, as nvls.py's), 64
    bytes, result key (name, k, "r")."""
    info = LoadInfo(gid, (k, 0, 0, 0), "sum", "float32", (gpu,), (name, k, "r"), (name, "src"))
    return fabric.gpu(gpu, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info))


def test_a_requester_s_own_refusals_keep_loads_to_the_other_node_within_the_budget():
    """2 nodes x 2 GPUs, one spine, group (0, 2). GPU 0 asks for slot (k, 0, 0, 0) and refuses its own
    LOAD of it at once (a bound member's notice, which the leaf takes: the requester is its own GPU),
    again and again; GPU 2 (node 1) neither serves nor refuses any. The budget of a partition's
    load-reduces at a leaf (partial_share_parts, 2,048 here) is what bounds the LOADs a leaf sends on
    to the other nodes (each costs a LOAD to every member), and leaf 1 takes whatever the spine passes
    down. Measured: every one of 3 x 2,048 requests was taken and leaf 1 sent GPU 2 6,144 LOADs, none
    answered, none refused (tests/nodes/test_attack3.py: 3,935 held in flight at once by the leaf of
    a GPU that sleeps). tests/unit/test_switch_cross_node_attack.py's refuser=0 case asserts this
    behaviour (that nothing is refused) and would change with a fix. Now leaf 1 keeps at most MAX_LOADS
    (1,024) LOADs unanswered to GPU 2: it drops each request past that and tells leaf 0 ("unserved"), and
    leaf 0 takes GPU 0's notices, each for a LOAD it sent GPU 0; nothing is refused (no NACK)."""
    from nvlink_emu.fabric.switch import MAX_LOADS

    fabric = Fabric(nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    leaf0 = fabric.switches[0]
    gid = fabric.group((0, 2))
    limit = leaf0.partial_share_parts
    assert limit == 2048
    to_gpu2 = refused = 0
    for k in range(3 * limit):
        sends = _ask(fabric, gid, k)
        refused += sum(s.packet.kind is Kind.NACK for s in sends)
        to_gpu2 += sum(s.port == 2 and s.packet.kind is Kind.LOAD for s in sends)
        fabric.gpu(0, _unserved(gid, (k, 0, 0, 0)))
    assert to_gpu2 == MAX_LOADS, f"leaf 1 sent GPU 2 {to_gpu2} LOADs it never answered ({refused} requests refused)"
    leaf1 = fabric.switches[1]
    assert refused == 0 and leaf1._loaded_count[2] == leaf1.peak_loads == MAX_LOADS
    assert leaf1.dropped_loads == 3 * limit - MAX_LOADS and leaf0._loaded_count[0] == 0 and leaf0._asked == {}


def test_a_member_s_notice_frees_no_other_group_s_or_partition_s_request():
    """Two pairs, (0, 2) in partition 0 and (1, 3) in partition 1, each asking slot (0, 0, 0, 0) at leaf 0
    (GPUs 0 and 1). GPU 2, a bound member of the first group only, sends notices naming the second
    group's id and its own group with the other requester's slot: the first is refused (AccessViolation,
    a NACK, counted at leaf 1), the second frees only its own group's request; partition 1's entry stays
    until its result or release."""
    config = nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096, partitions=((0, 2), (1, 3)))
    fabric = Fabric(config)
    leaf0, leaf1 = fabric.switches[0], fabric.switches[1]
    g0, g1 = fabric.group((0, 2), "a"), fabric.group((1, 3), "b")
    for gpu, gid, name in ((0, g0, "a"), (1, g1, "b")):
        assert all(s.packet.kind is Kind.LOAD for s in _ask(fabric, gid, 0, gpu, name))
    assert leaf0._asked_count == {0: 1, 1: 1}
    (nack,) = fabric.gpu(2, _unserved(g1, (0, 0, 0, 0)))
    assert nack.packet.kind is Kind.NACK and nack.packet.info.error == "AccessViolation"
    assert leaf1.refused[2] == 1 and leaf0._asked_count == {0: 1, 1: 1}
    assert fabric.gpu(2, _unserved(g0, (0, 0, 0, 0))) == []
    assert leaf0._asked_count == {0: 0, 1: 1} and (g1, ("b", 0, "r")) in leaf0._asked


# -- one switch (a node's group: one node's communicators, hier's node groups in the leaf) ---------------

def _one_switch_group(members=(0, 1, 2, 3)):
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.switch import SwitchLogic
    from switch_helpers import ready_group

    sw = SwitchLogic(preset("dgx-h100", gpus=4))
    return sw, ready_group(sw, members, name="w")


def test_a_member_cannot_load_reduce_into_another_member_s_result_on_one_switch():
    """Found in this review: on one switch a LOAD_REDUCE's result could go to any members (info.dest), so
    GPU 1 could ask, under GPU 0's result key and slot, for a range of its choosing: the members file a
    slot's LOAD under the slot alone, and one that served GPU 1's LOAD (it overwrote GPU 0's, or came
    first) sent GPU 0, under the key GPU 0 waits for, the sum of another range of every member's buffer:
    GPU 0's result silently wrong. Measured before the fix: the switch took it and sent a LOAD with
    dest [0] to each of the 4 members. Every honest request names its requester alone (Call.load_reduce),
    as across nodes already: now refused, AccessViolation naming GPU 1 and the destinations."""
    from switch_helpers import only_nack

    sw, gid = _one_switch_group()
    info = LoadInfo(gid, (0, 0, 0, 0), "sum", "float32", (0,), ("w", 0, 4, 0), ("w", 0, "nvls-bound"))
    nack = only_nack(sw.on_packet(1, Packet(Kind.LOAD_REDUCE, 0, -1, 4096, 512, req=5, info=info)), 1, 5)
    assert nack.info.error == "AccessViolation" and "GPU 1" in nack.info.message and "[0]" in nack.info.message
    assert sw.violations == [0, 1, 0, 0]
    mine = LoadInfo(gid, (0, 1, 0, 1), "sum", "float32", (1,), ("w", 0, 4, 1), ("w", 0, "nvls-bound"))
    sends = sw.on_packet(1, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 512, req=6, info=mine))
    assert sorted(s.port for s in sends if s.packet.kind is Kind.LOAD) == [0, 1, 2, 3]


@pytest.mark.xfail(strict=True, reason="on one switch a LOAD_REDUCE's slot need not name its requester (hier's "
                                       "node RS slots do not: (seq, phase, slice, position, chunk)), so a member "
                                       "can ask another's slot first and the members serve its LOAD instead")
def test_a_member_cannot_take_over_another_member_s_slot_on_one_switch():
    """GPU 1 asks for slot (0, 0, 0, 0) - nvls.py's slot of GPU 0's chunk 0 (seq, r, c, r + c) - under a key
    of its own, result to itself. Across nodes the leaf refuses it (the slot names its requester's rank
    second, test_cross_node_attack); on one switch it is taken (measured: a LOAD with dest [1] to each
    of the 4 members), and a member that serves it before GPU 0's LOAD of that slot arrives, or after
    GPU 1's overwrote it (both filed under the slot alone), sends GPU 1 its part of GPU 0's result; GPU
    0's own load-reduce then waits for answers that never come (FabricTimeout). The fix needs every
    program's slots to name their requester where the switch can check it (hier's name the position
    third), or members to file and serve LOADs by (slot, requester)."""
    sw, gid = _one_switch_group()
    info = LoadInfo(gid, (0, 0, 0, 0), "sum", "float32", (1,), ("w", "mine", 0), ("w", 0, "nvls-bound"))
    sends = sw.on_packet(1, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 512, req=5, info=info))
    assert [s.packet.kind for s in sends] == [Kind.NACK], [s.port for s in sends]


def test_a_notice_of_no_load_stays_at_its_leaf():
    """Group (0, 2) on 2 nodes, one spine, no load-reduce asked: GPU 0 sends notices naming slots of GPU 2's
    (rank 1 second). Each goes to the spine and on to leaf 1 (measured: 2 hops each, 200 for 100
    notices), where it frees nothing; an honest member sends one notice per LOAD it was sent, and the
    whole-run flood (tests/nodes/test_attack3.py) piles thousands up at the relaying spine.
    tests/unit/test_switch_cross_node_attack.py asserts a notice for no request is relayed (its last
    lines) and would change with a fix. Now each is refused at leaf 0 (AccessViolation, a NACK, counted):
    it sent GPU 0 no LOAD of that slot."""
    fabric = Fabric(nvlink(spines=1))
    gid = fabric.group((0, 2))
    fabric.hops.clear()  # the group's creation
    for k in range(100):
        (nack,) = fabric.gpu(0, _unserved(gid, (k, 1, 0, 0)))
        assert nack.packet.kind is Kind.NACK and nack.packet.info.error == "AccessViolation"
        assert "no LOAD" in nack.packet.info.message and "GPU 0" in nack.packet.info.message
    assert fabric.hops == [], f"{len(fabric.hops)} hops between the switches for 100 notices of no LOAD"
    assert fabric.switches[0].refused[0] == 100
