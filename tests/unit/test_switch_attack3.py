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


@pytest.mark.xfail(strict=True, reason="a requester's own notice 'unserved' frees its place in the budget while "
                                       "the LOAD it sent to the other node's member is unanswered")
def test_a_requester_s_own_refusals_keep_loads_to_the_other_node_within_the_budget():
    """2 nodes x 2 GPUs, one spine, group (0, 2). GPU 0 asks for slot (k, 0, 0, 0) and refuses its own
    LOAD of it at once (a bound member's notice, which the leaf takes: the requester is its own GPU),
    again and again; GPU 2 (node 1) neither serves nor refuses any. The budget of a partition's
    load-reduces at a leaf (partial_share_parts, 2,048 here) is what bounds the LOADs a leaf sends on
    to the other nodes (each costs a LOAD to every member), and leaf 1 takes whatever the spine passes
    down. Measured: every one of 3 x 2,048 requests was taken and leaf 1 sent GPU 2 6,144 LOADs, none
    answered, none refused (tests/nodes/test_attack3.py: 3,935 held in flight at once by the leaf of
    a GPU that sleeps). tests/unit/test_switch_cross_node_attack.py's refuser=0 case asserts this
    behaviour (that nothing is refused) and would change with a fix."""
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
    assert to_gpu2 <= limit, f"leaf 1 sent GPU 2 {to_gpu2} LOADs it never answered ({refused} requests refused)"


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
