"""The compute model: a roofline over each preset's GPU profile, with its sources and its errors."""

import math

import numpy as np
import pytest

from nvlink_emu.fabric import ConfigError, FabricError, preset
from nvlink_emu.fabric.compute import compute_dtype, roofline_ns
from nvlink_emu.fabric.config import MIN_EFFICIENCY, PRESETS
from nvlink_emu.fabric.profiles import COMPUTE_DTYPES, GPU_PROFILES


def test_every_profile_cites_a_source_and_has_positive_figures():
    for profile in GPU_PROFILES.values():
        assert profile.source and profile.hbm_gbytes_per_s > 0
        assert set(profile.peak_tflops) <= set(COMPUTE_DTYPES)
        assert all(v > 0 for v in profile.peak_tflops.values())


def test_every_preset_names_a_gpu_profile():
    for name in PRESETS:
        assert preset(name).gpu in GPU_PROFILES


def test_a_gemm_is_bound_by_the_math_units_and_a_copy_by_hbm():
    h100 = preset("dgx-h100")  # 989.4 TFLOP/s bf16 dense, 3350 GB/s, efficiencies 0.7 and 0.9
    n = 8192
    flops, moved = 2 * n ** 3, 3 * n * n * 2
    assert h100.compute_ns(flops, moved, "bfloat16") == pytest.approx(flops / (989.4e3 * 0.7))
    assert h100.compute_ns(0, 1 << 30) == pytest.approx((1 << 30) / (3350 * 0.9))
    # same kernel, a tenth of the flops: now HBM bound
    assert h100.compute_ns(flops / 1000, moved, "bfloat16") == pytest.approx(moved / (3350 * 0.9))


def test_generations_differ_by_their_datasheet_ratios():
    flops = 1e12
    a100 = preset("dgx-a100").compute_ns(flops, 0, "bfloat16")
    h100 = preset("dgx-h100").compute_ns(flops, 0, "bfloat16")
    b200 = preset("dgx-b200").compute_ns(flops, 0, "bfloat16")
    assert a100 / h100 == pytest.approx(989.4 / 312) and h100 / b200 == pytest.approx(2250 / 989.4)


def test_efficiencies_come_from_the_config():
    fast = preset("dgx-h100", compute_efficiency=1.0, memory_efficiency=1.0)
    assert fast.compute_ns(989.4e3, 0, "bfloat16") == pytest.approx(1.0)
    assert fast.compute_ns(0, 3350) == pytest.approx(1.0)


def test_numpy_dtypes_and_names():
    assert compute_dtype(np.float32) == "float32" and compute_dtype("tf32") == "tf32"
    assert compute_dtype(np.dtype("int8")) == "int8"
    with pytest.raises(FabricError, match="compute takes one of"):
        compute_dtype("int4")


@pytest.mark.parametrize("flops, nbytes", [(-1, 0), (0, math.nan), (math.inf, 0), ("5", 0), (True, 0)])
def test_bad_work_is_refused(flops, nbytes):
    with pytest.raises(FabricError, match="finite, non-negative"):
        roofline_ns(GPU_PROFILES["h100-sxm"], flops, nbytes, "float32", 1.0, 1.0)


def test_a_dtype_the_gpu_lacks_is_refused_but_memory_only_work_is_not():
    a100 = preset("dgx-a100")
    with pytest.raises(FabricError, match="no fp8 units"):
        a100.compute_ns(1e9, 0, "fp8")
    assert a100.compute_ns(0, 2039, "fp8") == pytest.approx(2039 / (2039 * 0.9))


@pytest.mark.parametrize("key, value", [("gpu", "h200"), ("gpu", 3), ("compute_efficiency", 0),
                                        ("memory_efficiency", 1.5), ("compute_efficiency", math.nan),
                                        ("memory_efficiency", True)])
def test_bad_compute_keys_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=key):
        preset("dgx-h100", **{key: value})


def test_numpy_strings_are_not_compute_dtypes_but_ml_dtypes_fp8_is():
    import ml_dtypes

    assert compute_dtype(ml_dtypes.float8_e4m3fn) == "fp8" and compute_dtype(ml_dtypes.bfloat16) == "bfloat16"
    for bad in ("f8", None, "float8"):  # "f8" is numpy's float64: easy to mistake for fp8
        with pytest.raises(FabricError, match="compute takes one of"):
            compute_dtype(bad)


def test_work_beyond_any_float_or_clock_is_refused():
    h100 = preset("dgx-h100")
    with pytest.raises(FabricError, match="finite, non-negative"):
        h100.compute_ns(10 ** 400, 0)
    # the config takes no efficiency below MIN_EFFICIENCY (test_config), so only a direct call gets this far
    with pytest.raises(FabricError, match="longer than any modeled clock"):
        roofline_ns(GPU_PROFILES["h100-sxm"], 1e300, 0, "float32", 5e-324, 0.9)
    assert math.isfinite(preset("dgx-h100", compute_efficiency=MIN_EFFICIENCY).compute_ns(1e300, 0))


def test_memory_only_work_takes_any_element_type():
    h100 = preset("dgx-h100")
    assert h100.compute_ns(0, 3350, "int64") == pytest.approx(1 / 0.9)
    with pytest.raises(FabricError, match="not a numpy dtype"):
        h100.compute_ns(0, 1, "bogus")
