"""Deterministic arbitration of the links between switches: conservative PDES with null messages.

Pure (no MPI, no clock of its own); all times are modeled ns, floats. The rule is the one in
fabric.topology's docstring ("Arbitration of shared links"): Chandy-Misra-Bryant with null messages.

**Terms.** A *channel* is one ingress port of a switch. A transfer arrives on it with `ready_start`
(first byte ready at this switch's input, ns); its *key* is (ready_start + s, source GPU, seq), s the
switch latency, seq the source GPU's send counter (strictly increasing in its send order). A
*promise* P_c on channel c says: nothing that arrives on c from now on has ready_start < P_c. Channels
are FIFO (a promise sent after a packet arrives after it), as MPI's non-overtaking rule gives for one
(source, tag, communicator).

**Rule.** Each switch-facing egress link e books its transfers on its LinkClock in key order. The
least held transfer x = (r, g, q) is safe when, for every feeder channel c of e (topology.feeders),
b_c = P_c + s > r, or b_c == r and no GPU that c can bring to e (`sources` of both links) is below
g. Why a tie is safe then: what c sends later has a key >= (r, g', .) with g' >= g, and g' == g only
on x's own channel (a GPU reaches e by one route), where it is later still: a GPU's later sends carry
a higher seq, so a GPU may promise exactly its clock without stalling what it sent at that clock; a
switch's later transfers are ready strictly later (its link serves them in key order, each >= 1 byte
long). A tie with a feeder that can bring a GPU below g waits for a promise past r: that GPU may yet
send a transfer ready at r, whose key comes first, whatever the host delivers first. Booked in key
order, a link serves first come first served (each transfer is ready no earlier than those before
it), so a held transfer cannot start before max(its ready, link free): that bound plus the link
latency is the switch's promise toward the link's far end (so what a leaf promises a spine after
sending a transfer is already past it: a spine never waits on the channel a transfer came by).

**Lookahead creep and LBTS.** When every GPU is blocked, promises rise only by each cycle's lookahead
per exchange (GPU -> leaf -> GPU: 2a + s per two rounds). `lbts_ns` breaks this: from a consistent
snapshot it gives T <= the ready_start of anything any switch will ever receive again, and
`advance_to(T)` raises every channel's promise to T. The snapshot must hold (a) every switch's
`held_floor_ns()`, (b) every GPU's `gpu_promise_ns(..., leaf_promise_ns=math.inf)` (what it may send
without receiving anything more; a GPU waiting in a barrier counts as blocked here: it sends again
at the last member's clock or later, which that member's own entry, or the arrival it waits for,
bounds), (c) every transfer in flight between ranks (sent, not yet taken in by `arrive` or by its
GPU): its ready_start at its receiver. Why: every later arrival is a held or
in-flight transfer moving on (>= its entry), a GPU's own send (>= (b)), or a GPU's send caused by an
arrival (>= that arrival, by induction). In MPI: one allreduce(MIN) when every switch rank stalls, with
each rank's sent and received packet counts summed in the same reduction and the reduction repeated
until they agree (Mattern's counting), so that (c) is complete. After it, the least held transfer of
the whole fabric is bookable, unless a GPU below it may still send at its very time (then that GPU is
running, not stalled).

**Measured** (tests/unit/test_arbitration.py, test_rounds_to_resolve_against_the_gap: 2 nodes x 2 GPUs,
1 spine, a = 100, s = 300, u = 200 ns; GPU 0 and GPU 3 blocked from t = 0, GPU 2 sends GPU 0 1000 B
after G ns of compute, then GPU 0 sends GPU 3; rounds until GPU 3 has it, each round delivering every
message queued before it; null messages counted until all is quiet):
G = 1 us: 12 rounds with null messages only, 9 with LBTS (1 reduction); 10 us: 48 / 9; 100 us: 408 / 9;
1 ms: 4008 / 9, i.e. 40,111 null messages against 96. Null messages alone take 2 G / (2a + s) + 8
rounds: about 3,600 per modeled ms of gap on nvlink4 (a = 150, s = 250 ns).
"""

import heapq
import math
from numbers import Integral
from typing import NamedTuple

from .errors import ConfigError, ProtocolError
from .timemodel import LinkClock
from .topology import Topology


class Booking(NamedTuple):
    """A transfer released by `bookable`: its token, the port it leaves by, and its start/end on that
    link (ns; on a GPU-facing port, ready at the downlink's sending end, which the GPU books itself)."""

    token: object
    egress_port: int
    start_ns: float
    end_ns: float


def _time(value, what: str, infinite: bool = False) -> float:
    """`value` as a float time >= 0 (ns); inf only if `infinite`; ProtocolError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 \
            or (math.isinf(value) and not infinite):
        raise ProtocolError(f"{what}: must be a {'' if infinite else 'finite '}time >= 0 ns, got {value!r}")
    return float(value)


def _count(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:  # numpy ints are Integral
        raise ProtocolError(f"{what}: must be an integer >= {least}, got {value!r}")
    return int(value)


class SwitchScheduler:
    """The arbiter of switch `switch_index`'s egress links (ns throughout).

    Switch-facing egress links are booked here on their own LinkClock, in key order, once safe.
    GPU-facing ones pass straight through (the GPU books its downlink in its consume order), but the
    switch still promises toward each GPU port. Refuses (ConfigError) a topology where a feeder of
    one of its links has zero lookahead (link + switch latency): a cycle of zero lookahead deadlocks.
    """

    def __init__(self, topology: Topology, switch_index: int):
        if not isinstance(topology, Topology):
            raise ConfigError(f"arbitration: SwitchScheduler takes a Topology, got {type(topology).__name__}")
        self.switch = sw = topology.switch(switch_index)
        self.what = f"switch {sw.name}"
        self.s = sw.latency_ns
        self._links = {p.number: topology.link(p.egress) for p in sw.ports}
        self._to_switch = {n for n, link in self._links.items() if link.level == "leaf-spine"}
        port_of = {p.ingress: p.number for p in sw.ports}
        # per egress: (feeder ingress port, least GPU it can bring there, every GPU it can bring there)
        self._feeders: dict[int, list[tuple[int, int, frozenset]]] = {}
        for number, link in self._links.items():
            lookahead = topology.lookahead_ns(link.name)
            if not lookahead > 0:
                raise ConfigError(f"{self.what}: link {link.name}: lookahead {lookahead} ns (feeder link latency + "
                                  f"switch latency {self.s} ns) must be positive, or null messages deadlock")
            out = set(topology.sources(link.name))
            both = [(f, out & set(topology.sources(f.name))) for f in topology.feeders(link.name)]
            self._feeders[number] = [(port_of[f.name], min(gpus), frozenset(gpus)) for f, gpus in both if gpus]
        self._promised = {p.number: 0.0 for p in sw.ports}   # P_c per ingress port
        self._clocks = {n: LinkClock(self._links[n].bandwidth_gbytes_per_s) for n in self._to_switch}
        self._held: dict[int, list] = {n: [] for n in self._links}  # heaps of (r, g, q, ready_end + s, raw, token)
        self._keys: set = set()                               # (g, q) held, to refuse a duplicate

    # -- inputs -----------------------------------------------------------------------------------
    def arrive(self, ingress_port, source_gpu, seq, ready_start_ns, ready_end_ns, raw_bytes, egress_port,
               token) -> None:
        """Hold a transfer of GPU `source_gpu` (its send number `seq`) that entered on `ingress_port`,
        first/last byte ready at this switch's input at ready_start_ns/ready_end_ns, `raw_bytes` (>= 1:
        at least a header) long, leaving by `egress_port`; `token` is returned with its booking."""
        where = f"{self.what}: port {ingress_port!r}"
        self._port(ingress_port, "ingress")
        self._port(egress_port, "egress")
        start = _time(ready_start_ns, f"{where}: GPU {source_gpu!r} seq {seq!r}: ready_start_ns")
        end = _time(ready_end_ns, f"{where}: GPU {source_gpu!r} seq {seq!r}: ready_end_ns")
        raw = _count(raw_bytes, f"{where}: GPU {source_gpu!r} seq {seq!r}: raw_bytes", 1)
        seq = _count(seq, f"{where}: GPU {source_gpu!r}: seq", 0)
        feeder = next((f for f in self._feeders[egress_port] if f[0] == ingress_port), None)
        if feeder is None or isinstance(source_gpu, bool) or source_gpu not in feeder[2]:
            raise ProtocolError(f"{where}: GPU {source_gpu!r} seq {seq}: no route enters here and leaves by "
                                f"port {egress_port} ({self._links[egress_port].name})")
        if end < start:
            raise ProtocolError(f"{where}: GPU {source_gpu} seq {seq}: last byte ready at {end} ns before its "
                                f"first at {start} ns")
        if start < self._promised[ingress_port]:
            raise ProtocolError(f"{where}: GPU {source_gpu} seq {seq}: ready at {start} ns, before the port's "
                                f"promise of {self._promised[ingress_port]} ns (a broken promise or snapshot)")
        if (source_gpu, seq) in self._keys:
            raise ProtocolError(f"{where}: GPU {source_gpu} seq {seq} is already held (sent twice?)")
        self._keys.add((source_gpu, seq))
        heapq.heappush(self._held[egress_port], (start + self.s, source_gpu, seq, end + self.s, raw, token))

    def promise(self, ingress_port, t_ns) -> None:
        """Channel `ingress_port` promises that nothing arriving on it later has ready_start < t_ns (inf:
        nothing more at all). Promises only move forward: a smaller one is ignored."""
        self._port(ingress_port, "ingress")
        t = _time(t_ns, f"{self.what}: port {ingress_port}: promise", infinite=True)
        self._promised[ingress_port] = max(self._promised[ingress_port], t)

    def advance_to(self, t_ns) -> None:
        """Apply an LBTS `t_ns` (`lbts_ns` over a consistent snapshot, see the module docstring) as a
        promise on every channel. Refuses a t_ns past this switch's own held floor: the snapshot
        must have missed what it holds."""
        t = _time(t_ns, f"{self.what}: advance_to", infinite=True)
        floor = self.held_floor_ns()
        if t > floor:
            raise ProtocolError(f"{self.what}: advance_to({t} ns) passes this switch's held floor {floor} ns: "
                                f"the LBTS snapshot missed its held transfers")
        for port in self._promised:
            self._promised[port] = max(self._promised[port], t)

    # -- outputs ----------------------------------------------------------------------------------
    def bookable(self) -> list[Booking]:
        """Pop every held transfer that is now safe, book it (switch-facing ports) and return its
        Booking, in key order. The next switch sees it ready at (start + link latency, end + latency)."""
        out = []
        for port, heap in self._held.items():
            clock = self._clocks.get(port)
            while heap and (clock is None or self._safe(port, heap[0])):
                r, g, q, end, raw, token = heapq.heappop(heap)
                self._keys.discard((g, q))
                times = clock.transmit(r, end, raw) if clock is not None else (r, end)
                out.append(((r, g, q), Booking(token, port, *times)))
        return [booking for _, booking in sorted(out, key=lambda item: item[0])]

    def promises(self) -> dict[int, float]:
        """Null-message value per egress port (ns): a lower bound of the ready_start, at the link's far
        end, of anything this switch may still send by it: max(link free, min(held least ready, feeders'
        promises + s)) + link latency (for a GPU port: when its first byte can reach the GPU). Monotone."""
        # monotone without clamping: an arrival on c is ready >= P_c, so it never undercuts the bound
        return {port: self._floor(port, min((self._promised[c] + self.s for c, _, _ in feeders), default=math.inf))
                for port, feeders in self._feeders.items()}

    def held_floor_ns(self) -> float:
        """This switch's entry in an LBTS snapshot: least ready_start, at the far end, of what it holds
        (inf if nothing)."""
        return min((self._floor(port, math.inf) for port in self._links), default=math.inf)

    @property
    def held(self) -> int:
        """Transfers held, not yet released."""
        return len(self._keys)

    # -- helpers ----------------------------------------------------------------------------------
    def _floor(self, port: int, bound: float) -> float:
        heap, clock = self._held[port], self._clocks.get(port)
        least = min(heap[0][0] if heap else math.inf, bound)
        if clock is not None and least < math.inf:
            least = max(least, clock.free_ns)  # FCFS in key order: nothing starts before the link is free
        return least + self._links[port].latency_ns

    def _safe(self, port: int, head: tuple) -> bool:
        r, g = head[0], head[1]
        for c, least, _ in self._feeders[port]:
            bound = self._promised[c] + self.s
            if bound < r or (bound == r and least < g):
                return False
        return True

    def _port(self, port, role: str) -> None:
        if isinstance(port, bool) or not isinstance(port, Integral) or port not in self._links:
            raise ProtocolError(f"{self.what}: no {role} port {port!r}; its ports are 0..{len(self._links) - 1}")


def lbts_ns(held_floors_ns, gpu_promises_ns, in_flight_ns=()) -> float:
    """Lower bound on the timestamp (ns) of anything any switch will ever receive again: the least of
    every switch's held_floor_ns(), every GPU's promise made with leaf_promise_ns=inf, and the
    ready_start at its receiver of every transfer in flight (see the module docstring for why all
    three, and what makes the snapshot consistent). inf when all are empty or inf: the run is over."""
    values = [_time(v, f"lbts: {what}", infinite=True)
              for what, group in (("held floor", held_floors_ns), ("GPU promise", gpu_promises_ns),
                                  ("in-flight transfer", in_flight_ns)) for v in group]
    return min(values, default=math.inf)


def gpu_promise_ns(now_ns, pending_start_ns, answers_requests: bool, leaf_promise_ns, *, blocked: bool = False,
                   uplink_latency_ns) -> float:
    """What a GPU may promise its leaf (ns, at the leaf's input, as its packets are stamped): nothing
    it sends from now on has its first byte ready there earlier.

    A send is stamped uplink.transmit(at) + a >= at + a, so bound `at` and add a = uplink_latency_ns.
    A later send is one of: (1) a send its program issues at its clock: at >= now_ns, but if it is
    `blocked` in a wait that only a fabric arrival ends, its clock will be >= that arrival, which the
    leaf's promise bounds: at >= max(now_ns, leaf_promise_ns) (a barrier or other control-plane wait is
    not blocked on the wire: it may end at a clock that no transfer to this GPU bounds); (2) a send it may issue without
    receiving anything more at an earlier time (a non-blocking request's next send, a reserved
    uplink stamp, a reply to a request it already holds): at >= pending_start_ns (None: there is
    none); (3) a send stamped at the consume time of a future arrival (a reply to a get, the next step
    of a request that waits for data): at >= leaf_promise_ns, if `answers_requests`. The promise is
    the least of those, + a. leaf_promise_ns: the leaf's latest promises()[this GPU's port],
    received after the GPU drained every packet before it (FIFO), so it bounds all the rest; pass
    math.inf for the GPU's LBTS entry. A GPU that has finished promises inf.
    """
    now = _time(now_ns, "gpu_promise: now_ns")
    leaf = _time(leaf_promise_ns, "gpu_promise: leaf_promise_ns", infinite=True)
    a = _time(uplink_latency_ns, "gpu_promise: uplink_latency_ns")
    bound = max(now, leaf) if blocked else now
    if pending_start_ns is not None:
        bound = min(bound, _time(pending_start_ns, "gpu_promise: pending_start_ns"))
    if answers_requests:
        bound = min(bound, leaf)
    return bound + a
