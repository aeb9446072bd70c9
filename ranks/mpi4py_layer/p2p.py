"""Point to point in the layer: per-communicator message matching (MPI's order rules) and Comm's calls."""

import builtins
import pickle as _pickle
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .buffers import message_simple
from .constants import ANY_SOURCE, ANY_TAG, ENVELOPE_BYTES, ERR_RANK, ERR_TAG, ERR_TRUNCATE, ERR_TYPE, PROC_NULL, TAG_UB
from .context import _ctx, _free, _gpu, _has_message, _peek_message, _poll, _progress_until, _staging
from .errors import Exception, MalformedMessage, _unsupported  # noqa: A004 - MPI.Exception
from .requests import Prequest, Request, _Op, _request

if TYPE_CHECKING:
    from ..comm import Communicator


# What the unexpected queue of a communicator keeps taken, per source member: past either bound, its arrived
# messages are queued by their envelope only and left in the GPU's mailbox, not taken, until a receive
# matches one; so the switch's mailbox bound (ranks/transport.packets.MAILBOX_PEER_*) holds the sender, and a
# program that receives nothing keeps at most these plus a mailbox of a member's messages
KEPT_MESSAGES = 1024
KEPT_BYTES = 32 << 20


class _Left:
    """An unexpected message left in the GPU's mailbox (past KEPT_*): its slot and payload size; taken and
    decoded when a receive matches it."""

    __slots__ = ("key", "peer", "size")

    def __init__(self, key, peer, size: int):
        self.key, self.peer, self.size = key, peer, size

    def take(self, engine, source: int) -> np.ndarray:
        data = _gpu().take_message(self.key, self.peer, f"MPI recv from {source}", f"GPU {self.peer}")
        return engine.decode(source, data)[1]


class _Engine:
    """Point-to-point matching of one communicator: messages to each member numbered per pair, pulled
    in order into the unexpected queue, matched to receives in the order they were posted (MPI's
    non-overtaking rule), ANY_SOURCE and ANY_TAG included. A message to oneself is a local copy.
    Past KEPT_* of a source's unmatched messages, its later ones stay in the mailbox (_Left)."""

    def __init__(self, comm):
        self.comm = comm
        self.emu = comm._emu
        n = self.emu.size
        self.sent = [0] * n
        self.received = [0] * n
        self.unexpected = []  # [source, tag, bytes (or _Left, or a MalformedMessage), send] in arrival order
        self.kept = [[0, 0] for _ in range(n)]  # per source: [payload bytes, messages] taken into `unexpected`
        self.posted = []      # _Recv in posting order
        self.key = (self.emu.name, "mpi4py")

    def _slot(self, source: int):
        return (*self.key, self.received[source]), self.emu.members[source]

    def who(self, source: int) -> str:
        """Member `source` as error messages name it: its rank, GPU and this communicator."""
        return _who(self.comm, source)

    def decode(self, source: int, data: np.ndarray) -> tuple[int, np.ndarray]:
        """(tag, payload) of a message from member `source`: its 8-byte tag header, then the bytes;
        MalformedMessage naming the sender if the header is short or the tag one no send may carry."""
        if data.dtype != np.uint8 or data.ndim != 1 or data.size < ENVELOPE_BYTES:
            raise MalformedMessage(f"MPI: a message of {data.nbytes} bytes from {self.who(source)} is shorter than "
                                   f"the layer's {ENVELOPE_BYTES}-byte tag header")
        tag = int(data[:ENVELOPE_BYTES].view(np.int64)[0])
        if not 0 <= tag <= TAG_UB:  # every send checks its tag (Comm._tag): only a forged message has another
            raise MalformedMessage(f"MPI: a message from {self.who(source)} carries tag {tag}, not 0..{TAG_UB}")
        return tag, np.array(data[ENVELOPE_BYTES:], copy=True)

    def arrived(self) -> bool:
        """Whether some member's next message is here."""
        return any(_has_message(*self._slot(s)) for s in range(self.emu.size) if s != self.emu.rank)

    def pull(self) -> None:
        """Take every arrived message, in order per source, and match it."""
        if self.emu.size == 1:
            return
        for source in range(self.emu.size):
            if source == self.emu.rank:
                continue
            kept = self.kept[source]
            while True:
                key, peer = self._slot(source)
                if kept[0] >= KEPT_BYTES or kept[1] >= KEPT_MESSAGES:  # its envelope only, unless it is malformed
                    data = _peek_message(key, peer)
                    if data is None:
                        break
                    self.received[source] += 1
                    try:
                        tag, _ = self.decode(source, data[:ENVELOPE_BYTES])
                    except MalformedMessage:
                        pass  # taken below, its error delivered
                    else:
                        self.deliver(source, tag, _Left(key, peer, data.size - ENVELOPE_BYTES))
                        continue
                elif not _has_message(key, peer):
                    break
                else:
                    self.received[source] += 1
                data = _gpu().take_message(key, peer, f"MPI recv from {source}", f"GPU {peer}")
                try:
                    tag, payload = self.decode(source, data)
                except MalformedMessage as error:
                    # the next receive from that source (any tag) or probe of it raises it; the messages
                    # after it from that source still come, in order
                    self.deliver(source, None, error)
                    continue
                self.deliver(source, tag, payload)

    def deliver(self, source: int, tag: int | None, data, send=None) -> None:
        """A message arrived (send: the _Send of a message to oneself, told when it is matched); tag None
        and a MalformedMessage for data: one that could not be decoded."""
        for recv in self.posted:
            if recv.matches(source, tag):
                self.posted.remove(recv)
                recv.complete(source, tag, data.take(self, source) if type(data) is _Left else data)
                if send is not None:
                    send.matched = True
                return
        if isinstance(data, np.ndarray) and source != self.emu.rank:
            self.kept[source][0] += data.nbytes
            self.kept[source][1] += 1
        self.unexpected.append([source, tag, data, send])

    def _unqueue(self, entry: list):
        """Remove `entry` from the unexpected queue; its data (taken now if it was left in the mailbox)."""
        self.unexpected.remove(entry)
        source, data = entry[0], entry[2]
        if type(data) is _Left:
            return data.take(self, source)
        if isinstance(data, np.ndarray) and source != self.emu.rank:
            self.kept[source][0] -= data.nbytes
            self.kept[source][1] -= 1
        return data

    def send(self, data: np.ndarray, dest: int, tag: int, synchronous: bool = False):
        """Post `data` (uint8) to member `dest`; returns the _Send (done once the switch took it)."""
        if dest == self.emu.rank:  # a local copy; a synchronous send completes when it is matched
            send = _Send(None, None, synchronous)
            self.deliver(dest, tag, np.array(data, copy=True), send)
            return send
        staged = _staging(ENVELOPE_BYTES + data.size, np.uint8)
        staged[:ENVELOPE_BYTES].view(np.int64)[0] = tag
        staged[ENVELOPE_BYTES:] = data
        number, self.sent[dest] = self.sent[dest], self.sent[dest] + 1
        requests = _gpu().send_message(self.emu.members[dest], (*self.key, number), staged)
        return _Send(requests, staged)

    def post(self, recv: "_Recv") -> None:
        for entry in self.unexpected:
            if recv.matches(entry[0], entry[1]):
                data = self._unqueue(entry)
                recv.complete(entry[0], entry[1], data)
                if entry[3] is not None:
                    entry[3].matched = True
                return
        self.posted.append(recv)

    def probe(self, source: int, tag: int):
        for entry in self.unexpected:
            if (source == ANY_SOURCE or entry[0] == source) and (tag == ANY_TAG or entry[1] in (tag, None)):
                if isinstance(entry[2], MalformedMessage):  # what a receive would raise, the probe raises
                    raise self._unqueue(entry)
                return entry
        return None


class _Send(_Op):
    """A send: done once the switch took its bytes (eager), or for a synchronous send to oneself once
    it was matched."""

    def __init__(self, requests, staged, synchronous=False):
        self._requests, self._staged = requests, staged
        self.matched = not synchronous

    def wait(self):
        if self._staged is not None:
            _gpu().wait_sent([self._requests], "MPI send")
            _free(self._staged)
            self._staged = None
        if not self.matched:
            _progress_until(lambda: self.matched or None, "synchronous send to oneself")

    def test(self):
        if not self.matched:
            return False
        self.wait()  # the data is in GPU memory already; the switch takes it at once
        return True


class _Recv(_Op):
    """A posted receive: into a Message (buffer calls) or, with msg None, a pickled object."""

    def __init__(self, engine, source, tag, message=None, pickled=False):
        self.engine, self.source, self.tag, self.message, self.pickled = engine, source, tag, message, pickled
        self.done = False
        self.cancelled = False
        self.error = None

    def matches(self, source, tag) -> bool:
        """Whether a message from `source` with `tag` is this receive's (tag None: a malformed message,
        whose tag is unknown: any receive from its source takes it, and raises its error)."""
        return (self.source in (ANY_SOURCE, source)) and (tag is None or self.tag in (ANY_TAG, tag))

    def complete(self, source, tag, data):
        self.done = True
        if isinstance(data, MalformedMessage):
            self.envelope, self.error = (source, ANY_TAG, 0), data
            return
        self.envelope = (source, tag, data.size)
        if self.pickled:
            try:
                self.result = _unpickle(data, self.engine.who(source))
            except MalformedMessage as error:
                self.error = error  # raised by the wait, as a truncation's
        else:
            message = self.message
            size = message.datatype.Get_size()
            room = message.count * size
            if data.size > room:
                self.error = Exception(ERR_TRUNCATE, f"MPI recv: message of {data.size} bytes from "
                                                     f"{self.engine.who(source)}, tag {tag}, truncated: the buffer "
                                                     f"holds {room}")
                return
            if data.size % message.base.itemsize or (size and data.size % size):
                self.error = Exception(ERR_TYPE, f"MPI recv: the {data.size} bytes from {self.engine.who(source)}, "
                                                 f"tag {tag}, are not whole items of {size} bytes ({message.base} "
                                                 f"elements)")
                return
            items = data.size // max(size, 1)
            message.unpack(data.view(message.base), 0, items)

    def _raise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def wait(self):
        if not self.done and not self.cancelled:
            _progress_until(lambda: self.done or None, f"recv from {self.source} tag {self.tag} on "
                                                        f"{self.engine.comm.Get_name()}")
        self._raise()

    def test(self):
        if not self.done and not self.cancelled:
            for engine in _ctx.engines:
                engine.pull()
            if not self.done:
                _poll()
                for engine in _ctx.engines:
                    engine.pull()
        if self.done or self.cancelled:
            self._raise()
            return True
        return False

    def cancel(self):
        if not self.done and self in self.engine.posted:
            self.engine.posted.remove(self)
            self.cancelled = True
            self.envelope = (self.source, self.tag, 0, True)


class _Null(_Op):
    """An operation with PROC_NULL: completes at once, source PROC_NULL, tag ANY_TAG, no bytes."""

    envelope = (PROC_NULL, ANY_TAG, 0)

    def wait(self):
        pass

    def test(self):
        return True


def _pickled(obj) -> np.ndarray:
    return np.frombuffer(_pickle.dumps(obj, _pickle.HIGHEST_PROTOCOL), np.uint8)


def _unpickle(data: np.ndarray, who: str):
    """The object of a pickle-based message from `who` (_who); an empty one is None (a buffer send of no
    bytes), as mpi4py. Unpickling runs what the bytes say, as mpi4py's does: the peer is a member of one's
    own communicator, of one's own partition. MalformedMessage naming `who` if the bytes do not load."""
    if not data.size:
        return None
    try:
        return _pickle.loads(data.tobytes())
    except builtins.Exception as exc:  # pickle raises many types (UnpicklingError, EOFError, ValueError, ...)
        raise MalformedMessage(f"MPI: the pickled object of {data.size} bytes from {who} does not load: "
                               f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def _who(comm, rank: int) -> str:
    """Member `rank` of MPI communicator `comm`, as error messages name it."""
    emu = comm._emu
    members = getattr(emu, "members", None) or (_gpu().rank,)  # a Solo's one member is this GPU
    gpu = members[rank] if 0 <= rank < len(members) else "?"
    return f"rank {rank} (GPU {gpu}) of communicator {comm.Get_name() or emu.name!r}"


class _Pair(_Op):
    """A send and a receive of one Sendrecv: done when both are."""

    def __init__(self, send, recv):
        self.send, self.recv = send, recv

    def wait(self):
        self.send.wait()
        self.recv.wait()
        self.envelope, self.result = self.recv.envelope, self.recv.result

    def test(self):
        if self.send.test() and self.recv.test():
            self.envelope, self.result = self.recv.envelope, self.recv.result
            return True
        return False


class PointToPoint:
    """Comm's point-to-point calls (a part of MPI.Comm, over its `_engine`)."""

    _engine: "_Engine"                          # Comm's (None on COMM_NULL, which _live refuses before a use)
    _live: Callable[[str], "Communicator"]      # Comm's: its emulator communicator, or ERR_COMM

    def _peer(self, rank, call: str, any_ok: bool = False) -> int:
        size = self._live(call).size
        if rank == PROC_NULL or (any_ok and rank == ANY_SOURCE) or (isinstance(rank, int) and 0 <= rank < size):
            return int(rank)
        raise Exception(ERR_RANK, f"MPI.Comm.{call}: rank {rank} is not 0..{size - 1}")

    def _tag(self, tag, call: str, any_ok: bool = False) -> int:
        if (any_ok and tag == ANY_TAG) or (isinstance(tag, int) and 0 <= tag <= TAG_UB):
            return int(tag)
        raise Exception(ERR_TAG, f"MPI.Comm.{call}: tag {tag} is not 0..{TAG_UB}")

    def _isend_bytes(self, data: np.ndarray, dest, tag, call: str, synchronous: bool = False) -> _Op:
        dest, tag = self._peer(dest, call), self._tag(tag, call)
        if dest == PROC_NULL:
            return _Null()
        return self._engine.send(data, dest, tag, synchronous)

    def _irecv(self, source, tag, message, pickled, call: str) -> _Op:
        source, tag = self._peer(source, call, any_ok=True), self._tag(tag, call, any_ok=True)
        if source == PROC_NULL:
            op = _Null()
            op.result = None
            return op
        recv = _Recv(self._engine, source, tag, message, pickled)
        self._engine.post(recv)
        return recv

    def _send_message(self, buf, dest, call):
        message = message_simple(buf, True, null=dest == PROC_NULL)
        return message.pack().view(np.uint8) if message.count else np.zeros(0, np.uint8)

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        return _request(self._isend_bytes(self._send_message(buf, dest, "Isend"), dest, tag, "Isend"))

    Ibsend = Irsend = Isend

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Synchronous: to oneself it completes when matched; to another GPU when the switch took it (eager)."""
        return _request(self._isend_bytes(self._send_message(buf, dest, "Issend"), dest, tag, "Issend", True))

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Eager: returns once the data is in GPU memory and handed to the switch."""
        self._isend_bytes(self._send_message(buf, dest, "Send"), dest, tag, "Send").wait()

    Bsend = Ssend = Rsend = Send

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        message = message_simple(buf, False, null=source == PROC_NULL)
        return _request(self._irecv(source, tag, message, False, "Irecv"))

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> None:
        self.Irecv(buf, source, tag).Wait(status)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status=None) -> None:
        self.Isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag).Wait(status)

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                  recvtag: int = ANY_TAG) -> Request:
        recv = self._irecv(source, recvtag, message_simple(recvbuf, False, null=source == PROC_NULL), False,
                           "Sendrecv")
        send = self._isend_bytes(self._send_message(sendbuf, dest, "Sendrecv"), dest, sendtag, "Sendrecv")
        return _request(_Pair(send, recv))

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                         status=None) -> None:
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        data = self._send_message(buf, dest, "Sendrecv_replace").copy()  # sent before the buffer is written
        send = self._isend_bytes(data, dest, sendtag, "Sendrecv_replace")
        recv = self._irecv(source, recvtag, message_simple(buf, False, null=source == PROC_NULL), False,
                           "Sendrecv_replace")
        return _request(_Pair(send, recv))

    def Send_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        return Prequest(make=lambda: self._isend_bytes(self._send_message(buf, dest, "Send_init"), dest, tag,
                                                       "Send_init"))

    Bsend_init = Ssend_init = Rsend_init = Send_init

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        return Prequest(make=lambda: self._irecv(source, tag, message_simple(buf, False, null=source == PROC_NULL),
                                                 False, "Recv_init"))

    def _probe(self, source, tag, status, call: str, wait: bool) -> bool:
        source, tag = self._peer(source, call, True), self._tag(tag, call, True)
        if source == PROC_NULL:
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, 0)
            return True
        if wait:
            entry = _progress_until(lambda: self._engine.probe(source, tag), f"probe of {source} tag {tag}")
        else:
            _poll()
            for engine in _ctx.engines:
                engine.pull()
            entry = self._engine.probe(source, tag)
        if entry is not None and status is not None:
            status._set(entry[0], entry[1], entry[2].size)
        return entry is not None

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        """Block until a message matching (source, tag) is here; it stays to be received."""
        return self._probe(source, tag, status, "Probe", True)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        """Whether a message matching (source, tag) is here, after serving the fabric once."""
        return self._probe(source, tag, status, "Iprobe", False)

    probe = Probe
    iprobe = Iprobe

    def Mprobe(self, *args, **kwargs):
        raise _unsupported("Comm.Mprobe", "matched probes are not in the mpi4py layer's scope")

    Improbe = mprobe = improbe = Mprobe

    # pickle-based point to point
    def send(self, obj, dest: int, tag: int = 0) -> None:
        self._isend_bytes(_pickled(obj), dest, tag, "send").wait()

    bsend = ssend = send

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        return _request(self._isend_bytes(_pickled(obj), dest, tag, "isend"))

    ibsend = isend

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        return _request(self._isend_bytes(_pickled(obj), dest, tag, "issend", True))

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        if buf is not None:
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)  # as mpi4py warns
        return _request(self._irecv(source, tag, None, True, "recv")).wait(status)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        return _request(self._irecv(source, tag, None, True, "irecv"))

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status=None):
        recv = self._irecv(source, recvtag, None, True, "sendrecv")
        send = self._isend_bytes(_pickled(sendobj), dest, sendtag, "sendrecv")
        return _request(_Pair(send, recv)).wait(status)
