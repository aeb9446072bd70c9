"""MPI reductions (MPI.Op) in the layer: Python and numpy forms, and which ones the fabric reduces itself."""

import numpy as np

from nvlink_emu.fabric.reduction import DTYPES

from .buffers import message_simple
from .constants import ERR_OP
from .errors import Exception, _unsupported  # noqa: A004 - MPI.Exception
from .handles import _Mpi4pyNames


def _maxloc(a, b):
    return a if (a[0], -a[1]) >= (b[0], -b[1]) else b


def _minloc(a, b):
    return a if (a[0], a[1]) <= (b[0], b[1]) else b


def _loc_array(better):
    def combine(a, b):
        take_b = better(b["v"], a["v"]) | ((b["v"] == a["v"]) & (b["i"] < a["i"]))
        return np.where(take_b, b, a)
    return combine


class Op(_Mpi4pyNames):
    """A reduction: `name`, its Python form (for the pickle-based calls) and numpy form (buffers).
    `native`: the emulator's op name, when the switch or a GPU algorithm can reduce it."""

    _mpi4py = "Op"

    def __init__(self, name=None, python=None, array=None, native=None, commute=True):
        self.name, self._python, self._array, self.native, self.commute = name, python, array, native, commute

    def __repr__(self):
        return f"<Op {self.name}>"

    def __bool__(self):
        return self.name is not None

    def __call__(self, x, y):
        return self._python(x, y)

    @classmethod
    def Create(cls, function, commute=False):
        def python(x, y):
            return function(x, y, None)
        return cls(f"user:{getattr(function, '__name__', 'op')}", python, None, None, bool(commute))

    def Is_commutative(self) -> bool:
        return self.commute

    is_commutative = property(Is_commutative)

    def Free(self):
        pass

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a op b element-wise, in a's dtype (a holds the lower ranks' partial result)."""
        if self._array is None:
            raise _unsupported(f"{self.name} on a buffer", "user-defined ops are taken by the pickle-based calls only")
        if a.dtype == np.bool_ and self.name in ("SUM", "PROD"):
            raise Exception(ERR_OP, f"MPI.{self.name} on C_BOOL")
        if a.dtype.kind == "c" and self.name in ("MAX", "MIN"):
            raise Exception(ERR_OP, f"MPI.{self.name} on a complex type")
        return np.asarray(self._array(a, b)).astype(a.dtype, copy=False)

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """inoutbuf <- inbuf op inoutbuf, on this process (no traffic)."""
        send = message_simple(inbuf, True)
        recv = message_simple(inoutbuf, False)
        if send.count != recv.count:
            raise ValueError(f"mismatch in inbuf count {send.count} and inoutbuf count {recv.count}")
        if send.datatype.base != recv.datatype.base or send.datatype.Get_size() != recv.datatype.Get_size():
            raise ValueError("mismatch in inbuf and inoutbuf MPI datatypes")
        recv.unpack(self.combine(send.pack(), recv.pack()))


# the predefined ops: (name, Python form, numpy form, the emulator op that reduces it on the fabric)
MAX = Op("MAX", lambda x, y: y if y > x else x, np.maximum, "max")
MIN = Op("MIN", lambda x, y: y if y < x else x, np.minimum, "min")
SUM = Op("SUM", lambda x, y: x + y, np.add, "sum")
PROD = Op("PROD", lambda x, y: x * y, np.multiply, "prod")
LAND = Op("LAND", lambda x, y: x and y, np.logical_and, None)
BAND = Op("BAND", lambda x, y: x & y, np.bitwise_and, None)
LOR = Op("LOR", lambda x, y: x or y, np.logical_or, None)
BOR = Op("BOR", lambda x, y: x | y, np.bitwise_or, None)
LXOR = Op("LXOR", lambda x, y: bool(x) != bool(y), np.logical_xor, None)
BXOR = Op("BXOR", lambda x, y: x ^ y, np.bitwise_xor, None)
MAXLOC = Op("MAXLOC", _maxloc, _loc_array(np.greater), None)
MINLOC = Op("MINLOC", _minloc, _loc_array(np.less), None)
REPLACE = Op("REPLACE", lambda x, y: y, lambda a, b: b, None)
NO_OP = Op("NO_OP", lambda x, y: x, lambda a, b: a, None)
OP_NULL = Op()


def native_reduction(op: Op, dtype: np.dtype):
    """(emulator op, dtype to reduce as) when the fabric reduces `op` on `dtype` itself, else None:
    SUM/PROD/MAX/MIN on the switch's dtypes (fabric.reduction.DTYPES); SUM of complex as its real
    view (element-wise, so exact); MAX/MIN/LOR/LAND/BOR/BAND of C_BOOL as uint8 max/min."""
    dtype = np.dtype(dtype)
    if op.native is not None and dtype in DTYPES.values():
        return op.native, dtype
    if op.name == "SUM" and dtype.kind == "c" and np.dtype(f"f{dtype.itemsize // 2}") in DTYPES.values():
        return "sum", np.dtype(f"f{dtype.itemsize // 2}")
    if dtype == np.bool_ and op.name in ("MAX", "LOR", "BOR"):
        return "max", np.dtype(np.uint8)
    if dtype == np.bool_ and op.name in ("MIN", "LAND", "BAND"):
        return "min", np.dtype(np.uint8)
    return None


def reduce_rows(op: Op, rows: np.ndarray) -> np.ndarray:
    """op over rows[0], rows[1], ... in rank order (fixed, so bitwise reproducible)."""
    acc = np.array(rows[0], copy=True)
    for row in rows[1:]:
        acc = op.combine(acc, row)
    return acc
