"""A GPU's raw port: what a well-behaved program never does, for the trust tests and the hostile example.

A workload talks to the fabric through `gpu.*` and `comm.*`; a hostile GPU bypasses them: it writes
headers and bytes of its own making to its switch or to other ranks, forges requests, and watches what
the fabric refused. `RawPort(gpu)` is the one supported way to do that (instead of reaching into the
Gpu's private fields), so the Gpu's insides may change without breaking the attacks written against it.
Nothing sent through it is trusted: the switches check it exactly as they check a program's traffic
(docs/model/trust.md).
"""

from nvlink_emu.fabric.packets import Packet


class RawPort:
    """`gpu`'s channels and bookkeeping, bare. Attributes that are dicts or lists are the GPU's own
    (a test may clear them, as the attack does with the replies it caused)."""

    def __init__(self, gpu):
        self._gpu = gpu

    # -- the channels -------------------------------------------------------------------------------
    @property
    def transport(self):
        """The data channel (ranks.transport.Transport): send, send_bytes, payload_only, in_flight, idle, comm."""
        return self._gpu._transport

    @property
    def control_channel(self):
        """The GPU ranks' control channel (ranks.transport.ControlChannel): send, send_bytes, idle, in_flight."""
        return self._gpu.control.channel

    @property
    def switch(self) -> int:
        """The MPI rank of this GPU's leaf switch."""
        return self._gpu._switch

    @property
    def addresses(self) -> tuple[int, ...]:
        """Every GPU's routing key: its network address (NVLink Network mode), its index (classic)."""
        return self._gpu._keys

    def send(self, packet: Packet, payload=None, at_ns: float | None = None,
             stamp: tuple[float, float] | None = None) -> list:
        """Post `packet` (any header) to the switch, counted and booked on the uplink as a program's send at
        `at_ns` (default now), or stamped with `stamp` (modeled start, end in ns) as given."""
        return self._gpu._send(packet, payload, at_ns=at_ns, stamp=stamp)

    def new_request(self) -> int:
        """The next request number this GPU would give a one-sided operation."""
        return next(self._gpu._req)

    # -- what came back -----------------------------------------------------------------------------
    @property
    def refusals(self) -> list:
        """Refusals of this GPU's traffic (NACKs, refused in-switch operations) that no wait raised yet; the
        next blocking wait raises the first. Settable (a test may count them in a list of its own)."""
        return self._gpu._traffic_errors

    @refusals.setter
    def refusals(self, errors: list) -> None:
        self._gpu._traffic_errors = errors

    def take_refusals(self) -> list:
        """The refusals waiting, taken."""
        taken, self._gpu._traffic_errors = self._gpu._traffic_errors, []
        return taken

    @property
    def put_errors(self) -> list:
        """Refusals of puts not yet raised (put, get, fence and barrier raise the first)."""
        return self._gpu.one_sided.refusals

    @property
    def replies(self) -> dict:
        """Request number -> the REPLY or NACK the switch sent for it, not yet taken."""
        return self._gpu._replies

    @property
    def gets(self) -> dict:
        """Request number -> where a GET's data lands, until it arrives."""
        return self._gpu.one_sided.gets

    @property
    def mailbox(self) -> dict:
        """(message key, sender) -> bytes received, not yet taken by the program."""
        return self._gpu.mailbox.arrived

    @property
    def control_box(self) -> dict:
        """(communicator, sequence, sender) -> a control message filed, not yet taken."""
        return self._gpu.control.box

    @property
    def bound(self) -> dict:
        """Buffer key -> bytes the switch may LOAD (NVLS)."""
        return self._gpu.loads.bound

    @property
    def loads(self) -> dict:
        """(group, buffer key, slot) -> a LOAD from the switch not yet served."""
        return self._gpu.loads.filed

    @property
    def shutdown(self) -> Packet | None:
        """The switch's shutdown packet, once it came."""
        return self._gpu._shutdown

    @property
    def fault_states(self) -> dict:
        """Link name -> the fault plan's state of this GPU's faulted links (fabric.faults.LinkFaultState)."""
        return self._gpu.links.faults

    @property
    def calls(self) -> list:
        """The collective calls recorded for the run's report (ranks.comm.CallRecord), oldest first."""
        return self._gpu.calls.records

    @calls.setter
    def calls(self, records: list) -> None:
        self._gpu.calls.records = list(records)

    @property
    def counters_packet(self):
        """The function that builds the counters packet sent at the end of the run (links, leftovers) -> Packet;
        replaceable, to send the launcher a malformed one."""
        return self._gpu._counters_packet

    @counters_packet.setter
    def counters_packet(self, build) -> None:
        self._gpu._counters_packet = build

    def offset_of(self, array) -> int:
        """Physical offset of `array` in this GPU's memory (what an EXPORT names)."""
        return self._gpu.allocations.offset_of(array)
