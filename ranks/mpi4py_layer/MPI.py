"""mpi4py's MPI module over the emulated fabric: COMM_WORLD is the GPUs, every byte goes through the switch.

A program's `from mpi4py import MPI` gets this module while it runs under `nvlink-emu run --mpi4py`
(ranks/mpi4py_layer/__init__.py installs it). Buffers are copied into GPU memory (gpu.alloc) and
moved by the emulator's collectives and messages; those host copies are not link traffic. See the
docs/guide/mpi4py.md, for what is supported and how each call maps onto the fabric.
"""

import builtins
import os
import pickle as _pickle
import platform
import time
import warnings

import numpy as np

from nvlink_emu.fabric.errors import ProtocolError, UnsupportedOperation
from nvlink_emu.fabric.reduction import DTYPES, blocks
from nvlink_emu.ranks import collectives

from .buffers import BOTTOM, DATATYPE_NULL, IN_PLACE, Datatype, Message, is_in_place, message_simple, message_vector, predefined

__all__ = ["BOTTOM", "IN_PLACE", "DATATYPE_NULL", "Datatype"]  # re-exported: mpi4py's MPI names them

ALGORITHM_ENV = "NVLINK_EMU_MPI4PY_ALGORITHM"
ENVELOPE_BYTES = 8  # every point-to-point message carries its tag (int64) ahead of the data, on the links too

# -- constants (MPICH's values where a program may print or compare them) ----------------------------
ANY_SOURCE, PROC_NULL, ROOT, ANY_TAG, UNDEFINED = -2, -1, -3, -1, -32766
TAG_UB = 2 ** 31 - 1
SUCCESS, ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_COMM, ERR_RANK, ERR_REQUEST, ERR_ROOT = 0, 1, 2, 3, 4, 5, 6, 19, 7
ERR_OP, ERR_ARG, ERR_TRUNCATE, ERR_OTHER, ERR_INTERN, ERR_PENDING, ERR_UNSUPPORTED_OPERATION = 9, 12, 14, 15, 16, 18, 52
ERR_LASTCODE = 0x3fffffff
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
KEYVAL_INVALID = 0x24000000
APPNUM = KEYVAL_INVALID
BSEND_OVERHEAD = 96
MAX_PROCESSOR_NAME = 128
VERSION, SUBVERSION = 4, 1
__version__ = "4.1.2"  # the mpi4py interface this layer follows


class Exception(RuntimeError):  # noqa: A001 - mpi4py's name
    """MPI.Exception: an MPI error class and its message."""

    def __init__(self, ierr: int = ERR_OTHER, message: str = ""):
        super().__init__(message or f"MPI error class {ierr}")
        self.error_code = ierr

    def Get_error_code(self) -> int:
        return self.error_code

    def Get_error_class(self) -> int:
        return self.error_code

    def Get_error_string(self) -> str:
        return str(self)

    error_class = property(Get_error_class)

    def __int__(self):
        return self.error_code

    def __eq__(self, other):
        if isinstance(other, int):
            return self.error_code == other
        return builtins.Exception.__eq__(self, other)

    __hash__ = RuntimeError.__hash__


class MalformedMessage(Exception, ProtocolError):
    """A peer's message the layer cannot decode: shorter than its tag header, a tag or a length field no
    honest member sends, a pickle that does not load. MPI.Exception (ERR_OTHER) for the program, the
    fabric's ProtocolError for the run's report; its message names the sender and the communicator."""

    def __init__(self, message: str):
        Exception.__init__(self, ERR_OTHER, message)


def _unsupported(call: str, why: str = "not in the mpi4py layer's scope") -> UnsupportedOperation:
    return UnsupportedOperation(f"MPI.{call}: {why} (nvlink-emu --mpi4py; see docs/guide/mpi4py.md)")


class MissingCall(UnsupportedOperation, AttributeError):
    """A name mpi4py's MPI has and this layer does not: UnsupportedOperation naming it, and an
    AttributeError too, so that hasattr() and getattr(..., default) still answer as for a missing name."""


def _missing(owner: str, name: str):
    """MissingCall for MPI.`owner`.`name` if the real mpi4py has it (the module the emulator's transport
    loaded, saved while the layer is installed), else a plain AttributeError."""
    real = _ctx.real
    if real is not None and not name.startswith("__") and hasattr(getattr(real, owner, real) if owner else real,
                                                                   name):
        return MissingCall(f"MPI.{owner + '.' if owner else ''}{name}: mpi4py has it, the layer does not "
                           f"(nvlink-emu --mpi4py; see docs/guide/mpi4py.md)")
    return AttributeError(f"{'MPI.' + owner if owner else 'module mpi4py.MPI'} has no attribute {name!r}")


def __getattr__(name: str):
    raise _missing("", name)


class _Mpi4pyNames:
    """Unknown attributes of a layer object: MissingCall when mpi4py's class `_mpi4py` has them."""

    _mpi4py = ""

    def __getattr__(self, name: str):
        raise _missing(self._mpi4py, name)


class _Handle(_Mpi4pyNames):
    """An MPI handle: true unless null, equal to another of its family (`_family`) that refers to the
    same thing (the object in attribute `_held`)."""

    _family: type = object
    _held = ""

    def __bool__(self):
        return getattr(self, self._held) is not None

    def __eq__(self, other):
        if not isinstance(other, self._family):
            return NotImplemented
        return getattr(self, self._held) is getattr(other, self._held)

    __hash__ = object.__hash__


# -- datatypes ------------------------------------------------------------------------------------------
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
globals()["2INT"] = TWOINT
UNSIGNED_INT, SIGNED_SHORT, SIGNED_INT, SIGNED_LONG = UNSIGNED, SHORT, INT, LONG
BOOL, CXX_BOOL = C_BOOL, C_BOOL
C_COMPLEX = C_FLOAT_COMPLEX
REAL, DOUBLE_PRECISION, INTEGER, LOGICAL, COMPLEX = FLOAT, DOUBLE, INT, C_BOOL, C_FLOAT_COMPLEX
# MPI types that C has and numpy does not model here: DATATYPE_NULL, as an MPI without them reports
for _name in ("LB", "UB", "LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8", "LOGICAL16", "INTEGER16", "REAL2",
              "COMPLEX4", "BFLOAT16_T", "CHARACTER", "CXX_FLOAT_COMPLEX", "CXX_DOUBLE_COMPLEX",
              "CXX_LONG_DOUBLE_COMPLEX", "SIGNED_LONG_LONG", "UNSIGNED_LONG_LONG_INT", "DOUBLE_COMPLEX",
              "INTEGER1", "INTEGER2", "INTEGER4", "INTEGER8", "REAL4", "REAL8", "REAL16", "COMPLEX8", "COMPLEX16",
              "COMPLEX32", "2REAL", "2DOUBLE_PRECISION", "2INTEGER", "C_WCHAR"):
    globals().setdefault(_name, DATATYPE_NULL)

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


Datatype.fromcode = staticmethod(typecode_datatype)


# -- ops ------------------------------------------------------------------------------------------------
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


# -- the process's context ----------------------------------------------------------------------------
class _Context:
    gpu = None
    real = None  # the real mpi4py.MPI (only its names are read: which calls the layer lacks)
    algorithm = "auto"
    engines: list = []
    attached = None
    start = time.time()


_ctx = _Context()


def _gpu():
    if _ctx.gpu is None:
        raise _unsupported("(any call)", "the layer is only installed while a program runs under nvlink-emu --mpi4py")
    return _ctx.gpu


def _algorithm(collective: str) -> str:
    """The algorithm of a call: NVLINK_EMU_MPI4PY_ALGORITHM where that algorithm implements the
    collective, else the fabric's auto."""
    name = _ctx.algorithm
    if name != "auto" and hasattr(collectives.ALGORITHMS[name], collective):
        return name
    return "auto"


def check_algorithm(name: str) -> str:
    """The value of NVLINK_EMU_MPI4PY_ALGORITHM, checked (auto or a registered algorithm)."""
    if name != "auto" and name not in collectives.ALGORITHMS:
        raise UnsupportedOperation(f"{ALGORITHM_ENV}={name!r}: known algorithms are auto, "
                                   f"{', '.join(collectives.ALGORITHMS)}")
    return name


def _stage(values: np.ndarray) -> np.ndarray:
    """A copy of `values` in this GPU's memory (host work, not link traffic)."""
    values = np.ascontiguousarray(values).reshape(-1)
    staged = _gpu().alloc(values.size, values.dtype)
    staged[:] = values
    return staged


def _staging(count: int, dtype) -> np.ndarray:
    return _gpu().alloc(int(count), dtype)


def _free(*arrays) -> None:
    for array in arrays:
        if array is not None:
            _gpu().free(array)


# -- status and requests ------------------------------------------------------------------------------
class Status(_Mpi4pyNames):
    """A receive's envelope: source, tag, error and byte count."""

    _mpi4py = "Status"

    def __init__(self, status=None):
        self.source, self.tag, self.error, self._count, self._cancelled = ANY_SOURCE, ANY_TAG, SUCCESS, 0, False
        if isinstance(status, Status):
            self.source, self.tag, self.error, self._count = status.source, status.tag, status.error, status._count

    def _set(self, source, tag, nbytes, cancelled=False):
        self.source, self.tag, self.error, self._count, self._cancelled = source, tag, SUCCESS, nbytes, cancelled

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag

    def Get_error(self):
        return self.error

    def Set_source(self, source):
        self.source = source

    def Set_tag(self, tag):
        self.tag = tag

    def Set_error(self, error):
        self.error = error

    def Get_count(self, datatype=None) -> int:
        size = (BYTE if datatype is None else datatype).Get_size()
        return self._count // size if size and self._count % size == 0 else (0 if not size else UNDEFINED)

    def Get_elements(self, datatype) -> int:
        item = datatype.base.itemsize
        return self._count // item if self._count % item == 0 else UNDEFINED

    def Set_elements(self, datatype, count):
        self._count = count * datatype.base.itemsize

    def Is_cancelled(self) -> bool:
        return self._cancelled

    def Set_cancelled(self, flag):
        self._cancelled = bool(flag)

    count = property(lambda self: self._count)
    cancelled = property(Is_cancelled)


class Request(_Handle):
    """A non-blocking operation. Falsy (REQUEST_NULL) once completed and waited/tested, as in mpi4py."""

    _mpi4py, _held = "Request", "_op"

    def __init__(self, request=None):
        self._op = request._op if isinstance(request, Request) else None

    def _finish(self, status):
        op, self._op = self._op, None
        if status is not None:
            status._set(*op.envelope)
        return op.result

    def Wait(self, status=None) -> bool:
        """Block until the operation completes."""
        self.wait(status)
        return True

    def wait(self, status=None):
        if self._op is None:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return None
        self._op.wait()
        return self._finish(status)

    def Test(self, status=None) -> bool:
        return self.test(status)[0]

    def test(self, status=None):
        if self._op is None:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return True, None
        if not self._op.test():
            return False, None
        return True, self._finish(status)

    def Get_status(self, status=None) -> bool:
        if self._op is None:
            return True
        done = self._op.test()
        if done and status is not None:
            status._set(*self._op.envelope)
        return done

    def get_status(self, status=None) -> bool:
        return self.Get_status(status)

    def Cancel(self) -> None:
        """Cancel a receive not matched yet; a send has left already, so its cancel does nothing."""
        if self._op is not None:
            self._op.cancel()

    cancel = Cancel

    def Free(self) -> None:
        if self._op is not None:
            self._op.wait()
        self._op = None

    def free(self) -> None:
        self.Free()

    # -- many requests ------------------------------------------------------------------------------
    @staticmethod
    def _statuses(statuses, n):
        if statuses is None:
            return [None] * n
        while len(statuses) < n:
            statuses.append(Status())
        return statuses

    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None) -> list:
        statuses = cls._statuses(statuses, len(requests))
        return [r.wait(s) for r, s in zip(requests, statuses)]

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        if not all(r._op is None or r._op.test() for r in requests):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests, status=None) -> int:
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        cls._wait_for_one(requests, "waitany")
        index, _, obj = cls.testany(requests, status)
        return index, obj

    @staticmethod
    def _wait_for_one(requests, what: str) -> None:
        """Serve the fabric until one of the active requests has completed (none active: return)."""
        active = [r for r in requests if r._op is not None]
        if active:
            _progress_until(lambda: any(r._op.test() for r in active) or None, f"{what} of {len(active)} requests")

    @classmethod
    def Testany(cls, requests, status=None):
        index, flag, _ = cls.testany(requests, status)
        return index, flag

    @classmethod
    def testany(cls, requests, status=None):
        active = [i for i, r in enumerate(requests) if r._op is not None]
        if not active:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return UNDEFINED, True, None
        for i in active:
            if requests[i]._op.test():
                return i, True, requests[i]._finish(status)
        return UNDEFINED, False, None

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        cls._wait_for_one(requests, "waitsome")
        return cls.testsome(requests, statuses)

    @classmethod
    def Testsome(cls, requests, statuses=None):
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        active = [i for i, r in enumerate(requests) if r._op is not None]
        if not active:
            return None, None
        done = [i for i in active if requests[i]._op.test()]
        statuses = cls._statuses(statuses, len(done))
        return done, [requests[i]._finish(s) for i, s in zip(done, statuses)]

    @classmethod
    def Startall(cls, requests):
        for request in requests:
            request.Start()

    def Start(self):
        raise _unsupported("Request.Start", "only persistent requests (Prequest) start")


Request._family = Request
REQUEST_NULL = Request()


class Prequest(Request):
    """A persistent request (Send_init/Recv_init): Start issues the operation again each time."""

    def __init__(self, request=None, make=None):
        super().__init__(request)
        self._make = make
        if isinstance(request, Prequest):
            self._make = request._make

    def __bool__(self):
        return self._make is not None

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or (not self and not other)

    __hash__ = object.__hash__

    def Start(self):
        self._op = self._make()

    def Free(self):  # waits as Request's do; only Free ends a persistent request
        if self._op is not None:
            self._op.wait()
        self._op = self._make = None


class Grequest(Request):
    @classmethod
    def Start(cls, *args, **kwargs):
        raise _unsupported("Grequest.Start", "generalized requests are not in the mpi4py layer's scope")


class _Op:
    """One pending operation behind a Request: wait(), test() (completes it if it can), cancel();
    envelope (source, tag, bytes) and result (the object of a pickle-based receive) once done."""

    envelope = (ANY_SOURCE, ANY_TAG, 0)
    result = None

    def cancel(self):
        pass


class _Collective(_Op):
    """Emulator requests and the step that finishes the call (copy out of GPU memory, local combine)."""

    def __init__(self, parts, finish=None):
        self._parts, self._finish, self._done = parts, finish, False

    def wait(self):
        if not self._done:
            for part in self._parts:
                part.wait()
            if self._finish is not None:
                self._finish()
            self._done = True

    def test(self):
        # the emulator has no progress thread: a collective moves its bytes at the call that tests it
        self.wait()
        return True


class _Done:
    """An emulator-like request that completed already (one-member communicators)."""

    def wait(self):
        pass

    def test(self):
        return True


# What point to point needs beyond sending and taking messages (MPI's ANY_SOURCE, ANY_TAG and Iprobe must
# see which messages have arrived without naming one): the GPU's probe, poll and wait.
def _has_message(key: tuple, peer: int) -> bool:
    """Whether GPU `peer`'s message in slot `key` has arrived (read-only)."""
    return _gpu().has_message(key, peer)


def _peek_message(key: tuple, peer: int):
    """GPU `peer`'s message in slot `key` if it arrived, left in the mailbox (read-only), else None."""
    return _gpu().peek_message(key, peer)


def _poll() -> None:
    """Serve the fabric once, without waiting (what Iprobe and Test do)."""
    _gpu().poll()


def _wait(done, what: str, whom: str) -> None:
    """Serve the fabric until done(), FabricTimeout at the run's deadline."""
    _gpu().wait(done, what, whom)


def _progress_until(found, what: str):
    """found()'s first non-None value, serving the fabric (pulling arrived messages) until there is one."""
    while True:
        for engine in _ctx.engines:
            engine.pull()
        value = found()
        if value is not None and value is not False:
            return value
        _wait(lambda: any(engine.arrived() for engine in _ctx.engines), f"MPI {what}", "a matching message")


# -- communicators --------------------------------------------------------------------------------------
class _Solo:
    """The emulator side of a one-member communicator (COMM_SELF, its Dups): every collective is a
    local copy, no link bytes; same i-forms as ranks.comm.Communicator."""

    size, rank = 1, 0

    def __init__(self, name: str):
        self.name = name

    def iallreduce(self, array, op="sum", algorithm="auto"):
        return _Done()

    def ireduce_scatter(self, send, recv, op="sum", algorithm="auto"):
        recv[:] = send[:recv.size]
        return _Done()

    def iallgather(self, send, recv, algorithm="auto"):
        recv[:] = send
        return _Done()

    def ibroadcast(self, array, root=0, algorithm="auto"):
        return _Done()

    def iall2allv(self, send, send_counts, recv, recv_counts):
        recv[:recv_counts[0]] = send[:send_counts[0]]
        return _Done()

    def ireduce(self, send, recv, root=0, op="sum", algorithm="auto"):
        recv[:] = send
        return _Done()

    def igather(self, send, recv, root=0):
        recv[:] = send
        return _Done()

    def iscatter(self, send, recv, root=0):
        recv[:] = send
        return _Done()

    def allgather_object(self, obj, op="allgather_object"):
        return [obj]

    def barrier(self):
        pass

    def split(self, color, key=None):
        return None if color is None else _Solo(f"{self.name}.{color}")

    def release_group(self):
        pass

    def free(self):
        pass


# What the unexpected queue of a communicator keeps taken, per source member: past either bound, its arrived
# messages are queued by their envelope only and left in the GPU's mailbox, not taken, until a receive
# matches one; so the switch's mailbox bound (ranks/transport.MAILBOX_PEER_*) holds the sender, and a
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


def _request(op: _Op) -> Request:
    request = Request()
    request._op = op
    return request


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
    members = getattr(emu, "members", None) or (_gpu().rank,)  # a _Solo's one member is this GPU
    gpu = members[rank] if 0 <= rank < len(members) else "?"
    return f"rank {rank} (GPU {gpu}) of communicator {comm.Get_name() or emu.name!r}"


class Comm(_Handle):
    """MPI.Comm over an emulator communicator (`_emu`: ranks.comm.Communicator, or _Solo for one member)."""

    _mpi4py, _held = "Comm", "_emu"

    def __init__(self, comm=None):
        if isinstance(comm, Comm):
            self._emu, self._engine, self._name = comm._emu, comm._engine, comm._name
        else:
            self._emu, self._engine, self._name = None, None, ""

    @classmethod
    def _over(cls, emu, name: str) -> "Intracomm":
        comm = Intracomm()
        comm._emu, comm._name = emu, name
        comm._engine = _Engine(comm)
        _ctx.engines.append(comm._engine)
        return comm

    def __repr__(self):
        return f"<Intracomm {self._name or 'COMM_NULL'}>"

    def _live(self, call: str):
        if self._emu is None:
            raise Exception(ERR_COMM, f"MPI.Comm.{call} on COMM_NULL")
        return self._emu

    # -- queries ------------------------------------------------------------------------------------
    def Get_rank(self) -> int:
        return self._live("Get_rank").rank

    def Get_size(self) -> int:
        return self._live("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self) -> str:
        return self._name

    def Set_name(self, name: str):
        self._name = name

    name = property(Get_name, Set_name)

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    is_inter, is_intra = property(Is_inter), property(Is_intra)

    def Get_topology(self) -> int:
        return UNDEFINED

    topology = property(Get_topology)

    def Get_attr(self, keyval):
        if keyval == TAG_UB:
            return TAG_UB
        return None

    def Compare(self, other) -> int:
        if self._emu is other._emu:
            return IDENT
        mine, theirs = getattr(self._emu, "members", (None,)), getattr(other._emu, "members", (None,))
        return CONGRUENT if mine == theirs and type(self._emu) is type(other._emu) else UNEQUAL

    def Get_group(self):
        """The members as an MPI.Group (what windows and PSCW take)."""
        return Group(members=_win.comm_members(self))

    # -- communicator management --------------------------------------------------------------------
    def Dup(self, info=None) -> "Intracomm":
        """A new communicator of the same members (collective)."""
        emu = self._live("Dup")
        return Comm._over(emu.split(0), f"{self._name}.dup")

    Clone = Dup

    def Split(self, color: int = 0, key: int = 0) -> "Intracomm":
        """Members of one color, ordered by (key, rank); color UNDEFINED gives COMM_NULL (collective)."""
        emu = self._live("Split")
        new = emu.split(None if color == UNDEFINED else color, key)
        if new is None:
            return Intracomm()
        if new.size == 1 and not isinstance(new, _Solo):
            new.free()  # a one-member communicator is local copies: its MPI communicators are not needed
            new = _Solo(new.name)
        return Comm._over(new, f"{self._name}.split")

    def Free(self) -> None:
        emu = self._live("Free")
        if self is COMM_WORLD or self is COMM_SELF:
            raise Exception(ERR_COMM, "MPI.Comm.Free of a predefined communicator")
        emu.free()
        if self._engine in _ctx.engines:
            _ctx.engines.remove(self._engine)
        self._emu = self._engine = None

    def Disconnect(self):
        self.Free()

    def Abort(self, errorcode: int = 0):
        from nvlink_emu.ranks.transport import abort_job
        abort_job(errorcode or 1)

    def Barrier(self) -> None:
        self._live("Barrier").barrier()

    barrier = Barrier

    def Ibarrier(self) -> Request:
        # out of band, as ranks.comm.Communicator.barrier: complete when every member reached it
        self.Barrier()
        return _request(_Collective([]))

    # -- point to point -----------------------------------------------------------------------------
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

    # -- buffer collectives -------------------------------------------------------------------------
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
        count = send.count if in_place else recv.count
        dtype = (send if in_place else recv).base
        staged = _stage(send.pack(0, send.count * emu.size)) if is_root else None
        out = _staging(count * (send.elements if in_place else recv.elements), dtype)
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
            mine = (recv.displs[emu.rank], recv.counts[emu.rank])
            send_blocks = [(0, 0)] * emu.size
            send_blocks[root] = mine
            recv_blocks = list(zip(recv.displs, recv.counts))
            return self._vector("Gatherv", send_blocks, recv, recv_blocks, recv)
        send = message_simple(sendbuf, True)
        send_blocks = [(0, 0)] * emu.size
        send_blocks[root] = (0, send.count)
        recv_blocks = list(zip(recv.displs, recv.counts)) if is_root else None
        return self._vector("Gatherv", send_blocks, send, recv_blocks, recv)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igatherv(sendbuf, recvbuf, root).Wait()

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        emu, root = self._live("Scatterv"), self._root(root, "Scatterv")
        is_root = emu.rank == root
        send = message_vector(sendbuf, True, emu.size) if is_root else None
        send_blocks = list(zip(send.displs, send.counts)) if is_root else None
        if is_root and is_in_place(recvbuf):
            send_blocks[root] = (0, 0)  # the root's block stays where it is
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

        def finish():
            recv.unpack(reduce_rows(op, out.reshape(emu.size, -1)) if values.size else values)
            _free(staged, out)
        return _request(_Collective([part], finish))

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

        def finish():
            if is_root:
                recv.unpack(reduce_rows(op, out.reshape(emu.size, -1)) if values.size else values)
            _free(staged, out)
        return _request(_Collective([part], finish))

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

        def finish():
            if mine:
                recv.unpack(reduce_rows(op, out.reshape(n, -1)), 0, counts[emu.rank])
            _free(staged, out)
        return _request(_Collective([part], finish))

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
        result, at = [], 0
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
            pieces = [_pickled(item) for item in items]
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


class Intracomm(Comm):
    """MPI.Intracomm: every communicator of the layer (there are no intercommunicators)."""

    _mpi4py = "Intracomm"


Comm._family = Comm
COMM_NULL = Intracomm()
COMM_WORLD = Intracomm()
COMM_SELF = Intracomm()


# -- module functions -----------------------------------------------------------------------------------
def Wtime() -> float:
    """Wall-clock seconds (as MPI_Wtime); modeled_time_ns() is the fabric's modeled clock."""
    return time.time() - _ctx.start


def Wtick() -> float:
    return time.get_clock_info("time").resolution


def modeled_time_ns() -> float:
    """This GPU's modeled clock, in ns (the emulator's gpu.now_ns)."""
    return float(_gpu().now_ns)


def link_counters() -> dict:
    """This GPU's link counters (payload and raw bytes, packets, per direction): gpu.link_counters()."""
    return _gpu().link_counters()


def emulated_gpu():
    """The emulator's Gpu object of this rank (the workload API: compute, alloc, world, ...)."""
    return _gpu()


def Get_version() -> tuple[int, int]:
    return VERSION, SUBVERSION


def Get_library_version() -> str:
    return f"nvlink-emu mpi4py layer (MPI {VERSION}.{SUBVERSION} interface subset) on an emulated fabric"


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    return "nvlink-emu", (0, 1, 0)


def Get_processor_name() -> str:
    return f"{platform.node()}:gpu{_gpu().rank}"


def Query_thread() -> int:
    return THREAD_SINGLE


def Is_thread_main() -> bool:
    return True


def Is_initialized() -> bool:
    return True


def Is_finalized() -> bool:
    return False


def Init() -> None:
    pass


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    return THREAD_SINGLE


def Finalize() -> None:
    pass


def Alloc_mem(size: int, info=None):
    """`size` bytes of this GPU's memory (gpu.alloc): a window over it (Win.Create) is that memory."""
    block = _gpu().alloc(int(size), np.uint8)
    return _win.Memory.over(block, block)


def Free_mem(mem) -> None:
    block = getattr(mem, "_block", None)
    if block is None:
        raise Exception(ERR_ARG, "MPI.Free_mem of memory Alloc_mem did not return")
    _gpu().free(block)
    mem._block = None


def Attach_buffer(buf) -> None:
    _ctx.attached = buf


def Detach_buffer():
    buf, _ctx.attached = _ctx.attached, None
    return buf


def Get_address(location) -> int:
    """The address of a buffer's memory (WIN_BASE compares with it; an empty buffer's is 0); messages at
    MPI.BOTTOM stay unsupported."""
    from .buffers import as_array
    array = as_array(location, readonly=True)
    return int(array.__array_interface__["data"][0]) if array.nbytes else 0


def Compute_dims(nnodes: int, dims):
    raise _unsupported("Compute_dims", "process topologies are not in the layer's scope")


def Pcontrol(level: int) -> None:
    pass


class _Pickle:
    """MPI.pickle: the serializer of the lowercase calls."""

    PROTOCOL = _pickle.HIGHEST_PROTOCOL
    THRESHOLD = 256 * 1024

    def dumps(self, obj):
        return _pickle.dumps(obj, self.PROTOCOL)

    def loads(self, data):
        return _pickle.loads(data)


pickle = _Pickle()


def bind(gpu, real=None) -> None:
    """Make this module the MPI of `gpu`'s program: COMM_WORLD over gpu.world, COMM_SELF over itself,
    the algorithm from NVLINK_EMU_MPI4PY_ALGORITHM; `real`: the real mpi4py.MPI, if loaded (its names
    tell an unsupported call from a misspelt one)."""
    _ctx.gpu, _ctx.real = gpu, real
    _ctx.algorithm = check_algorithm(os.environ.get(ALGORITHM_ENV, "auto").strip() or "auto")
    _ctx.engines = []
    _ctx.start = time.time()
    _win.reset()
    for target, emu, name in ((COMM_WORLD, gpu.world, "MPI_COMM_WORLD"),
                              (COMM_SELF, _Solo(f"self{gpu.rank}"), "MPI_COMM_SELF")):
        made = Comm._over(emu, name)
        target._emu, target._engine, target._name = made._emu, made._engine, made._name


def unbind() -> None:
    _ctx.gpu = _ctx.real = None
    _ctx.engines = []
    for target in (COMM_WORLD, COMM_SELF):
        target._emu = target._engine = None


# -- one-sided communication: ranks/mpi4py_layer/win.py -------------------------------------------------
from . import win as _win  # noqa: E402 - win.py builds on the names above
from .win import (ERR_DISP, ERR_GROUP, ERR_LOCKTYPE, ERR_RMA_RANGE, ERR_WIN, GROUP_EMPTY,  # noqa: E402,F401
                  LOCK_EXCLUSIVE, LOCK_SHARED, MODE_NOCHECK, MODE_NOPRECEDE, MODE_NOPUT, MODE_NOSTORE,
                  MODE_NOSUCCEED, WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_CREATE,
                  WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED, WIN_MODEL, WIN_NULL, WIN_SEPARATE, WIN_SIZE, WIN_UNIFIED,
                  ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN, INFO_ENV, INFO_NULL, Errhandler, Group,
                  Info, Win)
