"""The one thin transport: the only module that imports mpi4py.

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

import os
import random
import secrets
import select
import socket
import struct
import sys
import tempfile
import time
from collections import deque

import msgpack
import numpy as np
from mpi4py import MPI

from nvlink_emu.fabric import control
from nvlink_emu.fabric.errors import FabricTimeout, ProtocolError, ResourceExhausted
from nvlink_emu.fabric.packets import MAX_HEADER_BYTES, Packet  # noqa: F401 - a switch's header limit, here too

TAG_HEADER = 11
TAG_PAYLOAD = 12
TAG_CONTROL = 13
TAG_EXCHANGE = 14  # an exchange's slots, on the members' own MPI communicator (Exchange)
# a GPU's mailbox credit to its switch (send_credit): apart from its packets, so that a credit never waits
# behind a packet of the same GPU's that the switch holds for want of the other side's credit
TAG_CREDIT = 15
_CREDIT = 4  # int64s of a credit: the sending GPU, its mailbox class (mailbox_class), payload bytes, messages
# Mailbox bounds, per pair of GPUs of one node (ranks/switch.py holds a sender's next MSG past them, ranks/gpu.py
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
ABORT_GRACE_S = 0.5  # s, between a failing rank's report and MPI_Abort
_NOTHING = np.empty(0, np.uint8)  # where dropped messages go (a receive truncated to nothing)
# Payloads up to this many bytes travel inline, in their header's message. Below it a second message
# costs more than the copy into one: each MPI message is a probe, a match and a receive of Python and
# MPI work at both ends (tens of us), copying 4 KiB is well under one; above it the copy grows with the
# size while the message's cost does not. It also bounds what a switch holds of a GPU's packets that
# wait (ranks/switch.py: MAX_QUEUED of them and MAX_QUEUED_BYTES, 1 MiB, per GPU, headers and inline payloads
# counted) and what it reads before checking a header.
INLINE_PAYLOAD_BYTES = 4096
INLINE_MARK = 0xC1  # an inline frame's first byte: msgpack never uses it, so no plain header starts with it
_FRAME = struct.Struct("<BI")  # the mark, then the header's length in bytes (little-endian uint32)
INLINE_FRAME_BYTES = _FRAME.size + INLINE_PAYLOAD_BYTES  # an inline frame's bytes beyond its header, at most


def world_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def mpi_library_version() -> str:
    """What the MPI library mpi4py is linked against says of itself (MPI_Get_library_version; callable
    before MPI_Init), e.g. "MPICH Version: 4.2.0 ..." or "Open MPI v4.1.5, ..."."""
    return MPI.Get_library_version()


def count_failed_ranks(failed: bool, timeout_s: float) -> int:
    """How many ranks of the job failed to get ready (each says whether it did); FabricTimeout if some
    rank has not said within timeout_s (it is stuck before the fabric starts)."""
    send, count = np.array([int(failed)], np.int64), np.zeros(1, np.int64)
    _complete(MPI.COMM_WORLD.Iallreduce(send, count, MPI.SUM), timeout_s,
              f"rank {world_rank()}: not every rank loaded the fabric and the script within {timeout_s:g} s")
    return int(count[0])


def _complete(request, timeout_s: float, late: str) -> None:
    """Wait, backing off, until a non-blocking MPI `request` completes; FabricTimeout(late) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    idle = Idle()
    while not request.Test():
        if time.monotonic() > deadline:
            raise FabricTimeout(late)
        idle()


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (after the caller printed its report)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # MPI_Abort makes the launcher kill every rank; what this rank just wrote may still sit in the pipe
    # to the launcher (MPICH's hydra loses it then), so give the launcher time to forward it first.
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # MPI_Abort may return before the launcher kills us; never run on


class Waker:
    """Wake-up calls between the ranks of one host: a rank that posts a message to a rank on its host
    also sends it a one-byte datagram (`poke`), and a rank with nothing to do sleeps in select() on its
    own socket (`sleep`), so it wakes when something comes instead of at the end of its nap; a rank
    that took a payload message pokes its sender too, whose send completed then (nothing else tells
    it). A hint only: MPI carries every message, a lost poke (a full socket buffer, a rank on another
    host, a collective's internal messages, a message MPI had not delivered yet) costs at most the
    nap. Collective over `comm`'s ranks."""

    def __init__(self, comm):
        token = comm.bcast(secrets.token_hex(4) if comm.Get_rank() == 0 else None, root=0)
        name = f"nve-{token}-{comm.Get_rank()}"
        # Linux: an abstract socket (no file, none left behind by a killed job); elsewhere a file in /tmp
        self.path = "\0" + name if sys.platform.startswith("linux") else os.path.join(tempfile.gettempdir(), name)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(self.path)
            self.sock.setblocking(False)
            bound = self.path
        except OSError:  # no socket here (a path too long, a read-only /tmp): naps without wake-ups
            self.sock.close()
            self.sock, bound = None, None
        here = MPI.Get_processor_name()
        peers = comm.allgather((here, bound))
        self.peers = {rank: path for rank, (host, path) in enumerate(peers)
                      if host == here and path is not None and rank != comm.Get_rank()}

    def poke(self, rank: int) -> None:
        """Wake rank `rank` if it sleeps (nothing if it is on another host)."""
        path = self.peers.get(rank)
        if path is not None:
            try:
                self.sock.sendto(b"!", path)
            except OSError:  # its buffer is full (it has pokes to read already) or it has closed
                pass

    def sleep(self, seconds: float) -> None:
        """Sleep until poked or `seconds` pass, then take every poke waiting."""
        if self.sock is None:
            time.sleep(seconds)
            return
        select.select((self.sock,), (), (), seconds)
        try:
            while self.sock.recv(64):
                pass
        except OSError:  # none left
            pass

    def reaches(self, ranks) -> bool:
        """Whether a poke from each of `ranks` can wake this rank (all on its host, sockets on both sides)."""
        return self.sock is not None and all(rank in self.peers for rank in ranks)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if not self.path.startswith("\0"):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass


_waker: Waker | None = None  # this rank's, while a Transport is open: Idle sleeps on it


class Idle:
    """Back-off for polling loops: yield the core `yields` times first, then sleep first_nap_s, 2 x
    first_nap_s, ..., up to max_sleep_s (ranks may share few cores: a spinning rank would starve the one
    it waits for). A sleep ends early when a rank of this host posts this rank a message (Waker)."""

    def __init__(self, yields: int = 8, max_sleep_s: float = 5e-3, sending_nap_s: float = 3e-4,
                 first_nap_s: float = 1e-5):
        self.spins = 0
        self.yields = yields
        self.max_sleep_s = max_sleep_s
        self.first_nap_s = first_nap_s
        self.sending_nap_s = sending_nap_s

    def reset(self) -> None:
        self.spins = 0

    def __call__(self, sending: bool = False) -> None:
        """Wait a little. `sending`: a large message of ours is in flight; the receiver copies it while
        we sleep, so nap a fixed while rather than spin (measured: All2All 16 MiB on 8 GPUs ran
        3.3-4.5x native MPI with this, 4.4-5.5x without; short naps keep latency and noise low)."""
        nap = time.sleep if _waker is None else _waker.sleep
        if sending:
            nap(self.sending_nap_s)
            return
        self.spins += 1
        if self.spins <= self.yields:
            os.sched_yield()
        else:
            nap(min(self.max_sleep_s, self.first_nap_s * (self.spins - self.yields)))


# A wait whose every awaited message pokes its sender's Waker (the fabric's packets, control messages,
# an exchange's one round) sleeps from the start, 1 to 5 ms: the poke ends a nap, so a nap only bounds a
# poke that came before MPI delivered its message (measured, 1 KiB ring AllReduce on 8 GPUs, 50 calls: 447
# of a GPU's 716 packets found by the wake its poke caused, 8 after a nap timed out). Not longer: a burst of
# packets reaches MPI's queue at its receiver later than their pokes (with 2 to 20 ms naps at the switch,
# 514 of a 1 KiB sharp reduce_scatter's 729 packets were taken after a nap timed out)
POKED_FIRST_NAP_S = 1e-3
POKED_MAX_NAP_S = 5e-3


def poked_idle() -> "Idle":
    """The back-off of a wait that every awaited message pokes (above): no yields, naps from the start."""
    return Idle(yields=0, first_nap_s=POKED_FIRST_NAP_S, max_sleep_s=POKED_MAX_NAP_S)


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
        global _waker
        if _waker is not None:
            _waker.close()
        _waker = self.waker = Waker(self.comm)

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
            buffers = (message, payload)  # its payload's bytes are pending as a payload message's would be
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
        _drop_from(self.comm, source, tag)

    def drop_other_tags(self, sources=(), held=frozenset(), keep: int = 0) -> int:
        """Drop messages under tags the fabric never uses (left in MPI's queue, they would slow every
        later match, and hold their bytes); returns how many. Those at the front of the queue, up to the
        first message with a fabric tag; then each of `sources`' (GPUs) wherever they are in its stream:
        its messages in order (MPI keeps a source's order), dropping the others' and, for a source in
        `held` (whose messages its reader does not take now), matching the fabric's and keeping them in
        order (at most `keep` kept per source; poll, header_waiting and probe_payload take them first),
        so that nothing it sends stays unread behind a message of its own that waits; for any other
        source, up to its first fabric message (its reader takes those as they come)."""
        dropped = _drop_front(self.comm, self._status, lambda source, tag: tag in (TAG_HEADER, TAG_PAYLOAD, TAG_CREDIT))
        status = self._status
        for source in sources:
            kept = sum(len(self._kept.get((source, tag), ())) for tag in (TAG_HEADER, TAG_PAYLOAD))
            while self.comm.Iprobe(source, MPI.ANY_TAG, status):
                tag = status.Get_tag()
                if tag == TAG_CREDIT:  # taken by credits(), in turn: what is behind it waits for that
                    break
                if tag not in (TAG_HEADER, TAG_PAYLOAD):
                    _drop_from(self.comm, source, tag)
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
        return _drop_front(self.comm, self._status, lambda source, tag: source == expected)

    def sweep_outer(self) -> int:
        """Drop every point-to-point message waiting on the run's own communicator (`outer`), from any rank
        under any tag; returns how many. The fabric sends nothing there (its traffic is on duplicates),
        a workload reaches other GPUs through the fabric alone (the mpi4py layer too), so whatever waits
        there was sent by a rank around the fabric (left in MPI's queue, it would hold its bytes and slow
        every later match of this rank, whatever the communicator)."""
        return _drop_front(self.outer, self._status, lambda source, tag: False)

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
        _complete(self.comm.Ibarrier(), timeout_s, f"rank {self.rank}: setup barrier of the fabric's {self.size} "
                  f"ranks timed out after {timeout_s:g} s (a rank never reached it)")

    def close(self) -> None:
        global _waker
        for queue in self._kept.values():  # matched and never taken (the run ended): received into nothing
            for message, _ in queue:
                self.drop(message)
        self._kept.clear()
        if _waker is self.waker:
            _waker = None
        self.waker.close()
        self.comm.Free()


# the longest point-to-point control message a GPU reads (bytes): a credit or a "where are you?" question
# or answer carries a communicator's name (a few KiB at most: names travel in packets' MAX_TEXT fields)
# and a few numbers; the exchanges' larger objects go on the members' own communicators (MemberComms).
# A flood of longer ones (up to fabric.control.MAX_CONTROL_BYTES, 16 MiB, before) cost every receiver a
# full receive and copy per message and starved its other work (round-4 attack, F1)
MAX_P2P_CONTROL_BYTES = 64 << 10


class ControlChannel:
    """Point-to-point control messages between GPU ranks (fabric.control's encoding: no code runs on
    decode, nothing larger than the message is built); never counted on links. Only what is truly
    point to point travels here (sharp reduce's credits, the questions of a timed-out exchange): the
    exchanges of a communicator are MPI collectives on its members' own communicator (Exchange)."""

    def __init__(self, comm):
        self.comm = comm
        self._pending: list = []  # (request, bytes kept alive until sent, destination)
        self._status = MPI.Status()

    def send(self, dest: int, obj) -> None:
        self.send_bytes(dest, control.encode(obj))

    def send_bytes(self, dest: int, data: bytes) -> None:
        """Post a control message of any bytes to GPU rank `dest` (send() encodes an object)."""
        self._pending.append((self.comm.Isend([data, MPI.BYTE], dest, TAG_CONTROL), data, dest))
        if _waker is not None:  # a GPU's control rank is its fabric rank (split_roles keeps the order)
            _waker.poke(dest)

    def progress(self) -> bool:
        if not self._pending:  # the common case, at every wake of a wait
            return False
        before = len(self._pending)
        self._pending = [p for p in self._pending if not p[0].Test()]
        return len(self._pending) != before

    def backlog(self, dest: int) -> int:
        """Messages to `dest` posted and not yet sent."""
        return sum(1 for p in self._pending if p[2] == dest)

    @property
    def idle(self) -> bool:
        return not self._pending

    @property
    def in_flight(self) -> int:
        """Control messages posted and not yet sent."""
        return len(self._pending)

    def poll(self) -> tuple[int, object] | None:
        """The next control object from any GPU rank, or None. A message that is too long (past
        MAX_P2P_CONTROL_BYTES: dropped unread, nothing allocated) or does not decode is dropped:
        (source, None)."""
        status = self._status
        if not self.comm.Iprobe(MPI.ANY_SOURCE, TAG_CONTROL, status):
            return None
        source, count = status.Get_source(), status.Get_count(MPI.BYTE)
        message = self.comm.Improbe(source, TAG_CONTROL)
        if count > MAX_P2P_CONTROL_BYTES:  # no point-to-point control message is this long: never read
            Transport.drop(message)
            return source, None
        buffer = bytearray(count)
        message.Recv([buffer, MPI.BYTE])
        try:
            return source, control.decode(bytes(buffer))
        except ProtocolError:
            return source, None

    def drop_strays(self) -> int:
        """Drop messages on this communicator under tags it never uses, each source's wherever they are in
        its stream up to its next control message (poll takes that one, and the next sweep what is behind
        it); returns how many."""
        dropped, status = 0, self._status
        for source in range(self.comm.Get_size()):
            while self.comm.Iprobe(source, MPI.ANY_TAG, status) and status.Get_tag() != TAG_CONTROL:
                _drop_from(self.comm, source, status.Get_tag())
                dropped += 1
        return dropped


INLINE_BYTES = 512  # per member, an exchange's first step: an 8-byte length and up to 504 bytes of data
# members up to which an exchange's first step is one round of N(N-1) messages, not an Iallgather (log2 N
# rounds, N log2 N messages): measured at 4 and 8 GPUs (docs/guide/workloads.md, Control plane); not measured above, where
# the messages grow as N squared (992 at 32 GPUs, where point-to-point exchanges measured slower before)
ROUND_MEMBERS = 8


class MemberComms:
    """The MPI communicators of one emulated communicator's members (GPU ranks only, in member order):
    `comm` carries its control exchanges (barrier, allgather_object, split, the call check of every
    collective), `groups` the exchanges of its group creation, which run inside collectives at
    another point of each member's program (a communicator of their own keeps MPI's call order on
    each the same on every member). wait(done, what) serves the fabric until done() holds, with
    the run's deadline (gpu.wait_for_mpi)."""

    def __init__(self, comm, wait):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # per MPI communicator (comm, groups): member -> its exchange slot a sweep matched out of MPI's queue
        # (the next exchange's, if it is one: see sweep), which that exchange takes first (Exchange)
        self.kept: tuple[dict, dict] = ({}, {})
        try:
            self.groups = _idup(comm, wait, "duplicating a new communicator's MPI communicator")
        except BaseException:
            comm.Free()
            raise

    def kept_of(self, comm) -> dict:
        """The slots a sweep kept of MPI communicator `comm` (this one's `comm` or `groups`)."""
        return self.kept[comm is self.groups]

    def sweep(self, status) -> int:
        """Drop the point-to-point messages waiting on both MPI communicators that no exchange expects;
        returns how many. Members send each other nothing there but an exchange's slots (TAG_EXCHANGE,
        INLINE_BYTES each; MPI's collectives are invisible to a probe), and a member cannot be two
        exchanges ahead of this one (each needs this member's slot of the one before), so at most one slot
        of each member's is ever waiting unreceived: the first is matched and kept for the next exchange
        (bytes still in MPI's keeping), any more, and every other tag, dropped."""
        dropped = 0
        for comm, kept in ((self.comm, self.kept[0]), (self.groups, self.kept[1])):
            if comm == MPI.COMM_NULL:
                continue
            while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
                source, tag = status.Get_source(), status.Get_tag()
                if tag == TAG_EXCHANGE and source not in kept and source != self.rank:
                    kept[source] = comm.Improbe(source, tag)
                else:
                    _drop_from(comm, source, tag)
                    dropped += 1
        return dropped

    @classmethod
    def dup(cls, parent, wait) -> "MemberComms":
        """Every rank of MPI communicator `parent` (collective over it; non-blocking, served by wait)."""
        return cls(_idup(parent, wait, "duplicating the GPU ranks' MPI communicator"), wait)

    @classmethod
    def of_ranks(cls, parent, ranks, wait) -> "MemberComms":
        """Ranks `ranks` of `parent`, in that order (MPI_Comm_create_group: collective over those ranks
        only, so no other rank takes part in making it)."""
        group = parent.Get_group()
        members = group.Incl(list(ranks))
        try:
            comm = parent.Create_group(members)
        finally:
            members.Free()
            group.Free()
        return cls(comm, wait)

    def split(self, color: int | None, key: int, wait) -> "MemberComms | None":
        """MPI_Comm_split of `comm` (color None: no new communicator). Blocking, so called only once
        every member is known to be in the split (its agreement exchange completed): it waits for
        no one who is not already on the way. ResourceExhausted if MPI has no communicator left."""
        try:
            comm = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        except MPI.Exception as exc:
            raise ResourceExhausted(f"MPI_Comm_split: {exc.Get_error_string()}") from None
        if comm == MPI.COMM_NULL:
            return None
        return MemberComms(comm, wait)

    def free(self) -> None:
        """Free both MPI communicators (a collective still pending on one completes, or not, first)."""
        for kept in self.kept:  # matched and never taken: received into nothing
            for message in kept.values():
                Transport.drop(message)
            kept.clear()
        for comm in (self.comm, self.groups):
            if comm != MPI.COMM_NULL:
                comm.Free()
        self.comm = self.groups = MPI.COMM_NULL


def any_rank(comm, flag: bool, wait, what: str) -> bool:
    """Whether `flag` holds on any rank of `comm` (collective; non-blocking, served by wait(done, what))."""
    send, out = np.array([int(flag)], np.int64), np.zeros(1, np.int64)
    wait(comm.Iallreduce(send, out, MPI.MAX).Test, what)
    return bool(out[0])


def _idup(parent, wait, what: str):
    try:
        comm, request = parent.Idup()
    except MPI.Exception as exc:
        raise ResourceExhausted(f"MPI_Comm_idup: {exc.Get_error_string()}") from None
    wait(request.Test, what)
    return comm


class Exchange:
    """One control exchange: every member's bytes to every member by non-blocking MPI calls on the
    members' own communicator (no other rank can send there), completed by polling test() (the caller
    serves the fabric meanwhile). The same sequence of MPI calls whatever the bytes say, so members in
    different operations still meet, and see that they differ: one INLINE_BYTES slot per member (its
    length, and its bytes if they fit) to every other member, then, if some member's bytes did not
    fit, an Iallgatherv of those. Up to ROUND_MEMBERS members the slots go in one round (Isend/Irecv
    under TAG_EXCHANGE; MPI matches one source's messages in the order sent, so exchange k's slots
    meet exchange k's receives), not an Iallgather's log2(members) rounds: each round moves only when
    its members poll, and the poke at posting (comm._exchange) wakes them when the slot is there.
    Every member sizes the second step by the same lengths; a length outside 0..
    fabric.control.MAX_CONTROL_BYTES is never allocated for: that member's part is its length (an int)."""

    def __init__(self, comm, data: bytes, kept: dict | None = None):
        self._comm = comm
        self._size, self._rank = comm.Get_size(), comm.Get_rank()
        self._data = data
        slot = np.zeros(INLINE_BYTES, np.uint8)
        slot[:8] = np.array([len(data)], np.int64).view(np.uint8)
        if len(data) <= INLINE_BYTES - 8:
            slot[8:8 + len(data)] = np.frombuffer(data, np.uint8)
        self._slot = slot
        self._slots = np.empty((self._size, INLINE_BYTES), np.uint8)
        self._long = None  # (counts of the second step, its buffer, its send buffer)
        self.parts: list | None = None  # when done: each member's bytes, or its unusable length (int)
        self.failed: ProtocolError | None = None  # what MPI reported, if it did
        self.on_step = lambda: None  # called when the second collective is posted (the waiter's back-off)
        self._slots[self._rank] = slot
        if self._size <= ROUND_MEMBERS:
            self._request = self._start(lambda: _Round(comm, self._rank, self._size, slot, self._slots, kept))
        else:
            self._request = self._start(lambda: comm.Iallgather([slot, MPI.BYTE], [self._slots, MPI.BYTE]))

    def _start(self, post):
        try:
            return post()
        except MPI.Exception as exc:
            self.failed = ProtocolError(f"control exchange: MPI: {exc.Get_error_string()}")
            raise self.failed from None

    def test(self) -> bool:
        """Whether the exchange completed (then `parts` holds every member's bytes); ProtocolError if MPI
        reports an error (a member sent other bytes than the lengths it announced)."""
        if self.parts is not None:
            return True
        if self.failed is not None:
            raise self.failed
        try:
            if not self._request.Test():
                return False
        except MPI.Exception as exc:
            self.failed = ProtocolError(f"control exchange: MPI: {exc.Get_error_string()} (a member sent other "
                                        f"bytes than it announced)")
            raise self.failed from None
        if self._long is None:
            lengths = [int(n) for n in self._slots[:, :8].copy().view(np.int64)[:, 0]]
            usable = [0 <= n <= control.MAX_CONTROL_BYTES for n in lengths]
            counts = [n if ok and n > INLINE_BYTES - 8 else 0 for n, ok in zip(lengths, usable)]
            self._lengths, self._usable = lengths, usable
            if not any(counts):
                self._finish(None, counts)
                return True
            out = np.empty(sum(counts), np.uint8)
            send = np.frombuffer(self._data, np.uint8) if counts[self._rank] else np.empty(0, np.uint8)
            self._long = (counts, out, send)
            self._request = self._start(lambda: self._comm.Iallgatherv([send, MPI.BYTE], [out, counts, MPI.BYTE]))
            self.on_step()
            return self.test()
        self._finish(self._long[1], self._long[0])
        return True

    def _finish(self, out, counts) -> None:
        parts, offset = [], 0
        for member, (n, ok, count) in enumerate(zip(self._lengths, self._usable, counts)):
            if not ok:
                parts.append(n)
            elif count:
                parts.append(out[offset:offset + count].tobytes())
            else:
                parts.append(self._slots[member, 8:8 + n].tobytes())
            offset += count
        self.parts = parts
        self._slots = self._long = None


class _Round:
    """An exchange's first step as one request-like object: `slot` to every other rank of `comm`, and
    each one's slot into row `source` of `slots` (INLINE_BYTES each, under TAG_EXCHANGE)."""

    def __init__(self, comm, rank: int, size: int, slot: np.ndarray, slots: np.ndarray, kept: dict | None = None):
        # receives first: a slot that comes finds its buffer posted, not MPI's unexpected queue; a slot a
        # sweep matched already (MemberComms.sweep) is the member's oldest, so this exchange's
        kept = {} if kept is None else kept
        self._receives = [kept.pop(m).Irecv([slots[m], MPI.BYTE]) if m in kept else
                          comm.Irecv([slots[m], MPI.BYTE], m, TAG_EXCHANGE) for m in range(size) if m != rank]
        self._sends = [comm.Isend([slot, MPI.BYTE], m, TAG_EXCHANGE) for m in range(size) if m != rank]

    def Test(self) -> bool:
        if self._receives:
            if not MPI.Request.Testall(self._receives):
                return False
            self._receives = []
        return not self._sends or MPI.Request.Testall(self._sends)


def frame(header: bytes, payload: np.ndarray) -> bytes:
    """One message of `header` and its `payload` bytes (contiguous): an inline frame (module docstring)."""
    return b"".join((_FRAME.pack(INLINE_MARK, len(header)), header, payload))


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


def _drop_from(comm, source: int, tag: int) -> None:
    """Drop the first message from `source` under `tag` on `comm`, if one is waiting."""
    message = comm.Improbe(source, tag)
    if message is not None:
        Transport.drop(message)


def _drop_front(comm, status, wanted) -> int:
    """Drop the messages at the front of `comm`'s queue until one is `wanted(source, tag)` (or none is
    left); returns how many. A wanted message hides those behind it until it is taken."""
    dropped = 0
    while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status) and not wanted(status.Get_source(), status.Get_tag()):
        _drop_from(comm, status.Get_source(), status.Get_tag())
        dropped += 1
    return dropped


_NATIVE_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


def native_collective(channel: ControlChannel, collective: str, send: np.ndarray, recv: np.ndarray,
                      op: str = "sum", root: int = 0):
    """Start MPI's own non-blocking collective over the GPU ranks (the reference the bench and the
    tests compare with); returns the request. avg is sum here (the caller divides)."""
    comm = channel.comm
    if collective == "allreduce":
        return comm.Iallreduce(send, recv, _NATIVE_OPS["sum" if op == "avg" else op])
    if collective == "reduce_scatter":
        return comm.Ireduce_scatter_block(send, recv, _NATIVE_OPS["sum" if op == "avg" else op])
    if collective == "allgather":
        return comm.Iallgather(send, recv)
    if collective == "broadcast":
        return comm.Ibcast(recv, root)
    if collective == "all2all":
        return comm.Ialltoall(send, recv)
    raise ValueError(f"no native {collective}")


class SwitchChannel:
    """The switch ranks among themselves, which trust each other: sums and exchanges at the end of a
    run, by MPI's own non-blocking collectives (the caller serves traffic while they complete)."""

    def __init__(self, comm):
        self.comm = comm

    def sum(self, values, wait) -> list[int]:
        """Element-wise sums of every switch's `values` (ints); wait(done, what) serves until done()."""
        send = np.array(values, np.int64)
        total = np.zeros_like(send)
        request = self.comm.Iallreduce(send, total, MPI.SUM)
        wait(request.Test, "the other switches' counts (end of run)")
        return [int(v) for v in total]

    def allgather(self, obj, wait) -> list:
        """Every switch's `obj` (msgpack-encodable), in switch order."""
        data = np.frombuffer(msgpack.packb(obj), np.uint8)
        sizes = np.zeros(self.comm.Get_size(), np.int64)
        request = self.comm.Iallgather(np.array([data.size], np.int64), sizes)
        wait(request.Test, "the other switches' report sizes (end of run)")
        out = np.empty(int(sizes.sum()), np.uint8)
        request = self.comm.Iallgatherv(data, [out, sizes.tolist()])
        wait(request.Test, "the other switches' reports (end of run)")
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        return [msgpack.unpackb(out[a:b].tobytes(), strict_map_key=False) for a, b in zip(offsets[:-1], offsets[1:])]

    def close(self) -> None:
        self.comm.Free()


def split_roles(transport: Transport, is_gpu: bool) -> tuple[ControlChannel | None, SwitchChannel | None]:
    """(a control channel over the GPU ranks, a channel over the switch ranks): this rank's one of
    them, the other None (collective over the transport's communicator). One switch has no channel."""
    comm = transport.comm.Split(0 if is_gpu else 1, transport.rank)
    if is_gpu:
        return ControlChannel(comm), None
    if comm.Get_size() == 1:
        comm.Free()
        return None, None
    return None, SwitchChannel(comm)
