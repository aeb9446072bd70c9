"""A leaf switch's decisions (`SwitchLogic`): the port map, routing keys and the way out of every port, the
counters and refusals, and the rooms each kind of packet goes to: ingress checks (fabric.switch.ingress),
point-to-point and Link TLB (p2p), in-switch reduction (in_switch), groups spanning nodes (spanning),
multicast stores and NVLS loads across nodes (multicast), the control plane (control)."""

import math
from typing import Any, cast

import numpy as np

from ..addressing import assign_network_addresses, decode_physical
from ..budget import buffer_share_bytes, held_parts_share, held_slot_bytes
from ..config import FabricConfig
from ..counters import LinkCounters, downlink, uplink
from ..errors import AccessViolation, FabricError, LinkDown, ProtocolError, ResourceExhausted
from ..faults import spine_links_scale, spine_route
from ..groups import Group, GroupTable
from ..packets import WIRE_INT_MAX, Kind, LoadInfo, McastInfo, NackInfo, Packet, ReduceInfo
from ..timemodel import LinkEnd
from ..tlb import LinkTLB
from .control import ControlPlane
from .in_switch import InSwitch
from .ingress import bounded_stamp, check_header, checked_payload
from .multicast import NvlsLoads, Stores
from .p2p import POINT_TO_POINT, SERVED_REPLIES, PointToPoint
from .send import Send
from .spanning import Spanning


class SwitchLogic:
    """State and decisions of one leaf switch: its port map, Link TLBs (network mode), counters, refusals,
    groups and budgets, and the rooms it hands each packet to (p2p, in_switch, spanning, stores, nvls,
    control), each keeping its own state."""

    def __init__(self, config: FabricConfig, switch: int = 0):
        self.config = config
        self.topology = topology = config.topology
        self.switch = switch  # this leaf's switch index (its node's)
        per_node = config.gpus_per_node
        self.local = range(switch * per_node, (switch + 1) * per_node)  # the GPUs attached to its ports
        self.network = config.mode == "network"
        self.network_addresses = assign_network_addresses(config.gpus) if self.network else ()
        self._port_of_address = {na: gpu for gpu, na in enumerate(self.network_addresses)}
        # a port's page table maps each page of its GPU's memory twice at most (windows may overlap)
        pages = 2 * -(-config.memory_capacity_bytes // config.page_size_bytes)
        # Link TLBs of the ports: NVLink Network's, or classic nodes' registered windows (config.windows)
        self.tlbs = {g: LinkTLB(g, config.page_size_bytes, config.tlb_entries, pages) for g in self.local} \
            if config.windows else {}
        # each local GPU's outbound share of the node's uplink (fabric.topology, Shares), booked here in
        # the order that GPU's packets come; its inbound share and its downlink it books itself
        self.shares = {g: LinkEnd(cast(float, topology.share_gbytes_per_s), cast(float, config.uplink_latency_ns))
                       for g in self.local} if topology.spines else {}  # spines: both figures set
        self.counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        self.timing = config.timing
        # the fault plan's links between switches: a down one is routed around (fabric.faults.spine_route)
        self.plan = config.fault_plan
        self.spine_faults = any(not (a.startswith("gpu") or b.startswith("gpu"))
                                 for a, _, b in (link.partition("->") for link in self.plan.links()))
        self.violations = [0] * config.gpus  # AccessViolations, by the requester's port
        self.refused = [0] * config.gpus     # every refused packet, by the sender's port
        self.malformed = [0] * config.gpus   # of those, the ones that broke the protocol (ProtocolError)
        self.groups = GroupTable(step=topology.nodes, offset=switch)  # ids unique over the leaves
        self.peak_held_bytes = 0  # most contribution bytes held at once by in-switch reductions
        self.tracing = False      # when set, decisions worth a trace record are appended to `events`
        self.events: list[dict[str, Any]] = []
        self.partition_of_gpu = [config.partition_of(g) for g in range(config.gpus)]  # by GPU index
        # switch resources are shared out among partitions, so that one tenant cannot starve another
        self.group_share = max(1, self.groups.limit // len(config.partitions))
        self.buffer_share_bytes = buffer_share_bytes(config)
        # contributions held per partition, each counted at least slot_bytes against the share (held_slot_bytes:
        # 1 KiB on shares of 4 MiB and more): a held slot takes about 0.7 KiB of switch memory however few bytes
        # it holds (32,768 zero-byte ones took 23.3 MB, tracemalloc: tests/unit/test_switch_span_order_and_costs.py), so held
        # slots and their bytes together stay within the share; the credit windows count each chunk at least
        # slot_bytes too (Call.in_switch_window), so an honest window stays within both
        self.groups.slot_bytes = held_slot_bytes(config)
        self.held_parts_share = held_parts_share(config)
        # budgets of partials and load-reduces across nodes, per partition (fabric.budget)
        self.partial_share_bytes = self.buffer_share_bytes // max(1, topology.nodes)
        self.partial_share_parts = max(1, self.held_parts_share // max(1, topology.nodes))
        # the rooms, each with its own state, in the order a packet may go through them
        self.p2p = PointToPoint(self)
        self.in_switch = InSwitch(self)
        self.spanning = Spanning(self)
        self.stores = Stores(self)
        self.nvls = NvlsLoads(self)
        self.control = ControlPlane(self)

    # -- addressing -------------------------------------------------------------------------------
    def check_partial_share(self, what: str, ingress: int, info: ReduceInfo | LoadInfo, partition: int, awaiting: int,
                            kind: str) -> None:
        """ResourceExhausted unless partition `partition`, with `awaiting` of its `kind` (partials or load-reduces
        spanning nodes) awaiting a result at the spines, may have one more: its share of this leaf's held
        contributions over the nodes (partial_share_parts)."""
        if awaiting >= self.partial_share_parts:
            raise ResourceExhausted(f"{what} from GPU {ingress}: group {info.group} slot {list(info.slot)}: switch "
                                    f"{self.switch} has {awaiting} of partition {partition}'s {kind}, its share "
                                    f"{self.partial_share_parts} (held contributions' share / nodes)")

    def route_key(self, gpu: int) -> int:
        """What a packet's dst/src holds for GPU `gpu`: its network address, or its index in classic mode."""
        return self.network_addresses[gpu] if self.network else gpu

    def gpu_of_key(self, key: int) -> int | None:
        """The GPU whose routing key `key` is, or None (the switch's own -1, or no GPU's)."""
        gpu = self._port_of_address.get(key) if self.network else key
        return gpu if type(gpu) is int and 0 <= gpu < self.config.gpus else None

    def port_of(self, key: int) -> int:
        """The port (GPU index) a routing key leads to; AccessViolation if none."""
        if self.network:
            port = self._port_of_address.get(key)
        else:
            port = key if type(key) is int and 0 <= key < self.config.gpus else None
        if port is None:
            kind = "network address" if self.network else "GPU index"
            raise AccessViolation(f"no GPU has {kind} {key:#x}")
        return port

    # -- validation -------------------------------------------------------------------------------
    @property
    def payload_limit(self) -> int:
        """Largest transfer a GPU may send or request, in bytes: one GPU's whole memory."""
        return self.config.memory_capacity_bytes

    def check_header(self, ingress: int, packet: Packet) -> None:
        """ProtocolError unless `packet`, arriving from GPU `ingress`, is one a GPU may send, with every
        field in range; checked before its payload is taken or anything is looked up (ingress.check_header)."""
        check_header(self.config, ingress, packet)

    def bounded_stamp(self, packet: Packet) -> Packet:
        """`packet` with its last byte at most its bytes' time on a GPU link after its first (ingress.bounded_stamp)."""
        return bounded_stamp(self.config, self.timing, packet)

    def egress_ports(self, ingress: int, packet: Packet) -> tuple[int, ...]:
        """The ports `packet` from `ingress` would leave by (best effort, before it is validated: a
        packet that names nowhere is answered on its own port); the switch rank holds a packet back
        while one of them has too much in flight, so a slow GPU slows only the traffic bound for it."""
        kind, info = packet.kind, packet.info
        try:
            if kind is Kind.MCAST:
                group = self.groups.groups.get(cast(McastInfo, info).group)  # Packet checks each kind's record
                return group.members if group is not None else (ingress,)
            if kind is Kind.REDUCE:
                return tuple(p for p in cast(ReduceInfo, info).dest if 0 <= p < self.config.gpus) or (ingress,)
            if kind.counted and kind is not Kind.LOAD_REDUCE:
                if not self.network and packet.dst == -1:
                    return (decode_physical(packet.address, self.config.gpus)[0],)
                return (self.port_of(packet.dst),)
        except (AccessViolation, AttributeError, TypeError):
            pass
        return (ingress,)

    # -- the data plane ---------------------------------------------------------------------------
    def on_packet(self, ingress: int, packet: Packet, payload: np.ndarray | None = None,
                  checked: bool = False) -> list[Send]:
        """What to send in answer to `packet` (with its `payload` bytes) arriving from GPU `ingress`;
        `checked`: the caller ran check_header on it already (before taking its payload)."""
        try:
            if not checked:
                self.check_header(ingress, packet)
            payload = checked_payload(ingress, packet, payload)
            if not packet.kind.counted:
                return self.control.handle(ingress, packet)
        except ProtocolError as exc:
            return self.refuse(ingress, exc, packet.kind.name, packet.req, packet.t_end)
        packet = self.bounded_stamp(packet)
        self.counters.record(uplink(ingress, self.switch), packet.payload_bytes)
        try:
            room = self.p2p.data if packet.kind in POINT_TO_POINT else self.in_switch.handle
            sends = room(ingress, packet, payload)
        except FabricError as exc:
            return self.refuse(ingress, exc, packet.kind.name, packet.req, packet.t_end)
        try:
            return [self.out(send, ingress if send.origin is None else None) for send in sends]
        except LinkDown as exc:  # no route left around a down link between switches (fabric.faults)
            return self.refuse(ingress, exc, packet.kind.name, packet.req, packet.t_end)

    def on_transit(self, spine: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send for `packet` (with `payload`), which spine switch `spine` passed on from another
        node to a GPU of this one: a request is translated and authorised here, at its target's port;
        anything else was decided at the sender's leaf and goes down to its GPU."""
        link = f"sw{spine}->sw{self.switch}"
        self.counters.record(link, packet.payload_bytes)
        target = self.gpu_of_key(packet.dst)
        if target not in self.local:
            raise ProtocolError(f"switch {self.switch}: {packet.kind.name} from spine {spine} for {packet.dst:#x}, "
                                f"not a GPU of node {self.switch}")
        target = cast(int, target)  # one of this node's GPUs
        if packet.kind in (Kind.PUT, Kind.GET):
            requester = self.gpu_of_key(packet.src)  # stamped by the requester's leaf
            if requester is None:
                raise ProtocolError(f"switch {self.switch}: {packet.kind.name} from spine {spine} with source "
                                    f"{packet.src!r}, which is no GPU's")
            try:
                sends = self.p2p.request(requester, target, packet, payload)
            except FabricError as exc:
                return self.refuse(requester, exc, packet.kind.name, packet.req, packet.t_end)
        else:
            sends = [Send(target, self.through(packet), payload)]
        return [self.out(send) for send in sends]

    def egress_link(self, port: int, t_ns: float | None = None) -> str:
        """Name of the link a Send to GPU `port` leaves this leaf by (at modeled t_ns, with faults)."""
        if port in self.local:
            return downlink(port, self.switch)
        if self.spine_faults and t_ns is not None:
            return f"sw{self.switch}->sw{self.next_switch(port, t_ns)}"
        leaf = self.topology.switches[self.switch]
        return leaf.ports[self.topology.next_port(self.switch, port)].egress

    def next_switch(self, port: int, t_ns: float | None = None) -> int | None:
        """The switch index a Send to GPU `port` goes to next (None: the GPU is attached here); at modeled
        t_ns, around the fault plan's down links (fabric.faults.spine_route; LinkDown if none is left)."""
        if port in self.local:
            return None
        spine = cast(int, self.topology.spine_for(port))  # another node's port: there are spines
        if self.spine_faults and t_ns is not None:
            topology = self.topology
            spine = spine_route(self.plan, self.switch, port // self.config.gpus_per_node, spine, topology.nodes,
                                topology.spines, t_ns)
        return self.topology.nodes + spine

    # -- the way out, which every room's sends take -------------------------------------------------
    def out(self, send: Send, sender: int | None = None) -> Send:
        """Count `send` on the link it leaves by; up to a spine, stamp the packet with when its first/last
        byte reach the spine: booked on GPU `sender`'s outbound share (cut-through; a one-sided reply on
        its served lane, fabric.timemodel.LinkEnd), or, a switch's own packet (sender None), at the
        link's latency."""
        if send.switch is not None:  # to another switch: counted and booked by whoever made it
            return send
        via = None
        if self.spine_faults and send.port not in self.local:  # routed at the time its first byte is ready
            via = self.next_switch(send.port, send.packet.t_start)
            link = f"sw{self.switch}->sw{via}"
        else:
            link = self.egress_link(send.port)
        raw = self.counters.record(link, send.packet.payload_bytes)
        if send.port in self.local:
            return send
        share = self.shares.get(sender)  # type: ignore[arg-type]  # sender None (a switch's own packet): no share
        packet = send.packet
        if share is not None:
            timed: float = raw
            if self.spine_faults:  # the node's uplink lost the down links' part of its capacity
                timed = raw * spine_links_scale(self.plan, self.switch, self.topology.nodes, self.topology.spines,
                                                packet.t_start)
            # a one-sided reply leaves in the order the host delivered its request: the share's served lane
            book = share.serve if packet.kind in SERVED_REPLIES else share.send
            t_start, t_end = book(packet.t_start, packet.t_end, timed)
        else:
            latency = cast(float, self.config.uplink_latency_ns)  # up to a spine: a fabric of several nodes
            t_start, t_end = packet.t_start + latency, packet.t_end + latency
        return Send(send.port, packet.but(t_start=t_start, t_end=t_end), send.payload, send.origin, via=via)

    def refuse(self, ingress: int, error: FabricError, kind: str = "?", req: int = 0, t_end: float = 0.0) -> list[Send]:
        """Refuse a packet of GPU `ingress` (malformed ones too, whose header may not even decode):
        count it on its port, record why, and answer with a NACK (counted on the downlink)."""
        self.refused[ingress] += 1
        if isinstance(error, AccessViolation):
            self.violations[ingress] += 1
        elif isinstance(error, ProtocolError):
            self.malformed[ingress] += 1
        ready = (t_end if math.isfinite(t_end) and t_end >= 0 else 0.0) + self.timing.switch_latency_ns
        self.event({"ev": "refused", "gpu": ingress, "kind": kind, "error": type(error).__name__,
                    "message": str(error), "m": ready})
        nack = Packet(Kind.NACK, src=-1, dst=self.route_key(ingress), req=req if 0 <= req <= WIRE_INT_MAX else 0,
                      info=NackInfo(type(error).__name__, str(error)[:4000], kind), t_start=ready, t_end=ready)
        return [self.out(Send(ingress, nack, origin=-1))]

    def through(self, packet: Packet, **changes: object) -> Packet:
        """`packet` leaving the switch: cut-through, each byte one switch traversal later."""
        delay = self.timing.switch_latency_ns
        return packet.but(t_start=packet.t_start + delay, t_end=packet.t_end + delay, **changes)

    def deliver(self, port: int, group: int, key: tuple[int | str, ...], payload: np.ndarray, t_start: float, t_end: float,
                origin: int | None) -> Send:
        """A copy for `port` of an in-switch result or a multicast store through `group`."""
        return Send(port, Packet(Kind.MCAST, -1, self.route_key(port), 0, payload.nbytes, info=McastInfo(group, key),
                                 t_start=t_start, t_end=t_end), payload, origin)

    def event(self, record: dict[str, Any]) -> None:
        """Append `record` (a decision worth a trace record) to `events`, when tracing."""
        if self.tracing:
            self.events.append(record)

    # -- the rooms' public faces (ranks/switch.py and the report use them) --------------------------
    def on_switch(self, spine: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send for in-switch traffic of a spanning group that spine `spine` sent (spanning.on_switch)."""
        return self.spanning.on_switch(spine, packet, payload)

    @property
    def awaited_replies(self) -> int:
        """Forwarded requests whose answer has not come (the end-of-run report shows them)."""
        return self.p2p.awaited_replies

    def store_spine(self, group: Group, ingress: int, key: tuple[int | str, ...]) -> int:
        """The spine (switch index) member `ingress`'s store under `key` goes up to (multicast.Stores)."""
        return self.stores.store_spine(group, ingress, key)

    def remote_members(self, gid: int) -> tuple[int, ...]:
        """Members of group `gid` in other nodes (a store of a local member reaches each of them), or ()."""
        return self.stores.remote_members(gid)

    def store_targets(self, gid: int) -> tuple[int, ...]:
        """This node's members of spanning group `gid`, live or recently released (multicast.Stores)."""
        return self.stores.store_targets(gid)

    @property
    def max_loads(self) -> int:
        """LOADs of spanning groups this leaf keeps unanswered to one local GPU, at most (multicast.NvlsLoads)."""
        return self.nvls.max_loads

    @property
    def dropped_loads(self) -> int:
        """Load-reduce requests dropped here for that bound."""
        return self.nvls.dropped_loads

    @property
    def peak_loads(self) -> int:
        """The most LOADs held unanswered to one local GPU at once."""
        return self.nvls.peak_loads

    def port_stats(self) -> dict[int, dict[str, int]]:
        """Per-port TLB statistics, violations and refusals, for the report."""
        stats = {}
        for gpu in range(self.config.gpus):
            if gpu not in self.local and not self.refused[gpu]:
                continue  # a GPU of another node, which this leaf never refused: its own leaf reports it
            row = self.tlbs[gpu].stats() if gpu in self.tlbs else {}
            row.update(violations=self.violations[gpu], refused=self.refused[gpu], malformed=self.malformed[gpu])
            stats[gpu] = row
        return stats
