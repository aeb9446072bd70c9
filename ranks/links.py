"""A GPU's two links as it books and counts them: the uplink as it sends, the downlink (and its inbound share of
its node's uplink) as it consumes, their faults, their counters and their trace records."""

import time
from typing import overload

from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import LinkCounters, LinkStats, downlink, uplink
from nvlink_emu.fabric.faults import LinkFaultState, spine_links_scale
from nvlink_emu.fabric.packets import Kind, Packet, raw_bytes
from nvlink_emu.fabric.timemodel import LinkEnd

# the program's own one-sided traffic, which beside a channelled call takes a lane of its own (LinkEnd.post)
BESIDE_KINDS = (Kind.PUT, Kind.GET)


class GpuLinks:
    """The links of GPU `rank` (on leaf `leaf`); trace: its TraceWriter, or None. `tx`/`rx` name the links."""

    def __init__(self, config: FabricConfig, rank: int, leaf: int, trace=None):
        self.config, self.rank, self.leaf, self.trace = config, rank, leaf, trace
        self.tx, self.rx = uplink(rank, leaf), downlink(rank, leaf)
        self.counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        timing = config.timing
        self.uplink = LinkEnd(timing.bandwidth_gbytes_per_s, timing.link_latency_ns)
        self.downlink = LinkEnd(timing.bandwidth_gbytes_per_s, timing.link_latency_ns)
        # its inbound share of its node's uplink (fabric.topology; docs/model/time.md, "Several nodes"), booked as
        # it consumes a transfer from another node; the cable's latency is in the packet's stamp already
        share = config.topology.share_gbytes_per_s
        self.inbound = LinkEnd(share, 0.0) if share else None
        # the fault plan's state of this GPU's faulted links (fabric.faults), booked with them; from the
        # launcher's config only, never from a packet
        self.plan = config.fault_plan
        self.faults = {name: LinkFaultState(self.plan, name, config.mtu_bytes, config.header_bytes)
                       for name in (self.tx, self.rx) if self.plan.on(name)}
        self._spine_faults = any(link.startswith("sw") and "->sw" in link for link in self.plan.links())
        self.tx_seq = self.rx_seq = -1  # packets sent / received on this GPU's links
        self.program_bytes = [0, 0]     # payload its program sent / consumed (Gpu.program_bytes)

    @overload
    def link_time(self, link: str, payload_bytes: int, at_ns: float, raw: float) -> float: ...
    @overload
    def link_time(self, link: str, payload_bytes: int, at_ns: float, raw: None) -> float | None: ...

    def link_time(self, link: str, payload_bytes: int, at_ns: float, raw: float | None) -> float | None:
        """Raw bytes' worth of time a transfer keeps `link` busy: `raw`, or with the link's faults its
        replays added and its lanes accounted (fabric.faults.LinkFaultState); LinkDown if it is down."""
        state = self.faults.get(link)
        return raw if state is None else state.book(payload_bytes, at_ns)

    def reserve_uplink(self, payload_bytes: int, at_ns: float) -> tuple[float, float]:
        """Book the uplink now for a transfer sent later, as issued at `at_ns`; returns its stamp."""
        raw = raw_bytes(payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        return self.uplink.send(at_ns, at_ns, self.link_time(self.tx, payload_bytes, at_ns, raw))

    def book_send(self, packet: Packet, at: float, stamp: tuple[float, float] | None, served: bool,
                  lane: tuple[int, int] | None) -> tuple[Packet, float | None]:
        """Count counted `packet` on the uplink and stamp it: booked at `at` unless `stamp` was reserved;
        `served`: a one-sided reply, on the uplink's served lane (it neither moves sent_ns nor delays the
        program's sends); `lane`: the program's channel. Returns (the stamped packet, its last byte out if it
        went beside a channelled call on a lane of its own, else None)."""
        beside = None
        if stamp is None:  # a down link raises here, before anything is counted
            timed = self.link_time(self.tx, packet.payload_bytes, at, None)
        raw = self.counters.record(self.tx, packet.payload_bytes)
        if stamp is None:
            timed = raw if timed is None else timed
            stamp = self.uplink.serve(at, at, timed) if served else None
            if not served and lane is None and packet.kind in BESIDE_KINDS:
                # the program's own one-sided traffic beside a channelled call that still sends: a lane of
                # its own (fabric.timemodel.LinkEnd.post; docs/model/time.md, "A put beside a collective")
                stamp = self.uplink.post(at, at, timed)
                if stamp is not None:
                    beside = stamp[1] - self.uplink.latency_ns
            if stamp is None and not served:
                stamp = self.uplink.send(at, at, timed, lane)
        assert stamp is not None  # reserved, or served, posted or sent just above
        if not served:
            self.program_bytes[0] += packet.payload_bytes
        packet = packet.but(t_start=stamp[0], t_end=stamp[1])
        self.tx_seq += 1
        if self.trace is not None and self.trace.enabled:
            self.trace.write({"ev": "tx", "link": self.tx, "seq": self.tx_seq, "kind": packet.kind.name,
                              "payload": packet.payload_bytes, "raw": raw, "src": packet.src, "dst": packet.dst,
                              "m_start": stamp[0] - self.uplink.latency_ns,
                              "m_end": stamp[1] - self.uplink.latency_ns,
                              "wall": time.time(), **self.fault_fields(self.tx)})
        return packet, beside

    def count_receive(self, packet: Packet) -> int:
        """Count counted `packet` from the switch on the downlink; returns its sequence number there."""
        raw = self.counters.record(self.rx, packet.payload_bytes)
        self.rx_seq += 1
        if self.trace is not None and self.trace.enabled:
            self.trace.write({"ev": "rx", "link": self.rx, "seq": self.rx_seq, "kind": packet.kind.name,
                              "payload": packet.payload_bytes, "raw": raw, "src": packet.src, "dst": packet.dst,
                              "wall": time.time()})
        return self.rx_seq

    def consume(self, packet: Packet, seq: int | None, sender: int | None, program: bool, lane: tuple[int, int] | None) -> float:
        """Put transfer `seq` (from GPU `sender`; None: a switch's own) on the downlink; returns when its last
        byte arrived (ns). `program`: consumed by the program, in program order, on `lane`; else served as the
        host delivered it, on the served lane (fabric.timemodel.LinkEnd)."""
        raw = raw_bytes(packet.payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        start, end = packet.t_start, packet.t_end
        lane = lane if program else None  # a channel's receive: its lane of the downlink
        if self.inbound is not None and sender is not None and sender // self.config.gpus_per_node != self.leaf:
            timed: float = raw
            if self._spine_faults:  # the node's uplink lost its down links' part (fabric.faults)
                topology = self.config.topology
                timed = raw * spine_links_scale(self.plan, self.leaf, topology.nodes, topology.spines, start, up=False)
            start, end = self.inbound.book(start, end, timed, served=not program)
            # its burst on the faster downlink, ending with its last byte (docs/model/time.md)
            start = max(start, end - raw / self.downlink.lane_bandwidth(lane))
        start, end = self.downlink.book(start, end, self.link_time(self.rx, packet.payload_bytes, start, raw),
                                        served=not program, lane=lane)
        if program:
            self.program_bytes[1] += packet.payload_bytes
        if self.trace is not None and self.trace.enabled:
            self.trace.write({"ev": "busy", "link": self.rx, "seq": seq, "m_start": start, "m_end": end,
                              "wall": time.time(), **self.fault_fields(self.rx)})
        return end + self.downlink.latency_ns

    def status(self, now_ns: float) -> dict:
        """Both links at modeled time `now_ns` (Gpu.link_status)."""
        status = {}
        for link in (self.tx, self.rx):
            state = self.faults.get(link)
            status[link] = state.counters(now_ns) if state is not None else \
                {"crc_errors": 0, "replays": 0, "state": self.plan.state(link, now_ns)}
            window = self.plan.down(link, now_ns)
            if window is not None:
                status[link].update(down_since_ns=window[0], up_at_ns=window[1])
        return status

    def snapshot(self) -> dict:
        """Every link's counters this GPU keeps ({link name: LinkStats.as_dict()}), busy times and fault
        counts included: what it reports at the end of the run."""
        self.counters.links.setdefault(self.tx, LinkStats()).busy_ns = self.uplink.busy_ns
        self.counters.links.setdefault(self.rx, LinkStats()).busy_ns = self.downlink.busy_ns
        snapshot = self.counters.snapshot()
        for link, state in self.faults.items():  # only faulted links carry these: honest reports unchanged
            snapshot.setdefault(link, LinkStats().as_dict()).update(crc_errors=state.crc_errors, replays=state.replays)
        return snapshot

    def fault_fields(self, link: str) -> dict:
        """A trace record's crc_errors and replays so far on `link` (nothing on a link without faults)."""
        state = self.faults.get(link)
        return {} if state is None else {"crc_errors": state.crc_errors, "replays": state.replays}
