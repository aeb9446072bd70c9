"""Control traffic between ranks, apart from the fabric's packets: point-to-point control messages of the
GPU ranks (ControlChannel), a communicator's control exchanges on its members' own MPI communicators
(MemberComms, Exchange), MPI's own collectives as a reference (native_collective), and the switch ranks'
end-of-run sums and reports (SwitchChannel)."""

import msgpack
import numpy as np
from mpi4py import MPI

from nvlink_emu.fabric import control
from nvlink_emu.fabric.errors import ProtocolError, ResourceExhausted

from .job import poke
from .packets import TAG_CONTROL, TAG_EXCHANGE, Transport, drop_first

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
        poke(dest)  # a GPU's control rank is its fabric rank (split_roles keeps the order)

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
                drop_first(self.comm, source, status.Get_tag())
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
                    drop_first(comm, source, tag)
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
        self._long: tuple | None = None  # (counts of the second step, its buffer, its send buffer)
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
        parts: list[int | bytes] = []
        offset = 0
        for member, (n, ok, count) in enumerate(zip(self._lengths, self._usable, counts)):
            if not ok:
                parts.append(n)
            elif count:
                parts.append(out[offset:offset + count].tobytes())
            else:
                parts.append(self._slots[member, 8:8 + n].tobytes())
            offset += count
        self.parts = parts
        self._slots = self._long = None  # type: ignore[assignment]  # done: nothing reads them again


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
