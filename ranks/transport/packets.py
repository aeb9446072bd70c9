"""Fabric packets between ranks (Transport).

Fabric packets travel as a msgpack header message (TAG_HEADER) followed, when the packet carries a
payload, by the raw bytes as a second message (TAG_PAYLOAD) sent straight from the numpy buffer.
A payload of at most INLINE_PAYLOAD_BYTES travels inside its header's message instead (an inline
frame: INLINE_MARK, the header's length, the header, the payload; `frame`, `unframe`), so a small
packet costs one MPI message, not two. MPI keeps messages between two ranks in order per tag, so the
n-th payload message from a rank belongs to the n-th header from it that carries a payload and is
not inline. Every send is non-blocking: a rank waiting for anything keeps serving, so two ranks sending
to each other never deadlock.

Receivers trust nothing about a message but its MPI source: a GPU takes fabric packets from its
switch alone (`poll(source=...)`) and drops whatever other ranks send it (`drop_strays`); the
switch sizes a payload by what MPI says arrived, never by the header, and can drop any message
without allocating for it (`drop`); control objects use fabric.control's encoding, never pickle.
"""

import random
import struct
import time
from collections import deque

import msgpack
import numpy as np
from mpi4py import MPI

from nvlink_emu.fabric.errors import FabricTimeout, ProtocolError
from nvlink_emu.fabric.packets import MAX_HEADER_BYTES, Packet  # noqa: F401 - a switch's header limit, here too

from .job import Idle, Waker, complete, install, uninstall

TAG_HEADER = 11
TAG_PAYLOAD = 12
TAG_CONTROL = 13
TAG_EXCHANGE = 14  # an exchange's slots, on the members' own MPI communicator (Exchange)
# a GPU's mailbox credit to its switch (send_credit): apart from its packets, so that a credit never waits
# behind a packet of the same GPU's that the switch holds for want of the other side's credit
TAG_CREDIT = 15
_CREDIT = 4  # int64s of a credit: the sending GPU, its mailbox class (mailbox_class), payload bytes, messages
# Mailbox bounds, per pair of GPUs of one node (ranks/switch/ holds a sender's next MSG past them, ranks/gpu.py
# credits them back as its program takes messages): a GPU's messages to a peer that the peer's program has not
# taken are at most MAILBOX_PEER_BYTES of payload and MAILBOX_PEER_MESSAGES (as the switch's MAX_UNREAD) messages
MAILBOX_PEER_BYTES = 32 << 20
MAILBOX_PEER_MESSAGES = 1024
# A program's own point-to-point messages (a communicator's "p2p" slots, the mpi4py layer's) and the rest (a
# collective's messages, which its members' programs take as the collective runs) have a bound each, so that a
# backlog of point-to-point messages never holds a collective's traffic (a sender chooses its keys, so a hostile
# one gains at most a second bound)
MAILBOX_P2P, MAILBOX_FABRIC = 0, 1
# a receiver's program waits for one message (send_want): the switch lets it go whatever the bounds, as a
# rendezvous receive would (one per wait of the program: bounded by it); its key is at most this long, encoded
WANTED = -1
MAX_WANT_KEY_BYTES = 4096


def mailbox_class(key) -> int:
    """The mailbox bound a MSG with slot `key` counts against: MAILBOX_P2P or MAILBOX_FABRIC."""
    return MAILBOX_P2P if type(key) is tuple and len(key) > 1 and key[1] in ("p2p", "mpi4py") else MAILBOX_FABRIC
_NOTHING = np.empty(0, np.uint8)  # where dropped messages go (a receive truncated to nothing)
# Payloads up to this many bytes travel inline, in their header's message. Below it a second message
# costs more than the copy into one: each MPI message is a probe, a match and a receive of Python and
# MPI work at both ends (tens of us), copying 4 KiB is well under one; above it the copy grows with the
# size while the message's cost does not. It also bounds what a switch holds of a GPU's packets that
# wait (ranks/switch/: MAX_QUEUED of them and MAX_QUEUED_BYTES, 1 MiB, per GPU, headers and inline payloads
# counted) and what it reads before checking a header.
INLINE_PAYLOAD_BYTES = 4096
INLINE_MARK = 0xC1  # an inline frame's first byte: msgpack never uses it, so no plain header starts with it
_FRAME = struct.Struct("<BI")  # the mark, then the header's length in bytes (little-endian uint32)
INLINE_FRAME_BYTES = _FRAME.size + INLINE_PAYLOAD_BYTES  # an inline frame's bytes beyond its header, at most


DELAY_ENV = "NVLINK_EMU_TEST_SEND_DELAY"  # "SEED:MAX_MS": a test hook, see Transport.delay_sends


class Transport:
    """Packets between the ranks of one fabric (GPUs 0..G-1, then the switches) on a private communicator."""

    def __init__(self, comm=None):
        # the communicator the run was given (MPI_COMM_WORLD unless the caller passed another): while the run
        # lasts the fabric owns it point to point, and nothing of the fabric's travels there (sweep_outer)
        self.outer = comm or MPI.COMM_WORLD
        self.comm = self.outer.Dup()
        self.rank = self.comm.Get_rank()
        # fabric messages a sweep matched out of MPI's queue to reach what a source sent behind them (drop_
        # other_tags): (source, tag) -> [(message, its bytes)], oldest first; taken before MPI's queue
        self._kept: dict[tuple[int, int], deque] = {}
        self._delay = None  # (random.Random, most seconds): delay_sends
        self.size = self.comm.Get_size()
        # per destination, oldest first: (requests, buffers kept alive until sent, payload bytes); retired
        # in order, so a destination that does not receive costs the progress loop one test, not one per send
        self._pending: dict[int, deque] = {}
        self.pending_bytes = 0                      # payload bytes posted and not yet sent, all destinations
        self.pending_bytes_to: dict[int, int] = {}  # the same per destination
        self._sends = 0                             # sends posted and not yet retired, all destinations
        self._late: set[int] = set()                # destinations whose oldest send was still in flight at a test
        self._status = MPI.Status()
        self._wake()

    def _wake(self) -> None:
        """(Re)make this rank's Waker for the current numbering (collective)."""
        install(None)  # the old one closed before the new one is made: a rank holds one socket at a time
        self.waker = Waker(self.comm)
        install(self.waker)

    def reorder(self, key: int) -> None:
        """Renumber this rank `key` (a collective of every rank): the fabric numbers its ranks GPUs
        first, then switches, whatever the MPI world's layout."""
        comm = self.comm.Split(0, key)
        self.comm.Free()
        self.comm, self.rank = comm, comm.Get_rank()
        self._wake()

    def send(self, dest: int, packet: Packet, payload: np.ndarray | None = None) -> list:
        """Post `packet` (and its payload bytes) to `dest`, in one message if the payload is at most
        INLINE_PAYLOAD_BYTES; returns the requests, complete when sent."""
        nbytes = packet.payload_bytes
        if nbytes and (payload is None or payload.nbytes != nbytes):
            raise ValueError(f"{packet.kind.name} to rank {dest}: payload of "
                             f"{None if payload is None else payload.nbytes} bytes, header says "
                             f"{nbytes}")
        return self.send_bytes(dest, packet.to_wire(), payload if nbytes else None,
                               inline=nbytes <= INLINE_PAYLOAD_BYTES)

    def delay_sends(self, seed: int, most_s: float) -> None:
        """A test hook: from now on, sleep a random time in [0, most_s) (seeded by `seed` and this rank)
        before each send, so that the host delivers messages in another order, while modeled time must
        not change. $NVLINK_EMU_TEST_SEND_DELAY="SEED:MAX_MS" turns it on for every rank of a run."""
        self._delay = (random.Random(seed * 100003 + self.rank), most_s)

    def send_bytes(self, dest: int, header: bytes, payload: np.ndarray | None = None, inline: bool = False) -> list:
        """Post a header message of any bytes, and a payload message if given, to `dest`; `inline`: the
        payload (of any size) in the header's message instead (send() does it for packets; tests use it
        as a hostile GPU would); returns the requests."""
        if self._delay is not None:
            rng, most = self._delay
            time.sleep(rng.random() * most)
        if payload is not None and inline:
            message = frame(header, payload)
            requests = [self.comm.Isend([message, MPI.BYTE], dest, TAG_HEADER)]
            buffers: tuple = (message, payload)  # its payload's bytes are pending as a payload message's would be
        else:
            requests = [self.comm.Isend([header, MPI.BYTE], dest, TAG_HEADER)]
            if payload is not None:
                requests.append(self.comm.Isend([payload, MPI.BYTE], dest, TAG_PAYLOAD))
            buffers = (header, payload)
        self.waker.poke(dest)
        return self._keep(dest, requests, buffers)

    def send_credit(self, dest: int, sender: int, cls: int, nbytes: int, messages: int) -> None:
        """Tell switch rank `dest` that this GPU's program took `messages` messages (`nbytes` of payload)
        of mailbox class `cls` from GPU `sender` (TAG_CREDIT: read apart from this GPU's packets)."""
        data = np.array([sender, cls, nbytes, messages], np.int64)
        self._keep(dest, [self.comm.Isend([data, MPI.BYTE], dest, TAG_CREDIT)], (data, None))
        self.waker.poke(dest)

    def send_want(self, dest: int, sender: int, key: tuple) -> None:
        """Tell switch rank `dest` that this GPU's program waits for GPU `sender`'s message in slot `key`
        (TAG_CREDIT, after a credit's fields: class WANTED, then the key, msgpack)."""
        data = np.frombuffer(np.array([sender, WANTED, 0, 0], np.int64).tobytes() + msgpack.packb(list(key)), np.uint8)
        self._keep(dest, [self.comm.Isend([data, MPI.BYTE], dest, TAG_CREDIT)], (data, None))
        self.waker.poke(dest)

    def credits(self, most: int) -> list[tuple]:
        """Up to `most` credits waiting from any rank: (source rank, sender GPU, class, bytes, messages) each, or
        for a want (send_want) (source rank, sender GPU, WANTED, key); one of another size, or a want whose key
        does not decode, is dropped."""
        got: list[tuple]
        got, status, size = [], self._status, _CREDIT * 8
        while len(got) < most and self.comm.Iprobe(MPI.ANY_SOURCE, TAG_CREDIT, status):
            source, count = status.Get_source(), status.Get_count(MPI.BYTE)
            if not size <= count <= size + MAX_WANT_KEY_BYTES:
                self._drop_from(source, TAG_CREDIT)
                continue
            buffer = np.empty(count, np.uint8)
            self.comm.Recv([buffer, MPI.BYTE], source, TAG_CREDIT)
            fields = tuple(int(v) for v in buffer[:size].view(np.int64))
            if count == size and fields[1] != WANTED:
                got.append((source, *fields))
            elif count > size and fields[1] == WANTED:
                try:
                    key = msgpack.unpackb(buffer[size:].tobytes())
                except (ValueError, TypeError, msgpack.UnpackException):
                    continue
                if type(key) is list and all(type(part) in (int, str) for part in key):
                    got.append((source, fields[0], WANTED, tuple(key)))
        return got

    def payload_only(self, dest: int, payload: np.ndarray) -> list:
        """Post a payload message with no header (a hostile GPU's realignment; tests use it)."""
        requests = [self.comm.Isend([payload, MPI.BYTE], dest, TAG_PAYLOAD)]
        self.waker.poke(dest)
        return self._keep(dest, requests, (None, payload))

    def _keep(self, dest: int, requests: list, buffers: tuple) -> list:
        nbytes = 0 if buffers[1] is None else buffers[1].nbytes
        self._pending.setdefault(dest, deque()).append((requests, buffers, nbytes))
        self._sends += 1
        self.pending_bytes += nbytes
        self.pending_bytes_to[dest] = self.pending_bytes_to.get(dest, 0) + nbytes
        return requests

    def progress(self) -> bool:
        """Retire completed sends, oldest first per destination; True if any completed."""
        done = False
        if not self._pending:
            return done
        late = self._late
        for dest in list(self._pending):
            queue = self._pending[dest]
            retired = False
            while queue:
                requests = queue[0][0]
                # one request (a header, or an inline frame) is the common case: Test it without Testall's list
                if not (requests[0].Test() if len(requests) == 1 else MPI.Request.Testall(requests)):
                    late.add(dest)
                    break
                nbytes = queue.popleft()[2]
                self._sends -= 1
                if nbytes:
                    self.pending_bytes -= nbytes
                    self.pending_bytes_to[dest] -= nbytes
                retired = True
            if retired:
                done = True
                # a send that did not complete at once (MPI held it back: the receiver's queue from here
                # was full, or it was large) may have reached its receiver only now, after the poke sent
                # with it: poke again, or a receiver asleep would find it only at the end of its nap (a
                # hint: it did not cure the bursts of the constants' note above, whose sends complete)
                if dest in late:
                    late.discard(dest)
                    self.waker.poke(dest)
                    if queue:
                        late.add(dest)
            if not queue:
                del self._pending[dest]
        return done

    def sends_pending_to(self, dest: int) -> int:
        """Sends to `dest` posted and not yet retired (they retire in the order they were posted)."""
        queue = self._pending.get(dest)
        return len(queue) if queue else 0

    @property
    def in_flight(self) -> int:
        """Sends posted and not yet retired, all destinations."""
        return self._sends

    def backlogged(self, limit: int) -> list[int]:
        """Destinations with more than `limit` sends posted and not yet retired."""
        if self._sends <= limit:  # none has (the switch asks at every step)
            return []
        return [dest for dest, queue in self._pending.items() if len(queue) > limit]

    @staticmethod
    def sent(requests: list) -> bool:
        """Whether the sends behind `requests` completed (their buffers may be reused)."""
        return all(r == MPI.REQUEST_NULL for r in requests) or MPI.Request.Testall(requests)

    @property
    def idle(self) -> bool:
        return not self._pending

    def poll(self, source: int = -1, limit: int | None = None) -> tuple[int, bytearray | None] | None:
        """The next header message (its bytes: a header, or an inline frame, see `unframe`) from `source`
        (-1: any), or None if none is waiting; the payload of a plain header, if any, is the next
        TAG_PAYLOAD message from the same rank. A message longer than `limit` + INLINE_FRAME_BYTES
        bytes is dropped unread: (source, None); unframe(data, limit) refuses a longer header."""
        kept = self._kept_first(source, TAG_HEADER) if self._kept else None
        if kept is not None:  # a source's headers that a sweep kept come before any of its in MPI's queue
            source, message, count = kept
            if limit is not None and count > limit + INLINE_FRAME_BYTES:
                self.drop(message)
                return source, None
            buffer = bytearray(count)
            message.Recv([buffer, MPI.BYTE])
            return source, buffer
        if not self.comm.Iprobe(MPI.ANY_SOURCE if source < 0 else source, TAG_HEADER, self._status):
            return None
        source, count = self._status.Get_source(), self._status.Get_count(MPI.BYTE)
        if limit is not None and count > limit + INLINE_FRAME_BYTES:
            self._drop_from(source, TAG_HEADER)
            return source, None
        buffer = bytearray(count)
        self.comm.Recv([buffer, MPI.BYTE], source, TAG_HEADER)
        return source, buffer

    def _kept_first(self, source: int, tag: int):
        """The oldest message under `tag` a sweep kept of `source` (-1: any source's), as (source, message,
        its bytes), taken out of the kept ones; None if none is kept."""
        if source < 0:
            source = next((s for s, t in self._kept if t == tag), -1)
        queue = self._kept.get((source, tag))
        if not queue:
            return None
        message, count = queue.popleft()
        if not queue:
            del self._kept[(source, tag)]
        return source, message, count

    def anything_waiting(self) -> bool:
        """Whether any message, from any rank under any tag, is waiting to be read (one probe)."""
        return self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def header_waiting(self, source: int) -> bool:
        """Whether a header from `source` is waiting to be read."""
        return (source, TAG_HEADER) in self._kept or self.comm.Iprobe(source, TAG_HEADER)

    def probe_payload(self, source: int):
        """(message, its size in bytes) of the next payload from `source` if it has arrived, else None.
        The message is matched: take it with receive_matched or drop it."""
        kept = self._kept_first(source, TAG_PAYLOAD) if self._kept else None
        if kept is not None:
            return kept[1:]
        message = self.comm.Improbe(source, TAG_PAYLOAD, self._status)
        if message is None:
            return None
        return message, self._status.Get_count(MPI.BYTE)

    @staticmethod
    def receive_matched(message, out: np.ndarray):
        """Start receiving a matched `message` into `out` (uint8, its exact size); returns the request."""
        return message.Irecv([out, MPI.BYTE])

    @staticmethod
    def drop(message) -> None:
        """Receive a matched message into nothing: it is gone, whatever its size, and nothing was allocated."""
        try:
            message.Recv([_NOTHING, MPI.BYTE])
        except MPI.Exception as exc:  # truncation is the point
            if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                raise

    def _drop_from(self, source: int, tag: int) -> None:
        drop_first(self.comm, source, tag)

    def drop_other_tags(self, sources=(), held=frozenset(), keep: int = 0) -> int:
        """Drop messages under tags the fabric never uses (left in MPI's queue, they would slow every
        later match, and hold their bytes); returns how many. Those at the front of the queue, up to the
        first message with a fabric tag; then each of `sources`' (GPUs) wherever they are in its stream:
        its messages in order (MPI keeps a source's order), dropping the others' and, for a source in
        `held` (whose messages its reader does not take now), matching the fabric's and keeping them in
        order (at most `keep` kept per source; poll, header_waiting and probe_payload take them first),
        so that nothing it sends stays unread behind a message of its own that waits; for any other
        source, up to its first fabric message (its reader takes those as they come)."""
        dropped = drop_front(self.comm, self._status, lambda source, tag: tag in (TAG_HEADER, TAG_PAYLOAD, TAG_CREDIT))
        status = self._status
        for source in sources:
            kept = sum(len(self._kept.get((source, tag), ())) for tag in (TAG_HEADER, TAG_PAYLOAD))
            while self.comm.Iprobe(source, MPI.ANY_TAG, status):
                tag = status.Get_tag()
                if tag == TAG_CREDIT:  # taken by credits(), in turn: what is behind it waits for that
                    break
                if tag not in (TAG_HEADER, TAG_PAYLOAD):
                    drop_first(self.comm, source, tag)
                    dropped += 1
                    continue
                if source not in held or kept >= keep:
                    break
                message = self.comm.Improbe(source, tag, status)  # the one just probed: the oldest under tag
                self._kept.setdefault((source, tag), deque()).append((message, status.Get_count(MPI.BYTE)))
                kept += 1
        return dropped

    def drop_strays(self, expected: int, sweep: bool = False) -> int:
        """Drop messages waiting from ranks other than `expected` (a GPU hears only its switch);
        returns how many. Stops at the first message that is `expected`'s, unless `sweep`: then it
        asks every other rank in turn (strays left behind the switch's messages would slow every
        later match in MPI's queue)."""
        dropped = 0
        if sweep:
            for source in range(self.size):
                while source != expected and self.comm.Iprobe(source, MPI.ANY_TAG, self._status):
                    self._drop_from(source, self._status.Get_tag())
                    dropped += 1
            return dropped
        return drop_front(self.comm, self._status, lambda source, tag: source == expected)

    def sweep_outer(self) -> int:
        """Drop every point-to-point message waiting on the run's own communicator (`outer`), from any rank
        under any tag; returns how many. The fabric sends nothing there (its traffic is on duplicates),
        a workload reaches other GPUs through the fabric alone (the mpi4py layer too), so whatever waits
        there was sent by a rank around the fabric (left in MPI's queue, it would hold its bytes and slow
        every later match of this rank, whatever the communicator)."""
        return drop_front(self.outer, self._status, lambda source, tag: False)

    def sweep_outer_at_end(self, timeout_s: float) -> int:
        """The end of the run on every rank of its communicator (collective over `outer`): meet the others,
        sweeping meanwhile, then sweep once more; returns how many messages were dropped. A message left
        unreceived there makes MPICH's MPI_Finalize fail on its receiver ("Communicator ... being freed has
        N unmatched message(s)"), and mpiexec then kills every other rank: the job ended with status 9 (a
        rank killed by signal 9) although the run completed. Every rank comes here after its last send."""
        request, dropped = self.outer.Ibarrier(), 0
        deadline, idle = time.monotonic() + timeout_s, Idle()
        while not request.Test():
            dropped += self.sweep_outer()
            if time.monotonic() > deadline:
                raise FabricTimeout(f"rank {self.rank}: the end of the run: not every rank of the run's communicator "
                                    f"came within {timeout_s:g} s")
            idle()
        return dropped + self.sweep_outer()

    def drop_strays_from(self, allowed: set) -> int:
        """Drop messages waiting from ranks outside `allowed` (a switch hears its own GPUs and its
        neighbour switches only); returns how many."""
        dropped = 0
        if len(allowed) < self.size - 1:
            for source in range(self.size):
                while source != self.rank and source not in allowed and self.comm.Iprobe(source, MPI.ANY_TAG,
                                                                                         self._status):
                    self._drop_from(source, self._status.Get_tag())
                    dropped += 1
        return dropped

    def recv_payload(self, source: int, out: np.ndarray, deadline_s: float, what: str) -> None:
        """Receive the payload that follows a header from `source` into `out` (uint8, contiguous)."""
        request = self.comm.Irecv([out, MPI.BYTE], source, TAG_PAYLOAD)
        idle = Idle()
        while not request.Test():
            # keep our own sends moving: the peer may be waiting for them before it sends this payload
            if self.progress():
                idle.reset()
            if time.monotonic() > deadline_s:
                request.Cancel()
                raise FabricTimeout(f"rank {self.rank}: payload of {what} from rank {source} did not arrive "
                                    f"before the deadline")
            idle()

    def barrier(self, timeout_s: float) -> None:
        """Every rank of the fabric meets here (at setup only, before any traffic); FabricTimeout if
        some rank has not come within timeout_s."""
        complete(self.comm.Ibarrier(), timeout_s, f"rank {self.rank}: setup barrier of the fabric's {self.size} "
                  f"ranks timed out after {timeout_s:g} s (a rank never reached it)")

    def close(self) -> None:
        for queue in self._kept.values():  # matched and never taken (the run ended): received into nothing
            for message, _ in queue:
                self.drop(message)
        self._kept.clear()
        uninstall(self.waker)
        self.waker.close()
        self.comm.Free()


def frame(header: bytes, payload: np.ndarray) -> bytes:
    """One message of `header` and its `payload` bytes (contiguous): an inline frame (module docstring)."""
    return b"".join((_FRAME.pack(INLINE_MARK, len(header)), header, payload))  # type: ignore[arg-type]  # an array is a buffer


def unframe(data, limit: int | None = None) -> tuple[memoryview | bytearray, np.ndarray | None]:
    """(header bytes, payload) of a header message: a plain header and None, or an inline frame's header
    and payload (uint8, a view of `data`, sized by what arrived: the header is not trusted for it).
    ProtocolError for a frame whose lengths do not add up, a header longer than `limit` bytes, or an
    inline payload longer than INLINE_PAYLOAD_BYTES."""
    size = len(data)
    if not size or data[0] != INLINE_MARK:
        if limit is not None and size > limit:
            raise ProtocolError(f"a header of more than {limit} bytes")
        return data, None
    if size < _FRAME.size:
        raise ProtocolError(f"an inline frame of {size} bytes, shorter than its {_FRAME.size}-byte prefix")
    length = _FRAME.unpack_from(data)[1]
    payload = size - _FRAME.size - length
    if payload < 0 or (limit is not None and length > limit) or payload > INLINE_PAYLOAD_BYTES:
        most = "" if limit is None else f"headers are at most {limit} bytes, "
        raise ProtocolError(f"an inline frame of {size} bytes says its header has {length}: {most}inline "
                            f"payloads at most {INLINE_PAYLOAD_BYTES}")
    view = memoryview(data)
    end = _FRAME.size + length
    return view[_FRAME.size:end], np.frombuffer(data, np.uint8, payload, end)


def drop_first(comm, source: int, tag: int) -> None:
    """Drop the first message from `source` under `tag` on `comm`, if one is waiting."""
    message = comm.Improbe(source, tag)
    if message is not None:
        Transport.drop(message)


def drop_front(comm, status, wanted) -> int:
    """Drop the messages at the front of `comm`'s queue until one is `wanted(source, tag)` (or none is
    left); returns how many. A wanted message hides those behind it until it is taken."""
    dropped = 0
    while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status) and not wanted(status.Get_source(), status.Get_tag()):
        drop_first(comm, status.Get_source(), status.Get_tag())
        dropped += 1
    return dropped
