"""The switch rank: executes SwitchLogic's decisions over MPI, bounds its in-flight buffer, ends the run.

It trusts nothing a GPU rank sends: a header is decoded and checked before its payload is taken, a
payload is sized by what MPI says arrived (never by the header) and dropped unread when it does not
fit, and a sender whose payload does not come delays only its own later packets. Whatever is
refused is answered with a NACK and counted on the sender's port; the switch keeps serving.
"""

import dataclasses
import time
from collections import deque

import numpy as np

from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import LinkStats, check_gpu_links, downlink, uplink
from nvlink_emu.fabric.errors import FabricError, FabricTimeout, ProtocolError
from nvlink_emu.fabric.packets import CountersInfo, Kind, Packet, raw_bytes
from nvlink_emu.fabric.switch import SwitchLogic, port_share_bytes

from .transport import MAX_HEADER_BYTES, Idle, Transport

MAX_UNREAD = 1024  # answers a GPU may leave unread before the switch stops reading its packets
MAX_QUEUED = 256   # packets of one GPU waiting behind one that cannot go on yet
SWEEP_STEPS = 1024  # every this many intake steps, drop stray messages of every GPU


class _Waiting:
    """A header whose payload is still to come (or still being received), with its deadline."""

    __slots__ = ("packet", "deadline", "request", "buffer", "held")

    def __init__(self, packet: Packet, deadline: float):
        self.packet, self.deadline = packet, deadline
        self.request = self.buffer = None
        self.held = False  # its payload is not taken yet: a port it goes to has too much in flight


class SwitchRank:
    """Serves the GPUs until all of them are done, then gathers their counters and sends the report.

    In-flight forwarded bytes are bounded per port, by an equal share of switch_buffer_bytes: a
    transfer bound for a port with its share in flight waits (its payload not taken yet, its
    sender's later packets behind it) until that port drains, so the switch's memory is not N x S
    and a GPU that does not receive slows only the traffic bound for it. A GPU that leaves too many
    answers unread, or has too many packets waiting, is not read from until it catches up.
    """

    def __init__(self, config: FabricConfig, transport: Transport, timeout_s: float, trace=None):
        self.config = config
        self.logic = SwitchLogic(config)
        self.trace = trace  # a TraceWriter, or None
        self.logic.tracing = trace is not None
        self._seq: dict[str, int] = {}  # per link: packets seen, to pair each send with its receive
        self.transport = transport
        self.timeout_s = timeout_s
        self.end_timeout_s = 2 * timeout_s + 5
        self.port_share_bytes = port_share_bytes(config)
        self._done: set[int] = set()
        self._counters: dict[int, CountersInfo] = {}
        self._asked_counters = False
        self._waiting: dict[int, deque[_Waiting]] = {}  # per GPU: its headers behind a payload, in order
        self._abandoned: list[tuple] = []  # payload receives given up on: (request, buffer) until they end
        self._suspects: set[int] = set()   # GPUs that sent a malformed packet: their stray payloads are dropped
        self._steps = 0                    # intake steps, for the sweeps of stray messages
        self._busy_after_done = False      # a GPU that said DONE sent another packet
        self._idle = Idle(yields=64, max_sleep_s=1e-3)  # every packet passes here: stay more awake

    def serve(self) -> dict:
        """Run until every GPU reported DONE; returns the run's report (also sent to every GPU)."""
        gpus = self.config.gpus
        first_done = None
        while len(self._done) < gpus:
            if self._step():
                self._idle.reset()
                if self._busy_after_done:  # a GPU that said DONE still sends: it was not done
                    self._busy_after_done, first_done = False, None
                continue
            if self._done and first_done is None:
                first_done = time.monotonic()
            # a backstop behind the GPUs' own deadlines, which name the operation more precisely
            if first_done is not None and time.monotonic() - first_done > self.end_timeout_s:
                missing = sorted(set(range(gpus)) - self._done)
                raise FabricTimeout(f"switch: GPUs {missing} did not finish within {self.end_timeout_s:g} s of "
                                    f"GPUs {sorted(self._done)} finishing (end of run)")
            self._idle()
        return self._finish()

    # -- intake -------------------------------------------------------------------------------------
    def _step(self) -> bool:
        """Move what can move: sends, payloads being received, one new header; True if anything did."""
        moved = self.transport.progress()
        if self._waiting or self._abandoned:
            moved |= self._advance_all()
        self._steps += 1
        if not self._steps % SWEEP_STEPS:  # now and then, for every GPU (honest ones never leave any)
            moved |= self.transport.drop_other_tags() > 0
            for source in range(self.config.gpus):
                moved |= self._drop_orphans(source)
        else:
            for source in self._suspects:
                moved |= self._drop_orphans(source)
        got = self._poll()
        if got is not None:
            self._take(*got)
            moved = True
        return moved

    def _poll(self):
        """The next header from a GPU the switch is reading from (any GPU, unless some are held)."""
        transport = self.transport
        held = {s for s, queue in self._waiting.items() if len(queue) > MAX_QUEUED or queue[0].held}
        held.update(d for d in transport.backlogged(MAX_UNREAD) if d < self.config.gpus)
        if not held:
            return transport.poll(limit=MAX_HEADER_BYTES)
        for source in range(self.config.gpus):
            if source not in held:
                got = transport.poll(source, limit=MAX_HEADER_BYTES)
                if got is not None:
                    return got
        return None

    def _congested(self, source: int, packet: Packet) -> bool:
        """Whether a port `packet` goes to has its share of forwarded bytes in flight already."""
        pending = self.transport.pending_bytes_to
        return any(pending.get(port, 0) and pending[port] + packet.payload_bytes > self.port_share_bytes
                   for port in self.logic.egress_ports(source, packet))

    def _take(self, source: int, data: bytes | None) -> None:
        if not 0 <= source < self.config.gpus:
            return  # not a GPU of this fabric: nobody to answer
        if data is None:
            self._refuse(source, ProtocolError(f"switch: a header of more than {MAX_HEADER_BYTES} bytes from "
                                               f"GPU {source}"))
            return
        try:
            packet = Packet.from_wire(data)
        except ProtocolError as exc:
            self._refuse(source, ProtocolError(f"switch: from GPU {source}: {exc}"))
            return
        queue = self._waiting.get(source)
        if queue or packet.payload_bytes:  # a GPU's packets are served in the order it sent them
            self._waiting.setdefault(source, deque()).append(_Waiting(packet, time.monotonic() + self.timeout_s))
            self._advance(source)
        else:
            self._handle(source, packet, None)

    def _advance_all(self) -> bool:
        moved = False
        for source in list(self._waiting):
            moved |= self._advance(source)
        if self._abandoned:
            before = len(self._abandoned)
            self._abandoned = [(r, b) for r, b in self._abandoned if not r.Test()]
            moved |= len(self._abandoned) != before
        return moved

    def _advance(self, source: int) -> bool:
        """Serve GPU `source`'s waiting headers in order, as far as their payloads have come."""
        queue, moved = self._waiting[source], False
        while queue:
            entry = queue[0]
            packet = entry.packet
            if packet.payload_bytes and entry.request is None:
                entry.held = self._congested(source, packet)
                if entry.held:  # its wait for the payload starts once it may be taken
                    entry.deadline = time.monotonic() + self.timeout_s
                    break
                got = self.transport.probe_payload(source)
                if got is None:
                    if time.monotonic() <= entry.deadline:
                        break
                    queue.popleft()
                    self._refuse(source, ProtocolError(f"{packet.kind.name} from GPU {source}: its payload of "
                                                       f"{packet.payload_bytes} bytes did not come within "
                                                       f"{self.timeout_s:g} s"), packet)
                    moved = True
                    continue
                message, size = got
                try:
                    self.logic.check_header(source, packet)  # before allocating anything for it
                    if size != packet.payload_bytes:
                        raise ProtocolError(f"{packet.kind.name} from GPU {source}: header says "
                                            f"{packet.payload_bytes} bytes, {size} came")
                except ProtocolError as exc:
                    self.transport.drop(message)
                    queue.popleft()
                    self._refuse(source, exc, packet)
                    moved = True
                    continue
                entry.buffer = np.empty(size, np.uint8)
                entry.request = self.transport.receive_matched(message, entry.buffer)
                moved = True
            if entry.request is not None and not entry.request.Test():
                if time.monotonic() <= entry.deadline:
                    break
                # the sender stopped sending mid-payload: give up on it, keep its buffer until MPI lets go
                self._abandoned.append((entry.request, entry.buffer))
                queue.popleft()
                self._refuse(source, ProtocolError(f"{packet.kind.name} from GPU {source}: its payload of "
                                                   f"{packet.payload_bytes} bytes stalled"), packet)
                moved = True
                continue
            queue.popleft()
            self._handle(source, packet, entry.buffer)
            moved = True
        if not queue:
            del self._waiting[source]
        return moved

    # -- serving --------------------------------------------------------------------------------------
    def _handle(self, source: int, packet: Packet, payload: np.ndarray | None) -> None:
        kind = packet.kind
        if kind is Kind.DONE:
            self._done.add(source)
            return
        if source in self._done and not self._asked_counters:
            self._done.discard(source)  # it said DONE too early: it is still at work
            self._busy_after_done = True
        if kind is Kind.TRACE:
            if source != 0:  # GPU 0 speaks for the bench; nobody else may turn everyone's records off
                self._refuse(source, ProtocolError(f"TRACE from GPU {source}: only GPU 0 turns tracing on or off"),
                             packet)
            elif self.trace is not None:
                self.trace.enabled = packet.info.on
                self.logic.tracing = self.trace.enabled
            return
        if kind is Kind.COUNTERS:
            if not self._asked_counters or source in self._counters:
                self._refuse(source, ProtocolError(f"COUNTERS from GPU {source}: the switch did not ask for "
                                                   f"them (or has them already)"), packet)
            else:
                self._counters[source] = packet.info
            return
        link = uplink(source)
        before = self.logic.counters.get(link).packets if self.trace is not None else 0
        sends = self.logic.on_packet(source, packet, payload)
        if self.trace is not None and self.logic.counters.get(link).packets != before:
            self._record("rx", link, packet, source)
        self._send_all(sends, source)

    def _drop_orphans(self, source: int) -> bool:
        """Drop a payload of GPU `source` that no header of it waits for (it sent one after a header
        that did not decode, say): left in MPI's queue, such messages would slow every later match."""
        if source in self._waiting or self.transport.header_waiting(source):
            return False  # a header yet to be read may claim it
        got = self.transport.probe_payload(source)
        if got is None:
            return False
        self.transport.drop(got[0])
        return True

    def _refuse(self, source: int, error: FabricError, packet: Packet | None = None) -> None:
        if isinstance(error, ProtocolError):
            self._suspects.add(source)  # an honest GPU never breaks the protocol
        if packet is None:
            sends = self.logic.refuse(source, error)
        else:
            sends = self.logic.refuse(source, error, packet.kind.name, packet.req, packet.t_end)
        self._send_all(sends, source)

    def _send_all(self, sends: list, source: int) -> None:
        for send in sends:
            self.transport.send(send.port, send.packet, send.payload)
            if self.trace is not None and send.packet.kind.counted:
                self._record("tx", downlink(send.port), send.packet, source if send.origin is None else send.origin)
        if self.logic.events:
            wall = time.time()
            for event in self.logic.events:
                self.trace.write({**event, "wall": wall})
            self.logic.events.clear()

    def _record(self, ev: str, link: str, packet: Packet, origin: int) -> None:
        """A packet entering (rx) or leaving (tx) the switch on `link`; `origin` is the GPU its data
        comes from (-1: made by the switch). m_start/m_end: when its first/last byte is ready there."""
        seq = self._seq[link] = self._seq.get(link, -1) + 1
        config = self.config
        self.trace.write({"ev": ev, "link": link, "seq": seq, "kind": packet.kind.name, "origin": origin,
                          "src": packet.src, "dst": packet.dst, "payload": packet.payload_bytes,
                          "raw": raw_bytes(packet.payload_bytes, config.mtu_bytes, config.header_bytes),
                          "m_start": packet.t_start, "m_end": packet.t_end, "wall": time.time()})

    # -- end of run ---------------------------------------------------------------------------------
    def _wait(self, done, what: str, waiting_for) -> None:
        """Keep serving (and refusing) until done() holds; FabricTimeout at the deadline."""
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if self._step():
                continue
            if time.monotonic() > deadline:
                raise FabricTimeout(f"switch: {what} timed out after {self.timeout_s:g} s waiting for "
                                    f"{waiting_for()}")
            self._idle()

    def _finish(self) -> dict:
        gpus = self.config.gpus
        self._wait(lambda: self.transport.idle, "end of run", lambda: "forwarded packets to be received")
        self._asked_counters = True
        for gpu in range(gpus):
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu)))
        self._wait(lambda: len(self._counters) == gpus, "end of run",
                   lambda: f"counters of GPUs {sorted(set(range(gpus)) - set(self._counters))}")
        # The switch's own counts are the report's. Byte conservation is checked link by link against
        # what each GPU says it counted: a GPU's word is not trusted, so a mismatch is reported against
        # that GPU's links (an emulator bug, or a GPU that lies) and never fails the others' run.
        links = self.logic.counters.snapshot()
        conservation = {}
        for gpu in range(gpus):
            try:
                check_gpu_links(links, gpu, self._counters[gpu].links)
            except FabricError as exc:
                conservation[gpu] = str(exc)
            for link in (uplink(gpu), downlink(gpu)):  # modeled busy time is kept by the GPU end of each link
                busy = self._counters[gpu].links.get(link, {}).get("busy_ns", 0.0)
                links.setdefault(link, LinkStats().as_dict())["busy_ns"] = float(busy)
        report = {
            "fabric": self.config.name,
            "mode": self.config.mode,
            "gpus": gpus,
            "elapsed_ns": max(self._counters[g].now_ns for g in range(gpus)),
            "links": links,
            "ports": {g: row for g, row in self.logic.port_stats().items()},
            "network_addresses": list(self.logic.network_addresses),
            "switch": {"peak_held_bytes": self.logic.peak_held_bytes, "groups_created": self.logic.groups.created,
                       "groups_released": self.logic.groups.released,
                       "reduced_bytes": self.logic.groups.reduced_bytes,
                       "unanswered_requests": self.logic.awaited_replies},
            "unconsumed": {g: self._counters[g].unconsumed for g in range(gpus) if self._counters[g].unconsumed},
            "conservation": conservation,
            # each GPU's own record of its collective calls, in call order (its word, like its clock)
            "collectives": {g: [dataclasses.asdict(c) for c in self._counters[g].calls] for g in range(gpus)},
            "collectives_unrecorded": {g: self._counters[g].calls_unrecorded for g in range(gpus)},
        }
        for gpu in range(gpus):
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu), info=report))
        self._wait(lambda: self.transport.idle, "end of run", lambda: "the report to reach every GPU")
        return report
