"""An attacker's review of the multi-node trust boundary, in one process: every switch of a
fabric driven directly, each packet between switches delivered in an order MPI allows (it keeps each
sender's order, nothing between senders). A SwitchLogic or SpineLogic that raises ends its switch rank
and with it every tenant's run (ranks/switch/: the switches trust each other). The whole-run attacks
are in tests/nodes/test_junk_messages_at_the_leaf.py."""

import time

import numpy as np
import pytest

from nvlink_emu.fabric.packets import Kind, LoadInfo, McastInfo, Packet

from switch_helpers import Intake, Switches, group_packet, nvlink
from nvlink_emu.fabric.switch import SwitchLogic


def _spread_to_one_leaf():
    """3 nodes x 2 GPUs, 2 spines (switches 3 and 4; 3 the first, which relays the leaves' answers). GPU 0
    creates group (0, 2, 4) - a member in each node - and every spine takes it; each spine sends its span
    on to leaves 1 and 2 (phase 2); leaf 1 reads spine 3's at once, spine 4's not yet, leaf 2 neither.
    Returns (switches, gid, the spans still on their way)."""
    fabric = Switches(nvlink(nodes=3, spines=2))
    leaf0 = fabric.switches[0]
    pending = [(0, s) for s in leaf0.on_packet(0, group_packet("create", members=(0, 2, 4), name="c"))]
    gid = pending[0][1].packet.info.group
    late = lambda frm, send: send.packet.info.action == "span" and (send.switch == 2 or frm == 4)
    held, to_gpus = fabric.flow(pending, hold=late)
    assert to_gpus == [] and sorted((frm, s.switch) for frm, s in held) == [(3, 2), (4, 1), (4, 2)]
    assert gid in fabric.switches[1].groups.groups and gid not in fabric.switches[2].groups.groups
    assert all(gid in fabric.switches[s].groups.groups for s in (3, 4))
    return fabric, gid, held


@pytest.mark.parametrize("kind", [Kind.LOAD_REDUCE, Kind.MCAST], ids=["load-reduce", "store"])
def test_a_member_cannot_reach_a_leaf_before_the_group_s_span_does(kind):
    """Found in this review (the two-phase create, test_switch_cross_node_attack, closed the race between
    spines only). Leaf 1 took the span of group (0, 2, 4) from spine 3; GPU 2, a member there, bound it
    at once (its id, k x nodes + 0, it can guess; an honest member binds only after the create is
    answered, once every leaf took it) - accepted, its leaf's copy had its one local member bound - and
    sent a packet that goes up to spine 4: a load-reduce of slot (0, 1, 0, 1) (rank 1 second, chunk 1:
    spine (r + c) mod P = 4), or a store of key chunk 0 (spine (p + c) mod P, p = 1). Spine 4 holds the
    group (phase 1) and passes it to leaves 0 and 2; leaf 2 read it before spine 3's span (two senders:
    MPI orders nothing between them; a flood through spine 3 to node 2 keeps the span behind it).
    Before: leaf 2 raised ProtocolError ("LOAD_REDUCE of group 3 from spine 4, which spans no nodes of
    this leaf"; "a store of group 3 from spine 4 ...: no group spanning this leaf"), a switch's bug to
    every tenant, whose run ended. Needs 3 nodes and 2 spines (on 2 nodes the only other leaf is the
    creator's, which holds the group from the start; with 1 spine its span comes first). After (the
    attacker's fix, spanning.Spanning._span_in): every spine sends its span to the other leaves, and a leaf
    lets members bind, and answers the create, only once every spine's span reached it. So GPU 2's bind
    is refused (AccessViolation) while spine 4's span is still on its way to leaf 1; once it came, what
    GPU 2 sends through spine 4 reaches leaf 2 after spine 4's span (MPI's order per sender), which made
    leaf 2's copy: the load-reduce finds no member bound there (the notice "unserved" back, as for any
    request that waits for no one), the store no member to copy to; nothing raises, and leaf 2 answers
    once spine 3's span comes too, its members binding only then."""
    fabric, gid, held = _spread_to_one_leaf()
    leaf1, leaf2 = fabric.switches[1], fabric.switches[2]
    (early,) = leaf1.on_packet(2, group_packet("bind", gid))
    assert early.packet.info.get("error") == "AccessViolation", early.packet.info
    assert "not created yet" in early.packet.info["message"]
    spine4_to_1 = next(h for h in held if h[0] == 4 and h[1].switch == 1)
    answers, _ = fabric.flow([spine4_to_1])  # leaf 1 now has both spans: it answers, through spine 3
    assert answers == []
    (bound,) = leaf1.on_packet(2, group_packet("bind", gid))
    assert bound.packet.info == {"group": gid}, bound.packet.info
    if kind is Kind.LOAD_REDUCE:
        info = LoadInfo(gid, (0, 1, 0, 1), "sum", "float32", (2,), ("c", "r", 1), ("c", "src"))
        packet, payload = Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info), None
    else:
        payload = np.ones(16, np.float32).view(np.uint8)
        packet = Packet(Kind.MCAST, 0, -1, 0, payload.nbytes, info=McastInfo(gid, ("c", 0)))
    ups = [s for s in leaf1.on_packet(2, packet, payload) if s.switch is not None]
    assert [s.switch for s in ups] == [4]
    to_leaves = fabric.send(1, ups[0])
    assert sorted(node for _, s in to_leaves for node in [s.switch]) == [0, 2]
    on_to_2 = next(s for _, s in to_leaves if s.switch == 2)
    spine4_to_2 = next(h for h in held if h[0] == 4 and h[1].switch == 2)
    assert fabric.send(*spine4_to_2) == []  # spine 4's span first (its order): leaf 2's copy, no answer yet
    got = leaf2.on_switch(4, on_to_2.packet, on_to_2.payload)  # raised ProtocolError before
    if kind is Kind.LOAD_REDUCE:
        assert [(s.switch, s.packet.info.action) for s in got] == [(4, "unserved")]
    else:
        assert got == []
    (refused,) = leaf2.on_packet(4, group_packet("bind", gid))  # spine 3's span is still to come
    assert refused.packet.info.get("error") == "AccessViolation", refused.packet.info
    spine3_to_2 = next(h for h in held if h[0] == 3 and h[1].switch == 2)
    _, to_gpus = fabric.flow([spine3_to_2])
    assert [(s.port, s.packet.info) for s in to_gpus] == [(0, {"group": gid})]  # the create's answer
    (bound,) = leaf2.on_packet(4, group_packet("bind", gid))
    assert bound.packet.info == {"group": gid}, bound.packet.info
    assert all(gid in s.groups.groups for s in fabric.switches)
    assert sum(s.malformed[g] for s in fabric.switches[:3] for g in range(6)) == 0


def test_a_leaf_that_refuses_a_span_answers_once_and_drops_the_later_spans():
    """The refusal path of the fix above: leaf 2 holds partition 0's share of groups, so it refuses
    group (0, 2, 4) at the first span it reads (spine 3's) and answers at once; leaf 1 answers once both
    spans came, and the creator undoes the group (its "unspan" through spine 3, to leaves 1 and 2);
    spine 4's span, read by leaf 2 only after that (two senders: any order), is dropped, not taken as a
    new copy nor as a switch's bug. GPU 0 hears ResourceExhausted naming switch 2, no switch holds the
    group, GPU 2's bind is refused."""
    fabric = Switches(nvlink(nodes=3, spines=2))
    leaf2 = fabric.switches[2]
    for k in range(leaf2.group_share):
        leaf2.groups.create((4, 5), 4, f"x{k}", 0)
    pending = [(0, s) for s in fabric.switches[0].on_packet(0, group_packet("create", members=(0, 2, 4), name="c"))]
    gid = pending[0][1].packet.info.group
    held, to_gpus = fabric.flow(pending, hold=lambda frm, send: frm == 4 and send.switch == 2
                                                           and send.packet.info.action == "span")
    (reply,) = to_gpus
    assert reply.port == 0 and reply.packet.info["error"] == "ResourceExhausted", reply.packet.info
    assert "switch 2: cannot hold group" in reply.packet.info["message"]
    assert len(held) == 1
    assert fabric.flow(held) == ([], [])  # spine 4's span, after the undo: dropped
    assert all(gid not in s.groups.groups for s in fabric.switches)
    assert all(not s.spanning._spans_due for s in fabric.switches[:3])
    (bind,) = fabric.switches[1].on_packet(2, group_packet("bind", gid))
    assert bind.packet.info.get("error") == "AccessViolation", bind.packet.info


class _CountingDict(dict):
    """A dict that counts the keys its iterations yield (a scan of it)."""

    scanned = 0

    def __iter__(self):
        for key in dict.__iter__(self):
            _CountingDict.scanned += 1
            yield key


def test_a_release_costs_the_switch_what_the_released_group_holds_only():
    """One switch (dgx-h100, its 64 MiB buffer), partitions (0, 1) and (2, 3). GPU 0 holds its partition's
    share of zero-byte contributions (held_parts_share = 32,768: buffer share / 1,024) to ever new slots
    of its group A (GPU 1 never completes them: they cost no bytes, each a held reduction), then creates,
    binds and releases a second group B again and again: three control packets each, B holding nothing.
    GroupTable.release found B's reductions by a scan of every reduction held in the switch (`[k for k in
    self.reductions if k[0] == group_id]`), A's 32,768 included, and a leaf's release of a group spanning
    nodes scanned its partials, LOADs, load-reduces and parts the same way (spanning.Spanning.drop_span), a spine its stores'
    clocks. Before: 32,768 keys scanned per release of a group that holds nothing; 1.18 ms of switch
    CPU per release against 0.026 ms with nothing held and 0.017 ms for a 1 KiB message (medians of 41,
    this shared machine, without the counting dict), while every other tenant's packets wait (the switch
    serves in arrival order); A's held slots took 23.3 MB of the switch's memory (tracemalloc; 0 bytes
    of the partition's buffer share). The bound grows with switch_buffer_bytes (a 1 GiB buffer allows
    524,288 per partition of two). The smallest fix: GroupTable keeps each group's
    slots in a set of its own (group id -> its reduction keys), and the leaf its spanning state by group,
    so a release touches only what that group holds. After (that fix: GroupTable._slots, and fabric.groups.
    ByGroup for the leaf's and the spine's state): no key scanned, 0.021 ms of switch CPU per release
    (median of 20, this shared machine, with the counting dict). And the held slots are bounded in the share: each held contribution counts at least share / held_parts_share
    bytes (1 KiB here) against the partition's share of the buffer (GroupTable.slot_bytes), so A's 32,768
    zero-byte slots fill its 32 MiB share - a 1 KiB contribution to one more slot is refused
    (ResourceExhausted), where before A could hold them and its whole share of bytes as well - and the
    other partition's share is untouched."""
    from nvlink_emu.fabric.config import preset
    from switch_helpers import group_call, ready_group, reduce_packet

    sw = SwitchLogic(preset("dgx-h100", gpus=4, partitions=((0, 1), (2, 3))))
    a = ready_group(sw, (0, 1), name="a")
    nothing = np.empty(0, np.int32)
    for slot in range(sw.held_parts_share):
        assert sw.on_packet(0, *reduce_packet(a, (slot,), "sum", "int32", (0, 1), ("a", slot), nothing)) == []
    assert sw.held_parts_share == 32768 and len(sw.groups.reductions) == 32768
    sw.groups.reductions = _CountingDict(sw.groups.reductions)
    scanned, took = [], []
    for k in range(20):
        b = ready_group(sw, (0, 1), name=f"b{k}")
        _CountingDict.scanned = 0
        start = time.perf_counter()
        assert group_call(sw, 0, action="release", group=b) == {"group": b}
        took.append(time.perf_counter() - start)
        scanned.append(_CountingDict.scanned)
    assert len(sw.groups.reductions) == 32768  # A's, untouched
    assert max(scanned) == 0, f"a release of a group holding nothing scanned {max(scanned)} held reductions " \
                              f"(median {sorted(took)[10] * 1e3:.2f} ms of switch CPU)"
    (nack,) = sw.on_packet(0, *reduce_packet(a, ("more",), "sum", "int32", (0, 1), ("a", "more"),
                                             np.zeros(256, np.int32)))
    assert nack.packet.kind is Kind.NACK and nack.packet.info.error == "ResourceExhausted", nack.packet.info
    assert sw.groups.held_by(0) == 0 and len(sw.groups.reductions) == 32768
    c = ready_group(sw, (2, 3), name="c")  # the other partition: its whole share
    share_ints = np.zeros(sw.buffer_share_bytes // 4, np.int32)
    assert sw.on_packet(2, *reduce_packet(c, (0,), "sum", "int32", (2, 3), ("c", 0), share_ints)) == []
    assert sw.groups.held_by(1) == sw.buffer_share_bytes


def test_a_gpu_s_waiting_packets_cost_its_switch_about_what_their_payloads_do():
    """ranks/transport/packets.py: inline payloads (at most 4 KiB) bound "what a switch holds of a GPU's packets
    that wait (MAX_QUEUED of them, ranks/switch/: 1 MiB per GPU)". GPU 0 sends a PUT header whose 1 MiB
    payload never comes (its packets wait behind it up to timeout_s, 30 s by default), then inline MSG
    frames of 4 KiB each whose header is as long as a header may be: a key of 15 strings of 4,096
    characters (MsgInfo allows 16 of MAX_TEXT), 61.5 KiB. The switch read the frames until more than
    MAX_QUEUED (256) wait (_poll stopped reading a GPU then only) and keeps each decoded and its whole
    message (the inline payload is a view of it). Before: 257 packets waiting held 32.0 MiB (tracemalloc),
    against 1 MiB; the switch's GPUs each may (8 per DGX leaf: 256 MiB, 4 x switch_buffer_bytes). Honest
    headers are about 1 KiB but the end of run's COUNTERS (its call records: up to 48 KiB, sent once).
    The smallest fix: count a GPU's waiting packets in bytes too (their header messages' lengths, kept
    with the queue), and stop reading it past 1 MiB as past MAX_QUEUED packets. After (that fix: each waiting
    packet counts its message and its header's length again, for the decoded header, in Queue.nbytes (ranks/switch/queues.py);
    the switch stops reading a GPU past MAX_QUEUED_BYTES, 1 MiB, as past MAX_QUEUED packets): 10
    packets waiting hold 1.11 MiB (tracemalloc), counted 1.09 MiB; honest 4 KiB inline MSGs stop at 250."""
    import tracemalloc

    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.packets import MAX_TEXT, MsgInfo
    from nvlink_emu.ranks.switch import SwitchRank
    from nvlink_emu.ranks.switch.queues import MAX_QUEUED_BYTES
    from nvlink_emu.ranks.transport import frame
    from nvlink_emu.ranks.transport.packets import INLINE_PAYLOAD_BYTES, MAX_HEADER_BYTES

    config = preset("dgx-h100", gpus=4)
    rank = SwitchRank(config, Intake(), 30.0)
    dst = rank.logic.network_addresses[1]
    rank._take(0, bytearray(Packet(Kind.PUT, 0, dst, 0, 1 << 20).to_wire()))  # its payload never comes
    key = tuple("x" * MAX_TEXT for _ in range(15))
    header = Packet(Kind.MSG, 0, dst, 0, INLINE_PAYLOAD_BYTES, info=MsgInfo(key)).to_wire()
    assert len(header) <= MAX_HEADER_BYTES
    payload = np.zeros(INLINE_PAYLOAD_BYTES, np.uint8)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        while 0 not in rank._not_read():  # what _poll reads of GPU 0
            rank._take(0, bytearray(frame(header, payload)))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    waiting = len(rank._waiting[0])
    assert rank._waiting[0].nbytes > MAX_QUEUED_BYTES and rank.logic.refused[0] == 0
    assert held <= 2 << 20, f"{waiting} packets of GPU 0 waiting hold {held / 2**20:.1f} MiB of the switch"


def _median_ms(sw, gpu, packet, payload, n=41):
    took = []
    for _ in range(n):
        start = time.perf_counter()
        sends = sw.on_packet(gpu, packet, payload)
        took.append(time.perf_counter() - start)
    return sorted(took)[n // 2] * 1e3, sends


def test_a_forged_reply_costs_the_switch_what_any_refused_header_does():
    """GPU 0 exports a 128 KiB window to itself and sends 65,536 GETs of it (MAX_AWAITED, its bound of
    requests unanswered), all under request number 1, of 1, 2, ..., 65,536 bytes: forwarded to itself
    (it reads them, answers none). Then it sends, again and again, a header-only GET_DATA of 0 bytes for
    request 1: _answered looked its byte count up in the list of the 65,536 awaited (`packet.nbytes not
    in sizes`, a scan) before refusing it (AccessViolation, a NACK). Before: 2.55 ms of switch CPU per
    forged reply against 0.034 ms with one request awaited, 1.23 against 0.015 in another run (medians
    of 41, this shared machine; filling the list took 4.1 s of switch CPU once): 75-82 x, for a 0-byte packet it can repeat as often as it likes
    while every other tenant's packets wait (the switch serves in arrival order) - more than the refused
    GET of a whole 256 MiB window docs/model/trust.md lists (1.4 ms). The smallest fix: keep the awaited byte
    counts of one key in a Counter (count -> requests), so a reply is matched in O(1). After (that fix,
    p2p.PointToPoint._awaited): 0.022 ms per forged reply with 65,536 awaited against 0.014 with one (medians
    of 41, this shared machine), the same refusal."""
    from nvlink_emu.fabric.config import preset
    from switch_helpers import export, handle_of

    def forged(awaited):
        sw = SwitchLogic(preset("dgx-h100", gpus=4, partitions=((0, 1), (2, 3))))
        window = handle_of(export(sw, 0, phys_offset=0, size=1 << 17))
        for k in range(awaited):
            (send,) = sw.on_packet(0, Packet(Kind.GET, 0, window.network_address, window.address, k + 1, req=1))
            assert send.port == 0 and send.packet.kind is Kind.GET
        reply = Packet(Kind.GET_DATA, 0, sw.network_addresses[0], 0, 0, req=1)
        ms, sends = _median_ms(sw, 0, reply, np.empty(0, np.uint8))
        assert [s.packet.kind for s in sends] == [Kind.NACK] and sends[0].packet.info.error == "AccessViolation"
        return ms

    one, many = forged(1), forged(65536)
    assert many < 10 * one, f"a forged 0-byte reply took {many:.2f} ms with 65,536 requests awaited, {one:.3f} with one"


class _Recording(Intake):
    """Intake that records what the switch rank sends."""

    def __init__(self):
        super().__init__()
        self.sent = []

    def send(self, dest, packet, payload=None):
        self.sent.append((dest, packet, None if payload is None else bytes(payload)))
        return []


def test_inline_frames_that_wait_are_checked_once_in_their_turn(monkeypatch):
    """Not a finding (the switch holds): the path of an inline frame that waits behind a held packet of
    its sender (ranks/switch._advance), which no other test takes. GPU 0 sends three inline MSGs to GPU 1
    while GPU 1's port has its share in flight: the first is held (its payload came with it), the second,
    whose modeled times run backwards, and the third wait behind it. Once the port drains, they are
    served in order, each header checked exactly once (check_header; on_packet(checked=True) skips its
    own check): the first and third forwarded with their bytes, the second refused (ProtocolError, a
    NACK to GPU 0, counted malformed on its port), nothing else sent."""
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.packets import MsgInfo
    from nvlink_emu.ranks.switch import SwitchRank
    from nvlink_emu.ranks.transport import frame

    transport = _Recording()
    rank = SwitchRank(preset("dgx-h100", gpus=4), transport, 30.0)
    checks, check_header = [], SwitchLogic.check_header

    def counted(self, ingress, packet):
        checks.append(packet.req)
        return check_header(self, ingress, packet)

    monkeypatch.setattr(SwitchLogic, "check_header", counted)
    dst = rank.logic.network_addresses[1]
    transport.pending_bytes_to[1] = rank.port_share_bytes  # GPU 1's share in flight: its traffic waits
    payloads = [np.full(4096, k, np.uint8) for k in (1, 2, 3)]
    times = [(0.0, 10.0), (5.0, 1.0), (20.0, 30.0)]
    for req, (payload, (t0, t1)) in enumerate(zip(payloads, times), start=1):
        packet = Packet(Kind.MSG, 0, dst, 0, payload.nbytes, req, MsgInfo(("m", req)), t0, t1)
        rank._take(0, bytearray(frame(packet.to_wire(), payload)))
    assert transport.sent == [] and len(rank._waiting[0]) == 3 and rank._waiting[0][0].held and checks == []
    transport.pending_bytes_to[1] = 0  # the port drained
    rank._advance(0)
    assert checks == [1, 2, 3] and 0 not in rank._waiting
    assert [(dest, p.kind, p.req) for dest, p, _ in transport.sent] == [(1, Kind.MSG, 1), (0, Kind.NACK, 2),
                                                                         (1, Kind.MSG, 3)]
    (_, first, one), (_, nack, _), (_, third, three) = transport.sent
    assert first.info.key == ("m", 1) and one == payloads[0].tobytes()
    assert third.info.key == ("m", 3) and three == payloads[2].tobytes()
    assert nack.info.error == "ProtocolError" and "modeled times 5.0..1.0 ns" in nack.info.message
    assert rank.logic.malformed[0] == rank.logic.refused[0] == 1
