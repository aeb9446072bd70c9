"""The GPU compute model: a roofline over the preset's GPU profile (fabric/profiles.py).

A kernel of F floating-point (or integer) operations in dtype d that moves B bytes to and from HBM
takes max(F / (peak_d x compute_efficiency), B / (hbm x memory_efficiency)) ns of modeled time:
whichever of the math units and the memory is the bottleneck, the other overlaps with it. The
efficiencies stand for what real kernels reach below the datasheet peaks; they are assumptions of
this emulator (FabricConfig keys, see docs/model/compute.md), not measurements.
"""

import math

import numpy as np
import numpy.typing as npt

from .errors import FabricError
from .profiles import COMPUTE_DTYPES, GpuProfile

# numpy dtypes that name a compute dtype (tf32 has none: pass its name); ml_dtypes' 8-bit floats are fp8
_NUMPY_NAMES = {"float64": "float64", "float32": "float32", "float16": "float16", "int8": "int8",
                "bfloat16": "bfloat16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8",
                "float8_e5m2fnuz": "fp8"}


def compute_dtype(dtype: npt.DTypeLike) -> str:
    """The COMPUTE_DTYPES name of `dtype`: one of those names, or a numpy dtype (or type) that is one;
    FabricError otherwise (numpy's own strings such as "f8", which is float64, are not taken)."""
    if isinstance(dtype, str):
        if dtype in COMPUTE_DTYPES:
            return dtype
        name = None
    else:
        try:
            name = np.dtype(dtype).name if dtype is not None else None
        except TypeError:
            name = None
    if name in _NUMPY_NAMES:
        return _NUMPY_NAMES[name]
    raise FabricError(f"dtype {dtype!r}: compute takes one of {', '.join(COMPUTE_DTYPES)} (a name, or the "
                      f"numpy dtype)")


def amount(value: object) -> float | None:
    """`value` as a float if it is a finite, non-negative number (a bool is not); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) and number >= 0 else None


def roofline_ns(profile: GpuProfile, flops: float, nbytes: float, dtype: npt.DTypeLike, compute_efficiency: float,
                memory_efficiency: float) -> float:
    """Modeled ns of a kernel of `flops` operations in `dtype` moving `nbytes` HBM bytes on `profile`."""
    for what, value in (("flops", flops), ("bytes", nbytes)):
        if amount(value) is None:
            raise FabricError(f"compute {what}={value!r}: needs a finite, non-negative number")
    peak: float | None
    if not flops:  # a pure memory kernel needs no math units: any element type moves at HBM speed
        if not (isinstance(dtype, str) and dtype in COMPUTE_DTYPES):
            try:
                np.dtype(dtype)
            except TypeError:
                raise FabricError(f"dtype {dtype!r}: not a numpy dtype") from None
        peak = math.inf
    else:
        name = compute_dtype(dtype)
        peak = profile.peak_tflops.get(name)
        if peak is None:
            raise FabricError(f"compute in {name}: the {profile.description} has no {name} units "
                              f"(it has {', '.join(profile.peak_tflops)})")
    math_ns = float(flops) / (peak * 1e3 * compute_efficiency)  # TFLOP/s = 1e3 operations per ns
    memory_ns = float(nbytes) / (profile.hbm_gbytes_per_s * memory_efficiency)  # GB/s = bytes per ns
    ns = max(math_ns, memory_ns)
    if not math.isfinite(ns):
        raise FabricError(f"compute of flops={flops!r}, bytes={nbytes!r}: takes longer than any modeled clock")
    return ns
