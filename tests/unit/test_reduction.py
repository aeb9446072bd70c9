"""fabric.reduction: blocks, chunks, dtype/op checks, the switch accumulator and the reference fold."""

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.reduction import (BFLOAT16, DTYPES, OPS, blocks, check_dtype, check_op, chunks, combine, dtype_name,
                              finish, reduce_in_order, switch_accumulator)

BF16 = np.dtype(ml_dtypes.bfloat16)


# -- blocks ---------------------------------------------------------------------------------------------

def assert_partition(ranges, count, parts):
    """`ranges` are `parts` contiguous blocks covering [0, count) in order, sizes within one of each other."""
    assert len(ranges) == parts
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    for (_, stop), (start, _) in zip(ranges, ranges[1:]):
        assert stop == start
    sizes = [b - a for a, b in ranges]
    assert all(s >= 0 for s in sizes)
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger blocks come first


def test_blocks_zero_count():
    assert blocks(0, 4) == [(0, 0)] * 4


def test_blocks_fewer_elements_than_parts():
    assert blocks(3, 5) == [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]


def test_blocks_divisible():
    assert blocks(12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]


def test_blocks_not_divisible():
    # 10 = 3 + 3 + 2 + 2: the first 10 % 4 = 2 blocks get one element more
    assert blocks(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_blocks_one_part_is_everything():
    assert blocks(7, 1) == [(0, 7)]


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 1023])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 8, 16])
def test_blocks_partition_any_count(count, parts):
    ranges = blocks(count, parts)
    assert_partition(ranges, count, parts)
    base, extra = divmod(count, parts)
    assert [b - a for a, b in ranges] == [base + 1] * extra + [base] * (parts - extra)


# -- chunks ---------------------------------------------------------------------------------------------

def test_chunks_exact_and_remainder():
    assert chunks(0, 8, 4) == [(0, 4), (4, 8)]
    assert chunks(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunks(5, 12, 3) == [(5, 8), (8, 11), (11, 12)]


def test_chunks_step_larger_than_range():
    assert chunks(3, 5, 100) == [(3, 5)]


def test_chunks_empty_range():
    assert chunks(0, 0, 4) == []
    assert chunks(7, 7, 1) == []


def test_chunks_cover_blocks():
    for a, b in blocks(1001, 3):
        spans = chunks(a, b, 64)
        assert spans[0][0] == a and spans[-1][1] == b
        assert all(hi - lo == 64 for lo, hi in spans[:-1]) and 0 < spans[-1][1] - spans[-1][0] <= 64


# -- dtypes and ops ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "int32", "int64"])
def test_check_dtype_accepts_supported(name):
    expected = BF16 if name == "bfloat16" else np.dtype(name)
    assert check_dtype(name) == expected
    assert check_dtype(expected) == expected
    assert dtype_name(expected) == name


def test_supported_set_is_the_documented_one():
    assert set(DTYPES) == {"float16", "bfloat16", "float32", "float64", "int32", "int64"}
    assert OPS == ("sum", "avg", "max", "min", "prod")
    assert BFLOAT16 == BF16


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint32", "uint64", "bool", "complex64", "complex128",
                                   ">f4"])
def test_check_dtype_rejects_unsupported(dtype):
    with pytest.raises(FabricError, match="collectives support float16") as info:
        check_dtype(dtype)
    assert "bfloat16" in str(info.value)


def test_check_dtype_unknown_name_is_fabric_error():
    with pytest.raises(FabricError, match="bogus"):
        check_dtype("bogus")


@pytest.mark.parametrize("op", OPS)
def test_check_op_accepts(op):
    assert check_op(op) == op


@pytest.mark.parametrize("op", ["SUM", "mean", "", "band", None])
def test_check_op_rejects(op):
    with pytest.raises(FabricError, match=r"supported ops are sum, avg, max, min, prod"):
        check_op(op)


def test_switch_accumulator():
    assert switch_accumulator(np.dtype(np.float16)) == np.dtype(np.float32)
    assert switch_accumulator(BF16) == np.dtype(np.float32)
    for name in ("float32", "float64", "int32", "int64"):
        assert switch_accumulator(np.dtype(name)) == np.dtype(name)


# -- reduce_in_order: each op, each dtype ---------------------------------------------------------------------

def test_sum_max_min_prod_float32():
    a = np.array([1.5, -2.0, 3.0], np.float32)
    b = np.array([0.5, 4.0, -3.0], np.float32)
    c = np.array([2.0, -1.0, 0.25], np.float32)
    np.testing.assert_array_equal(reduce_in_order([a, b, c], "sum"), np.array([4.0, 1.0, 0.25], np.float32))
    np.testing.assert_array_equal(reduce_in_order([a, b, c], "max"), np.array([2.0, 4.0, 3.0], np.float32))
    np.testing.assert_array_equal(reduce_in_order([a, b, c], "min"), np.array([0.5, -2.0, -3.0], np.float32))
    np.testing.assert_array_equal(reduce_in_order([a, b, c], "prod"), np.array([1.5, 8.0, -2.25], np.float32))
    for op in OPS:
        assert reduce_in_order([a, b, c], op).dtype == np.float32


def test_avg_float_divides_by_count():
    arrays = [np.array([1.0, 2.0], np.float64), np.array([2.0, 2.0], np.float64),
              np.array([3.0, 5.0], np.float64)]
    out = reduce_in_order(arrays, "avg")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.array([2.0, 3.0]))


def test_avg_integer_is_floor_division():
    arrays = [np.array([1, 2, -3, -7, 5], np.int32), np.array([2, 2, -4, 0, 5], np.int32)]
    out = reduce_in_order(arrays, "avg")
    assert out.dtype == np.int32
    # sums 3, 4, -7, -7, 10 -> floor(/2): 1, 2, -4 (floor, not truncation toward 0), -4, 5
    np.testing.assert_array_equal(out, np.array([1, 2, -4, -4, 5], np.int32))


def test_avg_int64_three_members():
    arrays = [np.array([10, -10], np.int64), np.array([0, 0], np.int64), np.array([1, 0], np.int64)]
    np.testing.assert_array_equal(reduce_in_order(arrays, "avg"), np.array([3, -4], np.int64))


def test_integer_sum_wraps_around():
    big = np.iinfo(np.int32).max
    out = reduce_in_order([np.array([big, np.iinfo(np.int32).min], np.int32), np.array([1, -1], np.int32)], "sum")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.array([np.iinfo(np.int32).min, big], np.int32))


def test_integer_prod_wraps_around():
    x = np.array([1 << 20], np.int32)
    out = reduce_in_order([x, x], "prod")  # 2**40 mod 2**32 = 0
    np.testing.assert_array_equal(out, np.array([0], np.int32))
    y = np.array([1 << 62], np.int64)
    out64 = reduce_in_order([y, np.array([2], np.int64)], "prod")  # 2**63 wraps to the int64 minimum
    np.testing.assert_array_equal(out64, np.array([np.iinfo(np.int64).min], np.int64))


def test_integer_avg_of_wrapped_sum():
    big = np.iinfo(np.int32).max
    out = reduce_in_order([np.array([big], np.int32), np.array([big], np.int32)], "avg")
    # the sum wraps to -2 in int32 first, then floors to -1: the hardware does not widen integers
    np.testing.assert_array_equal(out, np.array([-1], np.int32))


def test_max_min_int64_extremes():
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    a, b = np.array([lo, 0, hi], np.int64), np.array([hi, -1, lo], np.int64)
    np.testing.assert_array_equal(reduce_in_order([a, b], "max"), np.array([hi, 0, hi], np.int64))
    np.testing.assert_array_equal(reduce_in_order([a, b], "min"), np.array([lo, -1, lo], np.int64))


def test_float_overflow_is_inf_without_warning():
    big = np.array([6e4], np.float16)
    with np.errstate(all="raise"):
        out = reduce_in_order([big, big], "sum")
    assert out.dtype == np.float16 and np.isinf(out[0])


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_sixteen_bit_accumulated_wide_rounded_once(dtype):
    # float16: 2048 + 1 + 1 + 1 rounds back to 2048 at every float16 step (spacing 2 there),
    # but is 2051 in float32, which rounds once to 2052 (ties to even); bfloat16 the same at 256.
    top = 2048.0 if dtype == np.float16 else 256.0
    arrays = [np.array([top], dtype)] + [np.array([1.0], dtype)] * 3
    narrow = reduce_in_order(arrays, "sum")
    wide = reduce_in_order(arrays, "sum", accumulate=np.float32)
    assert narrow.dtype == wide.dtype == np.dtype(dtype)
    assert float(narrow[0]) == top
    assert float(wide[0]) == top + 4
    avg = reduce_in_order(arrays, "avg", accumulate=np.float32)
    assert avg.dtype == np.dtype(dtype)
    assert avg[0] == np.array([(top + 3) / 4], np.float32).astype(dtype)[0]


def test_out_dtype_and_accumulate():
    arrays = [np.array([1, 2], np.int32), np.array([3, 4], np.int32)]
    out = reduce_in_order(arrays, "sum", accumulate=np.int64, out_dtype=np.int64)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [4, 6])


def test_single_contribution_is_itself():
    a = np.array([1.25, -3.5], np.float32)
    for op in ("sum", "max", "min", "prod", "avg"):
        out = reduce_in_order([a], op)
        np.testing.assert_array_equal(out, a)
        assert out is not a


def test_inputs_untouched():
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
    reduce_in_order([a, b], "sum")
    np.testing.assert_array_equal(a, [1.0, 2.0])
    np.testing.assert_array_equal(b, [3.0, 4.0])


def test_combine_and_finish_in_place():
    acc = np.array([1, 5], np.int64)
    combine("max", acc, np.array([3, 2], np.int64))
    np.testing.assert_array_equal(acc, [3, 5])
    out = np.empty(2, np.int64)
    finish("avg", np.array([7, -7], np.int64), 2, out)
    np.testing.assert_array_equal(out, [3, -4])
    out32 = np.empty(2, np.float16)
    finish("sum", np.array([1.5, 2.5], np.float32), 4, out32)
    np.testing.assert_array_equal(out32, np.array([1.5, 2.5], np.float16))


def test_order_matters_and_is_left_to_right():
    # ((1e8 + 1) - 1e8) + 1 = 1 in float32 (1e8 + 1 rounds to 1e8); the reversed fold gives 0
    values = [np.array([x], np.float32) for x in (1e8, 1.0, -1e8, 1.0)]
    assert reduce_in_order(values, "sum")[0] == np.float32(1.0)
    assert reduce_in_order(values[::-1], "sum")[0] == np.float32(0.0)


# -- property: reduce_in_order is a plain numpy left fold ------------------------------------------------------

_NUMPY_OP = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def numpy_left_fold(arrays, op, acc_dtype, out_dtype):
    with np.errstate(all="ignore"):
        acc = functools.reduce(lambda x, y: _NUMPY_OP[op](x, y).astype(acc_dtype),
                               [a.astype(acc_dtype) for a in arrays])
        if op == "avg":
            acc = acc // len(arrays) if acc.dtype.kind == "i" else (acc / acc_dtype.type(len(arrays))).astype(acc_dtype)
        return acc.astype(out_dtype)


@st.composite
def contributions(draw):
    dtype = draw(st.sampled_from(["int32", "int64", "float16", "float32", "float64"]))
    dtype = np.dtype(dtype)
    members = draw(st.integers(1, 5))
    size = draw(st.integers(0, 6))
    if dtype.kind == "i":
        elements = hnp.from_dtype(dtype)
    else:
        elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    arrays = [draw(hnp.arrays(dtype, size, elements=elements)) for _ in range(members)]
    return dtype, arrays


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=80, deadline=None)
@given(contributions(), st.sampled_from(OPS))
def test_reduce_in_order_is_numpy_left_fold(case, op):
    dtype, arrays = case
    got = reduce_in_order(arrays, op)
    assert bitwise_equal(got, numpy_left_fold(arrays, op, dtype, dtype))


@settings(max_examples=40, deadline=None)
@given(contributions(), st.sampled_from(OPS))
def test_reduce_in_order_switch_accumulator_is_numpy_left_fold(case, op):
    dtype, arrays = case
    acc = switch_accumulator(dtype)
    got = reduce_in_order(arrays, op, accumulate=acc)
    assert bitwise_equal(got, numpy_left_fold(arrays, op, acc, dtype))
