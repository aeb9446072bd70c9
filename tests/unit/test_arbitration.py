"""fabric.arbitration: switch schedulers of 2x2 (1 spine) and 2x4 (2 spines) fabrics in one process,
scripted GPUs, every message (packets and null messages) delivered in a seeded random order or in
synchronous rounds; hand-computed bookings, determinism over host orders, safety, creep and LBTS."""

import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.arbitration import CREEP_ROUNDS, SwitchScheduler, gpu_promise_ns, lbts_ns
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


class Gpu:
    """A scripted GPU: ("compute", ns), ("send", dst, raw bytes), ("recv", src) (blocks until a transfer
    from src is here). Books its uplink in send order and its downlink in receive order, as ranks/gpu.py."""

    def __init__(self, net, gpu, script):
        self.net, self.gpu, self.script = net, gpu, list(script)
        bw = net.topo.gpu_gbytes_per_s
        self.up, self.down = LinkClock(bw), LinkClock(bw)
        self.now, self.seq, self.pc, self.leaf = 0.0, 0, 0, 0.0
        self.inbox, self.got, self.told = {}, [], -1.0
        self.channel = (("sw", net.topo.leaf_of(gpu).index), net.topo.locate(gpu)[1])

    @property
    def done(self):
        return self.pc == len(self.script)

    def promise(self, leaf=None):
        if self.done:
            return math.inf
        blocked = self.script[self.pc][0] == "recv"
        return gpu_promise_ns(self.now, None, False, self.leaf if leaf is None else leaf, blocked=blocked,
                              uplink_latency_ns=A)

    def run(self):
        while not self.done:
            op = self.script[self.pc]
            if op[0] == "compute":
                self.now += op[1]
            elif op[0] == "send":
                start, end = self.up.transmit(self.now, self.now, op[2])
                self.seq += 1
                packet = ("pkt", (self.gpu, self.seq), op[1], op[2], start + A, end + A)
                # piggybacks its promise: its clock (its later sends have a higher seq)
                self.net.post(self.channel, packet, gpu_promise_ns(self.now, None, False, self.leaf,
                                                                   uplink_latency_ns=A))
            else:
                queue = self.inbox.get(op[1])
                if not queue:
                    break
                token, t_start, t_end, raw = queue.popleft()
                start, end = self.down.transmit(t_start, t_end, raw)
                self.got.append((token, start, end))
                self.now = max(self.now, end + A)
            self.pc += 1
        p = self.promise()
        if p > self.told:
            self.told = p
            self.net.post(self.channel, ("null",), p)

    def take(self, message, promise):
        if message[0] == "pkt":
            _, token, _, raw, t_start, t_end = message
            self.inbox.setdefault(token[0], deque()).append((token, t_start, t_end, raw))
        self.leaf = max(self.leaf, promise)
        self.run()


class Net:
    """GPUs, their leaves and the spines; channels[(receiver, port)] is a FIFO of (message, promise);
    receiver is ("sw", index) or ("gpu", index)."""

    def __init__(self, topo, scripts):
        self.topo = topo
        self.sw = [SwitchScheduler(topo, k) for k in range(len(topo.switches))]
        self.told = [dict.fromkeys(s.promises(), -1.0) for s in self.sw]
        self.channels = {}
        self.log = []       # ("arrive" | "book", switch, egress, key, times) in the order they happened
        self.bookings = {}  # (switch, token) -> (egress, start, end)
        self.packets = 0
        self.gpus = [Gpu(self, g, scripts.get(g, ())) for g in range(topo.gpus)]

    def post(self, channel, message, promise):
        """Queue (message, piggybacked promise or -1) on channel (receiver, port)."""
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
            _, token, dst, raw, t_start, _ = booking.token
            self.bookings[(k, token)] = (booking.egress_port, booking.start_ns, booking.end_ns)
            self.log.append(("book", k, booking.egress_port, (t_start + S, *token), booking.start_ns))
            port = sw.ports[booking.egress_port]
            # the next switch sees the booked times + the link latency; a GPU books its downlink itself
            lat = self.topo.link(port.egress).latency_ns if port.peer.startswith("sw") else 0.0
            moved = ("pkt", token, dst, raw, booking.start_ns + lat, booking.end_ns + lat)
            self.post(self.peer_channel(port), moved, -1.0)
        for port, value in sched.promises().items():
            if value > self.told[k][port]:
                self.told[k][port] = value
                self.post(self.peer_channel(sw.ports[port]), ("null",), value)

    def deliver(self, key):
        (kind, index), port = key
        message, promise = self.channels[key].popleft()
        if kind == "gpu":
            self.gpus[index].take(message, promise)
            return
        sched = self.sw[index]
        if message[0] == "pkt":
            self.packets += 1
            _, token, dst, raw, t_start, t_end = message
            egress = self.topo.next_port(index, dst)
            self.log.append(("arrive", index, egress, (t_start + S, *token), port))
            sched.arrive(port, token[0], token[1], t_start, t_end, raw, egress, message)
        if promise >= 0:
            sched.promise(port, promise)
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
        Returns (rounds, LBTS reductions) until nothing is queued."""
        self.start()
        rounds = reductions = 0
        while self.busy():
            rounds += 1
            assert rounds <= limit, "did not settle"
            before = self.packets + sum(len(g.got) for g in self.gpus)
            for key, n in [(key, len(self.channels[key])) for key in self.busy()]:
                for _ in range(n):
                    self.deliver(key)
            if use_lbts and self.packets + sum(len(g.got) for g in self.gpus) == before:
                in_flight = [m[0][4] for q in self.channels.values() for m in q if m[0][0] == "pkt"]
                t = lbts_ns([s.held_floor_ns() for s in self.sw], [g.promise(leaf=math.inf) for g in self.gpus],
                            in_flight)
                if t < math.inf:
                    reductions += 1
                    for k, sched in enumerate(self.sw):
                        sched.advance_to(t)
                        self.emit(k)
        return rounds, reductions

    def booked(self):
        """{(switch, source GPU, seq): (egress port, start, end)} for every switch-facing booking."""
        return {(k, *token): times for (k, token), times in self.bookings.items()
                if self.topo.link(self.topo.switches[k].ports[times[0]].egress).level == "leaf-spine"}

    def received(self):
        return {g.gpu: list(g.got) for g in self.gpus}

