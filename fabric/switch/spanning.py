"""In-switch groups spanning nodes, at a leaf: the group's copy in every switch it spans (created by its
first member's leaf through every spine, answered once every switch took it, released by that leaf for
all), the partials a leaf sends up (each member's part on its share of the uplink, within the partition's
budget) and the results and notices the spines send down. The design: docs/design/architecture.md."""

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import CollectiveMismatch, FabricError, ProtocolError, ResourceExhausted
from ..groups import ByGroup, GroupTable
from ..packets import MAX_TEXT, GroupInfo, Kind, McastInfo, NackInfo, Packet, ReduceInfo, raw_bytes
from ..reduction import check_dtype, switch_accumulator
from ..timemodel import LinkEnd
from .room import LeafRoom
from .send import Send

if TYPE_CHECKING:  # for annotations only
    from ..groups import Group

GONE_KEPT = 4096  # released spanning groups whose local members a leaf remembers (late stores' credit)


class Spanning(LeafRoom):
    """A leaf's spanning groups: creates awaiting the other switches, spans awaited from the spines, the
    partials sent up and awaiting their result, and each local GPU's share of the uplink to each spine."""

    _partition: list[int]

    def __init__(self, leaf: Any) -> None:
        super().__init__(leaf)
        self._partition = leaf.partition_of_gpu
        # creates waiting for the other switches' answers, gid -> [creator GPU, request, switches yet to
        # answer, errors, switches that took it, leaves still to span]; per partial sent up and not answered,
        # (group, result key) -> (local destinations, bytes); those bytes per partition; each member's part
        # of the partials in flight on its share of the uplink (member_part)
        self._spanning: dict[int, list[Any]] = {}
        self._partials: ByGroup[tuple[tuple[int, ...], int, int]] = ByGroup()  # + the group's partition
        self._partial_bytes: dict[int, int] = {}
        # partials whose result goes to no member here (reduce_scatter's other blocks): (group, slot) ->
        # (bytes, partition), until the spine's notice that it reduced the slot ("reduced")
        self._unanswered: ByGroup[tuple[int, int]] = ByGroup()
        self._partial_parts: dict[int, int] = {}  # and how many (zero-byte partials hold memory too)
        self._parts: ByGroup[tuple[float, float]] = ByGroup()  # (group, slot) -> its members' parts' latest stamps
        self._seen: dict[int, int] = {}  # creator leaf -> the highest k of its group ids held here (released)
        self._failed: set[int] = set()   # groups whose members heard a spine's refusal (once, until released)
        # spanning groups another leaf created, taken here from some spines' spans: gid -> the spines whose
        # span is still to come (the leaf answers, and its members may bind, once none is: _span_in)
        self._spans_due: dict[int, set[int]] = {}
        # each local GPU's share of the node's uplink to each spine (U / (G P)), which its multicast stores
        # and its parts of its groups' partials take, booked here in that GPU's packet order (so every group
        # of a GPU shares it); the local members of released spanning groups (the most recent GONE_KEPT),
        # so that a store crossing its group's release still returns the credit it took
        self._member_up: dict[tuple[int, int], LinkEnd] = {}
        self._gone: dict[int, tuple[int, ...]] = {}

    def pending(self, gid: int) -> bool:
        """Whether group `gid` is being created across nodes here (its members may not bind it yet)."""
        return gid in self._spanning or gid in self._spans_due

    def is_released(self, gid: int) -> bool:
        """Whether spanning group `gid`, not held here, may have been held and released (see released)."""
        return released(self.groups, self._seen, self.topology.nodes, gid)

    def released_members(self, gid: int) -> tuple[int, ...]:
        """This node's members of recently released spanning group `gid` (the last GONE_KEPT), or ()."""
        return self._gone.get(gid, ())

    def on_switch(self, spine: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send for in-switch traffic of a spanning group that spine `spine` sent: a result to copy
        to this node's members, or a group's creation, its answers, its release. The switches trust each
        other: anything that does not fit is a bug (ProtocolError, which ends the run)."""
        kind, info = packet.kind, packet.info
        here = f"switch {self.switch}"
        if kind is Kind.MCAST and packet.src != -1:  # a GPU's store from another node (Stores.store_span)
            return self.leaf.stores.store_in(spine, packet, payload)  # type: ignore[no-any-return]  # (leaf: Any)
        if kind is Kind.MCAST:
            info = cast(McastInfo, info)  # an MCAST packet carries one (Packet checks)
            self.counters.record(f"sw{spine}->sw{self.switch}", packet.payload_bytes)
            got = self._partials.pop((info.group, info.key), None)
            if got is None:
                if self.is_released(info.group):
                    return []  # it crossed its group's release (which freed its partial) on the way down
                raise ProtocolError(f"{here}: a result of group {info.group} key {list(info.key)} from spine {spine}, "
                                    f"for no partial this leaf sent")
            ports, nbytes, partition = got
            self.leaf.nvls.load_answered(info.group, info.key)
            self._free_partial(nbytes, partition)
            out = self.leaf.through(packet)
            return [self.leaf.out(self.leaf.deliver(port, info.group, info.key, payload, out.t_start, out.t_end, -1))
                    for port in ports]
        if kind is Kind.LOAD_REDUCE:
            return self.leaf.nvls.loads_asked(spine, packet)  # type: ignore[no-any-return]
        if kind is not Kind.GROUP:
            raise ProtocolError(f"{here}: {kind.name} from spine {spine} is no spanning group's traffic")
        info = cast(GroupInfo, info)  # a GROUP packet carries one (Packet checks)
        if info.action == "span":  # a group another leaf created, held by every spine already: this node's copy
            return self._span_in(spine, info)
        if info.action == "unspan":
            self.drop_span(info.group)
            return []
        if info.action == "unserved":  # a member of another node will not serve a LOAD of a slot asked here
            return self.leaf.nvls.load_refused(info.group, tuple(info.members))  # type: ignore[no-any-return]
        if info.action == "reduced":  # a slot whose result went to other nodes only: its partial's share back
            share = self._unanswered.pop((info.group, tuple(info.members)), None)  # (bytes, partition)
            if share is None:
                if self.is_released(info.group):
                    return []
                raise ProtocolError(f"{here}: spine {spine} reduced slot {list(info.members)} of group {info.group}, "
                                    f"for no partial this leaf sent")
            self._free_partial(*share)
            return []
        if info.action == "failed":  # a spine refused a slot of the group: this node's members hear why,
            # once until the group's release (each chunk in flight of the call is refused: one NACK per chunk
            # would raise again in their later, unrelated waits)
            group = self.groups.groups.get(info.group)
            if group is None or info.group in self._failed:
                return []
            self._failed.add(info.group)
            error, _, message = info.name.partition(": ")
            return [self._notice(port, error, message, packet.t_end) for port in group.inputs]
        if info.action in ("spanned", "refused"):
            return self._span_answered(packet.req, info)
        raise ProtocolError(f"{here}: GROUP {info.action!r} from spine {spine}")

    def check_partial(self, ingress: int, group: "Group", info: ReduceInfo, payload: np.ndarray) -> None:
        """Before the contribution that completes a leaf's partial is taken: its result key must not be
        awaited already, and the partition's partials in flight must stay within their share."""
        if not info.slot:  # slot[-1] is the chunk, which picks the spine
            raise ProtocolError(f"REDUCE from GPU {ingress}: group {info.group} spans nodes, and its slot [] names "
                                f"no chunk (the last entry picks the spine)")
        state = self.groups.reductions.get((info.group, *info.slot))
        if len(group.inputs) - (len(state.parts) if state else 0) != 1:
            return
        if (info.group, info.key) in self._partials or (info.group, tuple(info.slot)) in self._unanswered:
            raise CollectiveMismatch(f"REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: result "
                                     f"key {list(info.key)} is awaited from the spines already")
        nbytes = payload.nbytes // check_dtype(info.dtype).itemsize * switch_accumulator(check_dtype(info.dtype)).itemsize
        self.leaf.check_partial_share("REDUCE", ingress, info, group.partition,
                                      self._partial_parts.get(group.partition, 0),
                                      "partials at the spines without their result")
        held = self._partial_bytes.get(group.partition, 0)
        if held and held + nbytes > self.leaf.partial_share_bytes:
            raise ResourceExhausted(f"REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: switch "
                                    f"{self.switch} has {held} bytes of partition {group.partition}'s partials at the "
                                    f"spines without their result, and {nbytes} more would pass its share "
                                    f"{self.leaf.partial_share_bytes} (buffer share / nodes)")

    def member_clock(self, gpu: int, spine: int) -> LinkEnd:
        """GPU `gpu`'s share of the node's uplink to spine `spine` (U / (G P)), shared by all its groups."""
        clock = self._member_up.get((gpu, spine))
        if clock is None:  # (spanning nodes: both figures set)
            clock = self._member_up[(gpu, spine)] = LinkEnd(
                cast(float, self.topology.share_gbytes_per_s) / self.topology.spines,
                cast(float, self.config.uplink_latency_ns))
        return clock

    def member_part(self, ingress: int, group: "Group", info: ReduceInfo, packet: Packet, payload: np.ndarray) -> None:
        """Book member `ingress`'s part of its node's partial of `info`'s slot (1/m of its raw bytes, m the
        node's members of the group) on its share of the uplink to spine slot[-1] mod P, ready once its
        contribution has been through the engine (+ s + the engine's latency), in its packet order: every
        group of a GPU books that one share, in an order fixed by that GPU's program."""
        spine = self.topology.nodes + info.slot[-1] % self.topology.spines
        dtype = check_dtype(info.dtype)
        wide = payload.nbytes // dtype.itemsize * switch_accumulator(dtype).itemsize
        raw = raw_bytes(wide, self.config.mtu_bytes, self.config.header_bytes)
        ready = self.timing.switch_latency_ns + self.timing.reduction_latency_ns
        a, b = self.member_clock(ingress, spine).send(packet.t_start + ready, packet.t_end + ready,
                                                      raw / len(group.inputs))
        key = (info.group, tuple(info.slot))
        was = self._parts.get(key, (a, b))
        self._parts[key] = (max(was[0], a), max(was[1], b))

    def partial_up(self, group: "Group", info: ReduceInfo, dest: tuple[int, ...], key: tuple[int | str, ...],
                   partial: np.ndarray, start: float, end: float, raw: int) -> Send:
        """The leaf's partial of `info`'s slot, to spine slot[-1] mod P: its bytes reach the spine once the
        engine's result (+ u) and every member's part on its share (member_part) did; its result will
        come back for the local members of `dest` (none: the spine's notice "reduced" frees its share)."""
        topology = self.topology
        spine = topology.nodes + info.slot[-1] % topology.spines
        first, last = self._parts.pop((info.group, tuple(info.slot)))
        u = cast(float, self.config.uplink_latency_ns)  # spanning nodes: set
        t_start, t_end = max(start + u, first), max(end + u, last)
        self.counters.record(f"sw{self.switch}->sw{spine}", partial.nbytes)
        local = tuple(p for p in dest if p in self.local)
        if local:
            self._partials[(info.group, key)] = (local, partial.nbytes, group.partition)
        else:  # its result goes to other nodes only: the spine tells this leaf once it reduced the slot
            self._unanswered[(info.group, tuple(info.slot))] = (partial.nbytes, group.partition)
        self._partial_bytes[group.partition] = self._partial_bytes.get(group.partition, 0) + partial.nbytes
        self._partial_parts[group.partition] = self._partial_parts.get(group.partition, 0) + 1
        packet = Packet(Kind.REDUCE, -1, -1, 0, partial.nbytes, info=ReduceInfo(
            info.group, info.slot, info.op, info.dtype, dest, key), t_start=t_start, t_end=t_end)
        return Send(-1, packet, partial, -1, spine)

    def _free_partial(self, nbytes: int, partition: int) -> None:
        """A partial of `partition` (nbytes) answered or given up: it leaves the partition's share here."""
        self._partial_bytes[partition] -= nbytes
        self._partial_parts[partition] -= 1

    def span(self, ingress: int, packet: Packet, info: GroupInfo, nodes: list[int]) -> list[Send]:
        """Create spanning group `info` for GPU `ingress`: this leaf's copy, then the other switches'
        (answered once they all took it)."""
        topology = self.topology
        partition = self._partition[ingress]
        gid = self.groups.next_id()
        local = tuple(g for g in info.members if g in self.local)
        self.groups.create(info.members, ingress, info.name, partition, group_id=gid, inputs=local, stage="leaf")
        note_seen(self._seen, topology.nodes, gid)
        spines = range(topology.nodes, topology.nodes + topology.spines)
        # phase 1 the spines; phase 2, once they all took it, the other leaves (docs/design/architecture.md)
        self._spanning[gid] = [ingress, packet.req, set(spines), [], [], [n for n in nodes if n != self.switch]]
        span = Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("span", gid, info.members, info.name))
        return [Send(-1, span, switch=spine) for spine in spines]

    def _span_answered(self, switch: int, info: GroupInfo) -> list[Send]:
        """Switch `switch`'s answer to this leaf's create of group info.group; the create's REPLY once all came."""
        pending = self._spanning.get(info.group)
        if pending is None or switch not in pending[2]:
            raise ProtocolError(f"switch {self.switch}: switch {switch} answered {info.action} for group {info.group}, "
                                f"which it was not asked to hold")
        ingress, req, waiting, errors, took, leaves = pending
        waiting.discard(switch)
        (errors.append(info.name) if info.action == "refused" else took.append(switch))
        if waiting:
            return []
        if leaves and not errors:  # every spine holds it: now the other leaves, through every spine (_span_in)
            waiting.update(leaves)
            leaves.clear()
            group = self.groups.groups[info.group]
            spread = GroupInfo("spread", info.group, group.members, group.name)
            return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=spread), switch=spine)
                    for spine in range(self.topology.nodes, self.topology.nodes + self.topology.spines)]
        del self._spanning[info.group]
        sends = []
        if errors:
            self.drop_span(info.group)
            sends = [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unspan", info.group, (), "")),
                          switch=spine) for spine in range(self.topology.nodes, self.topology.nodes + self.topology.spines)]
            self.leaf.refused[ingress] += 1
            kind, _, message = errors[0].partition(": ")
            reply = {"error": kind, "message": f"GPU {ingress}: group create across nodes refused: {message}"
                                               + (f" (and {len(errors) - 1} more switches)" if len(errors) > 1 else "")}
        else:
            reply = {"group": info.group}
        return sends + [Send(ingress, Packet(Kind.REPLY, src=-1, dst=self.leaf.route_key(ingress), req=req,
                                             info=reply))]

    def _span_in(self, spine: int, info: GroupInfo) -> list[Send]:
        """Spine `spine`'s span of a group another leaf created (every spine sends one, phase 2): the first
        makes this node's copy (or is refused), the others are counted; answered (through the first spine,
        which relays the leaves' answers) once every spine's came, and only then may members bind here: so
        whatever any spine passes on for the group reaches this leaf after that spine's span (MPI's order
        per sender), whichever member sent it. A span of a group refused or undone here meanwhile is dropped."""
        topology = self.topology
        due = self._spans_due.get(info.group)
        if due is None:
            if info.group in self.groups.groups or self.is_released(info.group):
                if info.group in self.groups.groups:
                    raise ProtocolError(f"switch {self.switch}: a second span of group {info.group} from spine {spine}")
                return []  # refused here, or undone by its creator, before this spine's span came
            try:
                self._take_span(info)
            except FabricError as exc:
                note_seen(self._seen, topology.nodes, info.group)  # what comes for it is dropped, as if released
                answer = GroupInfo("refused", info.group, (), why(exc))
                return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=answer), switch=topology.nodes)]
            due = self._spans_due[info.group] = set(range(topology.nodes, topology.nodes + topology.spines))
        if spine not in due:
            raise ProtocolError(f"switch {self.switch}: a second span of group {info.group} from spine {spine}")
        due.discard(spine)
        if due:
            return []
        del self._spans_due[info.group]
        answer = GroupInfo("spanned", info.group, (), "")
        return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=answer), switch=topology.nodes)]

    def _take_span(self, info: GroupInfo) -> None:
        partition = self._partition[info.members[0]]
        if self.groups.count_in(partition) >= self.leaf.group_share:
            raise ResourceExhausted(f"switch {self.switch}: cannot hold group {info.group} for GPUs "
                                    f"{list(info.members)}: partition {partition} holds {self.leaf.group_share} groups "
                                    f"here, its share (the limit is {self.groups.limit} per switch)")
        local = tuple(g for g in info.members if g in self.local)
        self.groups.create(info.members, local[0], info.name, partition, group_id=info.group, inputs=local,
                           stage="leaf", who=f"switch {self.switch}")
        note_seen(self._seen, self.topology.nodes, info.group)

    def _notice(self, port: int, error: str, message: str, t_ns: float) -> Send:
        """A NACK to member `port` for what a spine refused (`error`: a fabric.errors class name; the
        refusal here at `t_ns`, modeled): no packet of this GPU's was refused, none is counted on its port."""
        ready = t_ns + self.timing.switch_latency_ns
        nack = Packet(Kind.NACK, src=-1, dst=self.leaf.route_key(port), req=0,
                      info=NackInfo(error, message[:4000], "REDUCE"), t_start=ready, t_end=ready)
        return self.leaf.out(Send(port, nack, origin=-1))  # type: ignore[no-any-return]  # (leaf: Any)

    def drop_span(self, gid: int) -> None:
        self._spans_due.pop(gid, None)
        # each of these is indexed by group (ByGroup): a release touches only what the group holds
        self.leaf.nvls.drop_group(gid)
        group = self.groups.groups.get(gid)
        if group is not None:
            self.groups.release(gid, group.inputs[0])
            # its partials' results will not come (the spines drop it too): their bytes leave the share
            for key in self._partials.of(gid):
                self._free_partial(self._partials.pop(key)[1], group.partition)
            for key in self._unanswered.of(gid):
                self._free_partial(self._unanswered.pop(key)[0], group.partition)
        self._failed.discard(gid)
        for key in self._parts.of(gid):
            del self._parts[key]
        if group is not None:
            remember_gone(self._gone, gid, group.inputs)



def note_seen(seen: dict[int, int], nodes: int, gid: int) -> None:
    """Note spanning group `gid` (id k x nodes + its creator leaf) as held here (see released)."""
    seen[gid % nodes] = max(seen.get(gid % nodes, 0), gid // nodes)


def remember_gone(gone: dict[int, tuple[int, ...]], gid: int, members: tuple[int, ...]) -> None:
    """Remember released spanning group `gid`'s `members` (a leaf's own, or all at a spine), the most
    recent GONE_KEPT groups only: a store crossing the release took credit for them at its sender's
    leaf, which the switch that drops it returns (ranks/switch.py)."""
    gone[gid] = members
    if len(gone) > GONE_KEPT:
        del gone[next(iter(gone))]


def released(groups: GroupTable, seen: dict[int, int], nodes: int, gid: int) -> bool:
    """Whether spanning group `gid`, not in `groups`, may have been held here and released: each leaf's
    ids grow (k = 1, 2, ...), so one number per creator leaf tells a late packet of a released group
    (dropped) from one of a group not created yet (a switch's bug; one of a group of that leaf's that
    never spanned this switch is dropped too, which only a switch's bug sends)."""
    return gid not in groups.groups and 0 < gid // nodes <= seen.get(gid % nodes, 0)


def why(exc: Exception, context: str = "") -> str:
    """`exc` as a switch tells another switch of it, "Class: message", cut to a header's string field
    (MAX_TEXT characters: a message listing a large group's members is longer, and a switch's packet
    that does not decode ends the run)."""
    return f"{type(exc).__name__}: {context}{exc}"[:MAX_TEXT]
