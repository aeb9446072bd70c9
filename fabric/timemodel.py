"""Modeled time: alpha-beta links with per-link busy-until, cut-through forwarding, in-switch reduction.

All times are ns of modeled (virtual) time, floats; bandwidths are GB/s, i.e. bytes per ns.

A transfer of `raw` bytes (payload plus headers) occupies a link for raw / bandwidth once the link is
free. Forwarding is cut-through: a transfer streams out of the switch as it streams in, so each hop
adds its latency, and a link's end is never before the upstream end (`LinkClock.transmit`). A packet
carries (t_start, t_end): when its first and last byte are ready at its current point. The sender
serializes its uplink in the order it issues sends; a receiver serializes its downlink in the order
it consumes transfers (program order for collectives), which makes modeled times independent of the
order messages happen to arrive in on the host.
"""

from dataclasses import dataclass


@dataclass
class LinkClock:
    """One direction of one link: when it is free next, and how long it has been busy (ns)."""

    bandwidth: float  # bytes per ns
    free_ns: float = 0.0
    busy_ns: float = 0.0

    def transmit(self, ready_start: float, ready_end: float, raw_bytes: int) -> tuple[float, float]:
        """(start, end) of a transfer whose first/last byte are ready at ready_start/ready_end."""
        duration = raw_bytes / self.bandwidth
        start = max(ready_start, self.free_ns)
        end = max(start + duration, ready_end)
        self.free_ns = end
        self.busy_ns += duration
        return start, end


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
