"""An attacker's review of in-switch collectives across nodes (issue 11), in one process: what a
member's packets can make a leaf or a spine do when packets of different senders reach a switch in
an order MPI allows (it keeps each sender's order, nothing between senders); each case was found by
that review and is fixed since. A SwitchLogic or SpineLogic that raises ends its switch rank and every tenant's run (ranks/switch/: the switches
trust each other); a credit between leaves that never comes back holds every later transfer of the
node towards that GPU for the rest of the run."""

import msgpack
import numpy as np
import pytest

from nvlink_emu.fabric.packets import (HEADER_GROWTH_BYTES, MAX_GPU_HEADER_BYTES, MAX_HEADER_BYTES, MAX_TEXT, GroupInfo,
                                       Kind, LoadInfo, McastInfo, MsgInfo, Packet, ReduceInfo)
from nvlink_emu.ranks.switch import SwitchRank
from nvlink_emu.ranks.transport import frame, unframe
from nvlink_emu.ranks.transport.packets import INLINE_FRAME_BYTES, INLINE_PAYLOAD_BYTES

from nvlink_emu.fabric.config import preset
from switch_helpers import Fabric, nvlink

X = np.ones(16, np.float32)


def group_packet(action, group=0, members=(), name=""):
    return Packet(Kind.GROUP, 0, -1, req=7, info=GroupInfo(action, group, tuple(members), name))


def _in_switch(kind, gid):
    """GPU 2's packet of `kind` through group `gid` (members (0, 2)) that goes up to spine 3 (the second
    of two): a contribution to chunk 1, a store of chunk 0 (spine (p + c) mod P, p = 1), a load-reduce
    of its own block's chunk 0 (slot (seq, r, c, r + c), spine (r + c) mod P)."""
    if kind is Kind.REDUCE:
        payload = X.view(np.uint8)
        info = ReduceInfo(gid, (0, 1), "sum", "float32", (0, 2), ("c", 0, 1))
        return Packet(Kind.REDUCE, 0, -1, 0, payload.nbytes, info=info), payload
    if kind is Kind.MCAST:
        payload = X.view(np.uint8)
        return Packet(Kind.MCAST, 0, -1, 0, payload.nbytes, info=McastInfo(gid, ("c", 0))), payload
    info = LoadInfo(gid, (0, 1, 0, 1), "sum", "float32", (2,), ("c", "r", 1), ("c", "src"))
    return Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info), None


@pytest.mark.parametrize("kind", [Kind.REDUCE, Kind.MCAST, Kind.LOAD_REDUCE])
def test_a_member_of_another_leaf_can_use_a_group_only_once_every_spine_holds_it(kind):
    """2 nodes x 2 GPUs, 2 spines. GPU 0 creates group (0, 2): its leaf sends the span to spine 2 and
    spine 3; spine 2 reads it first. Found by the attacker's review: leaf 1 took the group through
    spine 2 at once, and GPU 2 (its id is k x nodes + 0, k the creator leaf's count: it can guess it)
    bound it and sent a packet whose chunk picks spine 3 before spine 3 had read its span (MPI orders
    nothing between senders): spine 3 raised AccessViolation, which ends every tenant's run. Now the
    other leaves are asked only once every spine took the group (two phases): until then GPU 2's bind
    is refused, and what it sends afterwards finds the group at every spine."""
    fabric = Fabric(nvlink(spines=2))
    leaf0, leaf1, spine2, spine3 = fabric.switches
    spans = sorted(leaf0.on_packet(0, group_packet("create", members=(0, 2), name="c")), key=lambda s: s.switch)
    assert [s.switch for s in spans] == [2, 3]
    gid = spans[0].packet.info.group
    answer = spine2.on_switch(0, spans[0].packet)  # spine 2 first: it answers the creator leaf, asks no leaf
    assert [s.switch for s in answer] == [0]
    assert leaf0.on_switch(2, answer[0].packet) == []  # the creator leaf waits for spine 3
    assert gid not in leaf1.groups.groups
    (early,) = fabric.gpu(2, group_packet("bind", gid))
    assert early.packet.info.get("error") == "AccessViolation", early.packet.info
    (reply,) = fabric.flow(3, spine3.on_switch(0, spans[1].packet))  # spine 3, then leaf 1 through spine 2
    assert reply.port == 0 and reply.packet.info == {"group": gid}
    assert all(gid in s.groups.groups for s in fabric.switches)
    (bound,) = fabric.gpu(2, group_packet("bind", gid))
    assert bound.packet.info == {"group": gid}
    refused = leaf1.refused[2]  # the early bind
    packet, payload = _in_switch(kind, gid)
    fabric.gpu(2, packet, payload)  # through spine 3, which holds the group: nothing raises
    assert leaf1.refused[2] == refused


def test_a_member_cannot_use_a_group_whose_create_another_switch_refused():
    """Spine 3 holds partition 0's share of groups, so it refuses GPU 0's create of (0, 2). Found by the
    attacker's review: leaf 1 had taken the span through spine 2, GPU 2 bound the group and sent a
    contribution before the undo came back, and spine 3, which never held the group, raised
    AccessViolation (every tenant's run ended). Now no other leaf is asked while a spine refused: the
    create is refused, no switch holds the group, GPU 2's bind and contribution are refused at its own
    leaf, and a late packet of the group at spine 3 is dropped as a released group's."""
    fabric = Fabric(nvlink(spines=2))
    leaf0, leaf1, spine2, spine3 = fabric.switches
    for k in range(spine3.group_share):
        spine3.groups.create((0, 2), -1, f"other{k}", 0, group_id=1000 + k, inputs=(0, 1), stage="spine")
    (reply,) = fabric.gpu(0, group_packet("create", members=(0, 2), name="c"))
    assert reply.packet.info["error"] == "ResourceExhausted", reply.packet.info
    gid = next(p.info.group for _, _, p in fabric.hops if p.kind is Kind.GROUP)
    assert all(gid not in s.groups.groups for s in fabric.switches)
    assert not any(to == 1 for _, to, p in fabric.hops if p.kind is Kind.GROUP and p.info.action == "span")
    (bind,) = fabric.gpu(2, group_packet("bind", gid))
    assert bind.packet.info.get("error"), bind.packet.info
    packet, payload = _in_switch(Kind.REDUCE, gid)
    (nack,) = fabric.gpu(2, packet, payload)
    assert nack.packet.kind is Kind.NACK
    partial = Packet(Kind.REDUCE, -1, -1, 0, payload.nbytes, info=packet.info)
    assert spine3.on_switch(1, partial, payload) == []  # dropped: spine 3 refused the group


# -- credits between leaves, through SwitchRanks whose transports only record ---------------------
class _Outbox:
    """A Transport stand-in for one switch rank: sends are recorded (and complete at once)."""

    def __init__(self, rank: int, mail: list):
        self.rank, self.mail = rank, mail
        self.pending_bytes_to: dict[int, int] = {}

    def send(self, dest, packet, payload=None):
        self.mail.append((self.rank, dest, packet, payload))
        return []

    def sends_pending_to(self, dest):
        return 0


class _Ranks:
    """Every switch rank of `config` in one process; GPUs are ranks 0..G-1 and only collect."""

    def __init__(self, config):
        self.config, self.mail, self.to_gpus = config, [], []
        first = config.gpus
        self.ranks = {first + s: SwitchRank(config, _Outbox(first + s, self.mail), 5.0)
                      for s in range(config.switches)}

    def gpu(self, g, packet, payload=None, hold=lambda frm, dest, packet: False):
        self.leaf(g)._handle(g, packet, payload)
        return self.pump(hold)

    def leaf(self, g):
        return self.ranks[self.config.gpus + g // self.config.gpus_per_node]

    def pump(self, hold=lambda frm, dest, packet: False):
        """Deliver every message between switch ranks (returning those `hold` keeps back) and retire
        every send to a GPU (so each destination leaf credits its copies back)."""
        held = []
        while self.mail:
            frm, dest, packet, payload = self.mail.pop(0)
            if dest < self.config.gpus:
                self.to_gpus.append((dest, packet))
            elif hold(frm, dest, packet):
                held.append((frm, dest, packet, payload))
            else:
                self.ranks[dest]._handle(frm, packet, payload)
            if not self.mail:
                for rank in self.ranks.values():
                    rank.credits.drain(rank.transport.sends_pending_to)
        return held

    def deliver(self, held):
        for frm, dest, packet, payload in held:
            self.ranks[dest]._handle(frm, packet, payload)
        self.pump()


def test_a_store_dropped_at_a_spine_gives_its_credit_back():
    """2 nodes x 2 GPUs, 2 spines, one tenant; credit_bytes = 64 KiB / (2 + 2) / 1 = 16 KiB. GPU 2 (node 1)
    stores 16 KiB through group (0, 2) under chunk 0, which goes to spine 3; the creator member GPU 0
    releases the group meanwhile, and spine 3 reads leaf 0's unspan before leaf 1's store (two
    senders), so it drops the store. Found by the attacker's review: leaf 1 kept 16 KiB of credit for GPU
    0 in use for good, and honest GPU 3's next message to GPU 0, of any size, was held (the credit it
    asked for never came). Now spine 3 returns the credit of the store it dropped (it remembers the
    members of released groups). An honest store while the group lives gives its credit back in full."""
    fabric = _Ranks(nvlink(spines=2, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    leaf1 = fabric.leaf(2)
    assert leaf1.credits.credit_bytes == 16384
    fabric.gpu(0, group_packet("create", members=(0, 2), name="c"))
    ((_, reply),) = fabric.to_gpus
    gid = reply.info["group"]
    for g in (0, 2):
        fabric.gpu(g, group_packet("bind", gid))
    data = np.ones(16384, np.uint8)
    store = Packet(Kind.MCAST, 0, -1, 0, data.nbytes, info=McastInfo(gid, ("c", 0)))
    fabric.gpu(2, store, data)  # live group: its copy reaches GPU 0 and the credit comes back
    assert leaf1.credits.used.get(0, 0) == 0
    on_cable = fabric.gpu(2, store, data, hold=lambda frm, dest, packet: packet.kind is Kind.MCAST)
    assert [(frm, dest) for frm, dest, _, _ in on_cable] == [(5, 7)]  # leaf 1 -> spine 3
    assert leaf1.credits.used[0] == 16384
    fabric.gpu(0, group_packet("release", gid))
    fabric.deliver(on_cable)
    assert fabric.ranks[7].logic.late_stores == 1  # dropped at spine 3
    message = Packet(Kind.MSG, 0, leaf1.logic.route_key(0), 0, 64, info=MsgInfo(("m",)))
    leaf1._congested(3, message)  # held: leaf 1 asks leaf 0 for GPU 0's credit
    fabric.pump()
    assert not leaf1._congested(3, message), f"GPU 3's 64-byte message to GPU 0 is held: " \
                                             f"{leaf1.credits.used[0]} bytes of credit never came back"


def test_a_member_cannot_load_reduce_another_requester_s_slot_under_its_own_key():
    """Group (0, 1, 2, 3); GPU 3 asks for slot (0, 3, 0, 3) - its block 3, chunk 0, as nvls.py names it
    (seq, r, c, r + c) - under its result key. GPU 0 then asks for the same slot under a key of its own.
    Each request has its own leaf (leaf 1, leaf 0), so no leaf's table of load-reduces sees both. Found by
    the attacker's review: both were passed on, and every member got two LOADs its program cannot tell
    apart (it served one, and the honest requester timed out). Now a slot names its requester's rank
    second, and leaf 0 refuses GPU 0's request of GPU 3's slot."""
    fabric = Fabric(nvlink(spines=2))
    gid = fabric.group((0, 1, 2, 3))

    def ask(g, key):
        info = LoadInfo(gid, (0, 3, 0, 3), "sum", "float32", (g,), ("c", *key), ("c", "src"))
        return fabric.gpu(g, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info))

    honest = ask(3, ("r", 3))
    assert sorted(s.port for s in honest) == [0, 1, 2, 3]
    hostile = ask(0, ("x", 0))
    filed = {(s.port, s.packet.info.group, s.packet.info.source, s.packet.info.slot)
             for s in honest + hostile if s.packet.kind is Kind.LOAD}
    assert len(filed) == len([s for s in honest + hostile if s.packet.kind is Kind.LOAD]), \
        "members got two LOADs of one (group, buffer, slot): one of them is lost"
    assert [s.packet.kind for s in hostile] == [Kind.NACK] and hostile[0].packet.info.error == "AccessViolation"


def test_leaves_and_spines_remember_the_members_of_the_latest_released_groups_only(monkeypatch):
    """A released spanning group's members stay known (a store crossing the release returns the credit it
    took for them): at a leaf its own members, at a spine all of them; only the GONE_KEPT most recent."""
    monkeypatch.setattr("nvlink_emu.fabric.switch.spanning.GONE_KEPT", 2)
    fabric = Fabric(nvlink(spines=2))
    gids = []
    for members in ((0, 2), (1, 2, 3), (3, 0)):
        gids.append(fabric.group(members))
        assert fabric.call(members[0], "release", gids[-1]) == {"group": gids[-1]}
    leaf0, leaf1, spine2, spine3 = fabric.switches
    assert leaf0.spanning._gone == {gids[1]: (1,), gids[2]: (0,)}
    assert leaf1.spanning._gone == {gids[1]: (2, 3), gids[2]: (3,)}
    assert spine2._gone == spine3._gone == {gids[1]: (1, 2, 3), gids[2]: (3, 0)}
    assert spine3.dropped_store_ports(gids[2], 3) == (0,) and spine3.dropped_store_ports(gids[0], 2) == ()


def _unserved(gid, slot):
    """A member's notice that it will not serve the LOAD of `slot` (ranks/gpu.serve_load: a range past
    its bound buffer, or a call it gave up): header-only, answered by nothing."""
    return Packet(Kind.GROUP, 0, -1, req=9, info=GroupInfo("unserved", gid, tuple(slot), ""))


@pytest.mark.parametrize("refuser", [2, 0])
def test_a_refused_load_reduce_gives_its_budget_back_so_repeating_it_exhausts_nothing(refuser):
    """2 nodes x 2 GPUs, one spine; group (0, 2); GPU 0 asks for slot (k, 0, 0, 0) again and again, and a
    member - GPU 2 (the other node: its notice goes through the spine; GPU 0 then refuses its own too,
    as an honest requester does) or GPU 0 itself - refuses each LOAD. Measured before: each refused request kept its leaf's entry until the group's release, so
    after partial_share_parts of them (2048 here) the partition's next load-reduce was refused
    (ResourceExhausted), though none was in flight. Now the member's notice frees the entry at the
    requester's leaf (and nothing answers the notice): the budget stays free. With GPU 0 refusing, GPU
    2 answers none of its LOADs: leaf 1 keeps MAX_LOADS of them and drops every later request, telling
    leaf 0 ("unserved"), which finds it freed already; nothing is refused either way. A notice is taken
    only for a LOAD its leaf sent that member and has not seen answered: relayed (and freeing nothing
    at leaf 0, nothing raises) while GPU 2's LOAD of the slot is unanswered, else refused at leaf 1."""
    from nvlink_emu.fabric.switch import MAX_LOADS
    fabric = Fabric(nvlink(spines=1, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    leaf0, leaf1 = fabric.switches[:2]
    gid = fabric.group((0, 2))
    limit = leaf0.partial_share_parts
    assert limit == 2048

    def ask(k):
        info = LoadInfo(gid, (k, 0, 0, 0), "sum", "float32", (0,), ("c", k, "r"), ("c", k, "src"))
        return fabric.gpu(0, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info))

    for k in range(limit + 1):
        loads = ask(k)
        served = [0, 2] if refuser == 2 or k < MAX_LOADS else [0]
        assert sorted(s.port for s in loads if s.packet.kind is Kind.LOAD) == served, (k, loads[0].packet)
        for g in (refuser, 0) if refuser else (0,):
            assert fabric.gpu(g, _unserved(gid, (k, 0, 0, 0))) == []  # no answer to a notice
        assert leaf0.nvls._asked_count[0] == 0, k
    assert leaf0.nvls._asked == {} and all(not s.refused[g] for s in fabric.switches[:2] for g in range(4))
    assert leaf1.dropped_loads == (0 if refuser == 2 else limit + 1 - MAX_LOADS)
    fabric.hops.clear()
    sends = fabric.gpu(2, _unserved(gid, (7, 0, 0, 0)))  # a notice of a slot no request awaits
    if refuser == 0:  # GPU 2's LOAD of slot 7 is unanswered: taken, relayed, frees nothing, nothing raises
        assert sends == [] and [(frm, to) for frm, to, _ in fabric.hops] == [(1, 2), (2, 0)]  # leaf 1 -> spine -> leaf 0
    else:  # GPU 2 refused that LOAD already: a second notice is refused at its leaf
        (nack,) = sends
        assert nack.packet.info.error == "AccessViolation" and fabric.hops == [] and leaf1.refused[2] == 1
    assert leaf0.nvls._asked_count[0] == 0


def test_a_load_reduce_dropped_or_released_on_its_way_gives_its_budget_back_and_a_bad_notice_is_refused():
    """Group (0, 2, 1) created by GPU 0; GPU 2 (node 1) has not bound it. GPU 1's load-reduce is dropped at
    leaf 1 (a LOAD goes only to members that bound the group): before, its entry stayed at leaf 0 until
    the group's release; now leaf 1 sends the notice "unserved" back through the spine. A notice from a
    GPU that is no member, or one whose slot names no requester, is refused (counted, a NACK); the
    group's release by its creator frees a request of another leaf's GPU (GPU 2 asks at leaf 1)."""
    fabric = Fabric(nvlink(spines=1))
    leaf0, leaf1, _ = fabric.switches
    gid = fabric.call(0, "create", members=(0, 2, 1), name="c")["group"]
    for g in (0, 1):
        assert fabric.call(g, "bind", gid) == {"group": gid}

    def ask(g, rank, k=0):
        info = LoadInfo(gid, (k, rank, 0, rank), "sum", "float32", (g,), ("c", k, "r"), ("c", k, "src"))
        return fabric.gpu(g, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info))

    fabric.hops.clear()
    assert sorted(s.port for s in ask(1, 2)) == [0, 1]  # leaf 0's LOADs; none at leaf 1
    assert [(frm, to, p.kind) for frm, to, p in fabric.hops] == [
        (0, 2, Kind.LOAD_REDUCE), (2, 1, Kind.LOAD_REDUCE), (1, 2, Kind.GROUP), (2, 0, Kind.GROUP)]
    assert leaf0.nvls._asked == {} and leaf0.nvls._asked_count == {0: 0}
    (nack,) = fabric.gpu(3, _unserved(gid, (0, 2, 0, 2)))
    assert nack.packet.kind is Kind.NACK and nack.packet.info.error == "AccessViolation"
    (nack,) = fabric.gpu(1, _unserved(gid, (0, 7, 0, 7)))
    assert nack.packet.info.error == "ProtocolError" and "names no requester" in nack.packet.info.message
    assert (leaf1.refused[3], leaf0.refused[1]) == (1, 1)
    assert fabric.call(2, "bind", gid) == {"group": gid}
    ask(2, 1, k=1)
    assert leaf1.nvls._asked_count == {0: 1}
    assert fabric.call(0, "release", gid) == {"group": gid}
    assert leaf1.nvls._asked == leaf1.nvls._asked_slot == {} and leaf1.nvls._asked_count == {0: 0}
    assert fabric.gpu(2, _unserved(gid, (1, 1, 0, 1))) == []  # crossed the release: dropped


def test_two_groups_of_the_same_members_share_their_members_down_shares_from_a_spine():
    """2 nodes x 2 GPUs, one spine; groups A and B of members (0, 2), 16 KiB float32 each, GPU 0 reducing A
    then B and GPU 2 B then A: both slots complete at the spine at once (each leaf's uplink share sent
    one group's partial first). Found by review: the spine's down clocks were one per (group, node), so
    each result took the node's whole share of the spine's downlink (m U / (G P)) at the same time,
    twice the share the members have. Now each member's part of a result (1/m of its bytes) takes that
    member's own share (U / (G P)), shared by all its groups, as on the way up: the second result ends
    one serialization after the first. One group alone takes the same times as before."""
    def run(orders):  # the golden times were taken on the line-rate figures: its -line twin keeps them
        fabric = Fabric(preset("superpod-h100-nvlink-line", nodes=2, gpus=4, spines=1))
        gids = {name: fabric.group((0, 2), name) for name in "ab"}
        x = np.ones(4096, np.float32)
        times = {}
        for g, names in orders.items():
            for name in names:
                for send in fabric.reduce(g, gids[name], (0, 0), x, (0, 2), (name, 0)):
                    times[(name, send.port)] = (send.packet.t_start, send.packet.t_end)
        return times

    alone = run({0: "a", 2: "a"})
    assert alone == {("a", 0): (1250.0, pytest.approx(1327.368888888889, rel=1e-12)),
                     ("a", 2): (1250.0, pytest.approx(1327.368888888889, rel=1e-12))}
    start, end = alone[("a", 0)]
    serial = end - start  # 16 KiB + headers on the node's share from the spine
    both = run({0: "ab", 2: "ba"})
    for port in (0, 2):
        first, second = sorted((both[("a", port)], both[("b", port)]))
        assert first == pytest.approx((end, end + serial), rel=1e-12)
        assert second == pytest.approx((end + serial, end + 2 * serial), rel=1e-12), (port, first, second)


def test_a_one_switch_group_takes_a_member_s_load_refusal_and_answers_nothing():
    """On one switch no budget of load-reduces is kept: a bound member's notice "unserved" is taken and
    answered by nothing; a GPU that is no member is refused (counted, a NACK naming the group)."""
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.switch import SwitchLogic
    switch = SwitchLogic(preset("dgx-h100", gpus=4))
    (reply,) = switch.on_packet(0, group_packet("create", members=(0, 1), name="c"))
    gid = reply.packet.info["group"]
    for g in (0, 1):
        switch.on_packet(g, group_packet("bind", gid))
    assert switch.on_packet(1, _unserved(gid, (0, 0, 0))) == [] and switch.refused == [0] * 4
    (nack,) = switch.on_packet(2, _unserved(gid, (0, 0, 0)))
    assert nack.packet.kind is Kind.NACK and f"not a member of group {gid}" in nack.packet.info.message
    assert switch.refused == [0, 0, 1, 0]


# -- header sizes: what a leaf forwards, the next switch takes (issue 25, item 1) ----------------------
def _gpu_bytes(packet: Packet) -> bytes:
    """`packet`'s header as short as a GPU may encode it: src 0 and the times as the integer 0 (a switch
    writes them back as a routing key and float64s, 8 bytes longer each)."""
    info = packet.info.to_wire() if packet.info is not None else None
    return msgpack.packb([int(packet.kind), 0, packet.dst, packet.address, packet.nbytes, packet.req, info, 0, 0],
                         use_bin_type=True)


def _padded(kind, dst, size, nbytes=0):
    """A GPU's MSG header of exactly `size` bytes as the GPU encodes it (_gpu_bytes), its key padded."""
    for filler in range(MAX_TEXT + 1):
        parts = ("x" * MAX_TEXT,) * 15 + ("y" * filler,)
        data = _gpu_bytes(Packet(kind, 0, dst, 0, nbytes, info=MsgInfo(parts)))
        if len(data) == size:
            return data
    raise AssertionError(f"no key makes a {kind.name} header of {size} bytes")


class _Wire(_Ranks):
    """_Ranks whose switches take each other's packets as bytes, as ranks/switch/ reads them from MPI
    (poll's limit, then _take): a header a switch cannot take raises there, as it ended the run."""

    def __init__(self, config):
        super().__init__(config)
        self.hops: list[tuple[int, int, int]] = []  # (from rank, to rank, header bytes)

    def gpu_bytes(self, g, data, payload=None):
        """GPU g's header message of `data` (a frame with `payload` if given), read by its leaf."""
        message = bytearray(data if payload is None else frame(data, payload))
        self.leaf(g)._take(g, None if len(message) > MAX_HEADER_BYTES + INLINE_FRAME_BYTES else message)
        return self.pump()

    def pump(self, hold=lambda frm, dest, packet: False):
        while self.mail:
            frm, dest, packet, payload = self.mail.pop(0)
            header = packet.to_wire()
            self.hops.append((frm, dest, len(header)))
            inline = payload is not None and packet.payload_bytes <= INLINE_PAYLOAD_BYTES
            message = bytearray(frame(header, payload) if inline else header)
            if dest < self.config.gpus:  # a GPU reads its switch's frames as ranks/gpu.py does
                got, _ = unframe(message)
                self.to_gpus.append((dest, Packet.from_wire(got)))
            else:
                self.ranks[dest]._take(frm, None if len(message) > MAX_HEADER_BYTES + INLINE_FRAME_BYTES
                                       else message)
        return []


def test_a_gpu_s_header_at_its_leaf_s_limit_grows_on_no_hop_past_what_the_next_switch_takes():
    """2 nodes x 2 GPUs, 2 spines. Found in the round-3 attack (issue 25): GPU 0 sent a MSG to GPU 2 (node
    1) whose header was 65,536 bytes, the most its leaf took, with src 0 and integer times; the leaf
    re-encoded it with its routing key and float64 times, 18 bytes longer, and the spine raised
    ProtocolError ("a header of more than 65536 bytes"): the job ended, every tenant's. Now a GPU's header
    may be MAX_GPU_HEADER_BYTES long (what a switch writes into it fits the difference): one byte more is
    refused at its leaf (a NACK, counted on GPU 0's port); at the limit it crosses leaf 0, a spine and
    leaf 1 to GPU 2, each hop's header within what the next switch takes."""
    fabric = _Wire(nvlink(spines=2))
    leaf0 = fabric.leaf(0)
    dst = leaf0.logic.route_key(2)
    payload = np.full(8, 7, np.uint8)
    for size in (MAX_HEADER_BYTES, MAX_GPU_HEADER_BYTES + 1):  # the attack's header, and the first refused
        fabric.gpu_bytes(0, _padded(Kind.MSG, dst, size, payload.nbytes), payload)
    assert [(g, p.kind, p.info.error) for g, p in fabric.to_gpus] == [(0, Kind.NACK, "ProtocolError")] * 2
    assert all(f"headers are at most {MAX_GPU_HEADER_BYTES} bytes" in p.info.message for _, p in fabric.to_gpus)
    assert leaf0.logic.refused[0] == leaf0.logic.malformed[0] == 2
    assert [hop for hop in fabric.hops if hop[1] >= fabric.config.gpus] == []  # nothing went up
    fabric.to_gpus.clear()
    fabric.hops.clear()
    fabric.gpu_bytes(0, _padded(Kind.MSG, dst, MAX_GPU_HEADER_BYTES, payload.nbytes), payload)
    (gpu, delivered), = fabric.to_gpus
    assert gpu == 2 and delivered.kind is Kind.MSG and delivered.src == leaf0.logic.route_key(0)
    spine = fabric.hops[0][1]
    assert [(frm, dest) for frm, dest, _ in fabric.hops] == [(4, spine), (spine, 5), (5, 2)]  # leaf, spine, leaf, GPU
    assert all(size <= MAX_HEADER_BYTES for _, dest, size in fabric.hops if dest >= fabric.config.gpus)
    assert max(size for *_, size in fabric.hops) > MAX_GPU_HEADER_BYTES  # it did grow, within the room left
    assert leaf0.logic.refused[0] == 2 and not fabric.leaf(2).logic.refused[0]  # the two above only


class _Routed(Fabric):
    """Fabric, with the traffic that is no spanning group's passed on between switches too, as
    ranks/switch/ does (a spine's on_packet, a leaf's on_transit)."""

    def flow(self, here: int, sends: list) -> list:
        from nvlink_emu.ranks.switch.queues import SPANNING
        out, queue = [], [(here, send) for send in sends]
        while queue:
            frm, send = queue.pop(0)
            to = send.switch if send.switch is not None else (  # a spine's Send to a GPU: to its leaf
                send.port // self.config.gpus_per_node if frm >= self.config.nodes
                else self.switches[frm].next_switch(send.port))
            if to is None:
                out.append(send)
                continue
            self.hops.append((frm, to, send.packet))
            switch, packet = self.switches[to], send.packet
            if packet.kind in SPANNING and packet.kind is not Kind.REDUCE or send.switch is not None:
                got = switch.on_switch(frm, packet, send.payload)
            elif to >= self.config.nodes:
                got = [switch.on_packet(frm, packet, send.payload)]
            else:
                got = switch.on_transit(frm, packet, send.payload)
            queue += [(to, s) for s in got]
        return out


def test_a_switch_s_re_encoding_of_a_gpu_s_header_grows_it_by_at_most_header_growth_bytes():
    """fabric.packets' bound, kind by kind, on the pure switch logic of 2 nodes x 2 GPUs and 2 spines: what
    a GPU sends as short as it may (_gpu_bytes), every header the leaves and spines make of it, up to
    another switch or down to a GPU (a request translated at its target's leaf: dst, address), is at most
    HEADER_GROWTH_BYTES longer: a message, a put, a get and its answer, a group's create (its span to the
    spines), a multicast store, a 16-bit contribution (the leaf's partial: twice the bytes) and a
    load-reduce of a group that spans both nodes."""
    from switch_helpers import export, handle_of
    fabric = _Routed(nvlink(spines=2))
    leaf0, leaf1 = fabric.switches[:2]
    grown = {}

    def send(g, packet, payload=None):
        before = len(fabric.hops)
        sends = fabric.gpu(g, packet, payload)
        assert not any(s.packet.kind is Kind.NACK for s in sends), sends
        made = [p for _, _, p in fabric.hops[before:]] + [s.packet for s in sends]
        assert made, packet.kind
        grown[packet.kind.name] = max(grown.get(packet.kind.name, 0),
                                      max(len(p.to_wire()) for p in made) - len(_gpu_bytes(packet)))
        return sends

    window = handle_of(export(leaf1, 2, phys_offset=1 << 27, size=1 << 20, to=(0,)))
    far = window.network_address
    (reply,) = send(0, Packet(Kind.PUT, 0, far, window.address + 4096, 16, req=2 ** 40), np.ones(16, np.uint8))
    (get,) = send(0, Packet(Kind.GET, 0, far, window.address, 16, req=2 ** 40 + 1))
    assert reply.packet.kind is Kind.PUT and get.packet.kind is Kind.GET and get.port == 2
    send(2, Packet(Kind.GET_DATA, 0, leaf1.route_key(0), 0, 16, req=2 ** 40 + 1), np.ones(16, np.uint8))
    send(0, Packet(Kind.MSG, 0, far, 0, 16, info=MsgInfo(("m", 1))), np.ones(16, np.uint8))
    send(0, Packet(Kind.GROUP, 0, -1, req=7, info=GroupInfo("create", 0, (0, 2), "c")))
    gid = fabric.group((0, 2))
    send(0, Packet(Kind.MCAST, 0, -1, 0, 16, info=McastInfo(gid, ("c", 0))), np.ones(16, np.uint8))
    half = np.ones(2 ** 15, np.float16).view(np.uint8)  # 65,536 bytes: a uint32 on the wire, its partial's too
    info = ReduceInfo(gid, (0, 0), "sum", "float16", (0, 2), ("c", 0, 0))
    for g in (2, 0):  # GPU 0's completes node 0's partial only once node 1's is up: it goes to the spine
        send(g, Packet(Kind.REDUCE, 0, -1, 0, half.nbytes, info=info), half)
    send(0, Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3,
                   info=LoadInfo(gid, (1, 0, 0, 0), "sum", "float32", (0,), ("c", 1, "r"), ("c", "src"))))
    assert set(grown) == {"PUT", "GET", "GET_DATA", "MSG", "GROUP", "MCAST", "REDUCE", "LOAD_REDUCE"}
    assert [(k, g, s.refused[g]) for k, s in enumerate(fabric.switches[:2]) for g in range(4) if s.refused[g]] == []
    assert max(grown.values()) <= HEADER_GROWTH_BYTES, grown
