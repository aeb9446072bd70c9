"""Control objects on the wire (allgather_object, the collectives' call checks): a typed msgpack
encoding of plain values, tuples, sets, Handles, numpy arrays and scalars and fabric errors.

Unlike pickle, decoding runs no code and builds nothing larger than the bytes it was given (an
array's bytes travel whole; every element of a container is encoded), so a peer's message can
cost a receiver no more than its length.
"""

from typing import Any, cast

import msgpack
import numpy as np

from . import errors
from .addressing import Handle
from .errors import FabricError, ProtocolError

MAX_CONTROL_BYTES = 16 << 20  # the longest control message a GPU takes (16 MiB)
_TUPLE, _SET, _FROZENSET, _HANDLE, _ARRAY, _SCALAR, _ERROR, _COMPLEX, _BIGINT = range(1, 10)


def _encode(obj: object) -> "msgpack.ExtType":
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _pack(list(obj)))
    if isinstance(obj, (set, frozenset)):
        return msgpack.ExtType(_FROZENSET if isinstance(obj, frozenset) else _SET, _pack(list(obj)))
    if isinstance(obj, Handle):
        return msgpack.ExtType(_HANDLE, _pack([obj.network_address, obj.address, obj.size_bytes, obj.owner]))
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("numpy arrays of Python objects")
        return msgpack.ExtType(_ARRAY, _pack([obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()]))
    if isinstance(obj, np.generic):
        if obj.dtype.hasobject:
            raise TypeError("numpy object scalars")
        return msgpack.ExtType(_SCALAR, _pack([obj.dtype.str, obj.tobytes()]))
    if isinstance(obj, FabricError):
        return msgpack.ExtType(_ERROR, _pack([type(obj).__name__, str(obj)]))
    if isinstance(obj, complex):
        return msgpack.ExtType(_COMPLEX, _pack([obj.real, obj.imag]))
    if isinstance(obj, int) and not isinstance(obj, bool):  # past msgpack's 64 bits
        return msgpack.ExtType(_BIGINT, str(obj).encode())
    raise TypeError(f"{type(obj).__name__}")


def _pack(obj: object) -> bytes:
    return cast(bytes, msgpack.packb(obj, default=_encode, use_bin_type=True, strict_types=True))


def _dtype(text: object) -> np.dtype:
    dtype = np.dtype(text if isinstance(text, str) else "?invalid")
    if dtype.hasobject:
        raise ValueError("numpy object dtype")
    return dtype


def _decode(code: int, data: bytes) -> Any:  # a control object
    if code == _BIGINT:
        return int(data.decode())
    value = _unpack(data)
    if code == _TUPLE:
        return tuple(value)
    if code == _SET:
        return set(value)
    if code == _FROZENSET:
        return frozenset(value)
    if code == _HANDLE:
        return Handle(*value)
    if code == _ARRAY:
        dtype_text, shape, raw = value
        dtype = _dtype(dtype_text)
        if not all(type(n) is int and n >= 0 for n in shape) or int(np.prod(shape, dtype=np.int64)) * \
                dtype.itemsize != len(raw):
            raise ValueError(f"array of shape {shape} and dtype {dtype} in {len(raw)} bytes")
        return np.frombuffer(raw, dtype).reshape(shape).copy()
    if code == _SCALAR:
        dtype = _dtype(value[0])
        if len(value[1]) != dtype.itemsize:
            raise ValueError(f"{dtype} scalar in {len(value[1])} bytes")
        return np.frombuffer(value[1], dtype)[0]
    if code == _ERROR:
        cls = getattr(errors, value[0], None) if isinstance(value[0], str) else None
        if not (isinstance(cls, type) and issubclass(cls, FabricError)):
            cls = FabricError
        return cls(str(value[1]))
    if code == _COMPLEX:
        return complex(*value)
    raise ValueError(f"unknown extension type {code}")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_decode, raw=False, strict_map_key=False, use_list=True)


def encode(obj: object) -> bytes:
    """`obj` on the wire; FabricError naming the type if it is not a control object."""
    try:
        return _pack(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FabricError(f"control objects are plain values (None, bool, int, float, str, bytes, list, tuple, "
                          f"dict, set), Handles, numpy arrays and scalars and fabric errors; got {exc}") from None


def decode(data: bytes) -> Any:  # a control object
    """The object `data` encodes; ProtocolError for anything else (it builds nothing larger than `data`)."""
    if len(data) > MAX_CONTROL_BYTES:
        raise ProtocolError(f"control message of {len(data)} bytes, more than {MAX_CONTROL_BYTES}")
    try:
        return _unpack(data)
    except Exception as exc:  # noqa: BLE001 - whatever a peer sent, it is refused, never run
        raise ProtocolError(f"undecodable control message ({len(data)} bytes): {type(exc).__name__}: {exc}") from None
