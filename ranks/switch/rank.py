"""The switch rank: executes SwitchLogic's (a leaf's) or SpineLogic's decisions over MPI, bounds its
in-flight buffer, ends the run with the other switches.

It trusts nothing a GPU rank sends: a header is decoded and checked before its payload is taken, a
payload is sized by what MPI says arrived (never by the header) and dropped unread when it does not
fit, and a sender whose payload does not come delays only its own later packets. Whatever is
refused is answered with a NACK and counted on the sender's port; the switch keeps serving. A leaf
takes packets from its own node's GPUs and from the spines, a spine from the leaves, and nothing
else: a message from any other rank is dropped unread (the switches trust each other, never a GPU).

Ranks of the fabric's communicator: GPUs 0..G-1 (GPU index = rank), then switch s at rank G + s
(leaves 0..N-1, spines N..); ranks/session.py maps them onto the MPI world's node-major layout.
"""

import math
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import downlink, merge_reports, uplink
from nvlink_emu.fabric.errors import FabricError, FabricTimeout, ProtocolError
from nvlink_emu.fabric.packets import MAX_GPU_HEADER_BYTES, CountersInfo, Kind, McastInfo, MsgInfo, Packet, TraceInfo
from nvlink_emu.fabric.budget import port_share_bytes
from nvlink_emu.fabric.switch import Send, SpineLogic, SwitchLogic

from ..transport import Idle, SwitchChannel, Transport, mailbox_class, unframe
from ..transport.packets import MAILBOX_PEER_MESSAGES, MAX_HEADER_BYTES
from .credits import LeafCredits
from .mailboxes import Mailboxes
from .queues import (ANSWERS, CREDIT_STEPS, MAX_KEPT, MAX_QUEUED, MAX_QUEUED_BYTES, MAX_UNREAD, SPANNING, SWEEP_STEPS,
                     Queue, Waiting)
from .report import report_part
from .tracing import Records


class SwitchRank:
    """Serves the GPUs until all of them are done, then gathers their counters and sends the report.

    In-flight forwarded bytes are bounded per port, by an equal share of switch_buffer_bytes: a
    transfer bound for a port with its share in flight waits (its payload not taken yet, its
    sender's later packets behind it) until that port drains, so the switch's memory is not N x S
    and a GPU that does not receive slows only the traffic bound for it. A GPU that leaves too many
    answers unread, or has too many packets waiting, is not read from until it catches up.

    Across nodes a leaf takes whatever a spine passes down (holding it would stall every tenant's
    traffic from that spine), so the senders' leaves bound it by credits (LeafCredits): a GPU that does
    not receive costs its leaf its port's share from the other nodes at most, in bytes and in packets,
    and only the traffic bound for it waits.
    """

    def __init__(self, config: FabricConfig, transport: Transport, timeout_s: float, trace=None,
                 switches: SwitchChannel | None = None):
        self.config = config
        self.index = transport.rank - config.gpus  # switch index: leaves 0..N-1, then spines
        self.spine = self.index >= config.nodes
        # a leaf's SwitchLogic or a spine's SpineLogic: their interfaces differ, and the code below picks by
        # self.spine, which a type checker does not follow
        self.logic: Any = SpineLogic(config, self.index) if self.spine else SwitchLogic(config, self.index)
        self.switches = switches  # the switch ranks among themselves (end of run); None: this one alone
        # GPUs attached here (their ranks)
        self.gpus: Sequence[int] = () if self.spine else cast(SwitchLogic, self.logic).local
        # the switches this one takes packets from, by rank: a spine's leaves, a leaf's spines
        peers = range(config.nodes) if self.spine else range(config.nodes, config.switches)
        self._peer_of = {config.gpus + s: s for s in peers}
        self.sources = (*self.gpus, *self._peer_of)
        self._next_source = 0  # where _poll's scan of the sources starts while some are not read
        self.sent_to_switches = self.taken_from_switches = 0  # packets, for the end of run
        self.logic.tracing = trace is not None
        self.records = Records(config, self.logic, trace, self._send_tracing)  # a TraceWriter's, if trace
        self.transport = transport
        self.timeout_s = timeout_s
        self.end_timeout_s = 2 * timeout_s + 5
        self.port_share_bytes = port_share_bytes(config)
        self._done: set[int] = set()
        self._counters: dict[int, CountersInfo] = {}
        self._asked_counters = False
        self._waiting: dict[int, Queue] = {}  # per GPU: its headers behind a payload, in order
        self._abandoned: list[tuple] = []  # payload receives given up on: (request, buffer) until they end
        self._suspects: set[int] = set()   # GPUs that sent a malformed packet: their stray payloads are dropped
        self._steps = 0                    # intake steps, for the sweeps of stray messages
        self._busy_after_done = False      # a GPU that said DONE sent another packet
        self._ending = False               # every GPU here said DONE: the switches are ending the run
        self._idle = Idle(yields=64, max_sleep_s=1e-3)  # every packet passes here: stay more awake
        waker = getattr(transport, "waker", None)  # None: a stand-in transport (tests/unit)
        self._waker = waker  # pokes a GPU whose payload it took (_advance)
        self.credits = LeafCredits(config, self.index, self.logic, self.gpus, self._to_switch)  # between leaves
        self.mailboxes = Mailboxes(self.gpus)  # between the GPUs here

    @property
    def trace(self):
        """This switch's TraceWriter, or None (the run records nothing): the one its records go to."""
        return self.records.trace

    def serve(self) -> dict:
        """Run until every GPU of the fabric reported DONE and no packet is left between switches;
        returns the run's report (also sent to every GPU)."""
        gpus = len(self.gpus)
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
                missing = sorted(set(self.gpus) - self._done)
                raise FabricTimeout(f"switch: GPUs {missing} did not finish within {self.end_timeout_s:g} s of "
                                    f"GPUs {sorted(self._done)} finishing (end of run)")
            self._idle()
        return self._finish()

    # -- intake -------------------------------------------------------------------------------------
    def _step(self) -> bool:
        """Move what can move: sends, payloads being received, one new header; True if anything did."""
        moved = self.transport.progress()
        if self.credits.transit:
            moved |= self.credits.drain(self.transport.sends_pending_to)
        if self._waiting or self._abandoned:
            moved |= self._advance_all()
        self._steps += 1
        if self.mailboxes.full or self.mailboxes.parked or not self._steps % CREDIT_STEPS:
            moved |= self._take_credits()
        if self.mailboxes.parked:
            moved |= self._unpark()
        if self.records.pending:
            moved |= self.records.relay()
        if not self._steps % SWEEP_STEPS:  # now and then, for every GPU (honest ones never leave any)
            moved |= self._sweep_other_tags()
            moved |= self.transport.drop_strays_from(set(self.sources)) > 0
            moved |= self.transport.sweep_outer() > 0  # a flood sent around the fabric (transport.sweep_outer)
            for source in self.gpus:
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
        held = self._not_read()
        if not held:  # any rank: a header from one that is no source of this switch is dropped by _take
            return transport.poll(limit=MAX_HEADER_BYTES)
        # round robin, from the source after the one served last: a scan from the first would serve a GPU
        # that keeps sending before every later one, which then starves (tests/unit/test_switch_window_shares_and_starvation.py)
        sources, start = self.sources, self._next_source
        for k in range(len(sources)):
            i = (start + k) % len(sources)
            if sources[i] not in held:
                got = transport.poll(sources[i], limit=MAX_HEADER_BYTES)
                if got is not None:
                    self._next_source = i + 1
                    return got
        return None

    def _take_credits(self) -> bool:
        """Take the mailbox credits the GPUs here sent (Mailboxes.take_credits); whether any came."""
        got = self.transport.credits(4 * MAILBOX_PEER_MESSAGES)
        self.mailboxes.take_credits(got)
        return bool(got)

    def _mailbox_over(self, source: int, packet: Packet, parked_ok: bool = False) -> bool:
        """Whether MSG `packet` from GPU `source` must wait for its receiver's mailbox (Mailboxes.must_wait); the
        receiver is asked for its credit then (once)."""
        receiver = self.logic.gpu_of_key(packet.dst)
        over, ask = self.mailboxes.must_wait(source, receiver, packet, parked_ok)
        if ask:
            self._send_all([Send(receiver, Packet(Kind.CREDIT, self.logic.route_key(source), packet.dst,
                                                  req=mailbox_class(cast(MsgInfo, packet.info).key)))], -1)
        return over

    def _park(self, source: int, entry: Waiting) -> None:
        """Set checked MSG `entry` of GPU `source` apart (its payload inline, or matched in entry.message)
        until its receiver's mailbox has room (_unpark): its sender's later packets go on meanwhile, except
        MSGs of the same pair and class."""
        self.mailboxes.park(source, self.logic.gpu_of_key(entry.packet.dst), entry)

    def _unpark(self) -> bool:
        """Serve parked MSGs, in order per pair and class, as far as their mailboxes have room and their
        ports take them (a payload is received then, within timeout_s); once every GPU here is done, whatever
        is parked (nothing new comes then, and the receivers report what their programs left untaken).
        Whether any moved."""
        moved, ending = False, len(self._done) == len(self.gpus)
        parked = self.mailboxes.parked
        for pair in list(parked):
            source, queue = pair[0], parked[pair]
            while queue:
                entry = queue[0]
                packet = entry.packet
                if entry.request is None:
                    if not ending and (self._mailbox_over(source, packet, parked_ok=True)
                                       or self._congested(source, packet, mailbox=False)):
                        break
                    if entry.message is not None:
                        entry.buffer = np.empty(packet.payload_bytes, np.uint8)
                        entry.request = self.transport.receive_matched(entry.message, entry.buffer)
                        entry.message, entry.deadline = None, time.monotonic() + self.timeout_s
                        moved = True
                if entry.request is not None and not entry.request.Test():
                    if time.monotonic() <= entry.deadline:
                        break
                    self._abandoned.append((entry.request, entry.buffer))  # as _advance
                    self.mailboxes.unpark(source, queue)
                    self._refuse(source, ProtocolError(f"MSG from GPU {source}: its payload of "
                                                       f"{packet.payload_bytes} bytes stalled"), packet)
                    moved = True
                    continue
                self.mailboxes.unpark(source, queue)
                if entry.request is not None and self._waker is not None:  # its sender waits for the send
                    self._waker.poke(source)
                self._handle(source, packet, entry.inline if entry.request is None else entry.buffer, checked=True)
                moved = True
            if not queue:
                del parked[pair]
        return moved

    def _sweep_other_tags(self) -> bool:
        """Drop the messages under tags the fabric never uses: at the front of MPI's queue, and each GPU's
        wherever they are in its stream, behind what this switch does not read of it now too (a GPU whose
        transfer is held: its messages are matched and kept in order, MAX_KEPT at most), so that junk a GPU
        sends behind a payload of its own that waits does not pile up. Whether any was dropped."""
        return self.transport.drop_other_tags(self.gpus, self._not_read(), MAX_KEPT) > 0

    def _not_read(self) -> set[int]:
        """The GPUs whose packets the switch does not read now: one waiting behind a held transfer, or past
        MAX_QUEUED packets or MAX_QUEUED_BYTES waiting, or with more than MAX_UNREAD answers unread."""
        held = {s for s, queue in self._waiting.items()
                if len(queue) > MAX_QUEUED or queue.nbytes > MAX_QUEUED_BYTES or queue[0].held} \
            if self._waiting else set()
        backlogged = self.transport.backlogged(MAX_UNREAD)
        if backlogged:
            held.update(d for d in backlogged if d < self.config.gpus)
        return held

    def _congested(self, source: int, packet: Packet, mailbox: bool = True) -> bool:
        """Whether a rank `packet` goes to (a GPU here, or the next switch) has its share of forwarded
        bytes in flight already, or a GPU of another node it goes to has this leaf's credit for it in use
        (a packet without payload: only the credit). Packets of other switches are not held: the
        switches are trusted, and each GPU's traffic was bounded at its own leaf."""
        if source in self._peer_of:
            return False
        if mailbox and self.mailboxes.busy() and packet.kind is Kind.MSG and \
                self._mailbox_over(source, packet):
            return True
        pending = self.transport.pending_bytes_to
        for port in self.logic.egress_ports(source, packet):
            switch = self.logic.next_switch(port) if 0 <= port < self.config.gpus else None
            dest = port if switch is None else self.config.gpus + switch
            if packet.payload_bytes and pending.get(dest, 0) and \
                    pending[dest] + packet.payload_bytes > self.port_share_bytes:
                return True
            if switch is not None and self.credits.must_wait(port, switch, packet.payload_bytes):
                return True
        return False

    def _may_hold(self, packet: Packet) -> bool:
        """Whether a counted packet without payload may have to wait (_congested): for credit across nodes, or a
        message for a mailbox here."""
        return bool(self.credits.used) or (self.mailboxes.busy() and packet.kind is Kind.MSG)

    def _take(self, source: int, data: bytearray | None) -> None:
        if source in self._peer_of:
            if data is None:
                raise ProtocolError(f"switch {self.index}: a header of more than {MAX_HEADER_BYTES} bytes from "
                                    f"switch {self._peer_of[source]}")
            self.taken_from_switches += 1
            # a switch's packet: a bad one is a bug, and ends the run
            header, inline = unframe(data, MAX_HEADER_BYTES)
            packet = Packet.from_wire(header)
        elif source in self.gpus:
            if data is None:
                self._refuse(source, ProtocolError(f"switch: a header of more than {MAX_GPU_HEADER_BYTES} bytes from "
                                                   f"GPU {source}"))
                return
            try:  # a GPU's header leaves room for what the switches write into it (fabric.packets)
                header, inline = unframe(data, MAX_GPU_HEADER_BYTES)
                packet = Packet.from_wire(header)
            except ProtocolError as exc:
                self._refuse(source, ProtocolError(f"switch: from GPU {source}: {exc}"))
                return
        else:
            return  # neither a GPU of this switch nor a neighbour switch: nobody to answer
        if inline is not None and not packet.payload_bytes:
            self._refuse(source, ProtocolError(f"{packet.kind.name} from GPU {source}: its header carries no payload, "
                                               f"{inline.nbytes} bytes came with it"), packet)
            return
        # a sender's packets are served in the order it sent them; one without payload may wait for credit
        size = len(data) + len(header)  # if it waits: its message (the inline payload is a view of it), decoded
        if self._waiting.get(source):
            self._queue(source, packet, inline, size)
        elif inline is not None:  # the whole packet is here: unless held, served now, as _advance would
            if self._congested(source, packet):
                self._queue(source, packet, inline, size)
            elif self._checked(source, packet, inline.nbytes):
                self._handle(source, packet, inline, checked=True)
        elif packet.payload_bytes or (packet.kind.counted and self._may_hold(packet) and self._congested(source, packet)):
            self._queue(source, packet, None, size)
        else:
            self._handle(source, packet, None)

    def _queue(self, source: int, packet: Packet, inline, size: int = 0) -> None:
        """Queue `packet` behind GPU `source`'s waiting ones (with its payload if it came inline; `size`: the
        bytes it holds of the switch, counted against MAX_QUEUED_BYTES) and serve them."""
        self._waiting.setdefault(source, Queue()).append(
            Waiting(packet, time.monotonic() + self.timeout_s, inline, size))
        self._advance(source)

    def _checked(self, source: int, packet: Packet, size: int) -> bool:
        """Whether `packet` from `source`, with `size` bytes of payload come, may be taken: the one check of
        a GPU's header (before anything is allocated for its payload), and its size against what came.
        A packet that may not is refused."""
        try:
            if source in self.gpus:
                self.logic.check_header(source, packet)
            if size != packet.payload_bytes:
                raise ProtocolError(f"{packet.kind.name} from GPU {source}: header says "
                                    f"{packet.payload_bytes} bytes, {size} came")
        except ProtocolError as exc:
            self._refuse(source, exc, packet)
            return False
        return True

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
            if entry.request is None and (packet.payload_bytes or packet.kind.counted):
                # a MSG for a full mailbox is parked (_park) if its sender has room there, else it waits here
                entry.parks = packet.kind is Kind.MSG and self.mailboxes.busy() and \
                    self._mailbox_over(source, packet)
                entry.held = not self.mailboxes.room(source, entry) if entry.parks else self._congested(source, packet)
                if entry.held:  # its wait for the payload starts once it may be taken
                    entry.deadline = time.monotonic() + self.timeout_s
                    break
            if entry.inline is not None:
                queue.popleft()  # checked now, as a payload that came on its own would be
                if self._checked(source, packet, entry.inline.nbytes):
                    self._serve(source, entry, entry.inline)
                moved = True
                continue
            if packet.payload_bytes and entry.request is None:
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
                if not self._checked(source, packet, size):  # before allocating anything for it
                    self.transport.drop(message)
                    queue.popleft()
                    moved = True
                    continue
                if entry.parks:  # its payload stays matched, not received, until it may go (_unpark)
                    entry.message = message
                    self._park(source, queue.popleft())
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
            if entry.request is not None and self._waker is not None:  # its sender waits for the send to
                self._waker.poke(source)                                 # complete: wake it now
            if entry.parks:  # a MSG without payload
                if self._checked(source, packet, 0):
                    self._park(source, entry)
            else:
                self._handle(source, packet, entry.buffer, checked=entry.request is not None)
            moved = True
        if not queue:
            del self._waiting[source]
        return moved

    def _serve(self, source: int, entry: Waiting, payload) -> None:
        """Serve checked `entry` of GPU `source`, or park it (_park)."""
        if entry.parks:
            self._park(source, entry)
        else:
            self._handle(source, entry.packet, payload, checked=True)

    # -- serving --------------------------------------------------------------------------------------
    def _handle(self, source: int, packet: Packet, payload: np.ndarray | None, checked: bool = False) -> None:
        """Serve `packet` (with its payload) from `source`; `checked`: from a GPU, its header was checked
        (_checked) already."""
        peer = self._peer_of.get(source)
        if peer is not None and packet.kind is Kind.TRACE:  # a GPU's word, relayed by its leaf and the spines
            gpu = self.logic.gpu_of_key(packet.src)
            if gpu is None:
                raise ProtocolError(f"switch {self.index}: TRACE from switch {peer} for {packet.src!r}, no GPU's")
            self.records.set(gpu, cast(TraceInfo, packet.info).on, exclude=peer)
            return
        if peer is not None and packet.kind is Kind.CREDIT:
            self._on_credit(packet)
            return
        if peer is not None and packet.kind in SPANNING:  # a spanning group's traffic (fabric.switch)
            store = packet.kind is Kind.MCAST and packet.src != -1  # a GPU's multicast store, not a result
            origin = self.logic.gpu_of_key(packet.src) if store else -1
            sends = self.logic.on_switch(peer, packet, payload)
            if self.trace is not None and packet.kind.counted:
                self.records.record("rx", f"sw{peer}->sw{self.index}", packet, origin)
            if store and self.spine and not sends:  # dropped here (its group was released on the way): the
                # credit its leaf took for each member of the other nodes comes back from here
                charge = self.credits.charge(packet.payload_bytes)
                for port in self.logic.dropped_store_ports(cast(McastInfo, packet.info).group, origin):
                    self._to_switch(self.credits.leaf_rank(origin) - self.config.gpus,
                                    Packet(Kind.CREDIT, self.logic.route_key(port), packet.src, nbytes=charge))
                return
            if store and not self.spine:
                # its leaf took credit for each member here (_send_all): returned once the copy left, and
                # at once for one that does not go down (its group was released on the way)
                charge = self.credits.charge(packet.payload_bytes)
                self._send_all(sends, origin, transit=charge)
                delivered = {send.port for send in sends}
                lost = [port for port in self.logic.store_targets(cast(McastInfo, packet.info).group)
                        if port not in delivered]
                for port in lost:
                    self.credits.owe(origin, port, charge)
                if lost:
                    self.credits.return_drained()
                return
            self._send_all(sends, origin)
            return
        if peer is not None:  # from another switch: decided at the sender's leaf, or to be at this one
            if self.spine:
                sends = [self.logic.on_packet(peer, packet, payload)]
            else:
                sends = self.logic.on_transit(peer, packet, payload)
            origin = self.logic.gpu_of_key(packet.src)
            origin = -1 if origin is None else origin
            if self.trace is not None:
                self.records.record("rx", f"sw{peer}->sw{self.index}", packet, origin)
            held = self.credits.charge(packet.payload_bytes) if origin >= 0 and not self.spine else None
            self._send_all(sends, origin, transit=held)
            if held is not None and not any(send.port in self.gpus for send in sends):
                # refused here (a request the target's Link TLB refused): nothing goes down to the target,
                # and the origin leaf counted it against its credit for the target's port
                self.credits.owe(origin, self.logic.gpu_of_key(packet.dst), held)
                self.credits.return_drained()
            return
        kind = packet.kind
        if kind is Kind.DONE:
            self._done.add(source)
            return
        if source in self._done and self._ending and kind not in ANSWERS and kind is not Kind.COUNTERS:
            # forwarded now, it could still be between switches once they agreed that nothing is
            self._refuse(source, ProtocolError(f"{kind.name} from GPU {source} after it said DONE, while the "
                                               f"switches end the run"), packet)
            return
        # a GPU whose main has returned still answers puts and gets of GPUs still at work (its memory
        # outlives its program); anything else it sends says it was not done
        if source in self._done and not self._ending and kind not in ANSWERS:
            self._done.discard(source)  # it said DONE too early: it is still at work
            self._busy_after_done = True
        if kind is Kind.TRACE:  # a GPU's word on its own traffic's records only
            self.records.set(source, cast(TraceInfo, packet.info).on)
            return
        if kind is Kind.COUNTERS:
            if not self._asked_counters or source in self._counters:
                self._refuse(source, ProtocolError(f"COUNTERS from GPU {source}: the switch did not ask for "
                                                   f"them (or has them already)"), packet)
            else:
                self._counters[source] = cast(CountersInfo, packet.info)
            return
        if self.trace is None:
            self._send_all(self.logic.on_packet(source, packet, payload, checked), source)
            return
        link = uplink(source, self.index)
        before = self.logic.counters.get(link).packets
        sends = self.logic.on_packet(source, packet, payload, checked)
        if self.logic.counters.get(link).packets != before:
            self.records.record("rx", link, packet, source)
        self._send_all(sends, source)

    # -- credits between leaves (LeafCredits) --------------------------------------------------------
    def _to_switch(self, switch: int, packet: Packet) -> None:
        self.transport.send(self.config.gpus + switch, packet)
        self.sent_to_switches += 1

    def _on_credit(self, packet: Packet) -> None:
        """A CREDIT from another leaf (passed on by a spine) for this leaf, or at a spine, on to the leaf of its dst."""
        if self.spine:
            self._to_switch(self.logic.gpu_of_key(packet.dst) // self.config.gpus_per_node, packet)
        else:
            self.credits.on_credit(packet)

    def _send_tracing(self, gpu: int, on: bool, exclude: int | None) -> None:
        """GPU `gpu`'s TRACE word to the neighbour switches but `exclude` (Records.set)."""
        word = Packet(Kind.TRACE, self.logic.route_key(gpu), -1, info=TraceInfo(on))
        for rank, switch in self._peer_of.items():
            if switch != exclude and (self.spine or exclude is None):  # a leaf relays only its own GPUs' word
                self.transport.send(rank, word)
                self.sent_to_switches += 1

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
        if source in self._peer_of:  # switches trust each other: a switch's broken packet is a bug
            raise FabricError(f"switch {self.index}: from switch {self._peer_of[source]}: {error}")
        if isinstance(error, ProtocolError):
            self._suspects.add(source)  # an honest GPU never breaks the protocol
        if packet is None:
            sends = self.logic.refuse(source, error)
        else:
            sends = self.logic.refuse(source, error, packet.kind.name, packet.req, packet.t_end)
        self._send_all(sends, source)

    def _send_all(self, sends: list, source: int, transit: int | None = None) -> None:
        """Send `sends`; `source`: the GPU their data comes from (-1: the switch's own); `transit`: they
        came down from a spine, a packet of GPU `source` that took that much credit at its leaf."""
        for send in sends:
            switch = (self.logic.next_switch(send.port) if send.via is None else send.via) \
                if send.switch is None else send.switch
            nbytes = send.packet.payload_bytes
            if switch is None:
                self.transport.send(send.port, send.packet, send.payload)
                if send.packet.kind is Kind.MSG and source in self.gpus:  # until the receiver credits it
                    self.mailboxes.sent(source, send.port, send.packet.info.key, nbytes)
                link = downlink(send.port, self.index) if self.trace is not None else None
                if self.credits.active:  # position of this send among the port's, for LeafCredits.drain
                    self.credits.posted(send.port, source, transit)
            else:
                if self.records.pending:  # the other switches learn a GPU's word before its packets
                    self.records.flush(source if send.origin is None else send.origin)
                self.transport.send(self.config.gpus + switch, send.packet, send.payload)
                self.sent_to_switches += 1
                link = f"sw{self.index}->sw{switch}" if self.trace is not None else None
                if source in self.gpus and send.switch is None:
                    self.credits.take(send.port, nbytes)
                elif source in self.gpus and send.packet.kind is Kind.MCAST:  # a store up to a spine: one copy
                    # reaches every member of the other nodes, so it takes credit for each (ranks/switch/credits.py)
                    for port in self.logic.remote_members(send.packet.info.group):
                        self.credits.take(port, nbytes)
            if self.trace is not None and send.packet.kind.counted:
                assert link is not None  # named above when tracing
                self.records.record("tx", link, send.packet, source if send.origin is None else send.origin)
        if self.logic.events:
            self.records.write_events(self.logic.events)

    # -- end of run ---------------------------------------------------------------------------------
    def _wait(self, done, what: str, waiting_for, deadline: float | None = None) -> None:
        """Keep serving (and refusing) until done() holds; FabricTimeout at the deadline (time.monotonic()
        seconds; default timeout_s from now; math.inf: none, the peers' deadlines end the job)."""
        start = time.monotonic()
        deadline = start + self.timeout_s if deadline is None else deadline
        while not done():
            if self._step():
                continue
            if time.monotonic() > deadline:
                raise FabricTimeout(f"switch: {what} timed out after {deadline - start:g} s waiting for "
                                    f"{waiting_for()}")
            self._idle()

    def _finish(self) -> dict:
        self._ending = True
        self._quiesce()
        gpus = self.gpus
        self._asked_counters = True
        for gpu in gpus:
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu)))
        self._wait(lambda: len(self._counters) == len(gpus), "end of run",
                   lambda: f"counters of GPUs {sorted(set(gpus) - set(self._counters))}")
        part = report_part(self.config, self.index, self.logic, self.gpus, self._counters)
        parts = [part] if self.switches is None else self.switches.allgather(part, self._wait_for)
        report = merge_reports(self.config, parts)
        for gpu in gpus:
            self.transport.send(gpu, Packet(Kind.SHUTDOWN, -1, self.logic.route_key(gpu), info=report))
        self._wait(lambda: self.transport.idle, "end of run", lambda: "the report to reach every GPU")
        return report

    def _quiesce(self) -> None:
        """Serve until no packet is left anywhere between switches: every switch idle with all its GPUs
        done, in two successive rounds of sums over the switches with the same counts of packets
        sent to and taken from switches, and as many taken as sent (Mattern's four-counter method:
        a packet in flight in the first round would make the second round's counts differ). A leaf
        is idle once every request it forwarded to its GPUs was answered: a done GPU sends nothing
        else now (_handle refuses it), and an answer crosses switches only while its request is
        awaited.

        The first round waits for every switch to join, as long as a one-node switch waits for its GPUs:
        a leaf end_timeout_s after its own GPUs finished (the backstop of serve()), a spine, which has no
        GPUs, until the leaves join (their deadlines end the job if one does not); each later round has
        end_timeout_s from the first's end."""
        self._wait(lambda: self.transport.idle and not self._waiting and not self.mailboxes.parked, "end of run",
                   lambda: "forwarded packets to be received")
        if self.switches is None:
            return
        deadline = math.inf if self.spine else time.monotonic() + self.end_timeout_s
        previous = None
        while True:
            quiet = (len(self._done) == len(self.gpus) and self.transport.idle and not self._waiting
                     and not self.mailboxes.parked and (self.spine or not self.logic.awaited_replies))
            busy, sent, taken = self.switches.sum(
                (0 if quiet else 1, self.sent_to_switches, self.taken_from_switches),
                lambda done, what: self._wait_for(done, what, deadline))
            if deadline == math.inf:  # every switch joined: the rest of the agreement is quick
                deadline = time.monotonic() + self.end_timeout_s
            if not busy and sent == taken:
                if previous == (sent, taken):
                    return
                previous = (sent, taken)
            else:
                previous = None
            if time.monotonic() > deadline:
                missing = sorted(set(self.gpus) - self._done)
                raise FabricTimeout(f"switch {self.index}: the fabric did not go quiet within {self.end_timeout_s:g} "
                                    f"s of this switch's GPUs finishing (end of run; GPUs here not done: {missing}, "
                                    f"requests forwarded here and not answered: "
                                    f"{0 if self.spine else self.logic.awaited_replies}, "
                                    f"packets between switches: {sent} sent, {taken} taken)")

    def _wait_for(self, request_done, what: str, deadline: float | None = None) -> None:
        """Serve until request_done() holds (an MPI collective of the switches); FabricTimeout naming `what`
        at `deadline` (see _wait)."""
        self._wait(request_done, "end of run", lambda: what, deadline)

