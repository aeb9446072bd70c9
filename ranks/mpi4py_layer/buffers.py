"""Buffer specifications of the mpi4py layer: what mpi4py accepts as a message, read as numpy."""

import ctypes

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation

from .datatypes import BYTE, Datatype, dtype_datatype, typecode_datatype


class _Constant:
    """A named MPI constant object (IN_PLACE, BOTTOM): compared by identity, printed by name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<mpi4py layer constant {self.name}>"

    def __int__(self):
        return {"BOTTOM": 0, "IN_PLACE": 1}.get(self.name, -1)


IN_PLACE = _Constant("IN_PLACE")
BOTTOM = _Constant("BOTTOM")


def is_in_place(msg) -> bool:
    """mpi4py's rule: None or IN_PLACE as a send buffer means in place."""
    return msg is None or msg is IN_PLACE


# -- buffers ----------------------------------------------------------------------------------------
def as_array(obj, readonly: bool) -> np.ndarray:
    """A flat numpy view of `obj`'s memory (no copy): numpy arrays, array.array, bytes, bytearray,
    memoryview, any buffer-protocol object, DLPack (__dlpack__) and CUDA-array-interface objects
    (host memory only: their addresses are read as this process's memory)."""
    if isinstance(obj, np.ndarray):
        array = obj
    elif hasattr(obj, "__cuda_array_interface__") and not _has_buffer(obj):
        array = _from_cai(obj.__cuda_array_interface__)
    elif hasattr(obj, "__dlpack__") and not _has_buffer(obj):
        array = _from_dlpack(obj)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"message: expecting a buffer, got {type(obj).__name__}") from None
        array = np.asarray(view) if view.nbytes else np.zeros(0, _format_dtype(view.format))
    if not array.flags.c_contiguous:
        raise ValueError("message: the buffer is not contiguous")
    if not readonly and not array.flags.writeable:
        raise BufferError("message: the receive buffer is read-only")
    return array.reshape(-1)


def _has_buffer(obj) -> bool:
    try:
        memoryview(obj)
        return True
    except TypeError:
        return False


def _format_dtype(fmt: str) -> np.dtype:
    try:
        return np.dtype(fmt)
    except TypeError:
        return np.dtype(np.uint8)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_uint), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):  # the DLPack header (dlpack.h, DLTensor)
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # DLDataTypeCode: int, uint, float, complex, bool
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj) -> np.ndarray:
    """The host memory an object's __dlpack__ capsule describes, read from the DLTensor itself (the
    capsule stays unconsumed, so its producer frees it; the memory is the object's, alive meanwhile)."""
    device = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if int(device[0]) not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise ValueError(f"message: a DLPack buffer on device {tuple(device)}: the layer reads host memory only")
    capsule = obj.__dlpack__()
    tensor = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
    kind, bits = _DL_KINDS.get(tensor.dtype.code), tensor.dtype.bits
    if kind == "f" and tensor.dtype.lanes == 2:  # complex as two float lanes, as some producers write it
        kind, bits = "c", 2 * bits
    elif kind is None or tensor.dtype.lanes != 1:
        raise ValueError(f"message: DLPack dtype code {tensor.dtype.code} x{tensor.dtype.lanes} is not a numpy type")
    dtype = np.dtype("?") if kind == "b" else np.dtype(f"{kind}{bits // 8}")
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    count = int(np.prod(shape)) if shape else 1
    if tensor.strides and count > 1:
        expected = [int(np.prod(shape[i + 1:])) for i in range(tensor.ndim)]
        if [tensor.strides[i] for i in range(tensor.ndim) if shape[i] > 1] != \
                [e for e, n in zip(expected, shape) if n > 1]:
            raise ValueError("message: a strided DLPack buffer is not contiguous")
    if count == 0 or not tensor.data:
        return np.zeros(0, dtype)
    memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(tensor.data + tensor.byte_offset)
    return np.frombuffer(memory, dtype)  # type: ignore[call-overload]  # a ctypes array is a buffer; numpy's stubs omit it


def _from_cai(interface: dict) -> np.ndarray:
    """The host memory a CUDA-array-interface dict describes (the fake GPU arrays of mpi4py's tests)."""
    address, readonly = interface["data"]
    dtype = np.dtype(interface["typestr"])
    shape = tuple(interface.get("shape", ()))
    count = int(np.prod(shape)) if shape else 1
    if interface.get("strides") not in (None, ()) and count > 1:
        expected = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
        if tuple(interface["strides"]) != expected:
            raise ValueError("message: a strided __cuda_array_interface__ buffer is not contiguous")
    if count == 0 or not address:
        array = np.zeros(0, dtype)
    else:
        memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
        array = np.frombuffer(memory, dtype)
    if readonly:
        array = array.view()
        array.flags.writeable = False
    return array


def is_buffer_like(obj) -> bool:
    return (isinstance(obj, np.ndarray) or _has_buffer(obj) or hasattr(obj, "__dlpack__")
            or hasattr(obj, "__cuda_array_interface__"))


def as_datatype(obj) -> Datatype:
    if isinstance(obj, Datatype):
        return obj
    if isinstance(obj, str):
        return typecode_datatype(obj)
    raise TypeError(f"message: expecting a Datatype, got {obj!r}")


class Message:
    """One buffer of a call: `array` (the user's memory, flat, from the message's displacement on),
    `count` items of `datatype`; for a vector message, `counts` and `displs` (in items) per block."""

    def __init__(self, array, count, datatype, counts=None, displs=None):
        self.array, self.count, self.datatype = array, count, datatype
        self.counts, self.displs = counts, displs

    @property
    def base(self) -> np.dtype:
        return self.datatype.base

    def _base_view(self) -> np.ndarray:
        raw = self.array.view(np.uint8) if self.array.dtype != np.uint8 else self.array
        usable = raw.size - raw.size % self.base.itemsize
        return raw[:usable].view(self.base)

    def _index(self, start_items: int, count: int):
        dt = self.datatype
        if dt.contiguous:
            first = start_items * dt._extent
            return slice(first, first + count * dt._extent)
        return dt._items(start_items * dt._extent + np.arange(count) * dt._extent)

    def _check(self, index, view):
        last = index.stop if isinstance(index, slice) else (int(index.max()) + 1 if index.size else 0)
        if last > view.size:
            raise ValueError(f"message: {last} elements of {self.base} needed, the buffer holds {view.size}")

    def pack(self, start_items: int = 0, count: int | None = None) -> np.ndarray:
        """A contiguous copy of `count` items (default self.count) from item `start_items` on, in base elements."""
        count = self.count if count is None else count
        view, index = self._base_view(), self._index(start_items, count)
        self._check(index, view)
        return np.array(view[index], copy=True)

    def unpack(self, values: np.ndarray, start_items: int = 0, count: int | None = None) -> None:
        """Write `values` (base elements) into `count` items from item `start_items` on."""
        count = self.count if count is None else count
        view, index = self._base_view(), self._index(start_items, count)
        self._check(index, view)
        view[index] = values

    @property
    def elements(self) -> int:
        """Base elements per item."""
        return len(self.datatype.offsets)


def _null_message() -> Message:
    return Message(np.zeros(0, np.uint8), 0, BYTE)


def _basic(buf, datatype, readonly: bool) -> tuple[np.ndarray, Datatype]:
    if buf is BOTTOM:
        raise UnsupportedOperation("message at MPI.BOTTOM (absolute addresses): the mpi4py layer takes buffers")
    if buf is None:
        array = np.zeros(0, np.uint8)
    else:
        array = as_array(buf, readonly)
    if datatype is None:
        datatype = dtype_datatype(array.dtype)
    else:
        datatype = as_datatype(datatype)
    return array, datatype


def _extent_bytes(datatype: Datatype, what: str) -> int:
    if datatype.base is None:
        raise ValueError(f"message: cannot {what}, datatype is null")
    extent = datatype.extent
    if extent <= 0:
        raise ValueError(f"message: cannot {what}, datatype extent {extent}")
    return extent


def _spec(msg, pairs) -> tuple:
    """(buf, count, displ, datatype) of a message list: [buf, datatype], [buf, count], [buf, (count,
    displ)], [buf, count, datatype], [buf, (count, displ), datatype], [buf, count, displ, datatype];
    `pairs`: the types that hold (count, displ) (mpi4py takes a list there for simple messages only)."""
    count = displ = datatype = None
    if isinstance(msg, (list, tuple)):
        if len(msg) == 2:
            buf, count = msg
            if isinstance(count, (Datatype, str)):
                count, datatype = None, count
            elif isinstance(count, pairs):
                count, displ = count
        elif len(msg) == 3:
            buf, count, datatype = msg
            if isinstance(count, pairs):
                count, displ = count
        elif len(msg) == 4:
            buf, count, displ, datatype = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
    elif msg is None or is_buffer_like(msg) or msg is BOTTOM:
        buf = msg
    else:
        raise TypeError("message: expecting buffer or list/tuple")
    return buf, count, displ, datatype


def _entries(raw: np.ndarray, datatype: Datatype) -> int:
    """How many items of `datatype` the bytes `raw` hold (ValueError if not a whole number)."""
    if not raw.size:
        return 0
    extent = _extent_bytes(datatype, "infer count")
    if raw.size % extent:
        raise ValueError(f"message: cannot infer count, buffer length {raw.size} is not a multiple of "
                         f"datatype extent {extent}")
    return raw.size // extent


def message_simple(msg, readonly: bool, null: bool = False, blocks: int = 0) -> Message:
    """mpi4py's message_simple (forms as _spec). null: the peer is PROC_NULL (or the buffer is not
    used on this rank): an empty message. blocks >= 2: the count inferred is per block."""
    if null:
        return _null_message()
    buf, count, displ, datatype = _spec(msg, (list, tuple))
    array, datatype = _basic(buf, datatype, readonly)
    raw = array.view(np.uint8) if array.size else np.zeros(0, np.uint8)
    if displ is not None:
        displ = int(displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        if displ:
            offset = displ * _extent_bytes(datatype, "handle displacement")
            if offset > raw.size:
                raise ValueError(f"message: displacement {displ} out of bounds")
            raw = raw[offset:]
    if count is not None:
        count = int(count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count > 0 and buf is None:
            raise ValueError(f"message: buffer is None but count is {count}")
    else:
        count = _entries(raw, datatype)
        if blocks >= 2:
            if count % blocks:
                raise ValueError(f"message: cannot infer count, number of entries {count} is not a multiple of "
                                 f"required number of blocks {blocks}")
            count //= blocks
    return Message(raw, count, datatype)


def message_vector(msg, readonly: bool, blocks: int, null: bool = False) -> Message:
    """mpi4py's message_vector (forms as _spec, with counts and displs per block): counts an int
    (every block) or a sequence, displs an int (a stride) or a sequence, in items; no counts: the
    buffer split as evenly as possible."""
    if null:
        message = _null_message()
        message.counts, message.displs = [0] * blocks, [0] * blocks
        return message
    buf, counts, displs, datatype = _spec(msg, tuple)
    array, datatype = _basic(buf, datatype, readonly)
    raw = array.view(np.uint8) if array.size else np.zeros(0, np.uint8)
    if counts is None:
        total = _entries(raw, datatype)
        counts = [total // blocks + (total % blocks > i) for i in range(blocks)]
    elif isinstance(counts, (int, np.integer)):
        counts = [int(counts)] * blocks
    else:
        counts = [int(c) for c in counts]
        if len(counts) < blocks:
            raise ValueError(f"message: expecting {blocks} counts, got {len(counts)}")
        counts = counts[:blocks]
    if displs is None:
        displs = [sum(counts[:i]) for i in range(blocks)]
    elif isinstance(displs, (int, np.integer)):
        displs = [int(displs) * i for i in range(blocks)]
    else:
        displs = [int(d) for d in displs]
        if len(displs) < blocks:
            raise ValueError(f"message: expecting {blocks} displacements, got {len(displs)}")
        displs = displs[:blocks]
    return Message(raw, None, datatype, counts, displs)


# -- memory (what Alloc_mem and Win.tomemory return, and its address) ------------------------------------
class Memory(np.ndarray):
    """Bytes as mpi4py's MPI.buffer (what Alloc_mem and Win.tomemory return): a uint8 array, format "B",
    never false; `_block`: the gpu.alloc array it is (Alloc_mem), for Free_mem."""

    _block: np.ndarray | None

    @classmethod
    def over(cls, array: np.ndarray, block=None) -> "Memory":
        memory = array.reshape(-1).view(np.uint8).view(cls)
        memory._block = block
        return memory

    def __bool__(self):
        return True

    format = property(lambda self: "B")
    address = property(lambda self: int(self.__array_interface__["data"][0]))


def Get_address(location) -> int:
    """The address of a buffer's memory (WIN_BASE compares with it; an empty buffer's is 0); messages at
    MPI.BOTTOM stay unsupported."""
    array = as_array(location, readonly=True)
    return int(array.__array_interface__["data"][0]) if array.nbytes else 0
