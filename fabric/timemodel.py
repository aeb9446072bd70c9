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
    _starts: list = field(default_factory=list)  # sorted, disjoint busy intervals, touching ones merged
    _ends: list = field(default_factory=list)

    @property
    def free_ns(self) -> float:
        """When the link is free for good (after its last busy interval)."""
        return self._ends[-1] if self._ends else 0.0

    def transmit(self, ready_start: float, ready_end: float, raw_bytes: int) -> tuple[float, float]:
        """(start, end) of a transfer whose first/last byte are ready at ready_start/ready_end."""
        duration = raw_bytes / self.bandwidth
        starts, ends = self._starts, self._ends
        start = ready_start
        i = bisect.bisect_right(ends, start)  # the first interval that ends after `start`
        while True:
            end = max(start + duration, ready_end)
            if i == len(starts) or end <= starts[i] * (1 + 1e-12):
                # fits in the gap before interval i; a fit to within float rounding is a fit, so that
                # a schedule started at another clock (after earlier calls) gets the same times
                end = min(end, starts[i]) if i < len(starts) else end
                break
            start = max(start, ends[i])
            i += 1
        self._occupy(i, start, end)
        self.busy_ns += duration
        return start, end

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
    lane, would include a reply served meanwhile)."""

    bandwidth: float
    latency_ns: float
    clock: LinkClock = field(init=False)
    served_clock: LinkClock = field(init=False)
    sent_ns: float = field(init=False, default=0.0)

    def __post_init__(self):
        self.clock = LinkClock(self.bandwidth)
        self.served_clock = LinkClock(self.bandwidth)

    @property
    def free_ns(self) -> float:
        """When the link is free for good (its last byte booked in either lane has left)."""
        return max(self.clock.free_ns, self.served_clock.free_ns)

    @property
    def busy_ns(self) -> float:
        """Modeled ns the link has spent transmitting (both lanes)."""
        return self.clock.busy_ns + self.served_clock.busy_ns

    def book(self, ready_start: float, ready_end: float, raw_bytes: int,
             served: bool = False) -> tuple[float, float]:
        """(start, end) on the link of a transfer whose first/last byte are ready at its near end;
        `served`: booked in host order (one-sided traffic), on the served lane."""
        return (self.served_clock if served else self.clock).transmit(ready_start, ready_end, raw_bytes)

    def send(self, ready_start: float, ready_end: float, raw_bytes: int) -> tuple[float, float]:
        """When the transfer's first and last byte reach the far end: booked (cut-through), plus the
        latency; a transfer of the owner's program (it moves `sent_ns`)."""
        start, end = self.clock.transmit(ready_start, ready_end, raw_bytes)
        self.sent_ns = max(self.sent_ns, end)
        return start + self.latency_ns, end + self.latency_ns

    def serve(self, ready_start: float, ready_end: float, raw_bytes: int) -> tuple[float, float]:
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
