"""Multicast and NVLS across nodes at a leaf: a member's multicast stores through a group spanning nodes (a
copy to each member here, one up to a spine, copies down from the spines), and the bookkeeping of nvls's
load-reduces (the requests awaiting their result, the LOADs sent to each member and not yet answered, the
members' notices "unserved"), each within its budget (fabric.budget). The design: docs/design/architecture.md."""

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..budget import honest_loads
from ..errors import AccessViolation, CollectiveMismatch, FabricError, ProtocolError
from ..groups import ByGroup, Key
from ..packets import GroupInfo, Kind, LoadInfo, McastInfo, Packet, raw_bytes
from ..reduction import check_dtype, check_op
from .ingress import check_requester
from .room import LeafRoom
from .send import Send

if TYPE_CHECKING:  # for annotations only
    from ..groups import Group

# LOADs of spanning groups a leaf keeps unanswered to one local GPU (a REDUCE answer or its notice "unserved"
# answers one), at least: ranks/switch.MAX_UNREAD, the answers a GPU may leave unread on one switch; a config
# whose honest nvls keeps more (honest_loads) gets twice that (NvlsLoads.max_loads)
MAX_LOADS = 1024


class Stores(LeafRoom):
    """A leaf's multicast stores across nodes; no state of their own (each member's share of the uplink is
    the spanning room's member_clock, the released groups' members its released_members)."""

    def store_spine(self, group: "Group", ingress: int, key: tuple[int | str, ...]) -> int:
        """The spine (switch index) member `ingress`'s store under `key` goes up to: (p + c) mod P, p the
        member's rank in the group, c = key[-1] (the chunk); ProtocolError if key[-1] is no chunk number."""
        chunk = key[-1]
        if type(chunk) is not int or chunk < 0:
            raise ProtocolError(f"MCAST from GPU {ingress}: group {group.group_id} spans nodes, and its key "
                                f"{list(key)} ends in {chunk!r}, not a chunk number (the last entry picks the spine)")
        return self.topology.nodes + (group.members.index(ingress) + chunk) % self.topology.spines

    def remote_members(self, gid: int) -> tuple[int, ...]:
        """Members of group `gid` in other nodes (a store of a local member reaches each of them), or ()."""
        group = self.groups.groups.get(gid)
        return () if group is None else tuple(g for g in group.members if g not in self.local)

    def store_targets(self, gid: int) -> tuple[int, ...]:
        """This node's members of spanning group `gid`, live or recently released: the ports a store from
        another node is for (and whose credit it took at the sender's leaf)."""
        group = self.groups.groups.get(gid)
        return group.inputs if group is not None else self.leaf.spanning.released_members(gid)

    def store_span(self, ingress: int, group: "Group", packet: Packet, payload: np.ndarray) -> list[Send]:
        """A member's multicast store through a group spanning nodes: a copy to each member of this node
        (the sender's own included), one copy up to spine store_spine(...) on the sender's share of the
        node's uplink to it (U / (G P), booked here in the sender's packet order), src stamped with the
        sender, for the spine to send on to the group's other leaves."""
        info = cast(McastInfo, packet.info)  # a store is an MCAST packet, which carries one (Packet checks)
        spine = self.store_spine(group, ingress, info.key)
        out = self.leaf.through(packet)
        raw = raw_bytes(packet.nbytes, self.config.mtu_bytes, self.config.header_bytes)
        t_start, t_end = self.leaf.spanning.member_clock(ingress, spine).send(out.t_start, out.t_end, raw)
        self.counters.record(f"sw{self.switch}->sw{spine}", packet.nbytes)
        self.leaf.event({"ev": "mcast", "group": info.group, "from": ingress, "bytes": packet.nbytes,
                         "copies": len(group.inputs), "spine": spine, "m": out.t_start})
        up = Packet(Kind.MCAST, self.leaf.route_key(ingress), -1, 0, packet.nbytes,
                    info=McastInfo(info.group, info.key), t_start=t_start, t_end=t_end)
        return [self.leaf.deliver(port, info.group, info.key, payload, out.t_start, out.t_end, None)
                for port in group.inputs] + [Send(-1, up, payload, None, spine)]

    def store_in(self, spine: int, packet: Packet, payload: np.ndarray) -> list[Send]:
        """A store of a GPU of another node that spine `spine` sent down: a copy to each member of this
        node. Taken only for a group that spans this leaf and from a member of another node (the spines
        are trusted: anything else is a bug, ProtocolError)."""
        info, here = cast(McastInfo, packet.info), f"switch {self.switch}"  # an MCAST packet carries one
        self.counters.record(f"sw{spine}->sw{self.switch}", packet.payload_bytes)
        group = self.groups.groups.get(info.group)
        if group is None and self.leaf.spanning.is_released(info.group):
            return []  # it crossed its group's release on the way (ranks/switch returns its credit)
        sender = self.leaf.gpu_of_key(packet.src)
        if group is None or group.stage != "leaf" or sender not in group.members or sender in self.local:
            raise ProtocolError(f"{here}: a store of group {info.group} from spine {spine} for GPU {packet.src!r}: "
                                + ("no group spanning this leaf" if group is None or group.stage != "leaf" else
                                   f"not a member of another node (members {list(group.members)})"))
        out = self.leaf.through(packet)
        # a copy only to members that bound the group, as on one switch (ranks/switch returns the credit
        # of the others' copies)
        return [self.leaf.out(self.leaf.deliver(port, info.group, info.key, payload, out.t_start, out.t_end, sender))
                for port in group.inputs if port in group.bound]



class NvlsLoads(LeafRoom):
    """A leaf's load-reduces of groups spanning nodes: those its GPUs asked, awaiting their result, and the
    LOADs it sent its GPUs, awaiting their answer."""

    def __init__(self, leaf: Any) -> None:
        super().__init__(leaf)
        # load-reduces of this leaf's GPUs awaiting their result, (group, result key) -> (partition, slot), the
        # same by (group, slot) -> result key (a member's notice "unserved" names the slot), and their number
        # per partition (at most leaf.partial_share_parts: every LOAD they send costs every member)
        self._asked: ByGroup[tuple[int, tuple[int, ...]]] = ByGroup()
        self._asked_slot: dict[tuple[int, tuple[int, ...]], tuple[int | str, ...]] = {}
        self._asked_count: dict[int, int] = {}
        # LOADs sent to local GPUs of spanning groups and not yet answered, (group, slot, port), and their
        # number per port (at most max_loads); requests dropped here for that bound; the most held at once
        self._loaded: ByGroup[None] = ByGroup()  # a set of them (the values None)
        self._loaded_count: dict[int, int] = {}
        # the bound: MAX_LOADS, or twice what honest nvls keeps (a larger buffer share or a smaller NVLS chunk)
        self.max_loads = max(MAX_LOADS, 2 * honest_loads(self.config))
        self.dropped_loads = 0
        self.peak_loads = 0

    def drop_group(self, gid: int) -> None:
        """Group `gid` is released here: its load-reduces awaiting a result and its LOADs unanswered are done."""
        for key in self._asked.of(gid):
            self.load_answered(*key)
        for key in self._loaded.of(gid):  # their answers are dropped with the group
            self.load_done(*key)

    def reduce_across(self, ingress: int, packet: Packet, group: "Group", info: LoadInfo) -> list[Send]:
        """GPU `ingress`'s LOAD_REDUCE of a spanning group: header-only LOADs to this node's members (rank
        order) and the request, header-only, up to spine slot[-1] mod P, which passes it to the group's
        other leaves (spine.SpineLogic._load_reduce_on). The members' REDUCE answers make each leaf's partial
        (spanning.Spanning.partial_up); the result comes back to this leaf alone, for the requester."""
        try:
            check_op(info.op)
            check_dtype(info.dtype)
        except FabricError as exc:
            raise FabricError(f"LOAD_REDUCE from GPU {ingress}: {exc}") from None
        if tuple(info.dest) != (ingress,):
            raise AccessViolation(f"LOAD_REDUCE from GPU {ingress}: group {info.group} spans nodes, and a "
                                  f"load-reduce's result goes to its requester only, not to {list(info.dest)}")
        if not info.slot:
            raise ProtocolError(f"LOAD_REDUCE from GPU {ingress}: group {info.group} spans nodes, and its slot [] "
                                f"names no chunk (the last entry picks the spine)")
        check_requester(ingress, group, info)
        if (info.group, info.key) in self._asked or (info.group, tuple(info.slot)) in self._asked_slot:
            # members file a slot's LOADs under the slot alone: two requests of one slot would be one to them
            raise CollectiveMismatch(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: "
                                     f"result key {list(info.key)} or the slot is awaited already")
        if not self._may_load(group, info):  # as if a member here refused it: the requester hears nothing
            return []
        asked = self._asked_count.get(group.partition, 0)
        self.leaf.check_partial_share("LOAD_REDUCE", ingress, info, group.partition, asked,
                                      "load-reduces awaiting their result")
        self._asked[(info.group, info.key)] = (group.partition, tuple(info.slot))
        self._asked_slot[(info.group, tuple(info.slot))] = info.key
        self._asked_count[group.partition] = asked + 1
        ready = packet.t_end + self.timing.switch_latency_ns
        spine = self.topology.nodes + info.slot[-1] % self.topology.spines
        self.counters.record(f"sw{self.switch}->sw{spine}", 0)
        # header-only: the cable's latency (several nodes: set), booked on no share
        up = ready + cast(float, self.config.uplink_latency_ns)
        request = packet.but(src=self.leaf.route_key(ingress), t_start=up, t_end=up)
        return [*self._loads(group, packet, info, ready), Send(-1, request, None, -1, spine)]

    def _may_load(self, group: "Group", info: LoadInfo) -> bool:
        """Whether this leaf may LOAD `info`'s slot from each of its members of `group`: none has a LOAD of
        that slot unanswered (members file LOADs under the slot alone) or max_loads of them; else the
        request is dropped (counted in dropped_loads) and the requester's place in the budget given back."""
        slot = tuple(info.slot)
        if all((info.group, slot, port) not in self._loaded and self._loaded_count.get(port, 0) < self.max_loads
               for port in group.inputs):
            return True
        self.dropped_loads += 1
        self.leaf.event({"ev": "load-dropped", "group": info.group, "slot": list(slot)})
        return False

    def load_done(self, gid: int, slot: tuple[int, ...], port: int) -> bool:
        """Member `port`'s answer (REDUCE or "unserved") to the LOAD of `slot` of group `gid`: whether one
        was sent it and not yet answered (now it is)."""
        if (gid, slot, port) not in self._loaded:
            return False
        del self._loaded[(gid, slot, port)]
        self._loaded_count[port] -= 1
        return True

    def load_answered(self, gid: int, key: Key) -> None:
        """The load-reduce awaiting result `key` of group `gid` (if one of this leaf's GPUs asked) is done."""
        asked = self._asked.pop((gid, key), None)
        if asked is not None:
            partition, slot = asked
            del self._asked_slot[(gid, slot)]
            self._asked_count[partition] -= 1

    def load_refused(self, gid: int, slot: tuple[int, ...]) -> list[Send]:
        """A member will not serve the LOAD of `slot` of group `gid` (or a leaf dropped the request): the
        load-reduce of this leaf's GPU awaiting it, if any, gives its place in the budget back. Its
        requester hears nothing from the switch: it serves the same range of its own buffer (of the
        call's size, as every honest member's) and refuses it too, or its wait ends at its deadline."""
        key = self._asked_slot.get((gid, slot))
        if key is not None:
            self.load_answered(gid, key)
        return []

    def unserved(self, ingress: int, info: GroupInfo) -> list[Send]:
        """GPU `ingress`'s notice that it will not serve the LOAD of slot info.members of group info.group
        (ranks/gpu.serve_load): on to the requester's leaf (slot[1]: its rank, as reduce_across
        checks), through spine slot[-1] mod P if it is another node's. Nothing answers a notice; one for
        a group not live here (it crossed the group's release) is dropped."""
        group = self.groups.groups.get(info.group)
        if group is None:
            return []
        self.groups.group(info.group, ingress, "load refusal", bound=True)  # a bound member's only
        slot = tuple(info.members)
        if group.stage != "leaf":
            return []  # one switch keeps no budget of load-reduces
        if len(slot) < 2 or not 0 <= slot[1] < len(group.members):
            raise ProtocolError(f"load refusal by GPU {ingress}: group {info.group} spans nodes, and slot {list(slot)} "
                                f"names no requester's rank second (0..{len(group.members) - 1})")
        if not self.load_done(info.group, slot, ingress):  # one notice per LOAD: so notices are bounded by LOADs
            raise AccessViolation(f"load refusal by GPU {ingress}: group {info.group} slot {list(slot)}: switch "
                                  f"{self.switch} sent GPU {ingress} no LOAD of it that is unanswered")
        if group.members[slot[1]] in self.local:
            return self.load_refused(info.group, slot)
        notice = Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unserved", info.group, slot, ""))
        return [Send(-1, notice, switch=self.topology.nodes + slot[-1] % self.topology.spines)]

    def _loads(self, group: "Group", packet: Packet, info: LoadInfo, ready: float) -> list[Send]:
        """Header-only LOADs of `packet`'s range to this leaf's members of `group`, ready at `ready` ns, each
        awaiting its member's answer (_may_load checked it fits)."""
        slot = tuple(info.slot)
        for port in group.inputs:
            self._loaded.add((info.group, slot, port))
            self._loaded_count[port] = count = self._loaded_count.get(port, 0) + 1
            self.peak_loads = max(self.peak_loads, count)
        load = Packet(Kind.LOAD, -1, 0, packet.address, packet.nbytes, packet.req, info, ready, ready)
        return [Send(port, load.but(dst=self.leaf.route_key(port)), origin=-1) for port in group.inputs]

    def loads_asked(self, spine: int, packet: Packet) -> list[Send]:
        """Another node's load-reduce, passed on by spine `spine`: LOADs to this node's members. A request
        of a group released on its way is dropped; one for members here that have not bound the group is
        dropped too, and its requester's leaf told ("unserved"); anything else that does not fit is a
        switch's bug."""
        self.counters.record(f"sw{spine}->sw{self.switch}", 0)
        info = cast(LoadInfo, packet.info)  # a LOAD_REDUCE packet carries one (Packet checks)
        group = self.groups.groups.get(info.group)
        if group is None and self.leaf.spanning.is_released(info.group):
            return []
        if group is None or group.stage != "leaf":
            raise ProtocolError(f"switch {self.switch}: LOAD_REDUCE of group {info.group} from spine {spine}, which "
                                f"spans no nodes of this leaf")
        if not group.ready or not self._may_load(group, info):
            # a LOAD only to members that bound the group, as on one switch: the request waits for no one
            # (honest members bind before any call: comm.py's exchange after the binds), nor past a member's
            # max_loads; its requester's leaf gives its budget back (the spine passes the notice on)
            notice = GroupInfo("unserved", info.group, tuple(info.slot), "")
            return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=notice), switch=spine)]
        ready = packet.t_end + self.timing.switch_latency_ns
        return [self.leaf.out(send) for send in self._loads(group, packet, info, ready)]

