"""The switch's decisions as pure code: validate, route, translate, authorise, count; the switch rank
only moves bytes.

`SwitchLogic.on_packet(ingress, packet, payload)` returns the packets to send, each with the port it
leaves by and whether it carries the incoming payload on. The switch authorises by the ingress port
it saw the packet arrive on, never by a field the sender wrote; it validates every field against the
config before it allocates or looks anything up (`check_header`), forwards a reply only if it
answers a request it forwarded, and takes in-switch operations only from a group's bound members for
keys of that group. A refused packet is counted on the sender's port and answered with a NACK.

On several nodes (fabric.topology) each node's leaf runs a SwitchLogic for its own GPUs' ports, and
the spines run a SpineLogic (in-switch groups that span nodes: `Spanning groups` below). Ports are named by GPU index: a Send to a GPU of another node leaves by
the leaf's link to the spine the topology routes it over (the switch rank sends it to that spine).
Decisions stay where the state is: a request (PUT/GET) is translated and authorised by the Link TLB
at the leaf of the destination GPU's port, wherever the requester is (the requester's leaf only
checks the header and stamps the source, which the switches between trust); a reply is matched with
its request at the leaf of the GPU that answers, which forwarded the request; a message's partition
is checked at the sender's leaf; in-switch groups live at the leaf of their members (one node).
A transfer between nodes is timed on its sender's outbound share of the node's uplink (booked at the
sender's leaf) and its receiver's inbound share (booked by the receiver); the cables between switches
count bytes (fabric.topology, Shares).

**Spanning groups** (NVLink SHARP across nodes). A group whose members are in several nodes has a copy
in every switch it spans: the leaf of each of its nodes (its inputs: the node's members, in communicator
rank order) and every spine (its inputs: the leaves of its nodes, in node order). Created by its first
member at that GPU's leaf (the *creator* leaf; id = k x nodes + the leaf's index, so ids never collide
between leaves), which sends the group to every spine and, once every spine took it, through every
spine to the group's other leaves (in two phases: a member can bind the group at its own leaf, and use
it, only once every spine holds it and, at another leaf, once every spine's span reached that leaf, so
whatever a spine passes on for the group reaches each leaf after that spine's span, whatever order the
switches read each other's packets in: _span_in); each
checks its own 128-group limit (its partition's share) and answers, and the create is answered only
once every switch took the group (else it is undone everywhere and refused with the switches' errors;
a switch that refused it drops its late traffic as a released group's). Bound by each member at its own leaf; released by the creator leaf for all. A leaf
takes contributions only from its own members; once every local member's chunk is in, it reduces them
(accumulator: float32 for float16/bfloat16, unfinished) and sends the *partial* to spine slot[-1] mod P
(allreduce: chunk c to spine c mod P; reduce_scatter: slot (j, c, j + c), chunk c of block j to spine (j
+ c) mod P). A spine takes partials only from the leaves of the group's nodes, reduces them in node
order, finishes (avg divides by every member once, 16-bit floats round once) and multicasts the result
down to each leaf of a destination member (all of them for allreduce; for reduce_scatter's block j,
member j's only), which copies it to its destination members; every other leaf of the group gets a
notice ("reduced", a control packet: no bytes on the cable) that frees its partial's share. A GPU can
neither send a partial (only leaves reach a spine) nor a result (a leaf delivers only what a spine sent
for a partial it sent up). Time: a partial leaves the leaf's reduction engine and takes the group's
members' shares of the node's uplink to that spine taken together (m x U / (G P): m members in the node,
P spines): each member's part of it (1/m of its bytes) takes that member's own share (U / (G P), shared
by every group of the GPU and its multicast stores), booked by the leaf as the member's contribution
comes, ready once it has been through the engine (_member_part), so in that member's packet order
whatever its groups; the partial is at the spine once the engine's result and every part are. The
spine's engine reduces once every partial is in, and each result takes the group's shares of the
destination node's uplink from that spine, each member's part of it (1/m of its bytes) that member's
own share (U / (G P), shared by every group of the GPU: _result_down), booked by the spine in its
completion order; so
every clock is booked in one order fixed by the members' programs (fabric.replay replays it). In flight:
a leaf keeps at most its partition's buffer share / nodes of partials without their result (in bytes; in
number, held_parts_share / nodes), so what a spine holds stays within the share. Partials of a slot that
disagree between nodes (each leaf checks only its members) are refused at the spine to every member, a
NACK once per group until its release; a partial or result of a group released while on its way is
dropped (one number per creator leaf tells it from most switch bugs: _released).
*Multicast stores* (sharp allgather, broadcast): a member's MCAST goes to its leaf, which copies it to
the node's members and sends one copy up (src: the sender) to spine (p + c) mod P, p the sender's rank
in the group and c the key's last entry, its chunk (store_spine; a key without one is refused), so the
spines share a call's stores; the spine sends one copy down to each other leaf of the group, which
copies it to its members. Trust: a spine takes a store only from a leaf of the group's nodes, for a
member in that leaf's node; a leaf takes one from a spine only for a group that spans it, from a
member of another node; copies go only to the group's members, so a GPU can make no switch deliver to
a non-member. Time: up, on the sender's share of the node's uplink to that spine (U / (G P)), booked
by the leaf in the sender's packet order; down, on the sender's part of the group's shares of the
destination node's uplink from that spine (m_k U / (G P) over the n - m_k members outside node k,
equal parts: what fair arbitration gives when every member stores at once, as in allgather; a lone
sender, a broadcast's root, gets no more than its part), booked by the spine in the sender's order.
Members' stores reach a leaf or a spine in the host's order, so no clock is shared between senders:
that keeps modeled time a function of the programs (fabric.replay.sharp_mcast_ns replays it). A
store crossing its group's release is dropped; the leaves' credits bound the copies in flight to a
member of another node (ranks/switch.py).
*Load-reduce* (nvls): a member's LOAD_REDUCE of slot (seq, r, c, r + c), its result for itself alone
(dest (ingress,), else refused), goes to its leaf, which sends header-only LOADs to its members and
the request, header-only (src: the requester), to spine slot[-1] mod P (_load_reduce_across;
nvls.py: (r + c)); the spine passes it on to the group's other leaves (_load_reduce_on: only from a
leaf of the group's nodes, for a requester of that node), each of which LOADs its members
(_loads_asked). The members' REDUCE answers make each leaf's partial as above (to the same spine);
the spine's result goes down to the requester's leaf alone, and the notice "reduced" (a control
packet) to each other leaf, which frees its partial's share there, as for sharp's reduce_scatter (so
every leaf's partials in flight stay bounded). Time: the requests cross the cables at their latency
(header-only, booked on no share: they reach a leaf in the host's order), a LOAD is ready a switch
traversal after the request reaches its leaf; partials (each member's part on its share, as its
answer comes) and results are booked as above, in the order (chunk, block) the members' programs
serve the LOADs (fabric.replay.nvls_ns replays it). A request crossing its group's release is
dropped at the spine or the leaf. In flight: the requester's leaf keeps at most partial_share_parts
of a partition's load-reduces awaiting their result (each costs a LOAD to every member), one per
result key and per slot. A member that will not serve a LOAD (ranks/gpu.serve_load: a range past its
bound buffer) sends its leaf the notice "unserved" (a control packet naming the slot, answered by
nothing), which goes on through spine slot[-1] mod P to the requester's leaf (slot[1]: its rank), and
a leaf that drops a request for a member that has not bound sends the same back: the request's place
in the budget is given back, so a tenant repeating a refused load-reduce exhausts nothing (_unserved,
_load_refused). A leaf keeps at most max_loads LOADs unanswered (a REDUCE answer or the notice) to each
of its GPUs - MAX_LOADS, or twice the most an honest nvls call keeps, if more (honest_loads: about buffer
share / (2 x nodes x nvls chunk)) - and one of a slot: a request past that (local or from a spine) is
dropped there and its requester's leaf told as above (_may_load); it takes a member's notice only for a
LOAD it sent that member unanswered, else refuses it (so notices are bounded by LOADs). The requester
of a refused or dropped request hears nothing from the switch: it serves the same range of its own
buffer (of the call's size, as every honest member's) and refuses it too, or its wait ends at its deadline
(FabricTimeout); the members' contributions to the slot stay held until the group's release.
Every load-reduce's slot names its requester's rank in the group second, on one switch too (nvls.py's
(seq, r, c, r + c), hier's hier_plan.leaf_slot), else it is refused (AccessViolation, _check_requester):
members file a slot's LOADs under the slot alone, so one member's request of another's slot would take
over that member's answer.
"""

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .addressing import Handle, assign_network_addresses, decode_physical
from .config import FabricConfig
from .counters import LinkCounters, downlink, uplink
from .faults import spine_links_scale, spine_route
from .timemodel import LinkEnd
from .errors import (AccessViolation, CollectiveMismatch, FabricError, LinkDown, ProtocolError, ResourceExhausted,
                     UnsupportedOperation)
from .groups import ByGroup, GroupTable
from .packets import (MAX_TEXT, WIRE_INT_MAX, GroupInfo, Kind, LoadInfo, McastInfo, NackInfo, Packet, ReduceInfo,
                      raw_bytes)
from .reduction import check_dtype, check_op, switch_accumulator
from .budget import buffer_share_bytes, held_parts_share, held_slot_bytes, honest_loads
from .tlb import LinkTLB

# what a GPU may send to its switch; NACK, LOAD, REPLY and SHUTDOWN are the switch's own
FROM_GPU = frozenset({Kind.PUT, Kind.PUT_ACK, Kind.GET, Kind.GET_DATA, Kind.MSG, Kind.REDUCE, Kind.MCAST,
                      Kind.LOAD_REDUCE, Kind.EXPORT, Kind.REVOKE, Kind.GROUP, Kind.TRACE, Kind.DONE,
                      Kind.COUNTERS})
# the reply each request kind is answered with, by the GPU it was forwarded to
REPLY_OF = {Kind.PUT: Kind.PUT_ACK, Kind.GET: Kind.GET_DATA}
SERVED_REPLIES = frozenset(REPLY_OF.values())  # sent as the host delivered their requests, not in program order
_NO_BYTES = np.empty(0, np.uint8)  # the payload of a transfer of 0 bytes
GONE_KEPT = 4096  # released spanning groups whose local members a leaf remembers (late stores' credit)
MAX_AWAITED = 1 << 16  # requests of one GPU forwarded and not yet answered; past it, new ones are refused
# LOADs of spanning groups a leaf keeps unanswered to one local GPU (a REDUCE answer or its notice "unserved"
# answers one), at least: ranks/switch.MAX_UNREAD, the answers a GPU may leave unread on one switch; a config
# whose honest nvls keeps more (honest_loads) gets twice that (SwitchLogic.max_loads)
MAX_LOADS = 1024


@dataclass(frozen=True)
class Send:
    """Send `packet` towards GPU `port` (a GPU index: out of its port if it is attached here, else up
    the link to the next switch) with `payload` (uint8 bytes) if it carries one."""

    port: int
    packet: Packet
    payload: np.ndarray | None = None
    origin: int | None = None  # who the data comes from: the ingress GPU (None) or the switch itself (-1)
    switch: int | None = None  # to that switch itself (in-switch traffic between switches; counted already)
    via: int | None = None     # the spine switch it goes up to, if the leaf rerouted it (fabric.faults)


class SwitchLogic:
    """State and decisions of one switch: port map, Link TLBs (network mode), counters, refusals."""

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
        self.shares = {g: LinkEnd(topology.share_gbytes_per_s, config.uplink_latency_ns) for g in self.local} \
            if topology.spines else {}
        self.counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        self.timing = config.timing
        # the fault plan's links between switches: a down one is routed around (fabric.faults.spine_route)
        self.plan = config.fault_plan
        self._spine_faults = any(not (a.startswith("gpu") or b.startswith("gpu"))
                                 for a, _, b in (link.partition("->") for link in self.plan.links()))
        self.violations = [0] * config.gpus  # AccessViolations, by the requester's port
        self.refused = [0] * config.gpus     # every refused packet, by the sender's port
        self.malformed = [0] * config.gpus   # of those, the ones that broke the protocol (ProtocolError)
        self.groups = GroupTable(step=topology.nodes, offset=switch)  # ids unique over the leaves
        self.peak_held_bytes = 0  # most contribution bytes held at once by in-switch reductions
        self.tracing = False      # when set, decisions worth a trace record are appended to `events`
        self.events: list[dict] = []
        self._partition = [config.partition_of(g) for g in range(config.gpus)]
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
        # requests forwarded and not yet answered: (replier port, requester port, req, reply kind) -> the
        # byte counts the replies must carry -> how many (a reply is matched in O(1), however many a GPU
        # keeps awaited under one number: a scan of them made each forged reply cost the switch O(MAX_AWAITED))
        self._awaited: dict[tuple[int, int, int, Kind], Counter] = {}
        self._awaiting = [0] * config.gpus  # per requester port: its forwarded requests not yet answered
        # spanning groups (module docstring): creates waiting for the other switches' answers, gid ->
        # [creator GPU, request, switches yet to answer, errors, switches that took it]; per partial sent
        # up and not answered, (group, result key) -> (local destinations, bytes); those bytes per partition;
        # each member's part of the partials in flight on its share of the uplink (_member_part)
        self._spanning: dict[int, list] = {}
        self._partials: dict[tuple, tuple[tuple[int, ...], int, int]] = ByGroup()  # + the group's partition
        self._partial_bytes: dict[int, int] = {}
        # partials whose result goes to no member here (reduce_scatter's other blocks): (group, slot) ->
        # (bytes, partition), until the spine's notice that it reduced the slot ("reduced")
        self._unanswered: dict[tuple, tuple[int, int]] = ByGroup()
        self._partial_parts: dict[int, int] = {}  # and how many (zero-byte partials hold memory too)
        self._parts: dict[tuple, tuple[float, float]] = ByGroup()  # (group, slot) -> its members' parts' latest stamps
        self._seen: dict[int, int] = {}  # creator leaf -> the highest k of its group ids held here (_released)
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
        self.partial_share_bytes = self.buffer_share_bytes // max(1, topology.nodes)
        self.partial_share_parts = max(1, self.held_parts_share // max(1, topology.nodes))
        # nvls: load-reduces of this leaf's GPUs awaiting their result, (group, result key) -> (partition,
        # slot), the same by (group, slot) -> result key (a member's notice "unserved" names the slot), and
        # their number per partition (at most partial_share_parts: every LOAD they send costs every member)
        self._asked: dict[tuple, tuple[int, tuple]] = ByGroup()
        self._asked_slot: dict[tuple, tuple] = {}
        self._asked_count: dict[int, int] = {}
        # LOADs sent to local GPUs of spanning groups and not yet answered, (group, slot, port), and their
        # number per port (at most max_loads); requests dropped here for that bound; the most held at once
        self._loaded = ByGroup()  # a set of them (the values None)
        self._loaded_count: dict[int, int] = {}
        # the bound: MAX_LOADS, or twice what honest nvls keeps (a larger buffer share or a smaller NVLS chunk)
        self.max_loads = max(MAX_LOADS, 2 * honest_loads(config))
        self.dropped_loads = 0
        self.peak_loads = 0

    # -- addressing -------------------------------------------------------------------------------
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
        field in range; checked before its payload is taken or anything is looked up."""
        what = f"{packet.kind.name} from GPU {ingress}"
        if packet.kind not in FROM_GPU:
            raise ProtocolError(f"{what}: only the switch sends {packet.kind.name} packets")
        if not 0 <= packet.nbytes <= self.payload_limit:
            raise ProtocolError(f"{what}: {packet.nbytes} bytes is more than a GPU's {self.payload_limit} "
                                f"bytes of memory")
        if not 0 <= packet.address <= WIRE_INT_MAX - packet.nbytes:
            raise ProtocolError(f"{what}: address {packet.address:#x}+{packet.nbytes} is outside the 64-bit space")
        if not 0 <= packet.req <= WIRE_INT_MAX:
            raise ProtocolError(f"{what}: request number {packet.req} is negative")
        if not (math.isfinite(packet.t_start) and math.isfinite(packet.t_end)
                and 0 <= packet.t_start <= packet.t_end):
            raise ProtocolError(f"{what}: modeled times {packet.t_start}..{packet.t_end} ns are not "
                                f"0 <= start <= end")

    def bounded_stamp(self, packet: Packet) -> Packet:
        """`packet` (from a GPU, checked) with its last byte at most its bytes' time on a GPU link after
        its first (ns): a GPU's stamp is its word on when its transfer left it, not on how long the
        transfer occupies the links after it. An honest GPU's stamp is exactly that long; a longer one
        would book the links between switches, which every tenant's transfers share, for as long as
        the GPU liked."""
        raw = raw_bytes(packet.payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        longest = packet.t_start + raw / self.timing.bandwidth_gbytes_per_s
        if packet.t_end <= longest * (1 + 1e-9):  # rounding of an honest stamp's start + duration
            return packet
        return packet.but(t_end=longest)

    def egress_ports(self, ingress: int, packet: Packet) -> tuple[int, ...]:
        """The ports `packet` from `ingress` would leave by (best effort, before it is validated: a
        packet that names nowhere is answered on its own port); the switch rank holds a packet back
        while one of them has too much in flight, so a slow GPU slows only the traffic bound for it."""
        kind, info = packet.kind, packet.info
        try:
            if kind is Kind.MCAST:
                group = self.groups.groups.get(info.group)
                return group.members if group is not None else (ingress,)
            if kind is Kind.REDUCE:
                return tuple(p for p in info.dest if 0 <= p < self.config.gpus) or (ingress,)
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
            if packet.kind.has_payload:
                if payload is None and packet.nbytes == 0:
                    payload = _NO_BYTES
                if payload is None or payload.nbytes != packet.nbytes:
                    raise ProtocolError(f"{packet.kind.name} from GPU {ingress}: header says {packet.nbytes} "
                                        f"bytes, {None if payload is None else payload.nbytes} came")
            else:
                payload = None  # bytes beside a header that carries none go nowhere
            if not packet.kind.counted:
                return self._control(ingress, packet)
        except ProtocolError as exc:
            return self.refuse(ingress, exc, packet.kind.name, packet.req, packet.t_end)
        packet = self.bounded_stamp(packet)
        self.counters.record(uplink(ingress, self.switch), packet.payload_bytes)
        try:
            sends = self._data(ingress, packet, payload)
        except FabricError as exc:
            return self.refuse(ingress, exc, packet.kind.name, packet.req, packet.t_end)
        try:
            return [self._out(send, ingress if send.origin is None else None) for send in sends]
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
        if packet.kind in (Kind.PUT, Kind.GET):
            requester = self.gpu_of_key(packet.src)  # stamped by the requester's leaf
            if requester is None:
                raise ProtocolError(f"switch {self.switch}: {packet.kind.name} from spine {spine} with source "
                                    f"{packet.src!r}, which is no GPU's")
            try:
                sends = self._request(requester, target, packet, payload)
            except FabricError as exc:
                return self.refuse(requester, exc, packet.kind.name, packet.req, packet.t_end)
        else:
            sends = [Send(target, self._through(packet), payload)]
        return [self._out(send) for send in sends]

    def egress_link(self, port: int, t_ns: float | None = None) -> str:
        """Name of the link a Send to GPU `port` leaves this leaf by (at modeled t_ns, with faults)."""
        if port in self.local:
            return downlink(port, self.switch)
        if self._spine_faults and t_ns is not None:
            return f"sw{self.switch}->sw{self.next_switch(port, t_ns)}"
        leaf = self.topology.switches[self.switch]
        return leaf.ports[self.topology.next_port(self.switch, port)].egress

    def next_switch(self, port: int, t_ns: float | None = None) -> int | None:
        """The switch index a Send to GPU `port` goes to next (None: the GPU is attached here); at modeled
        t_ns, around the fault plan's down links (fabric.faults.spine_route; LinkDown if none is left)."""
        if port in self.local:
            return None
        spine = self.topology.spine_for(port)
        if self._spine_faults and t_ns is not None:
            topology = self.topology
            spine = spine_route(self.plan, self.switch, port // self.config.gpus_per_node, spine, topology.nodes,
                                topology.spines, t_ns)
        return self.topology.nodes + spine

    def _out(self, send: Send, sender: int | None = None) -> Send:
        """Count `send` on the link it leaves by; up to a spine, stamp the packet with when its first/last
        byte reach the spine: booked on GPU `sender`'s outbound share (cut-through; a one-sided reply on
        its served lane, fabric.timemodel.LinkEnd), or, a switch's own packet (sender None), at the
        link's latency."""
        if send.switch is not None:  # to another switch: counted and booked by whoever made it
            return send
        via = None
        if self._spine_faults and send.port not in self.local:  # routed at the time its first byte is ready
            via = self.next_switch(send.port, send.packet.t_start)
            link = f"sw{self.switch}->sw{via}"
        else:
            link = self.egress_link(send.port)
        raw = self.counters.record(link, send.packet.payload_bytes)
        if send.port in self.local:
            return send
        share = self.shares.get(sender)
        packet = send.packet
        if share is not None:
            timed = raw
            if self._spine_faults:  # the node's uplink lost the down links' part of its capacity
                timed = raw * spine_links_scale(self.plan, self.switch, self.topology.nodes, self.topology.spines,
                                                packet.t_start)
            # a one-sided reply leaves in the order the host delivered its request: the share's served lane
            book = share.serve if packet.kind in SERVED_REPLIES else share.send
            t_start, t_end = book(packet.t_start, packet.t_end, timed)
        else:
            latency = self.config.uplink_latency_ns
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
        self._event({"ev": "refused", "gpu": ingress, "kind": kind, "error": type(error).__name__,
                     "message": str(error), "m": ready})
        nack = Packet(Kind.NACK, src=-1, dst=self.route_key(ingress), req=req if 0 <= req <= WIRE_INT_MAX else 0,
                      info=NackInfo(type(error).__name__, str(error)[:4000], kind), t_start=ready, t_end=ready)
        return [self._out(Send(ingress, nack, origin=-1))]

    def _through(self, packet: Packet, **changes) -> Packet:
        """`packet` leaving the switch: cut-through, each byte one switch traversal later."""
        delay = self.timing.switch_latency_ns
        return packet.but(t_start=packet.t_start + delay, t_end=packet.t_end + delay, **changes)

    def _data(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        src = self.route_key(ingress)
        kind = packet.kind
        if kind in (Kind.PUT, Kind.GET):
            by_window = self.network or (self.tlbs and packet.dst != -1)  # classic: a registered window's handle
            target = self._port_for(ingress, packet) if by_window else self._physical_target(ingress, packet)
            if target not in self.local and self._partition[target] != self._partition[ingress]:
                # the target's Link TLB would refuse it (a window is its partition's): refused here, its bytes
                # never take the links between switches that other tenants share
                raise AccessViolation(f"{kind.name} from GPU {ingress} (partition {self._partition[ingress]}) to GPU "
                                      f"{target} (partition {self._partition[target]}): partitions are isolated")
            if target not in self.local:  # translated at the target's leaf: pass it on with its source
                return [Send(target, self._through(packet, src=src), payload if kind is Kind.PUT else None)]
            return self._request(ingress, target, packet, payload)
        if kind in (Kind.PUT_ACK, Kind.GET_DATA):
            target = self._port_for(ingress, packet)
            self._answered(ingress, target, packet)
            return [Send(target, self._through(packet, src=src), payload)]
        if kind is Kind.MSG:
            target = self._port_for(ingress, packet)
            if self._partition[target] != self._partition[ingress]:
                raise AccessViolation(f"MSG from GPU {ingress} (partition {self._partition[ingress]}) to GPU "
                                      f"{target} (partition {self._partition[target]}): partitions are isolated")
            return [Send(target, self._through(packet, src=src), payload)]
        return self._in_switch(ingress, packet, payload)

    def _request(self, ingress: int, target: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        """A PUT/GET of GPU `ingress` for GPU `target`, a port of this switch: translated, authorised,
        and remembered, so that only its own answer is forwarded back."""
        kind = packet.kind
        write = kind is Kind.PUT
        phys = self._resolve(ingress, target, packet, write)
        if self._awaiting[ingress] >= MAX_AWAITED:
            raise ResourceExhausted(f"{kind.name} from GPU {ingress}: {MAX_AWAITED} of its requests are still "
                                    f"unanswered")
        self._awaiting[ingress] += 1
        self._awaited.setdefault((target, ingress, packet.req, REPLY_OF[kind]), Counter())[
            0 if write else packet.nbytes] += 1
        return [Send(target, self._through(packet, src=self.route_key(ingress), dst=self.route_key(target),
                                           address=phys), payload if write else None)]

    def _answered(self, replier: int, requester: int, packet: Packet) -> None:
        """Retire the forwarded request that `packet` (a PUT_ACK or GET_DATA of GPU `replier`) answers;
        AccessViolation if it answers none (a forged or repeated reply)."""
        key = (replier, requester, packet.req, packet.kind)
        sizes = self._awaited.get(key)
        if not sizes or not sizes.get(packet.nbytes):
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {replier} to GPU "
                                  f"{requester} for request {packet.req}: it answers no request the switch "
                                  f"forwarded from GPU {requester} to GPU {replier}")
        sizes[packet.nbytes] -= 1
        if not sizes[packet.nbytes]:
            del sizes[packet.nbytes]
        self._awaiting[requester] -= 1
        if not sizes:
            del self._awaited[key]

    @property
    def awaited_replies(self) -> int:
        """Forwarded requests whose answer has not come (the end-of-run report shows them)."""
        return sum(sizes.total() for sizes in self._awaited.values())

    # -- NVLink SHARP: in-switch reduction and multicast ------------------------------------------
    def _in_switch(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        kind, info = packet.kind, packet.info
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"{kind.name} from GPU {ingress}: fabric {self.config.name!r} has "
                                       f"no in-switch reduction or multicast (needs NVLink Network with SHARP)")
        group = self.groups.group(info.group, ingress, kind.name, bound=True)
        if not group.ready:  # a copy must go only to members that bound the group
            raise AccessViolation(f"{kind.name} from GPU {ingress}: group {info.group} is not bound by all members "
                                  f"yet ({sorted(group.bound)} of {list(group.members)})")
        keys = (info.key, info.source) if isinstance(info, LoadInfo) else (info.key,)
        for key in keys:
            if not key or key[0] != group.name:
                raise AccessViolation(f"{kind.name} from GPU {ingress}: key {list(key)} is not one of group "
                                      f"{info.group}'s (its keys start with {group.name!r})")
        if group.stage == "leaf" and self._spine_faults:
            raise UnsupportedOperation(f"{kind.name} from GPU {ingress}: group {info.group} spans nodes, and the "
                                       f"fault plan has faults on links between switches: in-switch reduction "
                                       f"across them is not modeled (use the ring, direct or hier algorithm)")
        if group.stage == "leaf" and kind is Kind.LOAD_REDUCE:
            return self._load_reduce_across(ingress, packet, group, info)
        if kind is Kind.MCAST and group.stage == "leaf":
            return self._store_span(ingress, group, packet, payload)
        if kind is Kind.MCAST:
            # one packet in, a copy out of every member port, the sender's included
            out = self._through(packet)
            self._event({"ev": "mcast", "group": info.group, "from": ingress, "bytes": packet.nbytes,
                         "copies": len(group.members), "m": out.t_start})
            return [self._deliver(port, info.group, info.key, payload, out.t_start, out.t_end, None)
                    for port in group.members]
        try:  # before any contribution is held: the reduction must be one the switch can do
            check_op(info.op)
            check_dtype(info.dtype)
        except FabricError as exc:
            raise FabricError(f"{kind.name} from GPU {ingress}: {exc}") from None
        outside = [port for port in info.dest if port not in group.members]
        if outside or not info.dest:
            raise AccessViolation(f"{kind.name} from GPU {ingress}: result destinations {list(info.dest)}: "
                                  f"{' '.join(f'GPU {p}' for p in outside) or 'none'} not members of group "
                                  f"{info.group} ({list(group.members)})")
        if kind is Kind.LOAD_REDUCE:
            if tuple(info.dest) != (ingress,):  # members file a slot's LOAD under the slot alone: a result
                # for another member, of a range the requester picks, could take the place of its own
                raise AccessViolation(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: "
                                      f"a load-reduce's result goes to its requester only, not to {list(info.dest)}")
            _check_requester(ingress, group, info)
            # NVLS: read the range from every member's bound buffer; the answers are REDUCE packets
            ready = packet.t_end + self.timing.switch_latency_ns
            load = Packet(Kind.LOAD, -1, 0, packet.address, packet.nbytes, packet.req, info, ready, ready)
            return [Send(port, load.but(dst=self.route_key(port)), origin=-1) for port in group.members]
        if group.stage == "leaf":
            self._check_partial(ingress, group, info, payload)
        done = self.groups.contribute(info.group, info.slot, ingress, info.op, info.dtype, payload,
                                      (info.dest, info.key), (packet.t_start, packet.t_end), self.buffer_share_bytes,
                                      self.held_parts_share)
        if group.stage == "leaf":
            self._member_part(ingress, group, info, packet, payload)
            self._load_done(info.group, tuple(info.slot), ingress)  # a member's answer to a LOAD, if one
        if done is None:
            self.peak_held_bytes = max(self.peak_held_bytes, self.groups.held_bytes)
            return []
        result, (dest, key), (first, last) = done
        # the reduced stream leaves once the latest contribution streams in, through the group's engine
        delay = self.timing.switch_latency_ns
        raw = raw_bytes(result.nbytes, self.config.mtu_bytes, self.config.header_bytes)
        start, end = self.groups.engine(info.group, self.timing).reduce(first + delay, last + delay, raw)
        self._event({"ev": "reduce", "group": info.group, "slot": list(info.slot), "op": info.op,
                     "bytes": result.nbytes, "members": len(group.inputs), "m_start": start, "m_end": end})
        if group.stage == "leaf":
            return [self._partial_up(group, info, dest, key, result, start, end, raw)]
        return [self._deliver(port, info.group, key, result, start, end, -1) for port in dest]

    # -- spanning groups (module docstring) -------------------------------------------------------
    def _check_partial(self, ingress: int, group, info: ReduceInfo, payload: np.ndarray) -> None:
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
        parts = self._partial_parts.get(group.partition, 0)
        if parts >= self.partial_share_parts:
            raise ResourceExhausted(f"REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: switch "
                                    f"{self.switch} has {parts} of partition {group.partition}'s partials at the "
                                    f"spines without their result, its share {self.partial_share_parts} (held "
                                    f"contributions' share / nodes)")
        held = self._partial_bytes.get(group.partition, 0)
        if held and held + nbytes > self.partial_share_bytes:
            raise ResourceExhausted(f"REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: switch "
                                    f"{self.switch} has {held} bytes of partition {group.partition}'s partials at the "
                                    f"spines without their result, and {nbytes} more would pass its share "
                                    f"{self.partial_share_bytes} (buffer share / nodes)")

    def _member_clock(self, gpu: int, spine: int) -> LinkEnd:
        """GPU `gpu`'s share of the node's uplink to spine `spine` (U / (G P)), shared by all its groups."""
        clock = self._member_up.get((gpu, spine))
        if clock is None:
            clock = self._member_up[(gpu, spine)] = LinkEnd(self.topology.share_gbytes_per_s / self.topology.spines,
                                                            self.config.uplink_latency_ns)
        return clock

    def _member_part(self, ingress: int, group, info: ReduceInfo, packet: Packet, payload: np.ndarray) -> None:
        """Book member `ingress`'s part of its node's partial of `info`'s slot (1/m of its raw bytes, m the
        node's members of the group) on its share of the uplink to spine slot[-1] mod P, ready once its
        contribution has been through the engine (+ s + the engine's latency), in its packet order: every
        group of a GPU books that one share, in an order fixed by that GPU's program."""
        spine = self.topology.nodes + info.slot[-1] % self.topology.spines
        dtype = check_dtype(info.dtype)
        wide = payload.nbytes // dtype.itemsize * switch_accumulator(dtype).itemsize
        raw = raw_bytes(wide, self.config.mtu_bytes, self.config.header_bytes)
        ready = self.timing.switch_latency_ns + self.timing.reduction_latency_ns
        a, b = self._member_clock(ingress, spine).send(packet.t_start + ready, packet.t_end + ready,
                                                       raw / len(group.inputs))
        key = (info.group, tuple(info.slot))
        was = self._parts.get(key, (a, b))
        self._parts[key] = (max(was[0], a), max(was[1], b))

    def _partial_up(self, group, info: ReduceInfo, dest: tuple, key: tuple, partial: np.ndarray,
                    start: float, end: float, raw: int) -> Send:
        """The leaf's partial of `info`'s slot, to spine slot[-1] mod P: its bytes reach the spine once the
        engine's result (+ u) and every member's part on its share (_member_part) did; its result will
        come back for the local members of `dest` (none: the spine's notice "reduced" frees its share)."""
        topology = self.topology
        spine = topology.nodes + info.slot[-1] % topology.spines
        first, last = self._parts.pop((info.group, tuple(info.slot)))
        u = self.config.uplink_latency_ns
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

    # -- nvls across nodes: load-reduce through both levels (module docstring, Spanning groups) ----
    def _load_reduce_across(self, ingress: int, packet: Packet, group, info: LoadInfo) -> list[Send]:
        """GPU `ingress`'s LOAD_REDUCE of a spanning group: header-only LOADs to this node's members (rank
        order) and the request, header-only, up to spine slot[-1] mod P, which passes it to the group's
        other leaves (SpineLogic._load_reduce_on). The members' REDUCE answers make each leaf's partial
        (_partial_up); the result comes back to this leaf alone, for the requester."""
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
        _check_requester(ingress, group, info)
        if (info.group, info.key) in self._asked or (info.group, tuple(info.slot)) in self._asked_slot:
            # members file a slot's LOADs under the slot alone: two requests of one slot would be one to them
            raise CollectiveMismatch(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: "
                                     f"result key {list(info.key)} or the slot is awaited already")
        if not self._may_load(group, info):  # as if a member here refused it: the requester hears nothing
            return []
        asked = self._asked_count.get(group.partition, 0)
        if asked >= self.partial_share_parts:
            raise ResourceExhausted(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: "
                                    f"switch {self.switch} has {asked} of partition {group.partition}'s load-reduces "
                                    f"awaiting their result, its share {self.partial_share_parts} (held "
                                    f"contributions' share / nodes)")
        self._asked[(info.group, info.key)] = (group.partition, tuple(info.slot))
        self._asked_slot[(info.group, tuple(info.slot))] = info.key
        self._asked_count[group.partition] = asked + 1
        ready = packet.t_end + self.timing.switch_latency_ns
        spine = self.topology.nodes + info.slot[-1] % self.topology.spines
        self.counters.record(f"sw{self.switch}->sw{spine}", 0)
        up = ready + self.config.uplink_latency_ns  # header-only: the cable's latency, booked on no share
        request = packet.but(src=self.route_key(ingress), t_start=up, t_end=up)
        return [*self._loads(group, packet, info, ready), Send(-1, request, None, -1, spine)]

    def _may_load(self, group, info: LoadInfo) -> bool:
        """Whether this leaf may LOAD `info`'s slot from each of its members of `group`: none has a LOAD of
        that slot unanswered (members file LOADs under the slot alone) or max_loads of them; else the
        request is dropped (counted in dropped_loads) and the requester's place in the budget given back."""
        slot = tuple(info.slot)
        if all((info.group, slot, port) not in self._loaded and self._loaded_count.get(port, 0) < self.max_loads
               for port in group.inputs):
            return True
        self.dropped_loads += 1
        self._event({"ev": "load-dropped", "group": info.group, "slot": list(slot)})
        return False

    def _load_done(self, gid: int, slot: tuple, port: int) -> bool:
        """Member `port`'s answer (REDUCE or "unserved") to the LOAD of `slot` of group `gid`: whether one
        was sent it and not yet answered (now it is)."""
        if (gid, slot, port) not in self._loaded:
            return False
        del self._loaded[(gid, slot, port)]
        self._loaded_count[port] -= 1
        return True

    def _load_answered(self, gid: int, key: tuple) -> None:
        """The load-reduce awaiting result `key` of group `gid` (if one of this leaf's GPUs asked) is done."""
        asked = self._asked.pop((gid, key), None)
        if asked is not None:
            partition, slot = asked
            del self._asked_slot[(gid, slot)]
            self._asked_count[partition] -= 1

    def _load_refused(self, gid: int, slot: tuple) -> list[Send]:
        """A member will not serve the LOAD of `slot` of group `gid` (or a leaf dropped the request): the
        load-reduce of this leaf's GPU awaiting it, if any, gives its place in the budget back. Its
        requester hears nothing from the switch: it serves the same range of its own buffer (of the
        call's size, as every honest member's) and refuses it too, or its wait ends at its deadline."""
        key = self._asked_slot.get((gid, slot))
        if key is not None:
            self._load_answered(gid, key)
        return []

    def _unserved(self, ingress: int, info: GroupInfo) -> list[Send]:
        """GPU `ingress`'s notice that it will not serve the LOAD of slot info.members of group info.group
        (ranks/gpu.serve_load): on to the requester's leaf (slot[1]: its rank, as _load_reduce_across
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
        if not self._load_done(info.group, slot, ingress):  # one notice per LOAD: so notices are bounded by LOADs
            raise AccessViolation(f"load refusal by GPU {ingress}: group {info.group} slot {list(slot)}: switch "
                                  f"{self.switch} sent GPU {ingress} no LOAD of it that is unanswered")
        if group.members[slot[1]] in self.local:
            return self._load_refused(info.group, slot)
        notice = Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unserved", info.group, slot, ""))
        return [Send(-1, notice, switch=self.topology.nodes + slot[-1] % self.topology.spines)]

    def _loads(self, group, packet: Packet, info: LoadInfo, ready: float) -> list[Send]:
        """Header-only LOADs of `packet`'s range to this leaf's members of `group`, ready at `ready` ns, each
        awaiting its member's answer (_may_load checked it fits)."""
        slot = tuple(info.slot)
        for port in group.inputs:
            self._loaded.add((info.group, slot, port))
            self._loaded_count[port] = count = self._loaded_count.get(port, 0) + 1
            self.peak_loads = max(self.peak_loads, count)
        load = Packet(Kind.LOAD, -1, 0, packet.address, packet.nbytes, packet.req, info, ready, ready)
        return [Send(port, load.but(dst=self.route_key(port)), origin=-1) for port in group.inputs]

    def _loads_asked(self, spine: int, packet: Packet) -> list[Send]:
        """Another node's load-reduce, passed on by spine `spine`: LOADs to this node's members. A request
        of a group released on its way is dropped; one for members here that have not bound the group is
        dropped too, and its requester's leaf told ("unserved"); anything else that does not fit is a
        switch's bug."""
        self.counters.record(f"sw{spine}->sw{self.switch}", 0)
        info = packet.info
        group = self.groups.groups.get(info.group)
        if group is None and _released(self.groups, self._seen, self.topology.nodes, info.group):
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
        return [self._out(send) for send in self._loads(group, packet, info, ready)]

    def on_switch(self, spine: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send for in-switch traffic of a spanning group that spine `spine` sent: a result to copy
        to this node's members, or a group's creation, its answers, its release. The switches trust each
        other: anything that does not fit is a bug (ProtocolError, which ends the run)."""
        kind, info = packet.kind, packet.info
        here = f"switch {self.switch}"
        if kind is Kind.MCAST and packet.src != -1:  # a GPU's store from another node (_store_span)
            return self._store_in(spine, packet, payload)
        if kind is Kind.MCAST:
            self.counters.record(f"sw{spine}->sw{self.switch}", packet.payload_bytes)
            got = self._partials.pop((info.group, info.key), None)
            if got is None:
                if _released(self.groups, self._seen, self.topology.nodes, info.group):
                    return []  # it crossed its group's release (which freed its partial) on the way down
                raise ProtocolError(f"{here}: a result of group {info.group} key {list(info.key)} from spine {spine}, "
                                    f"for no partial this leaf sent")
            ports, nbytes, partition = got
            self._load_answered(info.group, info.key)
            self._free_partial(nbytes, partition)
            out = self._through(packet)
            return [self._out(self._deliver(port, info.group, info.key, payload, out.t_start, out.t_end, -1))
                    for port in ports]
        if kind is Kind.LOAD_REDUCE:
            return self._loads_asked(spine, packet)
        if kind is not Kind.GROUP:
            raise ProtocolError(f"{here}: {kind.name} from spine {spine} is no spanning group's traffic")
        if info.action == "span":  # a group another leaf created, held by every spine already: this node's copy
            return self._span_in(spine, info)
        if info.action == "unspan":
            self._drop_span(info.group)
            return []
        if info.action == "unserved":  # a member of another node will not serve a LOAD of a slot asked here
            return self._load_refused(info.group, tuple(info.members))
        if info.action == "reduced":  # a slot whose result went to other nodes only: its partial's share back
            got = self._unanswered.pop((info.group, tuple(info.members)), None)
            if got is None:
                if _released(self.groups, self._seen, self.topology.nodes, info.group):
                    return []
                raise ProtocolError(f"{here}: spine {spine} reduced slot {list(info.members)} of group {info.group}, "
                                    f"for no partial this leaf sent")
            self._free_partial(*got)
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

    # -- multicast stores across nodes (module docstring, Spanning groups) ------------------------
    def store_spine(self, group, ingress: int, key: tuple) -> int:
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
        return group.inputs if group is not None else self._gone.get(gid, ())

    def _store_span(self, ingress: int, group, packet: Packet, payload: np.ndarray) -> list[Send]:
        """A member's multicast store through a group spanning nodes: a copy to each member of this node
        (the sender's own included), one copy up to spine store_spine(...) on the sender's share of the
        node's uplink to it (U / (G P), booked here in the sender's packet order), src stamped with the
        sender, for the spine to send on to the group's other leaves."""
        info = packet.info
        spine = self.store_spine(group, ingress, info.key)
        out = self._through(packet)
        raw = raw_bytes(packet.nbytes, self.config.mtu_bytes, self.config.header_bytes)
        t_start, t_end = self._member_clock(ingress, spine).send(out.t_start, out.t_end, raw)
        self.counters.record(f"sw{self.switch}->sw{spine}", packet.nbytes)
        self._event({"ev": "mcast", "group": info.group, "from": ingress, "bytes": packet.nbytes,
                     "copies": len(group.inputs), "spine": spine, "m": out.t_start})
        up = Packet(Kind.MCAST, self.route_key(ingress), -1, 0, packet.nbytes, info=McastInfo(info.group, info.key),
                    t_start=t_start, t_end=t_end)
        return [self._deliver(port, info.group, info.key, payload, out.t_start, out.t_end, None)
                for port in group.inputs] + [Send(-1, up, payload, None, spine)]

    def _store_in(self, spine: int, packet: Packet, payload: np.ndarray) -> list[Send]:
        """A store of a GPU of another node that spine `spine` sent down: a copy to each member of this
        node. Taken only for a group that spans this leaf and from a member of another node (the spines
        are trusted: anything else is a bug, ProtocolError)."""
        info, here = packet.info, f"switch {self.switch}"
        self.counters.record(f"sw{spine}->sw{self.switch}", packet.payload_bytes)
        group = self.groups.groups.get(info.group)
        if group is None and _released(self.groups, self._seen, self.topology.nodes, info.group):
            return []  # it crossed its group's release on the way (ranks/switch returns its credit)
        sender = self.gpu_of_key(packet.src)
        if group is None or group.stage != "leaf" or sender not in group.members or sender in self.local:
            raise ProtocolError(f"{here}: a store of group {info.group} from spine {spine} for GPU {packet.src!r}: "
                                + ("no group spanning this leaf" if group is None or group.stage != "leaf" else
                                   f"not a member of another node (members {list(group.members)})"))
        out = self._through(packet)
        # a copy only to members that bound the group, as on one switch (ranks/switch returns the credit
        # of the others' copies)
        return [self._out(self._deliver(port, info.group, info.key, payload, out.t_start, out.t_end, sender))
                for port in group.inputs if port in group.bound]

    def _free_partial(self, nbytes: int, partition: int) -> None:
        """A partial of `partition` (nbytes) answered or given up: it leaves the partition's share here."""
        self._partial_bytes[partition] -= nbytes
        self._partial_parts[partition] -= 1

    def _span_in(self, spine: int, info: GroupInfo) -> list[Send]:
        """Spine `spine`'s span of a group another leaf created (every spine sends one, phase 2): the first
        makes this node's copy (or is refused), the others are counted; answered (through the first spine,
        which relays the leaves' answers) once every spine's came, and only then may members bind here: so
        whatever any spine passes on for the group reaches this leaf after that spine's span (MPI's order
        per sender), whichever member sent it. A span of a group refused or undone here meanwhile is dropped."""
        topology = self.topology
        due = self._spans_due.get(info.group)
        if due is None:
            if info.group in self.groups.groups or _released(self.groups, self._seen, topology.nodes, info.group):
                if info.group in self.groups.groups:
                    raise ProtocolError(f"switch {self.switch}: a second span of group {info.group} from spine {spine}")
                return []  # refused here, or undone by its creator, before this spine's span came
            try:
                self._take_span(info)
            except FabricError as exc:
                _seen(self._seen, topology.nodes, info.group)  # what comes for it is dropped, as if released
                answer = GroupInfo("refused", info.group, (), _why(exc))
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
        if self.groups.count_in(partition) >= self.group_share:
            raise ResourceExhausted(f"switch {self.switch}: cannot hold group {info.group} for GPUs "
                                    f"{list(info.members)}: partition {partition} holds {self.group_share} groups "
                                    f"here, its share (the limit is {self.groups.limit} per switch)")
        local = tuple(g for g in info.members if g in self.local)
        self.groups.create(info.members, local[0], info.name, partition, group_id=info.group, inputs=local,
                           stage="leaf", who=f"switch {self.switch}")
        _seen(self._seen, self.topology.nodes, info.group)

    def _notice(self, port: int, error: str, message: str, t_ns: float) -> Send:
        """A NACK to member `port` for what a spine refused (`error`: a fabric.errors class name; the
        refusal here at `t_ns`, modeled): no packet of this GPU's was refused, none is counted on its port."""
        ready = t_ns + self.timing.switch_latency_ns
        nack = Packet(Kind.NACK, src=-1, dst=self.route_key(port), req=0, info=NackInfo(error, message[:4000], "REDUCE"),
                      t_start=ready, t_end=ready)
        return self._out(Send(port, nack, origin=-1))

    def _drop_span(self, gid: int) -> None:
        self._spans_due.pop(gid, None)
        # each of these is indexed by group (ByGroup): a release touches only what the group holds
        for key in self._asked.of(gid):
            self._load_answered(*key)
        for key in self._loaded.of(gid):  # their answers are dropped with the group
            self._load_done(*key)
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
            _remember_gone(self._gone, gid, group.inputs)

    def _span(self, ingress: int, packet: Packet, info: GroupInfo, nodes: list[int]) -> list[Send]:
        """Create spanning group `info` for GPU `ingress`: this leaf's copy, then the other switches'
        (answered once they all took it)."""
        topology = self.topology
        partition = self._partition[ingress]
        gid = self.groups.next_id()
        local = tuple(g for g in info.members if g in self.local)
        self.groups.create(info.members, ingress, info.name, partition, group_id=gid, inputs=local, stage="leaf")
        _seen(self._seen, topology.nodes, gid)
        spines = range(topology.nodes, topology.nodes + topology.spines)
        # phase 1 the spines; phase 2, once they all took it, the other leaves (module docstring)
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
            self._drop_span(info.group)
            sends = [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unspan", info.group, (), "")),
                          switch=spine) for spine in range(self.topology.nodes, self.topology.nodes + self.topology.spines)]
            self.refused[ingress] += 1
            kind, _, message = errors[0].partition(": ")
            reply = {"error": kind, "message": f"GPU {ingress}: group create across nodes refused: {message}"
                                               + (f" (and {len(errors) - 1} more switches)" if len(errors) > 1 else "")}
        else:
            reply = {"group": info.group}
        return sends + [Send(ingress, Packet(Kind.REPLY, src=-1, dst=self.route_key(ingress), req=req, info=reply))]

    def _deliver(self, port: int, group: int, key: tuple, payload: np.ndarray, t_start: float, t_end: float,
                 origin: int | None) -> Send:
        """A copy for `port` of an in-switch result or a multicast store through `group`."""
        return Send(port, Packet(Kind.MCAST, -1, self.route_key(port), 0, payload.nbytes, info=McastInfo(group, key),
                                 t_start=t_start, t_end=t_end), payload, origin)

    def _event(self, record: dict) -> None:
        if self.tracing:
            self.events.append(record)

    def _port_for(self, ingress: int, packet: Packet) -> int:
        try:
            return self.port_of(packet.dst)
        except AccessViolation as exc:
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {ingress}: {exc}") from None

    def _resolve(self, ingress: int, target: int, packet: Packet, write: bool) -> int:
        """Physical offset in GPU `target` (a port of this switch) of a PUT/GET by GPU `ingress`: Link
        TLB in network mode and for a classic node's registered window (by handle), address bits otherwise."""
        if self.network or packet.dst != -1:
            tlb = self.tlbs[target]
            before = (tlb.hits, tlb.misses, tlb.faults)
            try:
                return tlb.translate(packet.address, packet.nbytes, ingress, self._partition[ingress], write)
            finally:
                if self.tracing:
                    hits, misses, faults = (now - was for now, was in zip((tlb.hits, tlb.misses, tlb.faults), before))
                    self._event({"ev": "tlb", "port": target, "by": ingress, "address": packet.address,
                                 "bytes": packet.nbytes, "hits": hits, "misses": misses, "faults": faults,
                                 "m": packet.t_start})
        offset = decode_physical(packet.address, self.config.gpus)[1]
        if offset + packet.nbytes > self.config.memory_capacity_bytes:
            raise AccessViolation(f"physical range {packet.address:#x}+{packet.nbytes} runs past the "
                                  f"{self.config.memory_capacity_bytes} bytes of GPU {target}")
        return offset

    def _physical_target(self, ingress: int, packet: Packet) -> int:
        """The GPU a classic PUT/GET's physical address names: one of this node's (the shared physical
        space ends at the node; another node is reached through a registered window, as RDMA does)."""
        if packet.dst != -1:
            raise AccessViolation(f"{packet.kind.name} from GPU {ingress}: classic NVLink routes requests by "
                                  f"physical address (dst -1), got dst {packet.dst}")
        target = decode_physical(packet.address, self.config.gpus)[0]
        if target not in self.local:
            raise UnsupportedOperation(f"{packet.kind.name} from GPU {ingress} to physical {packet.address:#x}: "
                                       f"GPU {target} is in node {target // self.config.gpus_per_node}, and a "
                                       f"classic physical address names a GPU of the same node only (node "
                                       f"{self.switch})")
        return target

    # -- the control plane (fabric manager) -------------------------------------------------------
    def _control(self, ingress: int, packet: Packet) -> list[Send]:
        handler = {Kind.EXPORT: self._export, Kind.REVOKE: self._revoke, Kind.GROUP: self._group}.get(packet.kind)
        if handler is None:  # DONE, TRACE, COUNTERS: the switch rank's own business
            raise ProtocolError(f"switch: {packet.kind.name} from GPU {ingress} is not a fabric-manager call")
        if packet.kind is Kind.GROUP and packet.info.action == "unserved":  # a notice, which nothing answers
            try:
                return [self._out(send) for send in self._unserved(ingress, packet.info)]
            except FabricError as exc:
                return self.refuse(ingress, exc, "GROUP", packet.req, packet.t_end)
        try:
            info = handler(ingress, packet.info)
            if isinstance(info, tuple):  # a spanning group: the other switches' part comes first
                return [self._out(send) for send in self._span(ingress, packet, *info)]
        except FabricError as exc:  # a refused call is answered, not a data-plane violation
            self.refused[ingress] += 1
            info = {"error": type(exc).__name__, "message": str(exc)}
        sends = []
        if isinstance(info, dict) and "unspan" in info:
            sends = [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unspan", info["group"], (), "")),
                          switch=spine) for spine in range(self.topology.nodes, self.topology.nodes + self.topology.spines)]
            info = {"group": info["group"]}
        return sends + [Send(ingress, Packet(Kind.REPLY, src=-1, dst=self.route_key(ingress), req=packet.req, info=info))]

    def _export(self, ingress: int, info) -> dict:
        if not self.tlbs:
            raise UnsupportedOperation(f"export by GPU {ingress}: classic NVLink connections are fixed at "
                                       f"boot; use gpu.physical_address(array)")
        capacity = self.config.memory_capacity_bytes
        if not (0 <= info.phys_offset and 0 < info.size_bytes <= capacity - info.phys_offset):
            raise AccessViolation(f"export by GPU {ingress}: bytes {info.phys_offset:#x}+{info.size_bytes} are "
                                  f"not inside its {capacity} bytes of memory")
        partition = self._partition[ingress]
        members = self.config.partitions[partition]
        allowed = members if info.to is None else info.to
        if not allowed:
            raise FabricError(f"export by GPU {ingress}: to= names no GPU; nobody could use the window")
        for gpu in allowed:
            if not 0 <= gpu < self.config.gpus:
                raise FabricError(f"export by GPU {ingress}: to= names {gpu!r}, not a GPU 0..{self.config.gpus - 1}")
            if self._partition[gpu] != partition:
                raise AccessViolation(f"export by GPU {ingress}: GPU {gpu} is in partition {self._partition[gpu]}, "
                                      f"GPU {ingress} in partition {partition}; partitions are isolated")
        window = self.tlbs[ingress].map(info.phys_offset, info.size_bytes, frozenset(allowed), partition,
                                        writable=info.writable, readable=info.readable)
        handle = Handle(self.route_key(ingress), window.address, window.size_bytes, ingress)
        return {"handle": [handle.network_address, handle.address, handle.size_bytes, handle.owner],
                "allowed": sorted(set(allowed))}

    def _revoke(self, ingress: int, info) -> dict:
        if not self.tlbs:
            raise UnsupportedOperation(f"revoke by GPU {ingress}: classic NVLink connections are fixed at boot")
        if info.network_address != self.route_key(ingress):
            raise AccessViolation(f"revoke by GPU {ingress}: the window {info.network_address:#x}:"
                                  f"{info.address:#x} is not GPU {ingress}'s; only its owner may revoke it")
        window = self.tlbs[ingress].unmap(info.address)
        return {"revoked": window.address}

    def _group(self, ingress: int, info: GroupInfo) -> dict:
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"multicast group call by GPU {ingress}: fabric {self.config.name!r} has no "
                                       f"multicast/SHARP groups (needs NVLink Network with a SHARP switch)")
        if info.action == "create":
            for gpu in info.members:
                if not 0 <= gpu < self.config.gpus:
                    raise FabricError(f"group create by GPU {ingress}: member {gpu!r} is not a GPU "
                                      f"0..{self.config.gpus - 1}")
            nodes = sorted({g // self.config.gpus_per_node for g in info.members})
            outside = [g for g in info.members if self._partition[g] != self._partition[ingress]]
            if outside:
                raise AccessViolation(f"group create by GPU {ingress}: GPUs {outside} are in another partition")
            if not info.name:
                raise ProtocolError(f"group create by GPU {ingress}: the group needs its communicator's name")
            partition = self._partition[ingress]
            if self.groups.count_in(partition) >= self.group_share:
                raise ResourceExhausted(f"GPU {ingress}: cannot create a multicast/SHARP group for GPUs "
                                        f"{list(info.members)}: partition {partition} holds {self.group_share} "
                                        f"groups, its share (the limit is {self.groups.limit} per switch, shared "
                                        f"by {len(self.config.partitions)} partitions); release one first")
            if nodes != [self.switch]:
                if not self.config.spine_sharp:
                    raise UnsupportedOperation(f"group create by GPU {ingress}: GPUs {list(info.members)} are in nodes "
                                               f"{nodes}, and the spines of fabric {self.config.name!r} do not reduce "
                                               f"or multicast (spine_sharp false); use ring, direct or hier")
                if ingress not in info.members or len(set(info.members)) != len(info.members):
                    raise FabricError(f"GPU {ingress}: group members {list(info.members)} must be distinct and "
                                      f"include it")
                return (info, nodes)  # a spanning group (_span)
            return {"group": self.groups.create(info.members, ingress, info.name, partition)}
        if info.action == "bind":
            if info.group in self._spanning or info.group in self._spans_due:
                raise AccessViolation(f"group bind by GPU {ingress}: group {info.group} is not created yet")
            self.groups.bind(info.group, ingress)
            return {"group": info.group}
        if info.action == "release":
            group = self.groups.group(info.group, ingress, "release", bound=True)
            if group.stage == "leaf":
                if info.group % self.topology.nodes != self.switch:
                    raise AccessViolation(f"group release by GPU {ingress}: group {info.group} spans nodes and was "
                                          f"created at node {info.group % self.topology.nodes}'s switch, which alone "
                                          f"releases it (its first member does)")
                self._drop_span(info.group)
                return {"group": info.group, "unspan": True}
            self.groups.release(info.group, ingress)
            return {"group": info.group}
        raise ProtocolError(f"group call by GPU {ingress}: unknown action {info.action!r}")

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
        # through the spine and down to the leaf: one traversal and the link's latency; the transfer is
        # timed on its receiver's inbound share, which the receiver books (fabric.topology, Shares)
        self.latency_ns = topology.switch_latency_ns + config.uplink_latency_ns
        self.tracing = False  # a spine makes no decisions worth a trace record beyond the packets
        self.events: list[dict] = []
        # spanning groups (module docstring, Spanning groups): their copies here, whose inputs are leaves,
        # and each GPU's share of its node's uplink from this spine (U / (G P)), which its part of every
        # result for its node takes, whatever the group (_result_down)
        self.timing = config.timing
        self.groups = GroupTable()
        self.group_share = max(1, self.groups.limit // len(config.partitions))
        self._member_down: dict[int, LinkEnd] = {}
        self._seen: dict[int, int] = {}  # creator leaf -> the highest k of its group ids held here (_released)
        self.peak_held_bytes = 0
        self.late_partials = 0  # partials of a group released while they were on their way (dropped)
        # multicast stores: the down clocks (group, sender, leaf), the sender's part of the group's shares
        # of that node's uplink from this spine; stores of a released group dropped on their way
        self._store_down: dict[tuple[int, int, int], LinkEnd] = ByGroup()
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
            self.counters.record(f"sw{leaf}->sw{self.switch}", packet.payload_bytes)
            group = self.groups.groups.get(info.group)
            if group is None and _released(self.groups, self._seen, nodes, info.group):
                self.late_partials += 1  # it crossed its group's release, which its leaf freed it with
                return []
            if group is None or leaf not in group.inputs:
                raise AccessViolation(f"{here}: partial REDUCE of group {info.group} slot {list(info.slot)} from leaf "
                                      f"{leaf}: " + (f"no live group {info.group}" if group is None else
                                                     f"leaf {leaf} is no leaf of the group's nodes {list(group.inputs)}"))
            try:
                done = self.groups.contribute(info.group, info.slot, leaf, info.op, info.dtype, payload,
                                              (info.dest, info.key), (packet.t_start, packet.t_end))
            except FabricError as exc:
                # the nodes disagree on this slot (their members' calls, or a member that lies; each leaf
                # checked its own): every member hears it, as on one switch the sender does, and the spine
                # serves on; the slot's held partials stay until the group's release
                why = _why(exc, f"{here}: group {info.group} slot {list(info.slot)}: ")
                ready = packet.t_end + self.latency_ns  # when the refused partial's last byte is in, at a leaf
                failed = Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("failed", info.group, (), why),
                                t_start=ready, t_end=ready)
                return [Send(-1, failed, switch=node) for node in group.inputs]
            if done is None:
                self.peak_held_bytes = max(self.peak_held_bytes, self.groups.held_bytes)
                return []
            result, (dest, key), (first_ns, last_ns) = done
            delay = self.timing.switch_latency_ns
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
            return self._store(leaf, packet, payload)
        if kind is not Kind.GROUP:
            raise ProtocolError(f"{here}: {kind.name} from leaf {leaf} is no spanning group's traffic")
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
                _seen(self._seen, nodes, info.group)
                answer = GroupInfo("spanned", info.group, (), "")
            except FabricError as exc:
                _seen(self._seen, nodes, info.group)  # what comes for it is dropped, as if released
                answer = GroupInfo("refused", info.group, (), _why(exc))
            return [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=answer), switch=leaf)]
        if info.action == "spread":  # every spine took the creator leaf's group: its span on to the other leaves
            others = sorted({g // self.config.gpus_per_node for g in info.members} - {leaf})
            span = packet.but(info=GroupInfo("span", info.group, info.members, info.name))
            return [Send(-1, span, switch=node) for node in others]
        if info.action == "unspan":
            if info.group in self.groups.groups:
                _remember_gone(self._gone, info.group, self.groups.groups[info.group].members)
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
            if group is None and _released(self.groups, self._seen, nodes, info.group):
                return []
            slot = tuple(info.members)
            requester = group.members[slot[1]] if group is not None and 2 <= len(slot) and \
                0 <= slot[1] < len(group.members) else None
            if requester is None or leaf not in group.inputs or requester // self.config.gpus_per_node == leaf:
                raise ProtocolError(f"{here}: load refusal of group {info.group} slot {list(slot)} from leaf {leaf}, "
                                    f"which is no other node's refusal of a live group's request")
            return [Send(-1, packet, switch=requester // self.config.gpus_per_node)]
        raise ProtocolError(f"{here}: GROUP {info.action!r} from leaf {leaf}")

    def _result_down(self, group, node: int, start: float, end: float, raw: int) -> tuple[float, float]:
        """When a result of `raw` bytes leaving the engine at start..end (ns) reaches leaf `node`: it takes
        the group's shares of that node's uplink from this spine together (m x U / (G P), m its members
        there), each member's part of it (1/m of its bytes) that member's own share, booked here in the
        spine's completion order and shared by every group of the member (as _member_part on the way up);
        the result is at the leaf once every part is."""
        per_node = self.config.gpus_per_node
        local = [g for g in group.members if g // per_node == node]
        first = last = -math.inf
        for gpu in local:
            clock = self._member_down.get(gpu)
            if clock is None:
                clock = self._member_down[gpu] = LinkEnd(self.topology.share_gbytes_per_s / self.topology.spines,
                                                         self.config.uplink_latency_ns)
            a, b = clock.send(start, end, raw / len(local))
            first, last = max(first, a), max(last, b)
        return first, last

    def _load_reduce_on(self, leaf: int, packet: Packet) -> list[Send]:
        """A requester's leaf's LOAD_REDUCE (header-only), on to the group's other leaves, each of which
        loads its members' range and sends its partial here. Only a leaf of the group's nodes, for a
        requester of its own node, asks; anything else is a leaf's bug (AccessViolation, ends the run).
        A request of a group released on its way is dropped."""
        self.counters.record(f"sw{leaf}->sw{self.switch}", 0)
        info = packet.info
        group = self.groups.groups.get(info.group)
        if group is None and _released(self.groups, self._seen, self.topology.nodes, info.group):
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
        """A member's multicast store that leaf `leaf` sent up (SwitchLogic._store_span): one copy down to
        each other leaf the group spans, each on the down clock (group, sender, leaf): the group's shares
        of that node's uplink from this spine (m_k x U / (G P), m_k its members), an equal part for each of
        the n - m_k members outside it, booked here in the sender's order. Taken only from a leaf of the
        group's nodes, for a member in that leaf's node (AccessViolation otherwise: a leaf's bug)."""
        info, here = packet.info, f"spine {self.switch}"
        self.counters.record(f"sw{leaf}->sw{self.switch}", packet.payload_bytes)
        group = self.groups.groups.get(info.group)
        if group is None and _released(self.groups, self._seen, self.topology.nodes, info.group):
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
        delay = self.timing.switch_latency_ns
        raw = raw_bytes(packet.payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        sends = []
        for node in group.inputs:
            if node == leaf:
                continue
            clock = self._store_down.get((info.group, sender, node))
            if clock is None:
                local = sum(1 for g in group.members if g // per_node == node)
                clock = self._store_down[(info.group, sender, node)] = LinkEnd(
                    self.topology.share_gbytes_per_s * local / (self.topology.spines * (len(group.members) - local)),
                    self.config.uplink_latency_ns)
            t_start, t_end = clock.send(packet.t_start + delay, packet.t_end + delay, raw)
            self.counters.record(f"sw{self.switch}->sw{node}", packet.payload_bytes)
            sends.append(Send(-1, packet.but(t_start=t_start, t_end=t_end), payload, sender, node))
        return sends


def _check_requester(ingress: int, group, info: LoadInfo) -> None:
    """AccessViolation unless GPU `ingress`'s load-reduce names its rank in `group` second in its slot (after
    the call's seq: nvls.py's (seq, r, c, r + c), hier's node RS (seq, position, phase, slice, chunk),
    hier_plan.leaf_slot). Every member files the LOADs of a slot under the slot alone, so a member that
    asked another's slot first would take over its answer (and the other's request would wait for ever),
    on one switch as across nodes."""
    rank = group.members.index(ingress)
    if len(info.slot) < 2 or info.slot[1] != rank:
        raise AccessViolation(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: a "
                              f"load-reduce names its requester's rank {rank} in the group second in its slot")


def _seen(seen: dict[int, int], nodes: int, gid: int) -> None:
    """Note spanning group `gid` (id k x nodes + its creator leaf) as held here (see _released)."""
    seen[gid % nodes] = max(seen.get(gid % nodes, 0), gid // nodes)


def _remember_gone(gone: dict[int, tuple[int, ...]], gid: int, members: tuple[int, ...]) -> None:
    """Remember released spanning group `gid`'s `members` (a leaf's own, or all at a spine), the most
    recent GONE_KEPT groups only: a store crossing the release took credit for them at its sender's
    leaf, which the switch that drops it returns (ranks/switch.py)."""
    gone[gid] = members
    if len(gone) > GONE_KEPT:
        del gone[next(iter(gone))]


def _released(groups: GroupTable, seen: dict[int, int], nodes: int, gid: int) -> bool:
    """Whether spanning group `gid`, not in `groups`, may have been held here and released: each leaf's
    ids grow (k = 1, 2, ...), so one number per creator leaf tells a late packet of a released group
    (dropped) from one of a group not created yet (a switch's bug; one of a group of that leaf's that
    never spanned this switch is dropped too, which only a switch's bug sends)."""
    return gid not in groups.groups and 0 < gid // nodes <= seen.get(gid % nodes, 0)


def _why(exc: Exception, context: str = "") -> str:
    """`exc` as a switch tells another switch of it, "Class: message", cut to a header's string field
    (MAX_TEXT characters: a message listing a large group's members is longer, and a switch's packet
    that does not decode ends the run)."""
    return f"{type(exc).__name__}: {context}{exc}"[:MAX_TEXT]
