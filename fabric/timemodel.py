"""Modeled time: alpha-beta links with per-link busy-until, cut-through forwarding, in-switch reduction.

All times are ns of modeled (virtual) time, floats; bandwidths are GB/s, i.e. bytes per ns.

A transfer of `raw` bytes (payload plus headers) occupies a link for raw / bandwidth from the earliest
time the link is free for it, at or after its first byte is ready. Forwarding is cut-through: a transfer streams out of the switch as it streams in, so each hop
adds its latency, and a link's end is never before the upstream end (`LinkClock.transmit`). A packet
carries (t_start, t_end): when its first and last byte are ready at its current point. The sender
serializes its uplink in the order it issues sends; a receiver serializes its downlink in the order
it consumes transfers (program order for collectives), which makes modeled times independent of the
order messages happen to arrive in on the host.
"""

import bisect
from dataclasses import dataclass, field


@dataclass
class LinkClock:
    """One direction of one link: its busy intervals, and how long it has been busy (ns).

    A transfer takes the earliest time at or after it is ready when the link is free for all of it
    (an idle gap left before later transfers included), so transfers that do not compete for the
    link get the same times whatever order the host hands them over in.
    """

    bandwidth: float  # bytes per ns
    busy_ns: float = 0.0
    _starts: list[float] = field(default_factory=list)  # sorted, disjoint busy intervals, touching ones merged
    _ends: list[float] = field(default_factory=list)

    @property
    def free_ns(self) -> float:
        """When the link is free for good (after its last busy interval)."""
        return self._ends[-1] if self._ends else 0.0

    def transmit(self, ready_start: float, ready_end: float, raw_bytes: float) -> tuple[float, float]:
        """(start, end) of a transfer whose first/last byte are ready at ready_start/ready_end. raw_bytes:
        its bytes on the wire, a float when scaled (a degraded link's lanes, a faulted uplink's spines)."""
        duration = raw_bytes / self.bandwidth
        starts, ends = self._starts, self._ends
        start = ready_start
        if not ends or ends[-1] <= start:  # after the last interval (most transfers): the loop's answer, at once
            end = start + duration
            if end < ready_end:
                end = ready_end
            if ends and ends[-1] == start:  # touches it: extend it (_occupy's rule)
                ends[-1] = end
            else:
                starts.append(start)
                ends.append(end)
            self.busy_ns += duration
            return start, end
        i = bisect.bisect_right(ends, start)  # the first interval that ends after `start`
        count = len(starts)
        while True:  # max() written as comparisons: the same floats, and the scan over gaps is hot
            end = start + duration
            if end < ready_end:
                end = ready_end
            if i == count or end <= starts[i] * (1 + 1e-12):
                # fits in the gap before interval i; a fit to within float rounding is a fit, so that
                # a schedule started at another clock (after earlier calls) gets the same times
                end = min(end, starts[i]) if i < count else end
                break
            if ends[i] > start:
                start = ends[i]
            i += 1
        self._occupy(i, start, end)
        self.busy_ns += duration
        return start, end

    def hold(self, start: float, end: float) -> None:
        """Keep the link from transfers in [start, end), after its last busy interval (start >= free_ns), with
        no busy time of its own: a channel lane that may not start before the program's earlier transfers,
        the program lane while channel lanes are busy (LinkEnd)."""
        self._occupy(len(self._starts), start, end)

    def _occupy(self, i: int, start: float, end: float) -> None:
        starts, ends = self._starts, self._ends
        if i > 0 and ends[i - 1] == start:  # touches the previous interval: extend it
            i -= 1
            ends[i] = end
        else:
            starts.insert(i, start)
            ends.insert(i, end)
        if i + 1 < len(starts) and starts[i + 1] == ends[i]:  # and the next one
            ends[i] = ends.pop(i + 1)
            starts.pop(i + 1)


@dataclass
class LinkEnd:
    """The end of one link where it is booked: its clock and its latency (ns). A GPU books its uplink
    here as it sends and its downlink as it consumes; a switch books each link to another switch as
    it sends on it. Bandwidth in bytes per ns.

    Two lanes, so that the host's order never enters the program's times (issue 28): `clock` takes
    what the owner's program sends (`send`) and consumes (`book`), in program order; `served_clock`
    takes what is booked in the order the host hands it over (`serve`, `book(served=True)`): one-sided
    traffic, i.e. puts and gets into this GPU's memory, their replies, and the owner's own puts' and
    gets' answers. A lane sees only its own transfers, so a put that the host delivers in the middle
    of a collective neither waits for the collective's transfers nor delays them, whatever the order.

    `sent_ns` is when the last byte of the transfers its owner's program sent (`send`) left: what a
    call that waits for its sends to leave waits for (`free_ns`, the link's last busy byte in either
    lane, would include a reply served meanwhile).

    Channel lanes (docs/model/time.md, "Channels"): a call that runs C > 1 independent channels books
    channel c's transfers with `lane=(c, C)` on lane c of C, a clock of its own at bandwidth / C, in
    that channel's program order. The lanes open at the program lane's last busy byte (none of them
    starts before the owner's earlier program transfers have left) and stay open while the owner's
    bookings name the same C; the next program-lane booking (or lanes of another C) closes them: the
    program lane is then busy until their last byte. lane=None, or C = 1, is the program lane itself.

    Beside a channelled call (docs/model/time.md, "A put beside a collective"): the owner's own one-sided
    transfers (`post`: a put's data, a get's request) booked while C channel lanes are open and still busy
    take a lane of their own at bandwidth / (C + 1), opened with the channel lanes' floor, instead of
    closing the channel lanes and queueing behind their last byte; the lanes stay open."""

    bandwidth: float
    latency_ns: float
    clock: LinkClock = field(init=False)
    served_clock: LinkClock = field(init=False)
    sent_ns: float = field(init=False, default=0.0)
    _lanes: list[LinkClock] = field(init=False, default_factory=list)       # the open channel lanes (LinkClocks), or none
    _lane_sent: list[float] = field(init=False, default_factory=list)   # per open lane: its program's last byte out (ns)
    _lanes_busy_ns: float = field(init=False, default=0.0)       # the lanes' transfers at the link's bandwidth
    _beside: LinkClock | None = field(init=False, default=None)    # one-sided transfers beside the open lanes

    def __post_init__(self) -> None:
        self.clock = LinkClock(self.bandwidth)
        self.served_clock = LinkClock(self.bandwidth)

    @property
    def free_ns(self) -> float:
        """When the link is free for good (its last byte booked in any lane has left)."""
        return max([self.clock.free_ns, self.served_clock.free_ns] + [lane.free_ns for lane in self._lanes]
                   + ([self._beside.free_ns] if self._beside is not None else []))

    @property
    def busy_ns(self) -> float:
        """Modeled ns the link has spent transmitting (every lane; a channel lane's bytes at the link's
        bandwidth, so that C lanes busy at once make the link busy once, not C times)."""
        return self.clock.busy_ns + self.served_clock.busy_ns + self._lanes_busy_ns

    def lane_bandwidth(self, lane: tuple[int, int] | None) -> float:
        """Bytes per ns of channel lane (c, C) (the link's bandwidth / C), or of the link (lane None)."""
        return self.bandwidth if lane is None else self.bandwidth / lane[1]

    def lane_sent_ns(self, lane: tuple[int, int] | None) -> float:
        """When the last byte the owner's program sent on `lane` left (None: on any lane, `sent_ns`)."""
        if lane is None or lane[1] == 1:
            return self.sent_ns
        return self._lane_sent[lane[0]] if len(self._lanes) == lane[1] else 0.0

    def _clock(self, lane: tuple[int, int] | None) -> LinkClock:
        """The program lane (lane None or of one channel), or channel lane (c, C), opened as needed."""
        if lane is None or lane[1] == 1:
            if self._lanes:
                self._close_lanes()
            return self.clock
        c, count = lane
        if len(self._lanes) != count:
            if self._lanes:
                self._close_lanes()
            floor = self.clock.free_ns  # no channel transfer before the owner's earlier program ones have left
            self._lanes = [LinkClock(self.bandwidth / count) for _ in range(count)]
            for clock in self._lanes:
                if floor > 0.0:
                    clock.hold(float("-inf"), floor)
            self._lane_sent = [0.0] * count
        return self._lanes[c]

    def _close_lanes(self) -> None:
        """The program lane takes over: busy until the lanes' last byte (a span with no busy time of its own)."""
        end = max([lane.free_ns for lane in self._lanes] + ([self._beside.free_ns] if self._beside is not None else []))
        if end > self.clock.free_ns:
            self.clock.hold(self.clock.free_ns, end)
        self._lanes, self._lane_sent, self._beside = [], [], None

    def book(self, ready_start: float, ready_end: float, raw_bytes: float,
             served: bool = False, lane: tuple[int, int] | None = None) -> tuple[float, float]:
        """(start, end) on the link of a transfer whose first/last byte are ready at its near end;
        `served`: booked in host order (one-sided traffic), on the served lane; `lane`: channel c of C's
        lane (c, C) (program transfers only)."""
        if served:
            return self.served_clock.transmit(ready_start, ready_end, raw_bytes)
        lanes = self._lanes
        if lane is not None and len(lanes) == lane[1] > 1:  # an open channel lane (_clock's answer, without a call)
            clock = lanes[lane[0]]
        else:
            clock = self._clock(lane)
        if clock is not self.clock:
            self._lanes_busy_ns += raw_bytes / self.bandwidth
        return clock.transmit(ready_start, ready_end, raw_bytes)

    def send(self, ready_start: float, ready_end: float, raw_bytes: float,
             lane: tuple[int, int] | None = None) -> tuple[float, float]:
        """When the transfer's first and last byte reach the far end: booked (cut-through), plus the
        latency; a transfer of the owner's program (it moves `sent_ns`), on channel lane `lane` if given."""
        start, end = self.book(ready_start, ready_end, raw_bytes, lane=lane)
        self.sent_ns = max(self.sent_ns, end)
        if lane is not None and lane[1] > 1:
            self._lane_sent[lane[0]] = max(self._lane_sent[lane[0]], end)
        return start + self.latency_ns, end + self.latency_ns

    def post(self, ready_start: float, ready_end: float, raw_bytes: float) -> tuple[float, float] | None:
        """As `send`, for the owner's own one-sided transfer beside a channelled call: while C channel lanes
        are open and busy past `ready_start`, on the beside lane at bandwidth / (C + 1) (the lanes stay
        open; it moves sent_ns); None when no channel lane is busy then (book it with `send`)."""
        if not self._lanes or ready_start >= max(lane.free_ns for lane in self._lanes):
            return None
        if self._beside is None:
            self._beside = LinkClock(self.bandwidth / (len(self._lanes) + 1))
            if self.clock.free_ns > 0.0:  # the channel lanes' floor: the program's transfers before them
                self._beside.hold(float("-inf"), self.clock.free_ns)
        start, end = self._beside.transmit(ready_start, ready_end, raw_bytes)
        self._lanes_busy_ns += raw_bytes / self.bandwidth
        self.sent_ns = max(self.sent_ns, end)
        return start + self.latency_ns, end + self.latency_ns

    def serve(self, ready_start: float, ready_end: float, raw_bytes: float) -> tuple[float, float]:
        """As `send`, for a transfer served for another GPU (a one-sided reply), on the served lane:
        `sent_ns` stays, and no program transfer waits for it."""
        start, end = self.served_clock.transmit(ready_start, ready_end, raw_bytes)
        return start + self.latency_ns, end + self.latency_ns


@dataclass
class ReductionClock:
    """A multicast group's reduction engine: results stream out at `bandwidth` bytes per ns."""

    bandwidth: float
    latency_ns: float
    free_ns: float = 0.0

    def reduce(self, inputs_start: float, inputs_end: float, raw_bytes: int) -> tuple[float, float]:
        """(start, end) of a result whose inputs' latest first and last bytes arrived at the given times."""
        start = max(inputs_start + self.latency_ns, self.free_ns)
        end = max(start + raw_bytes / self.bandwidth, inputs_end + self.latency_ns)
        self.free_ns = end
        return start, end
