"""An attacker's review of in-switch collectives across nodes (issue 11), in one process: what a
member's packets can make a leaf or a spine do when packets of different senders reach a switch in
an order MPI allows (it keeps each sender's order, nothing between senders). A SwitchLogic or
SpineLogic that raises ends its switch rank and every tenant's run (ranks/switch.py: the switches
trust each other); a credit between leaves that never comes back holds every later transfer of the
node towards that GPU for the rest of the run."""

import numpy as np
import pytest

from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, McastInfo, MsgInfo, Packet, ReduceInfo
from nvlink_emu.ranks.switch import SwitchRank

from test_switch_spanning import Fabric, nvlink

X = np.ones(16, np.float32)


def _group_packet(action, group=0, members=(), name=""):
    return Packet(Kind.GROUP, 0, -1, req=7, info=GroupInfo(action, group, tuple(members), name))


def _in_switch(kind, gid):
    """GPU 2's packet of `kind` through group `gid` (members (0, 2)) that goes up to spine 3 (the second
    of two): a contribution to chunk 1, a store of chunk 0 (spine (p + c) mod P, p = 1), a load-reduce
    of chunk 1."""
    if kind is Kind.REDUCE:
        payload = X.view(np.uint8)
        info = ReduceInfo(gid, (0, 1), "sum", "float32", (0, 2), ("c", 0, 1))
        return Packet(Kind.REDUCE, 0, -1, 0, payload.nbytes, info=info), payload
    if kind is Kind.MCAST:
        payload = X.view(np.uint8)
        return Packet(Kind.MCAST, 0, -1, 0, payload.nbytes, info=McastInfo(gid, ("c", 0))), payload
    info = LoadInfo(gid, (0, 0, 1), "sum", "float32", (2,), ("c", "r", 1), ("c", "src"))
    return Packet(Kind.LOAD_REDUCE, 0, -1, 0, 64, req=3, info=info), None


@pytest.mark.xfail(strict=True, reason="not fixed: a leaf other than the creator's lets a member bind a spanning "
                   "group as soon as it took the group's span, before every spine holds it (only the creator "
                   "leaf refuses binds while the create is under way); the member's partial, store or "
                   "load-reduce can then reach a spine that has not yet taken the span from the creator's "
                   "leaf, which raises AccessViolation ('no live group') and ends every tenant's run")
@pytest.mark.parametrize("kind", [Kind.REDUCE, Kind.MCAST, Kind.LOAD_REDUCE])
def test_a_member_of_another_leaf_cannot_use_a_group_before_every_spine_holds_it(kind):
    """2 nodes x 2 GPUs, 2 spines. GPU 0 creates group (0, 2): its leaf sends the span to spine 2 and
    spine 3; spine 2's arrives first and spine 2 relays it to leaf 1, which takes it. GPU 2 (node 1;
    its group id is k x nodes + 0, k the creator leaf's count, so it can guess it) binds it at once
    and sends a packet whose chunk picks spine 3, before spine 3 has read leaf 0's span (a message of
    another sender: MPI orders nothing between them). Today spine 3 raises; every switch must keep
    serving whatever the order of its inputs. Measured in a real run (8 ranks: 2 x 2 GPUs, 2 spines;
    GPU 0 creates, binds and releases group (0, 2) in a loop, GPU 2 sends bind for the next id until
    one is taken, then one contribution to chunk 1): spine 3 raised AccessViolation ('partial REDUCE
    of group 134 ... no live group 134') at the 67th create, and GPU 0's create timed out (20 s)."""
    fabric = Fabric(nvlink(spines=2))
    leaf0, leaf1, spine2, spine3 = fabric.switches
    spans = leaf0.on_packet(0, _group_packet("create", members=(0, 2), name="c"))
    assert sorted(s.switch for s in spans) == [2, 3]
    to_spine3 = [s for s in spans if s.switch == 3]  # on its cable: read later
    gid = spans[0].packet.info.group
    for send in spans:
        if send.switch == 2:
            for relay in spine2.on_switch(0, send.packet):
                if relay.switch == 1:
                    leaf1.on_switch(2, relay.packet)
    bind = fabric.gpu(2, _group_packet("bind", gid))
    packet, payload = _in_switch(kind, gid)
    sends = leaf1.on_packet(2, packet, payload) if bind[0].packet.info == {"group": gid} else []
    for send in sends:  # what GPU 2 made leaf 1 send up reaches spine 3 first
        if send.switch == 3:
            spine3.on_switch(1, send.packet, send.payload)
    for send in to_spine3:
        spine3.on_switch(0, send.packet)


@pytest.mark.xfail(strict=True, reason="not fixed: a leaf that took a spanning group's span lets its members bind "
                   "and use it while another switch's refusal is still on its way to the creator leaf; a "
                   "spine that refused the create then gets the member's partial for a group it never held "
                   "and raises AccessViolation, which ends every tenant's run")
def test_a_member_cannot_use_a_group_whose_create_another_switch_refused():
    """Spine 3 holds partition 0's share of groups (e.g. the group of an unspan it has not read yet), so
    it refuses GPU 0's create of (0, 2); leaf 1 took the span through spine 2 and holds the group
    until the creator leaf's undo comes back (a round trip through spine 2). GPU 2 binds it and sends
    a contribution to chunk 1 meanwhile: its leaf's partial goes to spine 3."""
    fabric = Fabric(nvlink(spines=2))
    leaf0, leaf1, spine2, spine3 = fabric.switches
    for k in range(spine3.group_share):
        spine3.groups.create((0, 2), -1, f"other{k}", 0, group_id=1000 + k, inputs=(0, 1), stage="spine")
    spans = leaf0.on_packet(0, _group_packet("create", members=(0, 2), name="c"))
    gid = spans[0].packet.info.group
    answers = []  # to the creator leaf: held until GPU 2 has sent
    for send in spans:
        switch = fabric.switches[send.switch]
        for out in switch.on_switch(0, send.packet):
            if out.switch == 1:
                answers += [(1, a) for a in leaf1.on_switch(send.switch, out.packet)]
            else:
                answers.append((send.switch, out))
    assert spine3.groups.groups.get(gid) is None and gid in leaf1.groups.groups
    bind = fabric.gpu(2, _group_packet("bind", gid))
    packet, payload = _in_switch(Kind.REDUCE, gid)
    sends = leaf1.on_packet(2, packet, payload) if bind[0].packet.info == {"group": gid} else []
    for send in sends:
        if send.switch == 3:
            spine3.on_switch(1, send.packet, send.payload)
    for frm, send in answers:  # the create is refused and undone everywhere
        fabric.flow(frm, [send])
    assert all(gid not in s.groups.groups for s in fabric.switches)


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
                    rank._credit_drained()
        return held

    def deliver(self, held):
        for frm, dest, packet, payload in held:
            self.ranks[dest]._handle(frm, packet, payload)
        self.pump()


@pytest.mark.xfail(strict=True, reason="not fixed: a spine that drops a multicast store of a released group "
                   "(SpineLogic._store: late_stores) returns nothing, while the sender's leaf took credit for "
                   "each member of the other nodes (ranks/switch.py _send_all); that credit never comes back, so "
                   "every later transfer of the sender's node towards those members is held for good")
def test_a_store_dropped_at_a_spine_gives_its_credit_back():
    """2 nodes x 2 GPUs, 2 spines, one tenant; credit_bytes = 64 KiB / (2 + 2) / 1 = 16 KiB. GPU 2 (node 1)
    stores 16 KiB through group (0, 2) under chunk 0, which goes to spine 3; the creator member GPU 0
    releases the group meanwhile, and spine 3 reads leaf 0's unspan before leaf 1's store (two
    senders), so it drops the store. Leaf 1 keeps 16 KiB of credit for GPU 0 in use for good: honest
    GPU 3's next message to GPU 0, of any size, is held (the credit it asks for never comes). An honest
    store while the group lives gives its credit back in full (the check below)."""
    fabric = _Ranks(nvlink(spines=2, switch_buffer_bytes=1 << 16, chunk_bytes=4096))
    leaf1 = fabric.leaf(2)
    assert leaf1.credit_bytes == 16384
    fabric.gpu(0, _group_packet("create", members=(0, 2), name="c"))
    ((_, reply),) = fabric.to_gpus
    gid = reply.info["group"]
    for g in (0, 2):
        fabric.gpu(g, _group_packet("bind", gid))
    data = np.ones(16384, np.uint8)
    store = Packet(Kind.MCAST, 0, -1, 0, data.nbytes, info=McastInfo(gid, ("c", 0)))
    fabric.gpu(2, store, data)  # live group: its copy reaches GPU 0 and the credit comes back
    assert leaf1._credit_used.get(0, 0) == 0
    on_cable = fabric.gpu(2, store, data, hold=lambda frm, dest, packet: packet.kind is Kind.MCAST)
    assert [(frm, dest) for frm, dest, _, _ in on_cable] == [(5, 7)]  # leaf 1 -> spine 3
    assert leaf1._credit_used[0] == 16384
    fabric.gpu(0, _group_packet("release", gid))
    fabric.deliver(on_cable)
    assert fabric.ranks[7].logic.late_stores == 1  # dropped at spine 3
    message = Packet(Kind.MSG, 0, leaf1.logic.route_key(0), 0, 64, info=MsgInfo(("m",)))
    leaf1._congested(3, message)  # held: leaf 1 asks leaf 0 for GPU 0's credit
    fabric.pump()
    assert not leaf1._congested(3, message), f"GPU 3's 64-byte message to GPU 0 is held: " \
                                             f"{leaf1._credit_used[0]} bytes of credit never came back"


@pytest.mark.xfail(strict=True, reason="not fixed: the requester's leaf refuses a second load-reduce of a result key "
                   "awaited already, not one of a slot awaited already under another key; every member files a "
                   "LOAD by (group, bound buffer, slot) (ranks/gpu.py, _loads) and keeps the later one, so the "
                   "honest requester's result never comes (its reduce_scatter ends in FabricTimeout)")
def test_a_member_cannot_load_reduce_another_requester_s_slot_under_its_own_key():
    """Group (0, 1, 2, 3); GPU 3 asks for slot (0, 3, 0, 3) - its block 3, chunk 0, as nvls.py names it
    (seq, r, c, r + c) - under its result key. GPU 0 then asks for the same slot under a key of its own.
    Each request has its own leaf (leaf 1, leaf 0), so no leaf's table of load-reduces sees both; both
    are passed on, and every member gets two LOADs that its program cannot tell apart: it serves one."""
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
