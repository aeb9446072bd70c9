"""The switch rank: executes SwitchLogic's decisions over MPI, bounds its in-flight buffer, ends the run."""

import time

import numpy as np

from fabric.config import FabricConfig
from fabric.counters import check_conservation, downlink, uplink
from fabric.errors import FabricTimeout, ProtocolError
from fabric.packets import Kind, Packet, raw_bytes
from fabric.switch import SwitchLogic

from .transport import Idle, Transport


class SwitchRank:
    """Serves the GPUs until all of them are done, then gathers and checks counters.

    In-flight forwarded bytes are bounded by switch_buffer_bytes: past it, the switch stops taking
    new packets until its sends drain (back-pressure), so its memory is not N x S.
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
        self._done: set[int] = set()
        self._counters: dict[int, dict] = {}
        self._idle = Idle(yields=64, max_sleep_s=1e-3)  # every packet passes here: stay more awake

    def serve(self) -> dict:
        """Run until every GPU reported DONE; returns the run's report (also sent to every GPU)."""
        gpus = self.config.gpus
        first_done = None
        while len(self._done) < gpus:
            moved = self.transport.progress()
            if self.transport.pending_bytes < self.config.switch_buffer_bytes:
                got = self.transport.poll()
                if got is not None:
                    self._handle(*got)
                    moved = True
            if moved:
                self._idle.reset()
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

    def _handle(self, source: int, packet: Packet) -> None:
        if packet.kind is Kind.DONE:
            self._done.add(source)
            return
        if packet.kind is Kind.TRACE:
            if self.trace is not None:
                self.trace.enabled = bool(packet.info["on"])
                self.logic.tracing = self.trace.enabled
            return
        payload = None
        if packet.payload_bytes:
            payload = np.empty(packet.payload_bytes, np.uint8)
            self.transport.recv_payload(source, payload, time.monotonic() + self.timeout_s,
                                        f"{packet.kind.name} req {packet.req}")
        if self.trace is not None and packet.kind.counted:
            self._record("rx", uplink(source), packet, source)
        for send in self.logic.on_packet(source, packet, payload):
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

    def _wait(self, done, what: str, waiting_for) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            moved = self.transport.progress()
            got = self.transport.poll()
            if got is not None:
                source, packet = got
                if packet.kind is not Kind.COUNTERS:
                    raise ProtocolError(f"switch: {packet.kind.name} from GPU {source} after every GPU was done")
                self._counters[source] = packet.info
                moved = True
            if moved:
                continue
            if time.monotonic() > deadline:
                raise FabricTimeout(f"switch: {what} timed out after {self.timeout_s:g} s waiting for "
                                    f"{waiting_for()}")
            self._idle()

    def _finish(self) -> dict:
        gpus = self.config.gpus
        self._wait(lambda: self.transport.idle, "end of run", lambda: "forwarded packets to be received")
        for gpu in range(gpus):
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu)))
        self._wait(lambda: len(self._counters) == gpus, "end of run",
                   lambda: f"counters of GPUs {sorted(set(range(gpus)) - set(self._counters))}")
        switch_side = self.logic.counters.snapshot()
        gpu_sides = [self._counters[g]["links"] for g in range(gpus)]
        check_conservation(switch_side, gpu_sides)
        for gpu_side in gpu_sides:  # modeled busy time is kept by the GPU end of each link
            for link, stats in gpu_side.items():
                switch_side.setdefault(link, dict(stats))["busy_ns"] = stats.get("busy_ns", 0.0)
        report = {
            "fabric": self.config.name,
            "mode": self.config.mode,
            "gpus": gpus,
            "elapsed_ns": max(self._counters[g]["now_ns"] for g in range(gpus)),
            "links": switch_side,
            "ports": {g: row for g, row in self.logic.port_stats().items()},
            "network_addresses": list(self.logic.network_addresses),
            "switch": {"peak_held_bytes": self.logic.peak_held_bytes, "groups_created": self.logic.groups.created,
                       "groups_released": self.logic.groups.released,
                       "reduced_bytes": self.logic.groups.reduced_bytes},
            "unconsumed": {g: self._counters[g]["unconsumed"] for g in range(gpus)
                           if self._counters[g]["unconsumed"]},
        }
        for gpu in range(gpus):
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu), info=report))
        self._wait(lambda: self.transport.idle, "end of run", lambda: "the report to reach every GPU")
        return report
