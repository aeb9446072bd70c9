"""Point-to-point programs on the link clocks: each GPU's clock and link ends, as ranks/links.py books them,
the messages in flight between them (Fabric), and the interpreter that runs every member's program
round-robin (run_programs). fabric.replay's schedules and fabric.plans.timing's plans both run here, so
both book links alike. Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns)."""

from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, cast

from .packets import raw_bytes
from .timemodel import LinkEnd
from .topology import Topology


class GpuClocks:
    """One member's clock and links, as ranks/links.py keeps them; `lanes`: the clocks of the channels of a
    call that runs several (channel c's ops carry lane (c, C); docs/model/time.md, "Channels"), each
    starting at the member's clock when the first of them does, until a Join op."""

    __slots__ = ("index", "node", "now", "uplink", "downlink", "inbound", "lanes")

    def __init__(self, index: int, topo: Topology):
        self.index, self.node = index, topo.locate(index)[0]
        self.now = 0.0
        self.lanes: dict[int, float] = {}
        self.uplink = LinkEnd(topo.gpu_gbytes_per_s, topo.gpu_latency_ns)
        self.downlink = LinkEnd(topo.gpu_gbytes_per_s, topo.gpu_latency_ns)
        # several nodes only (a spine: share_gbytes_per_s set)
        self.inbound = LinkEnd(cast(float, topo.share_gbytes_per_s), 0.0) if topo.spines else None

    def clock(self, lane: tuple[int, int] | None) -> float:
        """Modeled ns of channel lane (c, C)'s clock, or of the member's (lane None or one channel)."""
        return self.now if lane is None or lane[1] == 1 else self.lanes.get(lane[0], self.now)

    def advance(self, lane: tuple[int, int] | None, ns: float) -> None:
        """Move the clock of `lane` (as `clock`) to `ns` if later (a lane's clock is set even when it stays:
        later reads no longer follow `now`). Comparisons, not max(): a call a message."""
        if lane is None or lane[1] == 1:
            if ns > self.now:
                self.now = ns
        else:
            held = self.lanes.get(lane[0], self.now)
            self.lanes[lane[0]] = ns if ns > held else held

    def join(self) -> None:
        """The call's channels are done: the member's clock moves to the latest channel's."""
        self.now = max([self.now] + list(self.lanes.values()))
        self.lanes = {}


class Fabric:
    """The link clocks of every GPU and leaf of `topo`, and the messages in flight between them.
    mtu_bytes/header_bytes: the config's, for raw bytes."""

    def __init__(self, topo: Topology, mtu_bytes: int, header_bytes: int):
        self.topo, self.mtu, self.header = topo, mtu_bytes, header_bytes
        self.gpus = [GpuClocks(g, topo) for g in range(topo.gpus)]
        s, u = topo.switch_latency_ns, cast(float, topo.uplink_latency_ns)  # u: read only with spines, set then
        # a leaf's traversal; a spine's (its own switch's latency) and the cable down to the leaf
        self.s = s
        self.spine_ns = cast(float, topo.spine_latency_ns) + u if topo.spines else None
        self.shares = ([LinkEnd(cast(float, topo.share_gbytes_per_s), u) for _ in range(topo.gpus)]
                       if topo.spines else None)
        self.sent: dict[tuple[int, int, Hashable], tuple[float, float, int]] = {}  # (src, dst, key) -> stamps at dst's leaf, raw
        self._raw: dict[int, int] = {}  # payload bytes -> raw bytes (a call's messages come in a few sizes)

    def send(self, gpu: GpuClocks, peer: int, key: Hashable, nbytes: int,
             lane: tuple[int, int] | None = None) -> tuple[float, float]:
        """Book a message on its route; returns when it occupies the sender's uplink (ns). lane: channel
        (c, C) of a call that runs C channels: its own clock and lane of the uplink (the shares whole:
        docs/model/time.md, "Channels")."""
        raw = self._raw.get(nbytes)
        if raw is None:
            raw = self._raw[nbytes] = raw_bytes(nbytes, self.mtu, self.header)
        ready = gpu.clock(lane)
        start, end = gpu.uplink.send(ready, ready, raw, lane)
        uplink = start - gpu.uplink.latency_ns, end - gpu.uplink.latency_ns  # the link's own occupation
        start, end = start + self.s, end + self.s                       # the sender's leaf (cut-through)
        if self.gpus[peer].node != gpu.node:  # several nodes: shares and spine_ns set
            start, end = cast(list[LinkEnd], self.shares)[gpu.index].send(start, end, raw)  # outbound share, + u
            spine_ns = cast(float, self.spine_ns)
            start, end = start + spine_ns, end + spine_ns    # the spine, the cable down
            start, end = start + self.s, end + self.s                   # the destination's leaf
        self.sent[(gpu.index, peer, key)] = (start, end, raw)
        return uplink

    def receive(self, gpu: GpuClocks, peer: int, key: Hashable,
                lane: tuple[int, int] | None = None) -> tuple[float, float] | None:
        """Consume the message if it was sent: when it occupies the receiver's downlink (ns); None: not yet.
        lane: as send's (the receiver's channel: its clock and lane of the downlink)."""
        got = self.sent.pop((peer, gpu.index, key), None)
        if got is None:
            return None
        start, end, raw = got
        if self.gpus[peer].node != gpu.node:
            start, end = cast(LinkEnd, gpu.inbound).book(start, end, raw)  # several nodes: set
            start = max(start, end - raw / gpu.downlink.lane_bandwidth(lane))  # its burst on the faster downlink
        start, end = gpu.downlink.book(start, end, raw, lane=lane)
        gpu.advance(lane, end + gpu.downlink.latency_ns)
        return start, end


Lane = tuple[int, int]  # channel c of a call that runs C: (c, C) (GpuClocks)


class Send(NamedTuple):
    """A message of `nbytes` payload bytes to GPU `peer`, matched by `key` (any hashable the pair's receive
    names alike), on `lane` (None: the member's clock and whole links)."""
    peer: int
    key: Hashable
    nbytes: int
    lane: Lane | None = None


class Recv(NamedTuple):
    """Wait for GPU `peer`'s message `key`, on `lane` (as Send's)."""
    peer: int
    key: Hashable
    lane: Lane | None = None


class Flush(NamedTuple):
    """Wait until the sends so far have left the uplink (`lane`'s own with a lane)."""
    lane: Lane | None = None


class Join(NamedTuple):
    """The call's channels are done: the member's clock moves to the latest channel's (GpuClocks.join)."""


JOIN = Join()

Program = Iterator[Send | Recv | Flush | Join]  # a member's operations, in order (run_programs)
Event = tuple[int, str, int | None, float, float]  # (member, "send"/"recv"/"wait", peer, start_ns, end_ns)


def run_programs(fabric: Fabric, programs: dict[int, Program], stuck: Callable[[dict[int, Recv]], Exception],
                 events: list[Event] | None = None) -> float:
    """Run every member's program (iterators of Send, Recv, Flush and Join) on `fabric`'s clocks, round-robin, each until it waits for a message not yet sent; the
    latest member's clock at the end (ns). stuck(waiting): the error when no member can go on. Shared
    by replay_ns and fabric.plans.timing (the plan interpreter), so both book links alike. events: if
    given, gets (member, what, peer, start_ns, end_ns) for every operation: "send" its uplink's
    occupation, "recv" its downlink's, "wait" the member's clock moved by a receive or a flush (peer
    None for a flush)."""
    waiting: dict[int, Recv] = {}  # member -> the receive it waits on
    while programs:
        progressed = False
        for r in list(programs):
            gpu = fabric.gpus[r]
            # a Send, Recv, Flush or Join, dispatched by type(op) is ...; Any, not narrowed: isinstance would cost a
            # call per operation (millions a replay)
            op: Any = waiting.pop(r, None)
            while True:
                if op is None:
                    op = next(programs[r], None)
                    if op is None:
                        del programs[r]
                        progressed = True
                        break
                kind = type(op)
                if kind is Join:
                    gpu.join()
                    progressed, op = True, None
                    continue
                lane = op.lane
                before = gpu.clock(lane) if events is not None else 0.0
                booked: tuple[float, float] | None
                if kind is Send:
                    booked = fabric.send(gpu, op.peer, op.key, op.nbytes, lane)
                elif kind is Recv:
                    booked = fabric.receive(gpu, op.peer, op.key, lane)
                    if booked is None:
                        waiting[r] = op
                        break
                elif lane is None:
                    gpu.now = max(gpu.now, gpu.uplink.free_ns)
                else:  # a channel's flush: its own sends have left
                    gpu.advance(lane, gpu.uplink.lane_sent_ns(lane))
                if events is not None:
                    peer = op.peer if kind is not Flush else None
                    if kind is not Flush:  # a send's or a receive's booking (a receive not booked broke out above)
                        events.append((r, "send" if kind is Send else "recv", peer,
                                       *cast(tuple[float, float], booked)))
                    if gpu.clock(lane) > before:
                        events.append((r, "wait", peer, before, gpu.clock(lane)))
                progressed = True
                op = None
        if not progressed:
            raise stuck(waiting)
    return max(gpu.now for gpu in fabric.gpus)
