"""A spine switch's decisions (`SpineLogic`): it passes each transfer a leaf sends up on to the leaf of its
destination GPU, and holds its copy of every group spanning nodes: it reduces the leaves' partials and sends
each result down, copies a member's multicast store down to the group's other leaves, passes a load-reduce
on, and relays a group's creation and release between leaves. The design: docs/design/architecture.md."""

import math
from typing import Any, cast

import numpy as np

from ..addressing import assign_network_addresses
from ..config import FabricConfig
from ..counters import LinkCounters
from ..errors import AccessViolation, FabricError, ProtocolError, ResourceExhausted
from ..groups import ByGroup, Group, GroupTable
from ..packets import GroupInfo, Kind, LoadInfo, McastInfo, Packet, ReduceInfo, raw_bytes
from ..timemodel import LinkEnd
from .send import Send
from .spanning import note_seen, released, remember_gone, why


class SpineLogic:
    """A spine switch's decisions: pass each transfer a leaf sends up on to the leaf of its
    destination GPU (fabric.topology's route), count both links (cut-through; it books nothing).
    It holds no Link TLB and no GPU's state: every decision about a transfer was made at a leaf, the
    only ranks a spine takes packets from."""

    def __init__(self, config: FabricConfig, switch: int):
        self.config = config
        self.topology = topology = config.topology
        self.switch = switch
        if not topology.nodes <= switch < len(topology.switches):
            raise FabricError(f"spine: switch {switch} is not a spine of fabric {config.name!r} (spines are "
                              f"{topology.nodes}..{len(topology.switches) - 1})")
        addresses = assign_network_addresses(config.gpus) if config.mode == "network" else range(config.gpus)
        self._gpu_of = {key: gpu for gpu, key in enumerate(addresses)}
        self.counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        # through the spine and down to the leaf: one traversal (the spine's own switch latency) and the
        # link's latency; the transfer is timed on its receiver's inbound share, which the receiver books
        # (fabric.topology, Shares)
        # both set on a fabric of several nodes (topology.spine_latency_ns: the leaves' if not given)
        self.traversal_ns = cast(float, topology.spine_latency_ns)
        self.latency_ns = self.traversal_ns + cast(float, config.uplink_latency_ns)
        self.tracing = False  # a spine makes no decisions worth a trace record beyond the packets
        self.events: list[dict[str, Any]] = []
        # spanning groups (docs/design/architecture.md, Spanning groups): their copies here, whose inputs are leaves,
        # and each GPU's share of its node's uplink from this spine (U / (G P)), which its part of every
        # result for its node takes, whatever the group (_result_down)
        self.timing = config.timing
        self.groups = GroupTable()
        self.group_share = max(1, self.groups.limit // len(config.partitions))
        self._member_down: dict[int, LinkEnd] = {}
        self._seen: dict[int, int] = {}  # creator leaf -> the highest k of its group ids held here (spanning.released)
        self.peak_held_bytes = 0
        self.late_partials = 0  # partials of a group released while they were on their way (dropped)
        # multicast stores: the down clocks (group, sender, leaf), the sender's part of the group's shares
        # of that node's uplink from this spine; stores of a released group dropped on their way
        self._store_down: ByGroup[LinkEnd] = ByGroup()  # (group, sender, leaf) -> its down clock
        self.late_stores = 0
        # the members of released spanning groups (the most recent GONE_KEPT): a store dropped here took
        # credit at its sender's leaf for each member of another node, which this spine returns
        self._gone: dict[int, tuple[int, ...]] = {}
        self._key_of = list(addresses)

    def gpu_of_key(self, key: int) -> int | None:
        """The GPU whose routing key `key` is, or None."""
        return self._gpu_of.get(key)

    def route_key(self, gpu: int) -> int:
        """GPU `gpu`'s routing key (its network address; classic mode: its index)."""
        return self._key_of[gpu]

    def dropped_store_ports(self, gid: int, sender: int) -> tuple[int, ...]:
        """The members outside GPU `sender`'s node of released group `gid` (if this spine still knows it):
        the ports whose credit a store of `sender` dropped here took at its leaf."""
        per_node = self.config.gpus_per_node
        return tuple(g for g in self._gone.get(gid, ()) if g // per_node != sender // per_node)

    def on_packet(self, leaf: int, packet: Packet, payload: np.ndarray | None = None) -> Send:
        """The Send (towards GPU `port`, by its leaf) of `packet` that leaf switch `leaf` sent up."""
        self.counters.record(f"sw{leaf}->sw{self.switch}", packet.payload_bytes)
        gpu = self._gpu_of.get(packet.dst)
        if gpu is None or gpu // self.config.gpus_per_node == leaf:
            raise ProtocolError(f"spine {self.switch}: {packet.kind.name} from leaf {leaf} for {packet.dst!r}, "
                                f"which is no GPU of another node")
        self.counters.record(f"sw{self.switch}->sw{gpu // self.config.gpus_per_node}", packet.payload_bytes)
        return Send(gpu, packet.but(t_start=packet.t_start + self.latency_ns, t_end=packet.t_end + self.latency_ns),
                    payload)

    def next_switch(self, port: int) -> int:
        """The leaf a Send to GPU `port` goes to."""
        return port // self.config.gpus_per_node

    def on_switch(self, leaf: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send for in-switch traffic of a spanning group from leaf switch `leaf` (fabric.switch's
        Spanning groups): a partial, a group's creation or release, a leaf's answer to one. Only the
        leaves of a group's nodes contribute to it; anything else is refused (AccessViolation naming the
        spine, the leaf, the group and the operation), a bug of a leaf, which ends the run."""
        kind, info = packet.kind, packet.info
        nodes, here = self.topology.nodes, f"spine {self.switch}"
        first = self.switch == nodes  # the spine that relays a group's creation and answers between leaves
        if kind is Kind.REDUCE:
            info = cast(ReduceInfo, info)  # a REDUCE packet carries one (Packet checks)
            self.counters.record(f"sw{leaf}->sw{self.switch}", packet.payload_bytes)
            group = self.groups.groups.get(info.group)
            if group is None and released(self.groups, self._seen, nodes, info.group):
                self.late_partials += 1  # it crossed its group's release, which its leaf freed it with
                return []
            if group is None or leaf not in group.inputs:
                raise AccessViolation(f"{here}: partial REDUCE of group {info.group} slot {list(info.slot)} from leaf "
                                      f"{leaf}: " + (f"no live group {info.group}" if group is None else
                                                     f"leaf {leaf} is no leaf of the group's nodes {list(group.inputs)}"))
            try:
                done = self.groups.contribute(info.group, info.slot, leaf, info.op, info.dtype,
                                              cast(np.ndarray, payload),  # a partial carries its bytes
                                              (info.dest, info.key), (packet.t_start, packet.t_end))
            except FabricError as exc:
                # the nodes disagree on this slot (their members' calls, or a member that lies; each leaf
                # checked its own): every member hears it, as on one switch the sender does, and the spine
                # serves on; the slot's held partials stay until the group's release
                reason = why(exc, f"{here}: group {info.group} slot {list(info.slot)}: ")
                ready = packet.t_end + self.latency_ns  # when the refused partial's last byte is in, at a leaf
                failed = Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("failed", info.group, (), reason),
                                t_start=ready, t_end=ready)
                return [Send(-1, failed, switch=node) for node in group.inputs]
            if done is None:
                self.peak_held_bytes = max(self.peak_held_bytes, self.groups.held_bytes)
                return []
            result, (dest, key), (first_ns, last_ns) = done
            delay = self.traversal_ns
            raw = raw_bytes(result.nbytes, self.config.mtu_bytes, self.config.header_bytes)
            start, end = self.groups.engine(info.group, self.timing).reduce(first_ns + delay, last_ns + delay, raw)
            sends = []
            wanted = {g // self.config.gpus_per_node for g in dest}
            for node in group.inputs:
                if node not in wanted:  # no destination there (reduce_scatter): a notice, no bytes
                    notice = GroupInfo("reduced", info.group, tuple(info.slot), "")
                    sends.append(Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=notice), switch=node))
                    continue
                t_start, t_end = self._result_down(group, node, start, end, raw)
                self.counters.record(f"sw{self.switch}->sw{node}", result.nbytes)
                down = Packet(Kind.MCAST, -1, -1, 0, result.nbytes, info=McastInfo(info.group, key),
                              t_start=t_start, t_end=t_end)
                sends.append(Send(-1, down, result, -1, node))
            return sends
        if kind is Kind.LOAD_REDUCE:
            return self._load_reduce_on(leaf, packet)
        if kind is Kind.MCAST:
            return self._store(leaf, packet, cast(np.ndarray, payload))  # a store carries its bytes
        if kind is not Kind.GROUP:
            raise ProtocolError(f"{here}: {kind.name} from leaf {leaf} is no spanning group's traffic")
        info = cast(GroupInfo, info)  # a GROUP packet carries one (Packet checks)
        creator = info.group % nodes
        if info.action == "span":
            try:
                partition = self.config.partition_of(info.members[0])
                if self.groups.count_in(partition) >= self.group_share:
                    raise ResourceExhausted(f"{here}: cannot hold group {info.group} for GPUs {list(info.members)}: "
                                            f"partition {partition} holds {self.group_share} groups here, its share "
                                            f"(the limit is {self.groups.limit} per switch)")
                inputs = tuple(sorted({g // self.config.gpus_per_node for g in info.members}))
                self.groups.create(info.members, -1, info.name, partition, group_id=info.group, inputs=inputs,
                                   stage="spine", who=here)
                note_seen(self._seen, nodes, info.group)
                answer = GroupInfo("spanned", info.group, (), "")
            except FabricError as exc:
                note_seen(self._seen, nodes, info.group)  # what comes for it is dropped, as if released
                answer = GroupInfo("refused", info.group, (), why(exc))
            return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=answer), switch=leaf)]
        if info.action == "spread":  # every spine took the creator leaf's group: its span on to the other leaves
            others = sorted({g // self.config.gpus_per_node for g in info.members} - {leaf})
            span = packet.but(info=GroupInfo("span", info.group, info.members, info.name))
            return [Send(-1, span, switch=node) for node in others]
        if info.action == "unspan":
            if info.group in self.groups.groups:
                remember_gone(self._gone, info.group, self.groups.groups[info.group].members)
                self.groups.release(info.group, self.groups.groups[info.group].inputs[0])
            for key in self._store_down.of(info.group):
                del self._store_down[key]
            if first:
                group_nodes = range(nodes)  # the leaves that hold it: whoever took the span
                return [Send(-1, packet, switch=node) for node in group_nodes if node != leaf]
            return []
        if info.action in ("spanned", "refused") and first:  # a leaf's answer, on to the creator leaf
            return [Send(-1, packet, switch=creator)]
        if info.action == "unserved":  # a LOAD a leaf's member will not serve: on to the requester's leaf
            group = self.groups.groups.get(info.group)
            if group is None and released(self.groups, self._seen, nodes, info.group):
                return []
            slot = tuple(info.members)
            requester = group.members[slot[1]] if group is not None and 2 <= len(slot) and \
                0 <= slot[1] < len(group.members) else None
            # a requester comes from a live group
            if requester is None or leaf not in cast(Group, group).inputs or \
                    requester // self.config.gpus_per_node == leaf:
                raise ProtocolError(f"{here}: load refusal of group {info.group} slot {list(slot)} from leaf {leaf}, "
                                    f"which is no other node's refusal of a live group's request")
            return [Send(-1, packet, switch=requester // self.config.gpus_per_node)]
        raise ProtocolError(f"{here}: GROUP {info.action!r} from leaf {leaf}")

    def _result_down(self, group: Group, node: int, start: float, end: float, raw: int) -> tuple[float, float]:
        """When a result of `raw` bytes leaving the engine at start..end (ns) reaches leaf `node`: it takes
        the group's shares of that node's uplink from this spine together (m x U / (G P), m its members
        there), each member's part of it (1/m of its bytes) that member's own share, booked here in the
        spine's completion order and shared by every group of the member (as Spanning.member_part on the way up);
        the result is at the leaf once every part is."""
        per_node = self.config.gpus_per_node
        local = [g for g in group.members if g // per_node == node]
        first = last = -math.inf
        for gpu in local:
            clock = self._member_down.get(gpu)
            if clock is None:
                share = cast(float, self.topology.share_gbytes_per_s)  # a spine's fabric has several nodes
                clock = self._member_down[gpu] = LinkEnd(share / self.topology.spines,
                                                         cast(float, self.config.uplink_latency_ns))
            a, b = clock.send(start, end, raw / len(local))
            first, last = max(first, a), max(last, b)
        return first, last

    def _load_reduce_on(self, leaf: int, packet: Packet) -> list[Send]:
        """A requester's leaf's LOAD_REDUCE (header-only), on to the group's other leaves, each of which
        loads its members' range and sends its partial here. Only a leaf of the group's nodes, for a
        requester of its own node, asks; anything else is a leaf's bug (AccessViolation, ends the run).
        A request of a group released on its way is dropped."""
        self.counters.record(f"sw{leaf}->sw{self.switch}", 0)
        info = cast(LoadInfo, packet.info)  # a LOAD_REDUCE packet carries one (Packet checks)
        group = self.groups.groups.get(info.group)
        if group is None and released(self.groups, self._seen, self.topology.nodes, info.group):
            return []
        per_node = self.config.gpus_per_node
        if group is None or leaf not in group.inputs or any(g // per_node != leaf for g in info.dest):
            raise AccessViolation(f"spine {self.switch}: LOAD_REDUCE of group {info.group} slot {list(info.slot)} from "
                                  f"leaf {leaf} for GPUs {list(info.dest)}: " + (
                                      f"no live group {info.group}" if group is None else
                                      f"not a requester of the group's node {leaf} among nodes {list(group.inputs)}"))
        on = packet.but(t_start=packet.t_start + self.latency_ns, t_end=packet.t_end + self.latency_ns)
        sends = []
        for node in group.inputs:
            if node != leaf:
                self.counters.record(f"sw{self.switch}->sw{node}", 0)
                sends.append(Send(-1, on, None, -1, node))
        return sends

    def _store(self, leaf: int, packet: Packet, payload: np.ndarray) -> list[Send]:
        """A member's multicast store that leaf `leaf` sent up (multicast.Stores.store_span): one copy down to
        each other leaf the group spans, each on the down clock (group, sender, leaf): the group's shares
        of that node's uplink from this spine (m_k x U / (G P), m_k its members), an equal part for each of
        the n - m_k members outside it, booked here in the sender's order. Taken only from a leaf of the
        group's nodes, for a member in that leaf's node (AccessViolation otherwise: a leaf's bug)."""
        info, here = cast(McastInfo, packet.info), f"spine {self.switch}"  # an MCAST packet carries one
        self.counters.record(f"sw{leaf}->sw{self.switch}", packet.payload_bytes)
        group = self.groups.groups.get(info.group)
        if group is None and released(self.groups, self._seen, self.topology.nodes, info.group):
            self.late_stores += 1  # it crossed its group's release
            return []
        per_node = self.config.gpus_per_node
        sender = self._gpu_of.get(packet.src)
        if group is None or leaf not in group.inputs or sender not in group.members or sender // per_node != leaf:
            raise AccessViolation(f"{here}: multicast store of group {info.group} key {list(info.key)} from leaf "
                                  f"{leaf} for GPU {packet.src!r}: " + (
                                      f"no live group {info.group}" if group is None else
                                      f"leaf {leaf} is no leaf of the group's nodes {list(group.inputs)}"
                                      if leaf not in group.inputs else
                                      f"not a member of the group in node {leaf} (members {list(group.members)})"))
        delay = self.traversal_ns
        raw = raw_bytes(packet.payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        sends = []
        for node in group.inputs:
            if node == leaf:
                continue
            clock = self._store_down.get((info.group, sender, node))
            if clock is None:
                local = sum(1 for g in group.members if g // per_node == node)
                share = cast(float, self.topology.share_gbytes_per_s)  # a spine's fabric has several nodes
                clock = self._store_down[(info.group, sender, node)] = LinkEnd(
                    share * local / (self.topology.spines * (len(group.members) - local)),
                    cast(float, self.config.uplink_latency_ns))
            t_start, t_end = clock.send(packet.t_start + delay, packet.t_end + delay, raw)
            self.counters.record(f"sw{self.switch}->sw{node}", packet.payload_bytes)
            sends.append(Send(-1, packet.but(t_start=t_start, t_end=t_end), payload, sender, node))
        return sends
