"""fabric.reduction: blocks, chunks, dtype/op checks, the switch accumulator and the reference fold."""

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.reduction import (BFLOAT16, DTYPES, OPS, blocks, check_dtype, check_movable, check_op, chunks,
                              combine, dtype_itemsize, dtype_name,
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

REDUCTION_NAMES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
                   "float64", "bfloat16"]


@pytest.mark.parametrize("name", REDUCTION_NAMES)
def test_check_dtype_accepts_supported(name):
    expected = BF16 if name == "bfloat16" else np.dtype(name)
    assert check_dtype(name) == expected
    assert check_dtype(expected) == expected
    assert dtype_name(expected) == name
    assert dtype_itemsize(name) == expected.itemsize


def test_supported_set_is_the_documented_one():
    assert list(DTYPES) == REDUCTION_NAMES
    assert OPS == ("sum", "avg", "max", "min", "prod")
    assert BFLOAT16 == BF16


@pytest.mark.parametrize("dtype", ["bool", "complex64", "complex128", ">f4", ">i4", "float128", "S4", "datetime64[ns]",
                                   np.dtype([("a", "<i4")])])
def test_check_dtype_rejects_what_has_no_reduction(dtype):
    with pytest.raises(FabricError, match="reductions support int8, uint8, .*bfloat16; data-movement collectives "
                                          r"\(allgather, .*\) take any fixed-size dtype") as info:
        check_dtype(np.dtype(dtype))
    if np.dtype(dtype).kind == "b":
        assert "bool has no sum or average (reduce uint8 with max for a logical or" in str(info.value)
    if np.dtype(dtype).kind == "c":
        assert "complex has no order for max and min (reduce its real view" in str(info.value)


@pytest.mark.parametrize("name", ["bogus", "float", "int", "f4", "<f4", "bool", "complex64", "(1000000000,)f8", "O",
                                  "V8", "", "float32 ", "x" * 10000])
def test_check_dtype_looks_names_up_and_never_parses_them(name):
    # the switch takes dtype names from GPUs it does not trust: only DTYPES' own names pass
    with pytest.raises(FabricError, match="reductions support") as info:
        check_dtype(name)
    assert len(str(info.value)) < 1000


MOVABLE = [np.dtype(d) for d in ("bool", "int8", "uint8", "uint16", "int16", "uint32", "uint64", "complex64",
                                 "complex128", ">f4", "S7", "U3", "datetime64[ns]", "timedelta64[s]", "V8", "float32")] + \
          [BF16, np.dtype([("id", "<u4"), ("w", "<f8")]), np.dtype([(f"x{i}", "<f8") for i in range(60)])]


@pytest.mark.parametrize("dtype", MOVABLE, ids=str)
def test_data_movement_takes_every_fixed_size_dtype_and_names_it_readably(dtype):
    assert check_movable(dtype) == dtype
    name = dtype_name(dtype)
    assert dtype_itemsize(name) == dtype.itemsize
    assert len(name) <= 200
    if dtype.fields is None:
        assert np.dtype(name) == dtype  # a simple dtype's name is numpy's own


def test_dtype_names_tell_different_dtypes_apart():
    names = [dtype_name(d) for d in MOVABLE]
    assert len(set(names)) == len(names)
    assert dtype_name(np.dtype([("id", "<u4"), ("w", "<f8")])) == "V12:[('id', '<u4'), ('w', '<f8')]"
    assert dtype_name(np.dtype([("a", "<f8"), ("b", "<u4"), ("c", "<u4")])) != dtype_name(
        np.dtype([("a", "<f8"), ("b", "<f4"), ("c", "<u4")]))


@pytest.mark.parametrize("dtype", [object, np.dtype("V0"), np.dtype([("o", object)])])
def test_data_movement_refuses_objects_and_empty_elements(dtype):
    with pytest.raises(FabricError, match="fixed-size binary elements"):
        check_movable(dtype)


@pytest.mark.parametrize("name", ["bogus", "O", "(3,)f8", "V12", "V:", "Vx:", "float32 ", 7, None, "a" * 300])
def test_dtype_itemsize_refuses_names_dtype_name_never_gives(name):
    if name == "V12":  # numpy's own simple name for 12 raw bytes is one dtype_name gives
        assert dtype_itemsize(name) == 12
        return
    with pytest.raises(FabricError, match="not one dtype_name gives"):
        dtype_itemsize(name)


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16", "uint32", "uint64"])
def test_integer_widths_wrap_like_the_hardware_and_avg_floors(name):
    dtype = np.dtype(name)
    info = np.iinfo(dtype)
    top = np.array([info.max, info.max, 3], dtype)
    one = np.array([1, info.max, 4], dtype)
    total = reduce_in_order([top, one], "sum")
    assert total.dtype == dtype
    expect = ((top.astype(object) + one.astype(object) - info.min) % (info.max - info.min + 1) + info.min)
    assert [int(v) for v in total] == [int(v) for v in expect]  # modular, in the dtype's width
    assert [int(v) for v in reduce_in_order([top, one], "max")] == [info.max, info.max, 4]
    assert [int(v) for v in reduce_in_order([top, one], "min")] == [1, info.max, 3]
    small = [np.array([7, 1], dtype), np.array([2, 1], dtype)]
    assert [int(v) for v in reduce_in_order(small, "avg")] == [4, 1]  # (7 + 2) // 2
    assert [int(v) for v in reduce_in_order(small, "prod")] == [14, 1]


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
