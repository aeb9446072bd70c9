"""An attacker's review of the notice "unserved" and the refusal of a second request of an
awaited slot, in one process: every switch of a two-node fabric driven directly (switch_helpers.py's
Fabric). The whole-run attacks are in tests/nodes/test_load_reduce_bounds.py."""

import pytest

from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, Packet

from switch_helpers import Fabric, nvlink


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
    answered, none refused (tests/nodes/test_load_reduce_bounds.py: 3,935 held in flight at once by the leaf of
    a GPU that sleeps). tests/unit/test_switch_cross_node_attack.py's refuser=0 case asserts this
    behaviour (that nothing is refused) and would change with a fix. Now leaf 1 keeps at most max_loads
    LOADs unanswered to GPU 2 - MAX_LOADS, 1,024, here: honest nvls keeps at most 4 x 2 (fabric.switch.
    honest_loads: 4 GPUs' least window, 2; a pair's is 64 KiB // 8 // 4 KiB = 2 too) - drops each request
    past that and tells leaf
    0 ("unserved"), and leaf 0 takes GPU 0's notices, each for a LOAD it sent GPU 0; nothing is refused."""
    from nvlink_emu.fabric.budget import honest_loads
    from nvlink_emu.fabric.switch import MAX_LOADS

    config = nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096)
    fabric = Fabric(config)
    leaf0 = fabric.switches[0]
    gid = fabric.group((0, 2))
    limit = leaf0.partial_share_parts
    assert limit == 2048 and honest_loads(config) == 8 and leaf0.max_loads == MAX_LOADS
    to_gpu2 = refused = 0
    for k in range(3 * limit):
        sends = _ask(fabric, gid, k)
        refused += sum(s.packet.kind is Kind.NACK for s in sends)
        to_gpu2 += sum(s.port == 2 and s.packet.kind is Kind.LOAD for s in sends)
        fabric.gpu(0, _unserved(gid, (k, 0, 0, 0)))
    leaf1 = fabric.switches[1]
    bound = leaf1.max_loads
    assert to_gpu2 == bound, f"leaf 1 sent GPU 2 {to_gpu2} LOADs it never answered ({refused} requests refused)"
    assert refused == 0 and leaf1.nvls._loaded_count[2] == leaf1.peak_loads == bound
    assert leaf1.dropped_loads == 3 * limit - bound and leaf0.nvls._loaded_count[0] == 0 and leaf0.nvls._asked == {}


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
    assert leaf0.nvls._asked_count == {0: 1, 1: 1}
    (nack,) = fabric.gpu(2, _unserved(g1, (0, 0, 0, 0)))
    assert nack.packet.kind is Kind.NACK and nack.packet.info.error == "AccessViolation"
    assert leaf1.refused[2] == 1 and leaf0.nvls._asked_count == {0: 1, 1: 1}
    assert fabric.gpu(2, _unserved(g0, (0, 0, 0, 0))) == []
    assert leaf0.nvls._asked_count == {0: 0, 1: 1} and (g1, ("b", 0, "r")) in leaf0.nvls._asked


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


def test_a_member_cannot_take_over_another_member_s_slot_on_one_switch():
    """GPU 1 asks for slot (0, 0, 0, 0) - nvls.py's slot of GPU 0's chunk 0 (seq, r, c, r + c) - under a key
    of its own, result to itself. Across nodes the leaf refused it already (the slot names its requester's
    rank second, test_cross_node_attack); on one switch it was taken (measured before: a LOAD with dest
    [1] to each of the 4 members), and a member that served it before GPU 0's LOAD of that slot arrived,
    or after GPU 1's overwrote it (both filed under the slot alone), sent GPU 1 its part of GPU 0's
    result; GPU 0's own load-reduce then waited for answers that never came (FabricTimeout). Now every
    program's slot names its requester's rank second (hier's node RS: hier_plan.leaf_slot) and the switch
    refuses one that does not, on one switch too: AccessViolation naming GPU 1, the group and the slot;
    no LOAD goes to anyone, and GPU 0's own request of the slot is taken after it."""
    from switch_helpers import only_nack

    sw, gid = _one_switch_group()
    info = LoadInfo(gid, (0, 0, 0, 0), "sum", "float32", (1,), ("w", "mine", 0), ("w", 0, "nvls-bound"))
    nack = only_nack(sw.on_packet(1, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 512, req=5, info=info)), 1, 5)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "LOAD_REDUCE"
    message = nack.info.message
    assert "GPU 1" in message and f"group {gid}" in message and "slot [0, 0, 0, 0]" in message and "rank 1" in message
    assert sw.violations == [0, 1, 0, 0]
    short = LoadInfo(gid, (0,), "sum", "float32", (1,), ("w", "mine", 1), ("w", 0, "nvls-bound"))  # names no one
    assert only_nack(sw.on_packet(1, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 512, req=6, info=short)), 1, 6).info.error \
        == "AccessViolation"
    own = LoadInfo(gid, (0, 0, 0, 0), "sum", "float32", (0,), ("w", 0, 4, 0), ("w", 0, "nvls-bound"))
    sends = sw.on_packet(0, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 512, req=7, info=own))
    assert sorted(s.port for s in sends if s.packet.kind is Kind.LOAD) == [0, 1, 2, 3]
    assert sw.violations == [0, 2, 0, 0]


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_hier_s_node_slots_name_their_requester_s_position_second(collective):
    """hier's node RS in the leaf (fabric.hier_plan, 2 nodes x 4 positions, 3 slices): each member's
    load-reduce slots (hier_plan.leaf_slot of its keys, after the call's seq) name its own position first,
    its serves every position's slots, each slot exactly once per requester - so the switch's rule
    (ingress.check_requester) takes every honest request, the node group's ranks being the positions."""
    from nvlink_emu.fabric import hier_plan

    N, G, count, chunk = 2, 4, 3 * 2 * 4 * 16, 16
    share = 2 * (G - 1) * N * G * 4 * 16  # P = 16 elements: 3 slices
    asked, served = {}, {}
    for j in range(G):
        for op in hier_plan.program(collective, N, G, 0, j, count, chunk, 4, None, None, share):
            if op[0] == "load_reduce":
                slot = hier_plan.leaf_slot(op[1])
                assert slot[0] == j and slot not in asked, (j, slot)
                asked[slot] = j
            elif op[0] == "serve":
                slot = hier_plan.leaf_slot(op[2])
                assert slot[0] == op[1]
                served.setdefault(j, []).append(slot)
    assert len({slot[2] for slot in asked}) == 3  # every slice
    assert all(sorted(slots) == sorted(asked) for slots in served.values()) and len(served) == G


def test_a_notice_of_no_load_stays_at_its_leaf():
    """Group (0, 2) on 2 nodes, one spine, no load-reduce asked: GPU 0 sends notices naming slots of GPU 2's
    (rank 1 second). Each goes to the spine and on to leaf 1 (measured: 2 hops each, 200 for 100
    notices), where it frees nothing; an honest member sends one notice per LOAD it was sent, and the
    whole-run flood (tests/nodes/test_load_reduce_bounds.py) piles thousands up at the relaying spine.
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


# -- the bound of LOADs unanswered per GPU (fabric.budget.honest_loads, SwitchLogic.max_loads) ---------------

def _windows(config):
    """n x the window each member of an nvls call of n GPUs in two or more nodes keeps (ranks/collectives:
    Call.in_switch_window with nvls.streams, run on a stand-in for the call), for every n and reduction
    dtype: the LOADs of that call a leaf may have sent one GPU unanswered."""
    from types import SimpleNamespace

    from nvlink_emu.fabric.reduction import DTYPES
    from nvlink_emu.ranks.collectives import Call, nvls

    for n in range(2, config.gpus + 1):
        for dtype in DTYPES.values():
            call = SimpleNamespace(gpu=SimpleNamespace(config=config), n=n, dtype=dtype, nodes=lambda: 2)
            yield n * Call.in_switch_window(call, nvls.streams(call, dtype), least=2,
                                            chunk_bytes=config.nvls_chunk_bytes)


@pytest.mark.parametrize("nodes, scale, want", [(2, 1, 128), (3, 1, 84), (2, 16, 2048), (3, 16, 1364), (4, 16, 1024)])
def test_the_bound_of_loads_unanswered_per_gpu_is_twice_what_honest_nvls_keeps_if_more(nodes, scale, want):
    """superpod-h100-nvlink, 8 GPUs a node, its switch buffer (64 MiB) times `scale`: honest_loads is the
    largest n x window of the ranks' own rule (_windows), window = share // (streams (n - 1)) // chunk,
    streams = 2 n ceil(nodes / (n - 1)) (float32; 16-bit floats twice, half the window), chunk 128 KiB:
    2 nodes, n = 2: 64 MiB // 8 // 128 KiB = 64, x 2 = 128 (= share / (2 x nodes x chunk); n = 3: 3 x 42);
    3 nodes, n = 2 (streams 12) or 4 (streams 8, 3 others): 2 x 42 = 4 x 21 = 84; 16x: 2 x 1,024 = 2,048 at
    2 nodes, 2 x 682 = 4 x 341 = 1,364 at 3, 2 x 512 = 1,024 at 4 (n = 3: 3 x 341 = 1,023; n = 5: 5 x 204
    = 1,020). The bound is max(MAX_LOADS, 2 x that): 1,024 on the preset; 4,096, 2,728 and 2,048 with 16x.
    One node has no spanning group (0). The same ratio of buffer to chunk (tests/nodes' WIDE, each 64x
    smaller) keeps the same windows."""
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.budget import honest_loads
    from nvlink_emu.fabric.switch import MAX_LOADS, SwitchLogic

    config = preset("superpod-h100-nvlink", nodes=nodes, gpus=8 * nodes, switch_buffer_bytes=scale * (64 << 20))
    assert honest_loads(config) == max(_windows(config)) == want
    assert SwitchLogic(config).max_loads == max(MAX_LOADS, 2 * want)
    small = preset("superpod-h100-nvlink", nodes=nodes, gpus=8 * nodes, switch_buffer_bytes=scale * (64 << 20) // 64,
                   nvls_chunk_bytes=(128 << 10) // 64, chunk_bytes=1 << 16)
    assert honest_loads(small) == want
    assert honest_loads(preset("dgx-h100", gpus=8)) == 0
