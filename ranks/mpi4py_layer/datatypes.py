"""MPI datatypes in the layer: a numpy base dtype and a layout, and the predefined types by name.

A datatype is a numpy base dtype and a layout: the base-element offsets of one item and the item's
extent in base elements (a predefined type: offsets [0], extent 1). Derived types (contiguous,
vector, indexed, indexed_block, resized) are layouts over one base dtype; a struct of several base
dtypes is not representable and raises UnsupportedOperation.
"""

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation

from .constants import ERR_TYPE
from .errors import Exception as MPIException


class Datatype:
    """An MPI datatype: `base` numpy dtype, `offsets` (base elements of one item), `extent` (base
    elements from one item to the next). size in bytes = len(offsets) x base.itemsize."""

    def __init__(self, datatype=None, *, name=None, base=None, offsets=None, extent=None):
        if isinstance(datatype, Datatype):  # Datatype(other): the same handle, as mpi4py
            name, base, offsets, extent = datatype.name, datatype.base, datatype.offsets, datatype._extent
        self.name = name
        self.base = None if base is None else np.dtype(base)
        self.offsets = np.zeros(1, np.int64) if offsets is None else np.asarray(offsets, np.int64)
        self._extent = 1 if extent is None else int(extent)
        self.committed = True
        self.predefined = offsets is None and base is not None

    def __repr__(self):
        return f"<Datatype {self.name or 'derived'}>"

    def __bool__(self):
        return self.base is not None

    def __eq__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        if self.base is None or other.base is None:
            return self.base is None and other.base is None
        return self is other or (self.name is not None and self.name == other.name and self.predefined
                                 and other.predefined)

    def __hash__(self):
        return hash(self.name) if self.predefined else id(self)

    # -- queries ------------------------------------------------------------------------------------
    def _null_check(self, what: str):
        if self.base is None:
            raise MPIException(ERR_TYPE, f"{what} of DATATYPE_NULL")

    def Get_size(self) -> int:
        """Bytes of data in one item."""
        self._null_check("Get_size")
        return len(self.offsets) * self.base.itemsize

    size = property(Get_size)

    def Get_extent(self) -> tuple[int, int]:
        """(lower bound, extent) in bytes."""
        self._null_check("Get_extent")
        return 0, self._extent * self.base.itemsize

    def Get_true_extent(self) -> tuple[int, int]:
        self._null_check("Get_true_extent")
        low, high = int(self.offsets.min(initial=0)), int(self.offsets.max(initial=-1)) + 1
        return low * self.base.itemsize, (high - low) * self.base.itemsize

    extent = property(lambda self: self.Get_extent()[1])
    lb = property(lambda self: 0)
    ub = property(lambda self: self.extent)

    @property
    def contiguous(self) -> bool:
        return self._extent == len(self.offsets) and np.array_equal(self.offsets, np.arange(len(self.offsets)))

    # -- constructors -------------------------------------------------------------------------------
    def _derived(self, offsets, extent) -> "Datatype":
        self._null_check("a derived type")
        made = Datatype(base=self.base, offsets=np.asarray(offsets, np.int64).reshape(-1), extent=extent)
        made.committed = False
        return made

    def _items(self, starts) -> np.ndarray:
        """Base-element offsets of one item of self placed at each of `starts` (in base elements)."""
        return (np.asarray(starts, np.int64)[:, None] + self.offsets[None, :]).reshape(-1)

    def Dup(self) -> "Datatype":
        made = self._derived(self.offsets, self._extent)
        made.name = self.name
        return made

    def Create_contiguous(self, count: int) -> "Datatype":
        return self._derived(self._items(np.arange(count) * self._extent), count * self._extent)

    def Create_vector(self, count: int, blocklength: int, stride: int) -> "Datatype":
        starts = (np.arange(count)[:, None] * stride + np.arange(blocklength)[None, :]).reshape(-1) * self._extent
        return self._derived(self._items(starts), ((count - 1) * stride + blocklength) * self._extent if count else 0)

    def Create_indexed(self, blocklengths, displacements) -> "Datatype":
        starts = [d + i for b, d in zip(blocklengths, displacements) for i in range(b)]
        ends = [d + b for b, d in zip(blocklengths, displacements)]
        return self._derived(self._items(np.asarray(starts, np.int64) * self._extent),
                             max(ends, default=0) * self._extent)

    def Create_indexed_block(self, blocklength: int, displacements) -> "Datatype":
        return self.Create_indexed([blocklength] * len(displacements), displacements)

    def Create_resized(self, lb: int, extent: int) -> "Datatype":
        if lb != 0 or extent % self.base.itemsize:
            raise UnsupportedOperation(f"Datatype.Create_resized(lb={lb}, extent={extent}): the layer's layouts "
                                       f"have lower bound 0 and an extent in whole {self.base} elements")
        return self._derived(self.offsets, extent // self.base.itemsize)

    def Create_struct(self, *args, **kwargs):
        raise UnsupportedOperation("Datatype.Create_struct: the mpi4py layer's datatypes are layouts of one base "
                                   "type (contiguous, vector, indexed, indexed_block, resized)")

    Create_hvector = Create_hindexed = Create_hindexed_block = Create_subarray = Create_darray = Create_struct

    def Commit(self) -> "Datatype":
        self.committed = True
        return self

    def Free(self) -> None:
        if self.predefined:
            raise MPIException(ERR_TYPE, f"Free of predefined datatype {self.name}")
        self.base = None

    def Get_name(self) -> str:
        return self.name or ""

    def tocode(self) -> str:
        return self.base.char if self.base is not None else ""


DATATYPE_NULL = Datatype()


def predefined(name: str, dtype) -> Datatype:
    return Datatype(name=name, base=np.dtype(dtype))


# -- the predefined datatypes -----------------------------------------------------------------------------
def _pair(value) -> np.dtype:
    return np.dtype([("v", value), ("i", np.intc)], align=True)


# the predefined datatypes (numpy dtypes of this platform's C types, as mpi4py maps them)
CHAR = predefined("CHAR", "S1")
WCHAR = predefined("WCHAR", "U1")
SIGNED_CHAR = predefined("SIGNED_CHAR", np.byte)
SHORT = predefined("SHORT", np.short)
INT = predefined("INT", np.intc)
LONG = predefined("LONG", "l")
LONG_LONG = predefined("LONG_LONG", np.longlong)
UNSIGNED_CHAR = predefined("UNSIGNED_CHAR", np.ubyte)
UNSIGNED_SHORT = predefined("UNSIGNED_SHORT", np.ushort)
UNSIGNED = predefined("UNSIGNED", np.uintc)
UNSIGNED_LONG = predefined("UNSIGNED_LONG", "L")
UNSIGNED_LONG_LONG = predefined("UNSIGNED_LONG_LONG", np.ulonglong)
FLOAT = predefined("FLOAT", np.single)
DOUBLE = predefined("DOUBLE", np.double)
LONG_DOUBLE = predefined("LONG_DOUBLE", np.longdouble)
C_BOOL = predefined("C_BOOL", np.bool_)
INT8_T = predefined("INT8_T", np.int8)
INT16_T = predefined("INT16_T", np.int16)
INT32_T = predefined("INT32_T", np.int32)
INT64_T = predefined("INT64_T", np.int64)
UINT8_T = predefined("UINT8_T", np.uint8)
UINT16_T = predefined("UINT16_T", np.uint16)
UINT32_T = predefined("UINT32_T", np.uint32)
UINT64_T = predefined("UINT64_T", np.uint64)
C_FLOAT_COMPLEX = predefined("C_FLOAT_COMPLEX", np.csingle)
C_DOUBLE_COMPLEX = predefined("C_DOUBLE_COMPLEX", np.cdouble)
C_LONG_DOUBLE_COMPLEX = predefined("C_LONG_DOUBLE_COMPLEX", np.clongdouble)
BYTE = predefined("BYTE", np.ubyte)
PACKED = predefined("PACKED", np.ubyte)
AINT = predefined("AINT", np.intp)
OFFSET = predefined("OFFSET", np.int64)
COUNT = predefined("COUNT", np.int64)
FLOAT_INT = predefined("FLOAT_INT", _pair(np.single))
DOUBLE_INT = predefined("DOUBLE_INT", _pair(np.double))
LONG_INT = predefined("LONG_INT", _pair("l"))
SHORT_INT = predefined("SHORT_INT", _pair(np.short))
LONG_DOUBLE_INT = predefined("LONG_DOUBLE_INT", _pair(np.longdouble))
TWOINT = predefined("TWOINT", _pair(np.intc))
INT_INT = TWOINT
UNSIGNED_INT, SIGNED_SHORT, SIGNED_INT, SIGNED_LONG = UNSIGNED, SHORT, INT, LONG
BOOL, CXX_BOOL = C_BOOL, C_BOOL
C_COMPLEX = C_FLOAT_COMPLEX
REAL, DOUBLE_PRECISION, INTEGER, LOGICAL, COMPLEX = FLOAT, DOUBLE, INT, C_BOOL, C_FLOAT_COMPLEX

# the buffer's element type when a message names none (mpi4py's getdatatype of the buffer format)
_BY_CHAR = {"?": C_BOOL, "c": CHAR, "b": SIGNED_CHAR, "h": SHORT, "i": INT, "l": LONG, "q": LONG_LONG,
            "B": UNSIGNED_CHAR, "H": UNSIGNED_SHORT, "I": UNSIGNED, "L": UNSIGNED_LONG,
            "Q": UNSIGNED_LONG_LONG, "f": FLOAT, "d": DOUBLE, "g": LONG_DOUBLE, "F": C_FLOAT_COMPLEX,
            "D": C_DOUBLE_COMPLEX, "G": C_LONG_DOUBLE_COMPLEX, "e": None, "S": CHAR, "U": WCHAR}


def dtype_datatype(dtype: np.dtype) -> Datatype:
    """The predefined Datatype of numpy elements `dtype` (float16 and other types MPI does not name
    get a layer-made type of that dtype)."""
    dtype = np.dtype(dtype)
    known = _BY_CHAR.get(dtype.char)
    if known is not None and known.base == dtype:
        return known
    return predefined(f"numpy:{dtype.str}", dtype)


def typecode_datatype(code: str) -> Datatype:
    """A Datatype from a typecode string ('i', 'd', ...), as mpi4py's [buf, 'i'] messages."""
    return dtype_datatype(np.dtype(code))


Datatype.fromcode = staticmethod(typecode_datatype)  # type: ignore[attr-defined]  # mpi4py's name, set here
