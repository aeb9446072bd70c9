"""MPI.Win's data movement in the layer: Put, Get, accumulates and atomics, and their target side.

Accumulates, atomics and locks are answered by the target GPU's memory without its program, as the
hardware's atomics are: the origin puts its operand into its own slot of the target's *inbox* (a
second region exported to the same group, so the switch checks that write too), then asks the target
with a message; the target serves the request in its progress loop (gpu.serve_messages), which runs
one request at a time, so each read-modify-write is atomic per element (and per call), and answers
with a message (the old values for the fetching forms). Lock requests and the PSCW notices are
messages served the same way. As in MPI, passive-target progress needs the target to be in some
call of the layer (any blocking wait serves it).
"""

import ast
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from nvlink_emu.fabric.errors import FabricError

from . import ops
from .buffers import as_datatype, message_simple
from .constants import ERR_DISP, ERR_OP, ERR_RMA_RANGE, ERR_TYPE, TAG, WIN_FLAVOR_DYNAMIC
from .errors import Exception, _error  # noqa: A004 - MPI.Exception
from .ops import NO_OP, SUM, Op
from .requests import _Collective, _request

if TYPE_CHECKING:
    from ..gpu import Gpu

PREDEFINED_OPS = ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR", "MAXLOC", "MINLOC")


class Operations:
    """Win's data movement calls (a part of MPI.Win) and the target's read-modify-write."""

    # what these calls use of the window, which Win._make sets (rma_epochs.Epochs, win.Win)
    _wid: str | None                  # None: WIN_NULL (freed)
    _gpu: "Gpu"
    _members: tuple[int, ...]         # GPU of each group rank
    _rank: int                        # this GPU's group rank
    _flavor: int                      # WIN_FLAVOR_*
    _region: np.ndarray               # this GPU's part (uint8, GPU memory)
    _answers: dict[int, tuple]
    _numbers: Iterator[int]
    _slot: int                        # bytes of each member's slot in this GPU's inbox
    _inbox: np.ndarray
    _inboxes: list                    # each member's inbox target, by group rank
    _sizes: list[int]                 # each member's part in bytes
    _units: list[int]                 # and its displacement unit
    _slots: list[int]                 # and its inbox slot's bytes
    _target: Callable[[Any, str], int | None]  # Win's methods
    _reach: Callable[[int, int, int, str], tuple]
    _block_at: Callable[[int, int], tuple | None]

    def _layout(self, rank, target, msg, call: str) -> tuple[int, np.ndarray | None, np.dtype, int]:
        """(byte offset in the target's window, base-element indices from there or None if contiguous,
        base dtype, elements) of the target spec (None, disp, or (disp, count, datatype))."""
        disp, count, datatype = 0, msg.count, msg.datatype
        if isinstance(target, (int, np.integer)):
            disp = int(target)
        elif isinstance(target, (list, tuple)):
            parts = list(target) + [None] * (3 - len(target))
            disp = int(parts[0] or 0)
            count = msg.count if parts[1] is None else int(parts[1])
            datatype = msg.datatype if parts[2] is None else as_datatype(parts[2])
        elif target is not None:
            raise ValueError(f"MPI.Win.{call}: target must be None, a displacement or (disp, count, datatype)")
        if disp < 0:
            raise _error(ERR_DISP, f"MPI.Win.{call}: negative displacement {disp}")
        if datatype.base != msg.base or count * len(datatype.offsets) != msg.count * msg.elements:
            raise _error(ERR_TYPE, f"MPI.Win.{call}: the origin's {msg.count} x {msg.datatype} and the "
                                        f"target's {count} x {datatype} differ")
        offset = disp * self._units[rank]
        itemsize = datatype.base.itemsize
        if datatype.contiguous:
            index, span = None, count * len(datatype.offsets) * itemsize
        else:
            index = datatype._items(np.arange(count, dtype=np.int64) * datatype._extent)
            span = (int(index.max()) + 1) * itemsize if index.size else 0
        if self._flavor != WIN_FLAVOR_DYNAMIC and offset + span > self._sizes[rank]:
            raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: bytes {offset}..{offset + span} of rank {rank}'s "
                                             f"window of {self._sizes[rank]} (GPU {self._members[rank]})")
        return offset, index, datatype.base, count * len(datatype.offsets)

    # -- data movement ------------------------------------------------------------------------------
    def Put(self, origin, target_rank: int, target=None) -> None:
        """Write the origin buffer into `target_rank`'s window: gpu.put per contiguous run of the target
        datatype. Visible there at the next Fence / Flush / Unlock / Complete."""
        rank = self._target(target_rank, "Put")
        msg = message_simple(origin, readonly=True, null=rank is None)
        if rank is None:
            return
        offset, index, base, elements = self._layout(rank, target, msg, "Put")
        values = msg.pack().reshape(-1)
        for start, stop, at in runs(index, elements):
            data = np.ascontiguousarray(values[start:stop]).view(np.uint8)
            if not data.nbytes:
                continue
            local, remote, where = self._reach(rank, offset + at * base.itemsize, data.nbytes, "Put")
            if local is not None:  # this GPU's own memory: a local copy, as a GPU stores to its HBM
                local[where:where + data.nbytes] = data
            else:
                self._gpu.put(remote, data, where)

    def Get(self, origin, target_rank: int, target=None) -> None:
        """Read `target_rank`'s window into the origin buffer: gpu.get per contiguous run (complete at once)."""
        rank = self._target(target_rank, "Get")
        msg = message_simple(origin, readonly=False, null=rank is None)
        if rank is None:
            return
        offset, index, base, elements = self._layout(rank, target, msg, "Get")
        values = np.empty(elements, base)
        for start, stop, at in runs(index, elements):
            data = values[start:stop].view(np.uint8)
            if not data.nbytes:
                continue
            local, remote, where = self._reach(rank, offset + at * base.itemsize, data.nbytes, "Get")
            if local is not None:
                data[:] = local[where:where + data.nbytes]
            else:
                self._gpu.get(remote, data, where)
        msg.unpack(values)

    def Accumulate(self, origin, target_rank: int, target=None, op=None) -> None:
        """target = target op origin, element by element, atomically per element (see the module)."""
        self._accumulate("Accumulate", origin, None, None, target_rank, target, SUM if op is None else op)

    def Get_accumulate(self, origin, result, target_rank: int, target=None, op=None) -> None:
        """As Accumulate, and the target's values before it into `result`."""
        self._accumulate("Get_accumulate", origin, result, None, target_rank, target, SUM if op is None else op)

    def Fetch_and_op(self, origin, result, target_rank: int, target_disp: int = 0, op=None) -> None:
        """One element: result = target; target = target op origin (atomic)."""
        self._accumulate("Fetch_and_op", origin, result, None, target_rank, int(target_disp),
                         SUM if op is None else op, single=True)

    def Compare_and_swap(self, origin, compare, result, target_rank: int, target_disp: int = 0) -> None:
        """One element: result = target; if target == compare, target = origin (atomic)."""
        self._accumulate("Compare_and_swap", origin, result, compare, target_rank, int(target_disp), None, single=True)

    def _accumulate(self, call, origin, result, compare, target_rank, target, op, single=False) -> None:
        rank = self._target(target_rank, call)
        fetch = result is not None
        ignore_origin = op is NO_OP and fetch
        # res (a Message, None when not fetching), msg and values below are None only where their uses are
        # skipped (by fetch, ignore_origin, compare): Any, as a type checker does not follow these flags
        res: Any = message_simple(result, readonly=False, null=rank is None) if fetch else None
        msg: Any
        if ignore_origin and (origin is None or single):
            msg = res if not single else _checked_single(call, origin, res, "origin")
        else:
            msg = message_simple(origin, readonly=True, null=rank is None)
        if rank is None:
            return
        if single:
            msg = _checked_single(call, origin, res, "origin") if not ignore_origin else msg
            if compare is not None:
                _checked_single(call, compare, res, "compare")
            if res.count != 1:
                raise ValueError(f"MPI.Win.{call}: the result buffer must hold one {res.datatype}, holds {res.count}")
        if op is not None and (not isinstance(op, Op) or op._array is None):
            raise _error(ERR_OP, f"MPI.Win.{call}: {op!r} is not a predefined operation")
        shape = res if ignore_origin and origin is None else msg
        offset, index, base, elements = self._layout(rank, target, shape, call)
        if op is not None:
            op.combine(np.zeros(1, base), np.zeros(1, base))  # an op the type does not take: refused here
        if fetch and (res.count * res.elements != elements or res.base != base):
            raise _error(ERR_TYPE, f"MPI.Win.{call}: the result buffer holds {res.count} x {res.datatype}, "
                                        f"the operation {elements} elements of {base}")
        values: Any = None if ignore_origin else msg.pack().reshape(-1)
        if compare is not None:
            values = np.concatenate([values, message_simple(compare, readonly=True).pack().reshape(-1)])
        old = np.empty(elements, base)
        step = max(1, self._slots[rank] // (base.itemsize * (2 if compare is not None else 1)))
        for first in range(0, elements, step):
            last = min(elements, first + step)
            pieces = None if values is None else values[first:last]
            if compare is not None:
                pieces = np.concatenate([values[first:last], values[elements + first:elements + last]])
            # op is None only for Compare_and_swap, whose compare is given
            fetched = self._remote_rmw(rank, call, "CAS" if compare is not None else op.name, base, offset,  # type: ignore[union-attr]
                                       None if index is None else index[first:last], first, last, pieces, fetch)
            if fetch:
                old[first:last] = fetched
        if fetch:
            res.unpack(old)

    def _remote_rmw(self, rank, call, opname, base, offset, index, first, last, operand, fetch):
        """One piece of an accumulate: the operand into this GPU's inbox slot at the target (a put the
        switch checks), then the request; waits for the answer (the old values if `fetch`)."""
        gpu = self._gpu
        start = offset + (first * base.itemsize if index is None else 0)
        if rank == self._rank:  # its own memory: applied here (no request is being served meanwhile)
            status, data = self._apply(opname, base, start, last - first, operand,
                                       None if index is None else np.asarray(index, np.int64), fetch)
            return self._answered(rank, call, status, data, base, fetch)
        slot = self._rank * self._slots[rank]
        if operand is not None and operand.size:
            gpu.put(self._inboxes[rank], np.ascontiguousarray(operand).view(np.uint8), slot)
            gpu.fence()  # the operand is there before the request is
        number = next(self._numbers)
        elements = last - first
        where = np.zeros(0, np.int64) if index is None else np.ascontiguousarray(index, np.int64)
        key = (TAG, self._wid, "rmw", number, opname, _dtype_text(base), start, elements, int(fetch),
               int(operand is not None and operand.size > 0))
        gpu.wait_sent([gpu.send_message(self._members[rank], key, where.view(np.uint8))], call)
        gpu.wait(lambda: number in self._answers, f"MPI.Win.{call}", f"GPU {self._members[rank]} (rank {rank})")
        status, data = self._answers.pop(number)
        return self._answered(rank, call, status, data, base, fetch)

    def _answered(self, rank, call, status, data, base, fetch):
        if status:
            raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: GPU {self._members[rank]} (rank {rank}) refused it: "
                                        f"{bytes(data).decode(errors='replace')}")
        return data.view(base) if fetch else None

    def Rput(self, origin, target_rank: int, target=None):
        self.Put(origin, target_rank, target)
        return _done()

    def Rget(self, origin, target_rank: int, target=None):
        self.Get(origin, target_rank, target)
        return _done()

    def Raccumulate(self, origin, target_rank: int, target=None, op=None):
        self.Accumulate(origin, target_rank, target, op)
        return _done()

    def Rget_accumulate(self, origin, result, target_rank: int, target=None, op=None):
        self.Get_accumulate(origin, result, target_rank, target, op)
        return _done()


    def _rmw(self, sender, opname, dtype, start, elements, fetch, has_operand, where) -> tuple:
        """Apply one accumulate piece of `sender`, its operand in its inbox slot; (status, answer bytes)."""
        try:
            base = _dtype_of(dtype)
        except (ValueError, TypeError, SyntaxError) as exc:
            return 1, np.frombuffer(f"{opname}: type {dtype!r}: {exc}".encode()[:200], np.uint8).copy()
        slot = self._members.index(sender) * self._slot
        count = elements * (2 if opname == "CAS" else 1)
        operand = self._inbox[slot:slot + count * base.itemsize].view(base) if has_operand else None
        return self._apply(opname, base, start, elements, operand, where.view(np.int64) if where.nbytes else None,
                           fetch)

    def _apply(self, opname, base, start, elements, operand, index, fetch) -> tuple:
        """The read-modify-write of `elements` of `base` at byte `start` of this GPU's region (at the
        element `index`es from there, or contiguous); (status, answer bytes: the old values if `fetch`)."""
        try:
            index = np.arange(elements, dtype=np.int64) if index is None else index
            end = start + ((int(index.max()) + 1) * base.itemsize if index.size else 0)
            memory, first = self._region, start
            if self._flavor == WIN_FLAVOR_DYNAMIC:
                found = self._block_at(start, end - start)
                if found is None:
                    raise ValueError(f"bytes {start:#x}..{end:#x} are not attached")
                memory, first = found
            if first < 0 or first + end - start > memory.nbytes or (index.size and index.min() < 0):
                raise ValueError(f"bytes {start}..{end} of a window of {memory.nbytes}")
            view = memory[first:first + end - start].view(base)
            old = view[index].copy()
            if opname == "CAS":
                if np.array_equal(old, operand[elements:]):
                    view[index] = operand[:elements]
            elif opname == "REPLACE":
                view[index] = operand
            elif opname != "NO_OP":
                op = getattr(ops, opname, None) if opname in PREDEFINED_OPS else None
                if op is None:
                    raise ValueError(f"{opname!r} is not a predefined operation")
                view[index] = op.combine(old, operand)
            return 0, (old.view(np.uint8) if fetch else np.zeros(0, np.uint8))
        except (ValueError, TypeError, IndexError, FabricError, Exception) as exc:
            return 1, np.frombuffer(f"{opname} at byte {start}: {exc}".encode()[:200], np.uint8).copy()


def runs(index, elements: int):
    """(first, past-last, target element) of each run of consecutive target elements."""
    if index is None:
        return [(0, elements, 0)]
    if not index.size:
        return []
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [index.size]])
    return [(int(a), int(b), int(index[a])) for a, b in zip(starts, stops)]


def _checked_single(call, buf, res, what):
    msg = message_simple(buf, readonly=True)
    if msg.count != 1:
        raise ValueError(f"MPI.Win.{call}: the {what} buffer must hold one element, holds {msg.count}")
    if res is not None and (msg.base != res.base or msg.elements != res.elements):
        raise ValueError(f"MPI.Win.{call}: the {what} buffer is {msg.datatype}, the result {res.datatype}")
    return msg


def _dtype_text(dtype: np.dtype) -> str:
    return dtype.str if dtype.fields is None else repr(dtype.descr)


def _dtype_of(text: str) -> np.dtype:
    """The numpy type a request names (_dtype_text); a type of Python objects is refused (ValueError)."""
    dtype = np.dtype(text) if not text.startswith("[") else np.dtype(ast.literal_eval(text))
    if dtype.hasobject:
        raise ValueError(f"type {text!r} holds Python objects")
    return dtype


def _done():
    return _request(_Collective([]))  # complete already
