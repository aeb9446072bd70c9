"""Reduction ops, dtypes, block partitioning, and the fixed combine orders every algorithm documents.

Determinism: every reduction combines contributions in a fixed order that depends only on the
algorithm and the member ranks, never on arrival order, so results are bitwise identical run to run
and equal the numpy reference computed in the same order (`reduce_in_order`).
"""

import numpy as np

from .errors import FabricError

try:  # bfloat16 for numpy, from the ml_dtypes package
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BFLOAT16 = None

OPS = ("sum", "avg", "max", "min", "prod")
DTYPES = {name: np.dtype(name) for name in ("float16", "float32", "float64", "int32", "int64")}
if BFLOAT16 is not None:
    DTYPES["bfloat16"] = BFLOAT16
_COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def check_dtype(dtype) -> np.dtype:
    """The numpy dtype for a name or dtype the collectives support; FabricError otherwise."""
    try:
        dtype = np.dtype(DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    except TypeError:
        raise FabricError(f"dtype {dtype!r}: collectives support {', '.join(DTYPES)}") from None
    if dtype not in DTYPES.values():
        raise FabricError(f"dtype {dtype}: collectives support {', '.join(DTYPES)}")
    return dtype


def check_op(op: str) -> str:
    if op not in OPS:
        raise FabricError(f"op {op!r}: supported ops are {', '.join(OPS)}")
    return op


def dtype_name(dtype: np.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def switch_accumulator(dtype: np.dtype) -> np.dtype:
    """What the switch accumulates in: float16 and bfloat16 in float32 (NVSwitch sums 16-bit floats
    wider and rounds once at the end); every other dtype in itself."""
    return np.dtype(np.float32) if dtype in (np.dtype(np.float16), BFLOAT16) else dtype


def combine(op: str, acc: np.ndarray, x: np.ndarray) -> None:
    """acc <- acc (op) x, in place, in acc's dtype (integers wrap, like the hardware)."""
    with np.errstate(over="ignore", invalid="ignore"):
        _COMBINE[op](acc, x, out=acc)


def finish(op: str, acc: np.ndarray, members: int, out: np.ndarray) -> None:
    """out <- the final value of acc: avg divides the sum by the member count (floor for integers)."""
    if op == "avg":
        if acc.dtype.kind in "iu":
            acc = acc // members
        else:
            acc = acc / np.asarray(members, acc.dtype)
    out[...] = acc.astype(out.dtype, copy=False)


def reduce_in_order(arrays, op: str, accumulate: np.dtype | None = None, out_dtype=None) -> np.ndarray:
    """The reference: fold `arrays` left to right with `op` in `accumulate` dtype, then finish (avg)."""
    arrays = list(arrays)
    out_dtype = np.dtype(out_dtype or arrays[0].dtype)
    acc = arrays[0].astype(accumulate or out_dtype, copy=True)
    for x in arrays[1:]:
        combine(op, acc, x.astype(acc.dtype, copy=False))
    out = np.empty(acc.shape, out_dtype)
    finish(op, acc, len(arrays), out)
    return out


def blocks(count: int, parts: int) -> list[tuple[int, int]]:
    """(start, stop) element ranges splitting `count` into `parts` blocks: the first count % parts
    blocks get one element more, so any count works, including 0 and counts smaller than parts."""
    base, extra = divmod(count, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def chunks(start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """(start, stop) sub-ranges of at most `step` elements covering [start, stop); none if empty."""
    return [(s, min(s + step, stop)) for s in range(start, stop, step)]
