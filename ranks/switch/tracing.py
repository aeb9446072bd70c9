"""A switch rank's records of the traffic it sees (a TraceWriter): which are kept (a GPU may ask for no records
of its own traffic, its TRACE word, which every switch applies the same way: relayed at a bounded rate), and
the records themselves (packets in and out, the logic's events)."""

import time

from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.packets import Packet, raw_bytes

# a leaf relays a GPU's TRACE word to the spines at most once per this much host time (s); a change within
# it waits, only the latest one kept (Records.set): a GPU toggling its word cannot flood the switches
TRACE_RELAY_S = 0.05


class Records:
    """The records of one switch rank. trace: its TraceWriter, or None (the run records nothing); logic: its
    SwitchLogic or SpineLogic; send_word(gpu, on, exclude): the rank passes a word on to the neighbour switches
    but `exclude` (a leaf: to the spines, its own GPUs' words only; a spine: to the other leaves)."""

    def __init__(self, config: FabricConfig, logic, trace, send_word):
        self.config, self.logic, self.trace = config, logic, trace
        self.send_word = send_word
        self.untraced: set[int] = set()  # GPUs that asked for no records of their traffic (set)
        self.relayed: dict[int, tuple[float, bool]] = {}  # GPU here -> (host time, word) last relayed
        self.pending: set[int] = set()  # GPUs here whose word changed since, within TRACE_RELAY_S
        self.words_held = 0  # a GPU's TRACE changes not relayed at once (set), for tests
        self._seq: dict[str, int] = {}  # per link: packets seen, to pair each send with its receive

    def set(self, gpu: int, on: bool, exclude: int | None = None) -> None:
        """GPU `gpu` asks for records of its own traffic (`on`) or for none (its TRACE, which names it by
        the port it came in on, never by a field it wrote): see traced. A change is passed on to the
        neighbour switches (but `exclude`, the one it came from), so that every switch applies the same rule
        to the GPU's packets. Nothing is passed on in a run that records nothing (no trace directory: every
        switch's trace is None). A leaf passes on a GPU's word at most once per TRACE_RELAY_S: a change
        within that waits (relay), the latest one only, till then or till the GPU's next packet to another
        switch (flush), so a GPU that toggles its word costs the switches a bounded rate, or one word per
        packet it sends up."""
        if on == (gpu not in self.untraced):
            return
        if on:
            self.untraced.discard(gpu)
        else:
            self.untraced.add(gpu)
        if self.trace is None:  # nothing records: no switch needs the word
            return
        self.trace.enabled = self.logic.tracing = len(self.untraced) < self.config.gpus
        if exclude is None:  # a GPU's own word, at its leaf: bounded in rate
            last = self.relayed.get(gpu)
            if last is not None and time.monotonic() - last[0] < TRACE_RELAY_S:
                self.pending.add(gpu)
                self.words_held += 1
                return
            self.relayed[gpu] = (time.monotonic(), on)
        self.send_word(gpu, on, exclude)

    def relay(self) -> bool:
        """Pass on the latest word of each GPU here whose change waited (set) once TRACE_RELAY_S passed
        since its last; nothing if it came back to what was passed on. True if any was sent."""
        now, moved = time.monotonic(), False
        for gpu in list(self.pending):
            if now - self.relayed[gpu][0] >= TRACE_RELAY_S:
                moved |= self.flush(gpu, now)
        return moved

    def flush(self, gpu: int, now: float | None = None) -> bool:
        """Pass on GPU `gpu`'s waiting word now (before a packet of its goes to another switch, which
        records it by that word: so a GPU's word still reaches every switch before its next packet,
        whatever the rate bound); nothing if it came back to what was passed on. True if it was sent."""
        if gpu not in self.pending:
            return False
        self.pending.discard(gpu)
        on = gpu not in self.untraced
        if on == self.relayed[gpu][1]:
            return False
        self.relayed[gpu] = (time.monotonic() if now is None else now, on)
        self.send_word(gpu, on, None)
        return True

    def traced(self, packet: Packet, origin: int) -> bool:
        """Whether a record of `packet` (its data from GPU `origin`; -1: made by a switch) is kept: a GPU's
        set_tracing(False) leaves out its own traffic only. A GPU's packet is its sender's, whoever
        receives it; a switch's own packet to a GPU (a refusal, a reply, a reduction's result, a multicast
        copy) is that GPU's; one between switches (a spanning group's partial or result), like an event
        of no one GPU, is left out only once every GPU asked."""
        untraced = self.untraced
        if not untraced:
            return True
        if origin < 0:
            origin = self.logic.gpu_of_key(packet.dst)
            if origin is None:
                return len(untraced) < self.config.gpus
        return origin not in untraced

    def record(self, ev: str, link: str, packet: Packet, origin: int) -> None:
        """A packet entering (rx) or leaving (tx) the switch on `link`; `origin` is the GPU its data
        comes from (-1: made by the switch). m_start/m_end: when its first/last byte is ready there (a
        link to another switch, booked here: when they leave on it)."""
        seq = self._seq[link] = self._seq.get(link, -1) + 1  # counted kept or not: both ends pair by it
        if not self.traced(packet, origin):
            return
        config = self.config
        start, end = packet.t_start, packet.t_end
        if ev == "tx" and "->gpu" not in link:  # to a switch, stamped at its far end: on the link, a latency earlier
            latency = config.uplink_latency_ns
            assert latency is not None  # a link between switches: a fabric of several nodes, whose config sets it
            start, end = start - latency, end - latency
        self.trace.write({"ev": ev, "link": link, "seq": seq, "kind": packet.kind.name, "origin": origin,
                          "src": packet.src, "dst": packet.dst, "payload": packet.payload_bytes,
                          "raw": raw_bytes(packet.payload_bytes, config.mtu_bytes, config.header_bytes),
                          "m_start": start, "m_end": end, "wall": time.time()})

    def write_events(self, events: list) -> None:
        """The logic's events (a refusal, a TLB lookup, a store), each that GPU's (traced), then forgotten."""
        wall, untraced = time.time(), self.untraced
        for event in events:
            if not untraced or event.get("gpu", event.get("from", event.get("by"))) not in untraced:
                self.trace.write({**event, "wall": wall})
        events.clear()
