"""fabric.arbitration: switch schedulers of 2x2 (1 spine) and 2x4 (2 spines) fabrics in one process,
scripted GPUs, every message (packets and null messages) delivered in a seeded random order or in
synchronous rounds; hand-computed bookings, determinism over host orders, safety, creep and LBTS."""

import math
import random
from collections import deque
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.arbitration import Booking, SwitchScheduler, gpu_promise_ns, lbts_ns
from nvlink_emu.fabric.errors import ConfigError, FabricError, ProtocolError
from nvlink_emu.fabric.timemodel import LinkClock
from nvlink_emu.fabric.topology import Topology

A, S, U = 100.0, 300.0, 200.0  # ns: GPU link, switch traversal, leaf <-> spine link


def two_by_two():
    """GPUs 0, 1 on leaf sw0; 2, 3 on leaf sw1; spine sw2. GPU links 100 GB/s; one 50 GB/s uplink."""
    return Topology.multi_node(2, 2, 1, (100.0, A), 50.0, U, S, name="2x2")


def two_by_four():
    """GPUs 0-3 on sw0, 4-7 on sw1; spines sw2 (even local indices), sw3 (odd); 50 GB/s leaf-spine links."""
    return Topology.multi_node(2, 4, 2, (100.0, A), 100.0, U, S, name="2x4")


def three_by_two():
    """GPUs 0, 1 on sw0; 2, 3 on sw1; 4, 5 on sw2; spine sw3: its link to a leaf is shared by two leaves."""
    return Topology.multi_node(3, 2, 1, (100.0, A), 50.0, U, S, name="3x2")


class Pkt(NamedTuple):
    """A transfer on the wire: its source and send number (the key's), a label stable over host orders
    ((src, n) for the n-th scripted send; ("reply", label) for a reply), ready times at its receiver
    (a switch's input; for a GPU, the downlink's sending end); reply > 0: a get asking that many bytes."""

    src: int
    seq: int
    label: tuple
    dst: int
    raw: int
    t_start: float
    t_end: float
    reply: int = 0


class Gpu:
    """A scripted GPU: ("compute", ns), ("send", dst, raw bytes), ("get", dst, raw bytes) (a 100-byte
    request; the reply comes back as a transfer from dst), ("recv", src) (blocks until a transfer from src
    is here). Books its uplink in send order and its downlink in receive order, as ranks/gpu.py. A GPU
    whose script has a get served to it (`serves`) answers each request at its arrival until it is done."""

    def __init__(self, net, gpu, script, serves=False):
        self.net, self.gpu, self.script, self.serves = net, gpu, list(script), serves
        self.answers = serves  # what its promise admits to; a test makes a server deny it
        bw = net.topo.gpu_gbytes_per_s
        self.up, self.down = LinkClock(bw), LinkClock(bw)
        self.now, self.seq, self.sends, self.pc, self.leaf = 0.0, 0, 0, 0, 0.0
        self.inbox, self.got, self.told = {}, [], -1.0
        self.channel = (("sw", net.topo.leaf_of(gpu).index), net.topo.locate(gpu)[1])

    @property
    def done(self):
        return self.pc == len(self.script)

    def promise(self, leaf=None, blocked=None, lbts=False):
        """Its promise on the wire; with lbts, its LBTS entry, where a wait in a barrier counts as blocked
        too (the barrier ends at the latest member's clock, after every member's entry)."""
        if self.done:
            return math.inf
        if blocked is None:
            blocked = self.script[self.pc][0] in (("recv", "barrier") if lbts else ("recv",))
        return gpu_promise_ns(self.now, None, self.answers, self.leaf if leaf is None else leaf, blocked=blocked,
                              uplink_latency_ns=A)

    def send(self, at, dst, raw, label, reply=0):
        start, end = self.up.transmit(at, at, raw)
        self.seq += 1
        # piggybacks its promise (its clock: its later sends have a higher seq)
        self.net.post(self.channel, Pkt(self.gpu, self.seq, label, dst, raw, start + A, end + A, reply),
                      self.promise(blocked=False))

    def run(self):
        while not self.done:
            op = self.script[self.pc]
            if op[0] == "compute":
                self.now += op[1]
                # its clock moved: say so (a null message ahead of the sends it will make at this clock)
                self.tell(self.promise(blocked=False))
            elif op[0] in ("send", "get"):
                self.sends += 1
                self.send(self.now, op[1], 100 if op[0] == "get" else op[2], (self.gpu, self.sends),
                          op[2] if op[0] == "get" else 0)
            elif op[0] == "barrier":
                if not self.net.enter_barrier(self):
                    break
            else:
                queue = self.inbox.get(op[1])
                if not queue:
                    break
                pkt = queue.popleft()
                start, end = self.down.transmit(pkt.t_start, pkt.t_end, pkt.raw)
                self.got.append((pkt.label, start, end))
                self.now = max(self.now, end + A)
            self.pc += 1
        self.tell(self.promise())

    def tell(self, promise):
        if promise > self.told:
            self.told = promise
            self.net.post(self.channel, ("null",), promise)

    def take(self, message, promise):
        if isinstance(message, Pkt):
            if message.reply:  # answered at its last byte's arrival, stamped before sends made earlier
                assert self.serves and not self.done, f"GPU {self.gpu} got a request it does not serve"
                self.send(message.t_end + A, message.src, message.reply, ("reply", message.label))
            else:
                self.inbox.setdefault(message.src, deque()).append(message)
        self.leaf = max(self.leaf, promise)
        self.run()


class Net:
    """GPUs, their leaves and the spines; channels[(receiver, port)] is a FIFO of (message, promise);
    receiver is ("sw", index) or ("gpu", index); a message is a Pkt or ("null",)."""

    def __init__(self, topo, scripts, serves=()):
        self.topo = topo
        self.sw = [SwitchScheduler(topo, k) for k in range(len(topo.switches))]
        self.told = [dict.fromkeys(s.promises(), -1.0) for s in self.sw]
        self.channels = {}
        self.log = []       # ("arrive" | "book", switch, egress, key, times) in the order they happened
        self.bookings = {}  # (switch, label) -> (egress, start, end)
        self.packets = self.nulls = 0
        self.gpus = [Gpu(self, g, scripts.get(g, ()), g in serves) for g in range(topo.gpus)]
        self.in_barrier = {}  # GPU -> its clock when it entered the barrier not all have reached yet
        self.heard = [dict.fromkeys(s.promises(), 0.0) for s in self.sw]  # the promises each switch was given

    def enter_barrier(self, gpu):
        """Out of band, as the control plane's barrier: False while some GPU is still to come; the last
        one in gives every member the latest clock and lets the others go on."""
        self.in_barrier[gpu.gpu] = gpu.now
        if len(self.in_barrier) < len(self.gpus):
            return False
        latest, waiting = max(self.in_barrier.values()), [g for g in self.in_barrier if g != gpu.gpu]
        self.in_barrier = {}
        for g in self.gpus:
            g.now = latest
        for g in waiting:
            self.gpus[g].pc += 1
            self.gpus[g].run()
        return True

    def post(self, channel, message, promise):
        """Queue (message, piggybacked promise or -1) on channel (receiver, port)."""
        self.nulls += not isinstance(message, Pkt)
        self.channels.setdefault(channel, deque()).append((message, promise))

    @staticmethod
    def peer_channel(port):
        """The channel a switch port sends into: (("gpu", g), 0) or (("sw", k), its port there)."""
        kind, index = ("gpu", int(port.peer[3:])) if port.peer.startswith("gpu") else ("sw", int(port.peer[2:]))
        return (kind, index), port.peer_port

    def start(self):
        for gpu in self.gpus:
            gpu.run()
        for k in range(len(self.sw)):
            self.emit(k)

    def emit(self, k):
        """Forward switch k's bookable transfers, then its null messages that moved."""
        sched, sw = self.sw[k], self.topo.switches[k]
        for booking in sched.bookable():
            pkt = booking.token
            self.check_allowed(k, booking.egress_port, (pkt.t_start + S, pkt.src, pkt.seq))
            self.bookings[(k, pkt.label)] = (booking.egress_port, booking.start_ns, booking.end_ns)
            self.log.append(("book", k, booking.egress_port, (pkt.t_start + S, pkt.src, pkt.seq), booking.start_ns))
            port = sw.ports[booking.egress_port]
            # the next switch sees the booked times + the link latency; a GPU books its downlink itself
            lat = self.topo.link(port.egress).latency_ns if port.peer.startswith("sw") else 0.0
            self.post(self.peer_channel(port), pkt._replace(t_start=booking.start_ns + lat,
                                                            t_end=booking.end_ns + lat), -1.0)
        for port, value in sched.promises().items():
            if value > self.told[k][port]:
                self.told[k][port] = value
                self.post(self.peer_channel(sw.ports[port]), ("null",), value)

    def check_allowed(self, k, egress, key):
        """A switch-facing booking of key (r, g, q) at switch k needs, from every feeder c of the link, a
        promise P_c given to k with P_c + s > r, or == r with no GPU below g behind c."""
        sw = self.topo.switches[k]
        link = sw.ports[egress].egress
        if self.topo.link(link).level != "leaf-spine":
            return
        port_of = {p.ingress: p.number for p in sw.ports}
        for feeder in self.topo.feeders(link):
            bound = self.heard[k][port_of[feeder.name]] + S
            behind = set(self.topo.sources(feeder.name)) & set(self.topo.sources(link))
            assert bound > key[0] or (bound == key[0] and min(behind) >= key[1]), \
                f"sw{k} booked {key} on {link} with {feeder.name} promising only {bound - S}"

    def deliver(self, key):
        (kind, index), port = key
        message, promise = self.channels[key].popleft()
        if kind == "gpu":
            self.gpus[index].take(message, promise)
            return
        sched = self.sw[index]
        if isinstance(message, Pkt):
            self.packets += 1
            egress = self.topo.next_port(index, message.dst)
            self.log.append(("arrive", index, egress, (message.t_start + S, message.src, message.seq), port))
            sched.arrive(port, message.src, message.seq, message.t_start, message.t_end, message.raw, egress, message)
        if promise >= 0:
            sched.promise(port, promise)
            self.heard[index][port] = max(self.heard[index][port], promise)
        self.emit(index)

    def busy(self):
        return [key for key in sorted(self.channels) if self.channels[key]]

    def run_random(self, rng, limit=10 ** 6):
        """Deliver one message at a time from a random non-empty channel until none is left."""
        self.start()
        for _ in range(limit):
            busy = self.busy()
            if not busy:
                return self
            self.deliver(rng.choice(busy))
        raise AssertionError("did not settle")

    def run_rounds(self, use_lbts=False, limit=100_000):
        """Synchronous rounds: each delivers every message queued before it. With use_lbts, a round in
        which no packet moved is followed by an LBTS over the snapshot and advance_to on every switch.
        Returns (the round in which the last GPU finished its script, rounds until nothing is queued,
        LBTS reductions)."""
        self.start()
        rounds = reductions = resolved = 0
        while self.busy():
            rounds += 1
            assert rounds <= limit, "did not settle"
            before = self.packets + sum(len(g.got) for g in self.gpus)
            for key, n in [(key, len(self.channels[key])) for key in self.busy()]:
                for _ in range(n):
                    self.deliver(key)
            if use_lbts and self.packets + sum(len(g.got) for g in self.gpus) == before:
                in_flight = [m.t_start for q in self.channels.values() for m, _ in q if isinstance(m, Pkt)]
                t = lbts_ns([s.held_floor_ns() for s in self.sw], [g.promise(math.inf, lbts=True) for g in self.gpus],
                            in_flight)
                if t < math.inf:
                    reductions += 1
                    for k, sched in enumerate(self.sw):
                        sched.advance_to(t)
                        self.heard[k] = {port: max(p, t) for port, p in self.heard[k].items()}
                        self.emit(k)
            if not resolved and all(g.done for g in self.gpus):
                resolved = rounds
        return resolved, rounds, reductions

    def booked(self):
        """{(switch, *label): (egress port, start, end)} for every switch-facing booking; a scripted send's
        label is (source GPU, n), n its seq when the GPU serves no gets."""
        return {(k, *label): times for (k, label), times in self.bookings.items()
                if self.topo.link(self.topo.switches[k].ports[times[0]].egress).level == "leaf-spine"}

    def received(self):
        """{GPU: [(label, downlink start, end)] in the order it received them}."""
        return {g.gpu: list(g.got) for g in self.gpus}


def oracle(topo, scripts):
    """Independent reference for send-only scripts: every GPU's uplink in send order, then every leaf ->
    spine link, then every spine -> leaf link, each serving its transfers sorted by key, first come first
    served. {(switch, source GPU, seq): (egress port, start, end)}."""
    g = topo.gpus_per_node
    at = {}  # (src, seq) -> (switch, ready start, ready end, raw, dst) at the switch it enters next
    for src, script in scripts.items():
        up, now, seq = LinkClock(topo.gpu_gbytes_per_s), 0.0, 0
        for op in script:
            if op[0] == "compute":
                now += op[1]
            else:
                start, end = up.transmit(now, now, op[2])
                seq += 1
                if op[1] // g != src // g:  # only transfers between nodes cross switch-facing links
                    at[(src, seq)] = (src // g, start + A, end + A, op[2], op[1])
    booked = {}
    for _ in range(2):  # leaf -> spine, then spine -> leaf
        by_link = {}
        for (src, seq), (sw, t0, t1, raw, dst) in at.items():
            by_link.setdefault((sw, topo.next_port(sw, dst)), []).append((t0 + S, src, seq, t1 + S, raw, dst))
        nxt = {}
        for (sw, port), items in sorted(by_link.items()):
            link = topo.link(topo.switches[sw].ports[port].egress)
            clock = LinkClock(link.bandwidth_gbytes_per_s)
            for r, src, seq, end, raw, dst in sorted(items):
                start, finish = clock.transmit(r, end, raw)
                booked[(sw, src, seq)] = (port, start, finish)
                nxt[(src, seq)] = (int(link.dst[2:]), start + U, finish + U, raw, dst)
        at = {key: v for key, v in nxt.items() if topo.switches[v[0]].level == "spine"}
    return booked


def receive_all(scripts, gpus):
    """Append, to each GPU's script, a receive of every transfer the scripts send it (by source)."""
    out = {x: list(scripts.get(x, ())) for x in range(gpus)}
    for src in sorted(scripts):
        for op in scripts[src]:
            if op[0] == "send":
                out[op[1]].append(("recv", src))
    return out


def phased(rng, gpus, sends=3):
    """Two phases: every GPU sends to random peers after random compute (ties likely), receives what it
    was sent; then each sends once more (its time now depends on its receives) and receives again."""
    sizes, gaps = (1, 500, 1000, 3000), (0, 0, 10, 100, 700)
    phase1 = {x: [op for _ in range(sends) for op in (("compute", rng.choice(gaps)),
                                                     ("send", rng.choice([y for y in range(gpus) if y != x]),
                                                      rng.choice(sizes)))] for x in range(gpus)}
    first = receive_all(phase1, gpus)
    phase2 = {x: [("compute", rng.choice(gaps)), ("send", (x + gpus // 2 + 1) % gpus, rng.choice(sizes))]
              for x in range(gpus)}
    second = receive_all(phase2, gpus)
    return {x: first[x] + [op for op in second[x] if op[0] == "send"] + [op for op in second[x] if op[0] == "recv"]
            for x in range(gpus)}


def check_safe(net):
    """No transfer arrives at a switch-facing egress after one with a larger key was booked there, and each
    such link booked in key order."""
    top = {}
    for event, k, port, key, _ in net.log:
        if net.topo.link(net.topo.switches[k].ports[port].egress).level != "leaf-spine":
            continue
        if event == "arrive":
            assert key > top.get((k, port), (-1.0,)), f"sw{k} port {port}: {key} arrived after {top[(k, port)]}"
        else:
            assert key > top.get((k, port), (-1.0,)), f"sw{k} port {port}: booked {key} after {top[(k, port)]}"
            top[(k, port)] = key


# -- (a) hand-computed bookings -----------------------------------------------------------------------------
# 1000 raw bytes: 10 ns on a 100 GB/s GPU link, 20 ns on a 50 GB/s leaf <-> spine link. A send at t leaves the
# GPU at t, is ready at its leaf at t + a = t + 100, at the leaf's egress at t + 400 (key); the spine sees
# booked + u = + 200, its egress + 300 more.

def test_two_gpus_of_a_node_at_the_same_time_go_in_source_order():
    scripts = {0: [("send", 2, 1000)], 1: [("send", 2, 1000)], 2: [("recv", 1), ("recv", 0)]}
    net = Net(two_by_two(), scripts).run_random(random.Random(7))
    assert net.booked() == {
        (0, 0, 1): (2, 400.0, 420.0), (0, 1, 1): (2, 420.0, 440.0),  # sw0 -> sw2: key tie at 400, GPU 0 first
        (2, 0, 1): (1, 900.0, 920.0), (2, 1, 1): (1, 920.0, 940.0)}  # sw2 -> sw1: ready 600 and 620, + 300
    # sw1 passes them through at +300: 1400 and 1420; GPU 2 takes GPU 1's first (its program order), and
    # GPU 0's, ready at 1400, fits in the idle gap its downlink left before it (LinkClock)
    assert net.received()[2] == [((1, 1), 1420.0, 1440.0), ((0, 1), 1400.0, 1420.0)]


def test_ready_time_comes_before_the_source_index():
    # GPU 0's 3000 bytes tie with GPU 1's at 400 and go first (60 ns); GPU 0 10 ns later goes after GPU 1
    tie = Net(two_by_two(), receive_all({0: [("send", 3, 3000)], 1: [("send", 2, 1000)]}, 4))
    assert tie.run_random(random.Random(1)).booked() == {
        (0, 0, 1): (2, 400.0, 460.0), (0, 1, 1): (2, 460.0, 480.0),
        (2, 0, 1): (1, 900.0, 960.0), (2, 1, 1): (1, 960.0, 980.0)}
    late = Net(two_by_two(), receive_all({0: [("compute", 10.0), ("send", 3, 3000)], 1: [("send", 2, 1000)]}, 4))
    assert late.run_random(random.Random(1)).booked() == {
        (0, 1, 1): (2, 400.0, 420.0), (0, 0, 1): (2, 420.0, 480.0),
        (2, 1, 1): (1, 900.0, 920.0), (2, 0, 1): (1, 920.0, 980.0)}


def test_two_spines_share_each_leafs_gpus_by_destination():
    # spine sw2 carries destinations of even local index, sw3 odd; leaf port 4 faces sw2, 5 faces sw3
    sends = {0: [("send", 5, 1000)], 1: [("send", 7, 1000)], 2: [("send", 4, 1000)], 3: [("send", 6, 1000)],
             4: [("send", 1, 1000)], 5: [("send", 3, 1000)]}
    net = Net(two_by_four(), receive_all(sends, 8)).run_random(random.Random(3))
    assert net.booked() == {
        (0, 0, 1): (5, 400.0, 420.0), (0, 1, 1): (5, 420.0, 440.0),   # sw0 -> sw3
        (0, 2, 1): (4, 400.0, 420.0), (0, 3, 1): (4, 420.0, 440.0),   # sw0 -> sw2
        (1, 4, 1): (5, 400.0, 420.0), (1, 5, 1): (5, 420.0, 440.0),   # sw1 -> sw3
        (3, 0, 1): (1, 900.0, 920.0), (3, 1, 1): (1, 920.0, 940.0),   # sw3 -> sw1
        (2, 2, 1): (1, 900.0, 920.0), (2, 3, 1): (1, 920.0, 940.0),   # sw2 -> sw1
        (3, 4, 1): (0, 900.0, 920.0), (3, 5, 1): (0, 920.0, 940.0)}   # sw3 -> sw0
    assert net.booked() == oracle(net.topo, sends)


def test_a_spine_orders_two_leaves_by_key():
    # sw1 books GPU 2 at 400 and GPU 3 at 420 (tie at 400, GPU 2 first), sw0 GPU 0 at 400 and GPU 1 at 420
    # (ready 405, the link busy until 420); at the spine they are ready at 600, 620, 600, 620: by key
    sends = {0: [("send", 4, 1000)], 1: [("compute", 5.0), ("send", 4, 1000)], 2: [("send", 5, 1000)],
             3: [("send", 5, 1000)]}
    net = Net(three_by_two(), receive_all(sends, 6)).run_random(random.Random(5))
    spine = {key[1:]: times for key, times in net.booked().items() if key[0] == 3}
    assert spine == {(0, 1): (2, 900.0, 920.0), (2, 1): (2, 920.0, 940.0), (1, 1): (2, 940.0, 960.0),
                     (3, 1): (2, 960.0, 980.0)}
    assert net.booked() == oracle(net.topo, sends)


GETS = {0: [("get", 2, 4000), ("recv", 2), ("send", 2, 100)],        # GPU 0 reads 4000 B of GPU 2, then says bye
        2: [("compute", 5000.0), ("send", 1, 1000), ("recv", 0)],      # GPU 2 serves until the bye
        1: [("recv", 3), ("recv", 2)],
        3: [("send", 0, 1000), ("compute", 1000.0), ("send", 1, 2000)]}


def test_a_reply_stamped_before_its_servers_earlier_send_is_ordered_by_its_time():
    # the request: 100 B, 1 ns on a GPU link, 2 ns on an uplink: sw0 (400, 402), the spine (900, 902), GPU 2 has
    # it at 1402 + 100; the reply (4000 B, 40 ns; 80 ns upstairs) leaves GPU 2 at 1502, before GPU 2's send at
    # 5000 (seq 1): ready at sw1 1602, key 1902 -> (1902, 1982), the spine 2402 -> (2402, 2482)
    want = {(1, 3, 1): (2, 400.0, 420.0), (1, 3, 2): (2, 1400.0, 1440.0), (1, "reply", (0, 1)): (2, 1902.0, 1982.0),
            (1, 2, 1): (2, 5400.0, 5420.0), (0, 0, 1): (2, 400.0, 402.0), (0, 0, 2): (2, 3482.0, 3484.0),
            (2, 0, 1): (1, 900.0, 902.0), (2, 0, 2): (1, 3982.0, 3984.0), (2, 3, 1): (0, 900.0, 920.0),
            (2, 3, 2): (0, 1900.0, 1940.0), (2, "reply", (0, 1)): (0, 2402.0, 2482.0), (2, 2, 1): (0, 5900.0, 5920.0)}
    for seed in range(50):
        net = Net(two_by_two(), GETS, serves={2}).run_random(random.Random(seed))
        assert net.booked() == want, f"seed {seed}"
        assert net.received()[0][0] == (("reply", (0, 1)), 2902.0, 2982.0)
        check_safe(net)


def test_a_server_that_does_not_promise_its_answers_breaks_its_promise():
    # GPU 2 computes to 5000 first and would promise 5100; its reply is ready at 1602: sw1 refuses it
    net = Net(two_by_two(), GETS, serves={2})
    net.gpus[2].answers = False
    with pytest.raises(ProtocolError, match=r"sw1: port 0: GPU 2 seq 2: ready at 1602.0 ns, before the port's "
                                            r"promise of 5100.0 ns"):
        net.run_random(random.Random(0))


# -- (b) host delivery order does not decide modeled time -----------------------------------------------------

@pytest.mark.parametrize("make", [two_by_two, two_by_four, three_by_two])
def test_fifty_delivery_orders_give_identical_times(make):
    topo = make()
    scripts = phased(random.Random(2026), topo.gpus)
    reference = Net(topo, scripts)
    reference.run_rounds()
    want = (reference.booked(), reference.received())
    assert len(want[0]) > 2 * topo.gpus  # the workload crosses the spines
    for seed in range(50):
        net = Net(topo, scripts).run_random(random.Random(seed))
        assert (net.booked(), net.received()) == want, f"seed {seed}"
        check_safe(net)


def test_send_only_bookings_equal_the_sorted_reference_for_fifty_orders():
    topo, rng = two_by_four(), random.Random(11)
    sends = {x: [op for _ in range(4) for op in (("compute", rng.choice((0, 0, 5, 50))),
                                                  ("send", rng.choice([y for y in range(8) if y != x]),
                                                   rng.choice((1, 1000, 4000))))] for x in range(8)}
    want = oracle(topo, sends)
    for seed in range(50):
        assert Net(topo, receive_all(sends, 8)).run_random(random.Random(seed)).booked() == want, f"seed {seed}"


# -- (c) never booked before a feeder's promise allows it -----------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 32 - 1), st.sampled_from(["2x2", "2x4"]))
def test_no_transfer_is_booked_before_a_feeder_could_still_send_one_ahead_of_it(work, order, shape):
    topo = two_by_two() if shape == "2x2" else two_by_four()
    scripts = phased(random.Random(work), topo.gpus, sends=2)
    net = Net(topo, scripts)
    seen = []
    for k, sched in enumerate(net.sw):  # every promise a switch gives only moves forward
        promises = sched.promises

        def watched(k=k, promises=promises):
            now = promises()
            if len(seen) > k and seen[k]:
                assert all(now[p] >= seen[k][p] for p in now), f"sw{k}: {seen[k]} -> {now}"
            seen.extend([None] * (k + 1 - len(seen)))
            seen[k] = now
            return now
        sched.promises = watched
    net.run_random(random.Random(order))
    check_safe(net)
    assert not any(s.held for s in net.sw) and all(g.done for g in net.gpus)
    twin = Net(topo, scripts)
    twin.run_rounds()
    assert (twin.booked(), twin.received()) == (net.booked(), net.received())


# -- (d) lookahead creep, and LBTS ---------------------------------------------------------------------------
# GPU 0 waits for GPU 2, which computes G ns first, then GPU 0 sends to GPU 3, which waits from the start.
# Rounds: each delivers every message queued before it (round 0: scripts start, switches' first promises).

def creep(gap):
    return {0: [("recv", 2), ("send", 3, 1000)], 2: [("compute", gap), ("send", 0, 1000)], 3: [("recv", 0)]}


def creep_rounds(gap):
    """Hand count, null messages only. A blocked GPU promises max(now, L) + a, its leaf L = its promise
    + s + a (the least feeder); so its promise is 100 after round 0, 500 after round 1, then +500 (2a + s)
    every 2 rounds: p(k) = 100 + 500 (k // 2) + 400 (k % 2). sw1 holds GPU 2's transfer, key G + 400, until
    GPU 3's promise + s reaches it (a tie is fine: GPU 3 > GPU 2): p(k1) >= G + 100, then 8 rounds: sw1
    books, the spine books, sw0 passes, GPU 0 takes it and sends, sw0 books (GPU 0's own promise ties:
    fine), the spine books, sw1 passes, GPU 3 takes it."""
    k1 = next(k for k in range(10 ** 6) if 100 + 500 * (k // 2) + 400 * (k % 2) >= gap + 100)
    return k1 + 8


@pytest.mark.parametrize("gap", [0.0, 1000.0, 10_000.0, 1_000_000.0])
def test_a_blocked_cycle_resolves_by_null_messages_and_far_sooner_with_lbts(gap):
    null = Net(two_by_two(), creep(gap))
    resolved, rounds, reductions = null.run_rounds()
    assert (resolved, reductions) == (creep_rounds(gap), 0) and rounds > resolved  # and then goes quiet
    assert null.received()[3] == [((0, 1), gap + 2920.0, gap + 2940.0)]
    fast = Net(two_by_two(), creep(gap))
    resolved_fast, _, reductions = fast.run_rounds(use_lbts=True)
    # round 1 moves GPU 2's packet; round 2 moves none, so LBTS = sw1's held floor G + 400 + u = G + 600:
    # every channel's promise jumps there, sw1 books at once and the 7 rounds after it are the same chain
    if gap:
        assert (resolved_fast, reductions) == (9, 1)
    else:
        assert (resolved_fast, reductions) == (8, 0)  # no gap: nothing to creep over
    assert (fast.booked(), fast.received()) == (null.booked(), null.received())


def test_rounds_to_resolve_against_the_gap():
    """The figure in fabric.arbitration's docstring: rounds until GPU 3 has its data, by gap."""
    table = {}
    for gap in (1e3, 1e4, 1e5, 1e6):
        null, fast = Net(two_by_two(), creep(gap)), Net(two_by_two(), creep(gap))
        table[gap] = (null.run_rounds()[0], fast.run_rounds(use_lbts=True)[::2], null.nulls, fast.nulls)
    assert table == {1e3: (12, (9, 1), 151, 96), 1e4: (48, (9, 1), 511, 96), 1e5: (408, (9, 1), 4111, 96),
                     1e6: (4008, (9, 1), 40111, 96)}


def test_a_gpu_in_a_barrier_counts_as_blocked_in_the_lbts():
    # GPU 0 waits in the barrier at 0, so on the wire it can promise only its clock (the barrier may end
    # at 0); GPU 1's transfer at G, key G + 400, is held behind it at sw0, and GPU 3 waits for that
    # transfer before it joins the barrier: null messages stop with it still held (a deadlock)
    scripts = {0: [("barrier",)], 1: [("compute", 5000.0), ("send", 3, 1000), ("barrier",)],
               2: [("barrier",)], 3: [("recv", 1), ("barrier",)]}
    stuck = Net(two_by_two(), scripts)
    resolved, _, _ = stuck.run_rounds()
    assert resolved == 0 and not stuck.busy() and stuck.sw[0].held == 1
    assert stuck.sw[0].promises()[2] == 100.0 + S + U   # GPU 0's promise 100 (its clock + a)
    # the LBTS entry of a GPU in the barrier is inf (its next send comes after GPU 3's entry): round 1
    # moves GPU 1's packet, round 2 nothing, so T = sw0's held floor 5400 + u: booked, then the spine
    # (round 3), sw1 (4), GPU 3 takes it (5) and joins the barrier, the last one in
    net = Net(two_by_two(), scripts)
    assert net.run_rounds(use_lbts=True)[::2] == (5, 1)
    assert net.booked() == {(0, 1, 1): (2, 5400.0, 5420.0), (2, 1, 1): (1, 5900.0, 5920.0)}
    assert [g.now for g in net.gpus] == [6520.0] * 4   # GPU 3's: 6400 + 20 on its downlink + a


def test_lbts_takes_the_least_and_is_infinite_when_nothing_is_left():
    assert lbts_ns([700.0, math.inf], [900.0], [650.0]) == 650.0
    assert lbts_ns([], [math.inf], []) == math.inf
    with pytest.raises(ProtocolError, match="in-flight transfer"):
        lbts_ns([1.0], [2.0], [float("nan")])


def test_advance_to_releases_a_held_transfer_and_refuses_a_snapshot_that_missed_it():
    topo = two_by_two()
    leaf = SwitchScheduler(topo, 1)
    leaf.arrive(0, 2, 1, 1100.0, 1110.0, 1000, 2, "x")  # GPU 2 -> a GPU of node 0, key 1400
    assert leaf.bookable() == [] and leaf.held_floor_ns() == 1400.0 + U
    with pytest.raises(ProtocolError, match=r"sw1: advance_to\(1601.0 ns\) passes .* 1600.0 ns"):
        leaf.advance_to(1601.0)
    leaf.advance_to(1600.0)
    assert leaf.bookable() == [Booking("x", 2, 1400.0, 1420.0)]
    assert leaf.held_floor_ns() == math.inf
    assert leaf.promises()[2] == 1600.0 + S + U  # its GPUs' promises are 1600 now, past the link's free 1420


# -- the tie rule, on one scheduler ------------------------------------------------------------------------

def test_ties_go_by_source_and_a_gpus_own_clock_does_not_stall_it():
    leaf = SwitchScheduler(two_by_two(), 0)   # ports 0, 1: GPUs 0, 1; port 2: the spine
    leaf.arrive(1, 1, 1, 100.0, 110.0, 1000, 2, "gpu1")
    leaf.promise(0, 100.0)
    leaf.promise(1, 100.0)
    assert leaf.bookable() == []              # GPU 0 may still send at 100: it would go first
    leaf.arrive(0, 0, 7, 100.0, 110.0, 1000, 2, "gpu0")
    # GPU 0's transfer at the clock it promised goes (its later sends have a higher seq); GPU 1's still
    # waits: GPU 0 may send another at 100, ahead of it, until it promises past 100
    assert leaf.bookable() == [Booking("gpu0", 2, 400.0, 420.0)]
    leaf.promise(0, 100.5)
    assert leaf.bookable() == [Booking("gpu1", 2, 420.0, 440.0)]
    # a promise + s exactly at a held key is enough when every GPU behind that feeder ranks above the source
    spine = SwitchScheduler(two_by_four(), 2)  # port 0: leaf 0 (GPUs 0-3), port 1: leaf 1 (GPUs 4-7)
    spine.arrive(0, 2, 1, 600.0, 620.0, 1000, 1, "a")
    spine.promise(0, 600.0)                    # leaf 0 may still send GPU 0 or 1 ready at 600: wait
    assert spine.bookable() == []
    spine.promise(0, 601.0)
    assert spine.bookable() == [Booking("a", 1, 900.0, 920.0)]
    assert spine.promises() == {0: 0.0 + S + U, 1: 920.0 + U}  # leaf 1 promised nothing yet


def test_promises_only_move_forward_and_gpu_ports_pass_through():
    leaf = SwitchScheduler(two_by_two(), 0)
    leaf.promise(2, 1000.0)
    leaf.promise(2, 10.0)                     # ignored
    leaf.promise(0, 50.0)
    leaf.promise(1, math.inf)
    # to GPU 0: min(50, inf, 1000) + s + a; to the spine: min(50, inf) + s + u
    assert leaf.promises() == {0: 450.0, 1: 450.0, 2: 550.0}
    leaf.arrive(2, 2, 4, 1000.0, 1010.0, 1000, 1, "down")  # from the spine to GPU 1: straight through
    assert leaf.bookable() == [Booking("down", 1, 1300.0, 1310.0)]


# -- the GPU's promise -------------------------------------------------------------------------------------

def test_gpu_promise_by_hand():
    assert gpu_promise_ns(500.0, None, False, 200.0, uplink_latency_ns=A) == 600.0            # its clock + a
    assert gpu_promise_ns(500.0, None, False, 900.0, blocked=True, uplink_latency_ns=A) == 1000.0  # waits for data
    assert gpu_promise_ns(500.0, None, False, 200.0, blocked=True, uplink_latency_ns=A) == 600.0
    assert gpu_promise_ns(500.0, None, True, 200.0, uplink_latency_ns=A) == 300.0             # may reply at 200
    assert gpu_promise_ns(500.0, 50.0, True, 200.0, blocked=True, uplink_latency_ns=A) == 150.0  # pending
    assert gpu_promise_ns(500.0, None, True, math.inf, blocked=True, uplink_latency_ns=A) == math.inf
    assert gpu_promise_ns(500.0, None, False, math.inf, uplink_latency_ns=A) == 600.0         # LBTS entry, running
    with pytest.raises(ProtocolError, match="now_ns"):
        gpu_promise_ns(float("inf"), None, False, 0.0, uplink_latency_ns=A)
    with pytest.raises(ProtocolError, match="pending_start_ns"):
        gpu_promise_ns(1.0, -1.0, False, 0.0, uplink_latency_ns=A)


# -- (e) bad inputs ----------------------------------------------------------------------------------------

def test_bad_inputs_raise_typed_errors_naming_switch_port_gpu_and_times():
    leaf = SwitchScheduler(two_by_two(), 0)
    leaf.promise(0, 200.0)
    cases = [
        (dict(ingress_port=0, ready_start_ns=150.0), ProtocolError,
         r"sw0: port 0: GPU 0 seq 1: ready at 150.0 ns, before the port's promise of 200.0 ns"),
        (dict(ingress_port=1), ProtocolError, r"sw0: port 1: GPU 0 seq 1: no route enters here"),
        (dict(source_gpu=2, ingress_port=2, egress_port=2), ProtocolError, r"port 2: GPU 2 seq 1: no route"),
        (dict(egress_port=9), ProtocolError, r"sw0: no egress port 9"),
        (dict(ingress_port=True), ProtocolError, r"sw0: no ingress port True"),
        (dict(ready_end_ns=250.0), ProtocolError, r"GPU 0 seq 1: last byte ready at 250.0 ns before its first at 300"),
        (dict(ready_start_ns=float("nan")), ProtocolError, r"GPU 0 seq 1: ready_start_ns: must be a finite time"),
        (dict(raw_bytes=0), ProtocolError, r"raw_bytes: must be an integer >= 1, got 0"),
        (dict(seq=-1), ProtocolError, r"GPU 0: seq: must be an integer >= 0, got -1"),
    ]
    good = dict(ingress_port=0, source_gpu=0, seq=1, ready_start_ns=300.0, ready_end_ns=310.0, raw_bytes=1000,
                egress_port=2, token=None)
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            leaf.arrive(**{**good, **change})
    leaf.arrive(**good)
    with pytest.raises(ProtocolError, match=r"GPU 0 seq 1 is already held"):
        leaf.arrive(**good)
    with pytest.raises(ProtocolError, match=r"sw0: port 0: promise: must be a time >= 0 ns, got -1"):
        leaf.promise(0, -1)
    with pytest.raises(FabricError, match="no switch 5"):
        SwitchScheduler(two_by_two(), 5)
    with pytest.raises(ConfigError, match="takes a Topology"):
        SwitchScheduler("2x2", 0)


def test_zero_lookahead_is_refused():
    flat = Topology.multi_node(2, 2, 1, (100.0, 0.0), 50.0, U, 0.0, name="flat")
    with pytest.raises(ConfigError, match=r"switch sw0: link sw0->gpu0: lookahead 0.0 ns .* must be positive"):
        SwitchScheduler(flat, 0)
    # a spine whose uplinks and traversal take no time has zero lookahead too
    with pytest.raises(ConfigError, match=r"switch sw2: link sw2->sw0: lookahead 0.0 ns"):
        SwitchScheduler(Topology.multi_node(2, 2, 1, (100.0, A), 50.0, 0.0, 0.0), 2)
    SwitchScheduler(Topology.multi_node(2, 2, 1, (100.0, 0.0), 50.0, U, 1.0), 0)  # 1 ns is enough
