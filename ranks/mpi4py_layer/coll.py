"""Collectives in the layer: Comm's buffer calls on the fabric's collectives, and the pickle-based ones."""

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from nvlink_emu.fabric.reduction import blocks

from .buffers import Message, is_in_place, message_simple, message_vector
from .constants import ERR_OP, ERR_ROOT
from .context import _algorithm, _free, _stage, _staging
from .errors import Exception, MalformedMessage, _unsupported  # noqa: A004 - MPI.Exception
from .ops import SUM, Op, native_reduction, reduce_rows
from .p2p import _pickled, _unpickle, _who
from .requests import Request, _Collective, _request

if TYPE_CHECKING:
    from ..comm import Communicator


class Collectives:
    """Comm's collective calls (a part of MPI.Comm, over its emulator communicator `_emu`)."""

    _live: Callable[[str], "Communicator"]      # Comm's: its emulator communicator, or ERR_COMM

    def _root(self, root, call: str) -> int:
        size = self._live(call).size
        if not isinstance(root, (int, np.integer)) or not 0 <= root < size:
            raise Exception(ERR_ROOT, f"MPI.Comm.{call}: root {root!r} is not a rank 0..{size - 1}")
        return int(root)

    def Ibcast(self, buf, root: int = 0) -> Request:
        emu, root = self._live("Bcast"), self._root(root, "Bcast")
        message = message_simple(buf, emu.rank == root)
        staged = _stage(message.pack())
        part = emu.ibroadcast(staged, root, _algorithm("broadcast"))

        def finish():
            if emu.rank != root:
                message.unpack(staged)
            _free(staged)
        return _request(_Collective([part], finish))

    def Bcast(self, buf, root: int = 0) -> None:
        self.Ibcast(buf, root).Wait()

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        emu, root = self._live("Gather"), self._root(root, "Gather")
        is_root = emu.rank == root
        recv = message_simple(recvbuf, False, null=not is_root, blocks=emu.size)
        if is_root and is_in_place(sendbuf):
            send_values = recv.pack(emu.rank * recv.count, recv.count)
        else:
            send_values = message_simple(sendbuf, True).pack()
        staged = _stage(send_values)
        out = _staging(send_values.size * emu.size, send_values.dtype) if is_root else None
        part = emu.igather(staged, out, root)

        def finish():
            if is_root:
                recv.unpack(out.view(recv.base), 0, recv.count * emu.size)
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igather(sendbuf, recvbuf, root).Wait()

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        emu, root = self._live("Scatter"), self._root(root, "Scatter")
        is_root = emu.rank == root
        send = message_simple(sendbuf, True, null=not is_root, blocks=emu.size)
        in_place = is_root and is_in_place(recvbuf)
        recv = None if in_place else message_simple(recvbuf, False)
        count = send.count if in_place else recv.count  # type: ignore[union-attr]  # recv is None only in place
        dtype = (send if in_place else recv).base  # type: ignore[union-attr]  # as above
        staged = _stage(send.pack(0, send.count * emu.size)) if is_root else None
        out = _staging(count * (send.elements if in_place else recv.elements), dtype)  # type: ignore[union-attr]  # as above
        part = emu.iscatter(staged, out, root)

        def finish():
            if not in_place:
                recv.unpack(out.view(recv.base))
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatter(sendbuf, recvbuf, root).Wait()

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        emu = self._live("Allgather")
        recv = message_simple(recvbuf, False, blocks=emu.size)
        if is_in_place(sendbuf):
            values = recv.pack(emu.rank * recv.count, recv.count)
        else:
            values = message_simple(sendbuf, True).pack()
        staged = _stage(values)
        out = _staging(values.size * emu.size, values.dtype)
        part = emu.iallgather(staged, out, _algorithm("allgather"))

        def finish():
            recv.unpack(out.view(recv.base), 0, recv.count * emu.size)
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Allgather(self, sendbuf, recvbuf) -> None:
        self.Iallgather(sendbuf, recvbuf).Wait()

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        emu = self._live("Alltoall")
        recv = message_simple(recvbuf, False, blocks=emu.size)
        send = recv if is_in_place(sendbuf) else message_simple(sendbuf, True, blocks=emu.size)
        values = send.pack(0, send.count * emu.size)
        staged = _stage(values)
        out = _staging(recv.count * recv.elements * emu.size, recv.base)
        per = values.size // emu.size
        part = emu.iall2allv(staged, [per] * emu.size, out, [recv.count * recv.elements] * emu.size)

        def finish():
            recv.unpack(out, 0, recv.count * emu.size)
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self.Ialltoall(sendbuf, recvbuf).Wait()

    # vector variants: every one is the emulator's all2allv with the counts that say who sends what to whom
    def _vector(self, call, send_blocks, send, recv_blocks, recv) -> Request:
        """all2allv of send's blocks (member j gets send_blocks[j] = (start item, items)) into recv's
        blocks (recv_blocks[i] from member i); a block list None sends or receives nothing."""
        emu = self._live(call)
        n = emu.size
        empty = [(0, 0)] * n
        send_blocks, recv_blocks = send_blocks or empty, recv_blocks or empty
        dtype = (send or recv).base
        parts = [send.pack(start, items) for start, items in send_blocks] if send is not None else []
        values = np.concatenate(parts) if parts else np.zeros(0, dtype)
        staged = _stage(values.astype(dtype, copy=False))
        elements = recv.elements if recv is not None else 1
        out = _staging(sum(items for _, items in recv_blocks) * elements, dtype)
        send_counts = [p.size for p in parts] if parts else [0] * n
        recv_counts = [items * elements for _, items in recv_blocks]
        part = emu.iall2allv(staged, send_counts, out, recv_counts)

        def finish():
            at = 0
            for (start, items), count in zip(recv_blocks, recv_counts):
                if items:
                    recv.unpack(out[at:at + count], start, items)
                at += count
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        emu, root = self._live("Gatherv"), self._root(root, "Gatherv")
        is_root = emu.rank == root
        recv = message_vector(recvbuf, False, emu.size, null=not is_root) if is_root else None
        if is_root and is_in_place(sendbuf):
            mine = (recv.displs[emu.rank], recv.counts[emu.rank])  # type: ignore[union-attr]  # recv is None only off the root
            send_blocks = [(0, 0)] * emu.size
            send_blocks[root] = mine
            recv_blocks = list(zip(recv.displs, recv.counts))  # type: ignore[union-attr]  # as above
            return self._vector("Gatherv", send_blocks, recv, recv_blocks, recv)
        send = message_simple(sendbuf, True)
        send_blocks = [(0, 0)] * emu.size
        send_blocks[root] = (0, send.count)
        recv_blocks = list(zip(recv.displs, recv.counts)) if is_root else None  # type: ignore[union-attr, assignment]  # as above
        return self._vector("Gatherv", send_blocks, send, recv_blocks, recv)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igatherv(sendbuf, recvbuf, root).Wait()

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        emu, root = self._live("Scatterv"), self._root(root, "Scatterv")
        is_root = emu.rank == root
        send = message_vector(sendbuf, True, emu.size) if is_root else None
        send_blocks = list(zip(send.displs, send.counts)) if is_root else None  # type: ignore[union-attr]  # send is None only off the root
        if is_root and is_in_place(recvbuf):
            send_blocks[root] = (0, 0)  # type: ignore[index]  # the root's block stays where it is (None: off the root)
            return self._vector("Scatterv", send_blocks, send, None, None)
        recv = message_simple(recvbuf, False)
        recv_blocks = [(0, 0)] * emu.size
        recv_blocks[root] = (0, recv.count)
        return self._vector("Scatterv", send_blocks, send, recv_blocks, recv)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatterv(sendbuf, recvbuf, root).Wait()

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        emu = self._live("Allgatherv")
        recv = message_vector(recvbuf, False, emu.size)
        recv_blocks = list(zip(recv.displs, recv.counts))
        if is_in_place(sendbuf):
            send, mine = recv, recv_blocks[emu.rank]
        else:
            send = message_simple(sendbuf, True)
            mine = (0, send.count)
        return self._vector("Allgatherv", [mine] * emu.size, send, recv_blocks, recv)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self.Iallgatherv(sendbuf, recvbuf).Wait()

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        emu = self._live("Alltoallv")
        recv = message_vector(recvbuf, False, emu.size)
        recv_blocks = list(zip(recv.displs, recv.counts))
        if is_in_place(sendbuf):
            copy = Message(recv.array.copy(), None, recv.datatype)  # the sends read the buffer before it is written
            return self._vector("Alltoallv", recv_blocks, copy, recv_blocks, recv)
        send = message_vector(sendbuf, True, emu.size)
        return self._vector("Alltoallv", list(zip(send.displs, send.counts)), send, recv_blocks, recv)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self.Ialltoallv(sendbuf, recvbuf).Wait()

    def Alltoallw(self, *args, **kwargs):
        raise _unsupported("Comm.Alltoallw", "per-block datatypes (and MPI.BOTTOM addresses) are not in the "
                           "layer's scope")

    Ialltoallw = Alltoallw

    # -- reductions ---------------------------------------------------------------------------------
    def _reduction_args(self, call, sendbuf, recvbuf, in_place_ok=True):
        recv = message_simple(recvbuf, False)
        if in_place_ok and is_in_place(sendbuf):
            return recv.pack(), recv
        send = message_simple(sendbuf, True)
        if send.count != recv.count:
            raise ValueError(f"mismatch in send count {send.count} and receive count {recv.count}")
        if send.base != recv.base:
            raise ValueError("mismatch in send and receive MPI datatypes")
        return send.pack(), recv

    def _check_op(self, op, call):
        if not isinstance(op, Op) or not op:
            raise Exception(ERR_OP, f"MPI.Comm.{call}: {op!r} is not an Op")

    def Iallreduce(self, sendbuf, recvbuf, op=None) -> Request:
        op = SUM if op is None else op
        emu = self._live("Allreduce")
        self._check_op(op, "Allreduce")
        values, recv = self._reduction_args("Allreduce", sendbuf, recvbuf)
        native = native_reduction(op, values.dtype)
        if native is not None:
            staged = _stage(values.view(native[1]) if values.size else values.astype(native[1]))
            part = emu.iallreduce(staged, native[0], _algorithm("allreduce"))

            def finish():
                recv.unpack(staged.view(values.dtype) if values.size else values)
                _free(staged)
            return _request(_Collective([part], finish))
        op.combine(values[:0], values[:0])  # an op the dtype has not: the error now, on this member
        staged = _stage(values)
        out = _staging(values.size * emu.size, values.dtype)
        part = emu.iallgather(staged, out, _algorithm("allgather"))

        def finish_combined():
            recv.unpack(reduce_rows(op, out.reshape(emu.size, -1)) if values.size else values)
            _free(staged, out)
        return _request(_Collective([part], finish_combined))

    def Allreduce(self, sendbuf, recvbuf, op=None) -> None:
        self.Iallreduce(sendbuf, recvbuf, op).Wait()

    def Ireduce(self, sendbuf, recvbuf, op=None, root: int = 0) -> Request:
        op = SUM if op is None else op
        emu, root = self._live("Reduce"), self._root(root, "Reduce")
        self._check_op(op, "Reduce")
        is_root = emu.rank == root
        if is_root:
            values, recv = self._reduction_args("Reduce", sendbuf, recvbuf)
        else:
            values, recv = message_simple(sendbuf, True).pack(), None
        native = native_reduction(op, values.dtype)
        if native is not None:
            as_type = native[1]
            staged = _stage(values.view(as_type) if values.size else values.astype(as_type))
            out = _staging(staged.size, as_type) if is_root else None
            part = emu.ireduce(staged, out, root, native[0], _algorithm("reduce"))

            def finish():
                if is_root:
                    recv.unpack(out.view(values.dtype) if values.size else values)
                _free(staged, out)
            return _request(_Collective([part], finish))
        op.combine(values[:0], values[:0])
        staged = _stage(values)
        out = _staging(values.size * emu.size, values.dtype) if is_root else None
        part = emu.igather(staged, out, root)

        def finish_combined():
            if is_root:
                recv.unpack(reduce_rows(op, out.reshape(emu.size, -1)) if values.size else values)
            _free(staged, out)
        return _request(_Collective([part], finish_combined))

    def Reduce(self, sendbuf, recvbuf, op=None, root: int = 0) -> None:
        self.Ireduce(sendbuf, recvbuf, op, root).Wait()

    def _ireduce_scatter(self, call, values, recv, counts, op) -> Request:
        """recv <- items of block `rank` (counts[i] items to member i) of the reduction of `values`."""
        emu = self._live(call)
        self._check_op(op, call)
        n, elements = emu.size, recv.elements
        sizes = [c * elements for c in counts]
        if sum(sizes) != values.size:
            raise ValueError(f"{call}: counts {counts} sum to {sum(counts)} items; the send buffer holds "
                             f"{values.size // max(elements, 1)}")
        native = native_reduction(op, values.dtype)
        mine = sizes[emu.rank]
        # the fabric's blocks are of the array it reduces: complex as twice as many floats
        factor = values.dtype.itemsize // native[1].itemsize if native is not None else 1
        even = [(end - start) for start, end in blocks(values.size * factor, n)] == [z * factor for z in sizes]
        if native is not None and even:
            as_type = native[1]
            staged = _stage(values.view(as_type) if values.size else values.astype(as_type))
            out = _staging(mine * factor, as_type)
            part = emu.ireduce_scatter(staged, out, native[0], _algorithm("reduce_scatter"))

            def finish():
                recv.unpack(out.view(values.dtype) if mine else values[:0], 0, counts[emu.rank])
                _free(staged, out)
            return _request(_Collective([part], finish))
        if native is None:
            op.combine(values[:0], values[:0])
        # uneven blocks, or an op the fabric does not reduce: each block to its member, combined there
        staged = _stage(values)
        out = _staging(mine * n, values.dtype)
        part = emu.iall2allv(staged, sizes, out, [mine] * n)

        def finish_combined():
            if mine:
                recv.unpack(reduce_rows(op, out.reshape(n, -1)), 0, counts[emu.rank])
            _free(staged, out)
        return _request(_Collective([part], finish_combined))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=None) -> Request:
        op = SUM if op is None else op
        emu = self._live("Reduce_scatter_block")
        if is_in_place(sendbuf):
            recv = message_simple(recvbuf, False, blocks=emu.size)
            values = recv.pack(0, recv.count * emu.size)
        else:
            recv = message_simple(recvbuf, False)
            send = message_simple(sendbuf, True, blocks=emu.size)
            if send.base != recv.base:
                raise ValueError("mismatch in send and receive MPI datatypes")
            values = send.pack(0, recv.count * emu.size)
        return self._ireduce_scatter("Reduce_scatter_block", values, recv, [recv.count] * emu.size, op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=None) -> None:
        self.Ireduce_scatter_block(sendbuf, recvbuf, op).Wait()

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=None) -> Request:
        op = SUM if op is None else op
        emu = self._live("Reduce_scatter")
        recv = message_simple(recvbuf, False)
        if recvcounts is None:  # every member's receive count, as mpi4py gathers them (out of band here)
            recvcounts = emu.allgather_object(recv.count, "mpi4py Reduce_scatter counts")
        counts = [int(c) for c in recvcounts]
        if is_in_place(sendbuf):
            values = recv.pack(0, sum(counts))
        else:
            values = message_simple(sendbuf, True).pack(0, sum(counts))
        return self._ireduce_scatter("Reduce_scatter", values, recv, counts, op)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=None) -> None:
        self.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op).Wait()

    def _iscan(self, call, sendbuf, recvbuf, op, exclusive: bool) -> Request:
        """Prefix reductions: every member's contribution gathered (allgather), combined in rank order."""
        op = SUM if op is None else op
        emu = self._live(call)
        self._check_op(op, call)
        values, recv = self._reduction_args(call, sendbuf, recvbuf)
        op.combine(values[:0], values[:0])
        staged = _stage(values)
        out = _staging(values.size * emu.size, values.dtype)
        part = emu.iallgather(staged, out, _algorithm("allgather"))
        upto = emu.rank if exclusive else emu.rank + 1

        def finish():
            if upto and values.size:
                recv.unpack(reduce_rows(op, out.reshape(emu.size, -1)[:upto]))
            _free(staged, out)
        return _request(_Collective([part], finish))

    def Iscan(self, sendbuf, recvbuf, op=None) -> Request:
        return self._iscan("Scan", sendbuf, recvbuf, op, False)

    def Scan(self, sendbuf, recvbuf, op=None) -> None:
        self.Iscan(sendbuf, recvbuf, op).Wait()

    def Iexscan(self, sendbuf, recvbuf, op=None) -> Request:
        return self._iscan("Exscan", sendbuf, recvbuf, op, True)

    def Exscan(self, sendbuf, recvbuf, op=None) -> None:
        self.Iexscan(sendbuf, recvbuf, op).Wait()

    # -- pickle-based collectives ------------------------------------------------------------------------
    def _varying(self, call, pieces, dest_of) -> list:
        """Move byte strings of any length: pieces[j] (uint8) goes to member j (None: nothing); returns
        what each member sent this one (None where it sent nothing). Two all2allv through the switch:
        the lengths (int64 each), then the bytes."""
        emu = self._live(call)
        n = emu.size
        lengths = np.array([-1 if p is None else p.size for p in pieces], np.int64)
        counts = [1 if dest_of(j) else 0 for j in range(n)]
        staged_len = _stage(lengths[np.array(counts, bool)])  # all2allv sends its blocks packed, in order
        got_len = _staging(n, np.int64)
        recv_counts = [1 if dest_of(-1 - i) else 0 for i in range(n)]
        emu.iall2allv(staged_len, counts, got_len, recv_counts).wait()
        expected = np.full(n, -1, np.int64)
        expected[np.array(recv_counts, bool)] = got_len[:sum(recv_counts)]
        _free(staged_len, got_len)
        for member in range(n):  # a member that sends says how many bytes: never fewer than 0
            if recv_counts[member] and expected[member] < 0:
                raise MalformedMessage(f"MPI {call}: {_who(self, member)} announces {int(expected[member])} bytes")
        data = [p for p in pieces if p is not None and p.size] or [np.zeros(0, np.uint8)]
        staged = _stage(np.concatenate(data))
        out = _staging(int(expected[expected > 0].sum()), np.uint8)
        emu.iall2allv(staged, [max(int(s), 0) for s in lengths], out, [max(int(s), 0) for s in expected]).wait()
        result: list[np.ndarray | None] = []
        at: int | np.integer = 0  # a count of expected's (int64) once a piece came
        for size in expected:
            if size < 0:
                result.append(None)
            else:
                result.append(np.array(out[at:at + size], copy=True))
                at += size
        _free(staged, out)
        return result

    def bcast(self, obj=None, root: int = 0):
        emu, root = self._live("bcast"), self._root(root, "bcast")
        length = _stage(np.array([_pickled(obj).size if emu.rank == root else 0], np.int64))
        emu.ibroadcast(length, root, _algorithm("broadcast")).wait()
        size = int(length[0])
        if size < 0:
            _free(length)
            raise MalformedMessage(f"MPI bcast: {_who(self, root)} announces {size} bytes")
        data = _stage(_pickled(obj)) if emu.rank == root else _staging(size, np.uint8)
        emu.ibroadcast(data, root, _algorithm("broadcast")).wait()
        try:
            result = obj if emu.rank == root and emu.size == 1 else _unpickle(data, _who(self, root))
        finally:
            _free(length, data)
        return result

    def gather(self, sendobj, root: int = 0):
        emu, root = self._live("gather"), self._root(root, "gather")
        mine = _pickled(sendobj)
        pieces = [mine if j == root else None for j in range(emu.size)]
        got = self._varying("gather", pieces, lambda j: (j == root) if j >= 0 else emu.rank == root)
        return [_unpickle(g, _who(self, j)) for j, g in enumerate(got)] if emu.rank == root else None

    def scatter(self, sendobj, root: int = 0):
        emu, root = self._live("scatter"), self._root(root, "scatter")
        if emu.rank == root:
            items = list(sendobj)
            if len(items) != emu.size:
                raise ValueError(f"scatter: expecting {emu.size} items, got {len(items)}")
            pieces: list[np.ndarray | None] = [_pickled(item) for item in items]
        else:
            pieces = [None] * emu.size
        got = self._varying("scatter", pieces, lambda j: emu.rank == root if j >= 0 else (-1 - j) == root)
        return _unpickle(got[root], _who(self, root))

    def allgather(self, sendobj):
        emu = self._live("allgather")
        mine = _pickled(sendobj)
        got = self._varying("allgather", [mine] * emu.size, lambda j: True)
        return [_unpickle(g, _who(self, j)) for j, g in enumerate(got)]

    def alltoall(self, sendobj):
        emu = self._live("alltoall")
        items = list(sendobj)
        if len(items) != emu.size:
            raise ValueError(f"alltoall: expecting {emu.size} items, got {len(items)}")
        got = self._varying("alltoall", [_pickled(i) for i in items], lambda j: True)
        return [_unpickle(g, _who(self, j)) for j, g in enumerate(got)]

    def reduce(self, sendobj, op=None, root: int = 0):
        op = SUM if op is None else op
        values = self.gather(sendobj, root)
        return None if values is None else _fold(op, values)

    def allreduce(self, sendobj, op=None):
        op = SUM if op is None else op
        return _fold(op, self.allgather(sendobj))

    def scan(self, sendobj, op=None):
        op = SUM if op is None else op
        return _fold(op, self.allgather(sendobj)[:self.Get_rank() + 1])

    def exscan(self, sendobj, op=None):
        op = SUM if op is None else op
        values = self.allgather(sendobj)[:self.Get_rank()]
        return _fold(op, values) if values else None


def _fold(op, values):
    acc = values[0]
    for value in values[1:]:
        acc = op(acc, value)
    return acc
