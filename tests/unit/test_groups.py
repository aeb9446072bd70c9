"""fabric.groups.GroupTable: group lifecycle, the 128-group limit, in-switch reductions in member order."""

import functools

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric.errors import AccessViolation, CollectiveMismatch, FabricError, ResourceExhausted
from nvlink_emu.fabric.groups import MAX_GROUPS, GroupTable
from nvlink_emu.fabric.reduction import reduce_in_order

BF16 = np.dtype(ml_dtypes.bfloat16)


def as_bytes(values, dtype):
    """What the switch receives: the uint8 bytes of a contribution."""
    return np.ascontiguousarray(np.asarray(values, dtype)).view(np.uint8)


def ready_group(table, members=(0, 1, 2, 3), requester=None):
    gid = table.create(tuple(members), members[0] if requester is None else requester)
    for gpu in members:
        table.bind(gid, gpu)
    return gid


def contribute_all(table, gid, slot, order, arrays, op, dtype_name):
    """Contribute arrays[gpu] from each GPU in `order`; returns the results (None until the last)."""
    done = [table.contribute(gid, slot, gpu, op, dtype_name, as_bytes(arrays[gpu], dtype_name)) for gpu in order]
    return [None if d is None else d[0] for d in done]


# -- lifecycle ----------------------------------------------------------------------------------------------

def test_create_bind_release():
    t = GroupTable()
    gid = t.create((0, 1, 2), 1)
    assert gid == 1
    g = t.groups[gid]
    assert g.members == (0, 1, 2) and g.bound == set() and not g.ready
    t.bind(gid, 0)
    t.bind(gid, 2)
    assert not g.ready and g.bound == {0, 2}
    t.bind(gid, 2)  # binding twice is harmless
    t.bind(gid, 1)
    assert g.ready
    assert (t.created, t.released) == (1, 0)
    t.release(gid, 2)
    assert gid not in t.groups
    assert (t.created, t.released) == (1, 1)


def test_group_ids_are_not_reused():
    t = GroupTable()
    first = t.create((0, 1), 0)
    t.release(first, 0)
    second = t.create((0, 1), 0)
    assert second != first
    with pytest.raises(AccessViolation, match=f"no live group {first}"):
        t.bind(first, 0)


def test_members_keep_their_given_order():
    t = GroupTable()
    gid = t.create((3, 0, 2), 0)
    assert t.groups[gid].members == (3, 0, 2)


@pytest.mark.parametrize("members, requester", [((0, 1), 2), ((0, 1, 1), 0), ((), 0)])
def test_create_needs_distinct_members_including_requester(members, requester):
    t = GroupTable()
    with pytest.raises(FabricError, match=f"GPU {requester}: group members"):
        t.create(members, requester)
    assert t.groups == {} and t.created == 0


def test_bind_by_non_member_refused():
    t = GroupTable()
    gid = t.create((0, 1), 0)
    with pytest.raises(AccessViolation, match=r"bind by GPU 2: not a member of group 1 \(members \[0, 1\]\)"):
        t.bind(gid, 2)
    assert t.groups[gid].bound == set()


def test_release_by_non_member_refused():
    t = GroupTable()
    gid = t.create((0, 1), 0)
    with pytest.raises(AccessViolation, match="release by GPU 3: not a member"):
        t.release(gid, 3)
    assert gid in t.groups and t.released == 0


@pytest.mark.parametrize("action", ["bind", "release"])
def test_unknown_group_refused(action):
    t = GroupTable()
    with pytest.raises(AccessViolation, match=f"{action} by GPU 0: no live group 42"):
        getattr(t, action)(42, 0)


def test_limit_is_128_and_release_frees_a_slot():
    t = GroupTable()
    assert t.limit == MAX_GROUPS == 128
    ids = [t.create((0, 1), 0) for _ in range(128)]
    assert len(set(ids)) == 128 and len(t.groups) == 128
    with pytest.raises(ResourceExhausted, match=r"GPU 1: .*GPUs \[1, 0\].*128 groups, its limit is 128"):
        t.create((1, 0), 1)
    assert len(t.groups) == 128 and t.created == 128
    t.release(ids[57], 1)
    new = t.create((1, 0), 1)
    assert new not in ids and len(t.groups) == 128
    with pytest.raises(ResourceExhausted):
        t.create((0, 1), 0)


def test_custom_limit_named():
    t = GroupTable(limit=2)
    t.create((0,), 0)
    t.create((0,), 0)
    with pytest.raises(ResourceExhausted, match="its limit is 2"):
        t.create((0,), 0)


# -- contribute: authorisation and mismatches -----------------------------------------------------------------

def test_contribute_before_every_member_bound_refused():
    t = GroupTable()
    gid = t.create((0, 1, 2), 0)
    t.bind(gid, 0)
    t.bind(gid, 2)
    with pytest.raises(AccessViolation, match=r"GPU 0: group 1 is not bound by all members yet \(\[0, 2\] of "
                                              r"\[0, 1, 2\]\)"):
        t.contribute(gid, (0,), 0, "sum", "float32", as_bytes([1.0], "float32"))
    assert t.held_bytes == 0 and t.reductions == {}


def test_contribute_by_non_member_refused():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    with pytest.raises(AccessViolation, match="in-switch reduction by GPU 3: not a member of group"):
        t.contribute(gid, (0,), 3, "sum", "float32", as_bytes([1.0], "float32"))
    assert t.held_bytes == 0


def test_contribute_to_dead_group_refused():
    t = GroupTable()
    with pytest.raises(AccessViolation, match="no live group 9"):
        t.contribute(9, (0,), 0, "sum", "float32", as_bytes([1.0], "float32"))


def test_duplicate_contribution_is_mismatch():
    t = GroupTable()
    gid = ready_group(t, (0, 1, 2))
    assert t.contribute(gid, (5,), 1, "sum", "int32", as_bytes([1, 2], "int32")) is None
    with pytest.raises(CollectiveMismatch, match=r"slot \(5,\) of group 1: GPU 1 contributed twice"):
        t.contribute(gid, (5,), 1, "sum", "int32", as_bytes([1, 2], "int32"))
    assert t.held_bytes == 8  # the first one is still held


@pytest.mark.parametrize("op, dtype, values", [
    ("max", "float32", [1.0, 2.0]),            # op differs
    ("sum", "int32", [1, 2]),                   # dtype differs (same size)
    ("sum", "float32", [1.0, 2.0, 3.0]),        # size differs
    ("sum", "float64", [1.0]),                  # dtype and the element count differ, bytes equal
])
def test_op_dtype_size_mismatch(op, dtype, values):
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    t.contribute(gid, (0,), 0, "sum", "float32", as_bytes([1.0, 2.0], "float32"))
    with pytest.raises(CollectiveMismatch, match=r"GPU 1 sent .* others sum/float32/8 B"):
        t.contribute(gid, (0,), 1, op, dtype, as_bytes(values, dtype))
    assert t.held_bytes == 8


def test_unsupported_dtype_refused():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    with pytest.raises(FabricError, match="'bool': reductions support int8"):
        t.contribute(gid, (0,), 0, "sum", "bool", as_bytes([1], "uint8"))
    assert t.held_bytes == 0


def test_slots_are_independent():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    assert t.contribute(gid, (0,), 0, "sum", "int32", as_bytes([1], "int32")) is None
    assert t.contribute(gid, (1,), 1, "max", "int64", as_bytes([7, 8], "int64")) is None
    assert t.held_bytes == 4 + 16
    out, *_ = t.contribute(gid, (0,), 1, "sum", "int32", as_bytes([10], "int32"))
    np.testing.assert_array_equal(out.view(np.int32), [11])
    assert t.held_bytes == 16


def test_same_slot_in_two_groups_is_two_reductions():
    t = GroupTable()
    a, b = ready_group(t, (0, 1)), ready_group(t, (0, 1))
    t.contribute(a, (0,), 0, "sum", "int32", as_bytes([1], "int32"))
    t.contribute(b, (0,), 0, "sum", "int32", as_bytes([100], "int32"))
    np.testing.assert_array_equal(t.contribute(b, (0,), 1, "sum", "int32", as_bytes([200], "int32"))[0].view(np.int32),
                                  [300])
    np.testing.assert_array_equal(t.contribute(a, (0,), 1, "sum", "int32", as_bytes([2], "int32"))[0].view(np.int32), [3])


def test_release_drops_held_contributions_of_that_group_only():
    t = GroupTable()
    a, b = ready_group(t, (0, 1)), ready_group(t, (0, 1))
    t.contribute(a, (0,), 0, "sum", "float64", as_bytes([1.0, 2.0], "float64"))
    t.contribute(b, (0,), 1, "sum", "float64", as_bytes([3.0], "float64"))
    assert t.held_bytes == 24
    t.release(a, 1)
    assert t.held_bytes == 8
    assert list(t.reductions) == [(b, 0)]
    with pytest.raises(AccessViolation, match=f"no live group {a}"):
        t.contribute(a, (0,), 1, "sum", "float64", as_bytes([1.0, 2.0], "float64"))


def test_slot_can_be_reused_after_completion():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    for round_ in range(3):
        t.contribute(gid, (0,), 1, "sum", "int64", as_bytes([round_], "int64"))
        out, *_ = t.contribute(gid, (0,), 0, "sum", "int64", as_bytes([10], "int64"))
        np.testing.assert_array_equal(out.view(np.int64), [10 + round_])


# -- the result: member order, accumulator, avg, byte accounting -----------------------------------------------

def test_result_only_when_last_member_contributes():
    t = GroupTable()
    gid = ready_group(t, (0, 1, 2, 3))
    arrays = {g: np.full(3, g + 1, np.int32) for g in range(4)}
    results = contribute_all(t, gid, (0, 0), [2, 0, 3, 1], arrays, "sum", "int32")
    assert results[:3] == [None, None, None]
    out = results[3]
    assert out.dtype == np.uint8 and out.nbytes == 12
    np.testing.assert_array_equal(out.view(np.int32), [10, 10, 10])
    assert t.reductions == {} and t.held_bytes == 0


def test_held_and_reduced_bytes_exact():
    t = GroupTable()
    gid = ready_group(t, (0, 1, 2))
    data = as_bytes(np.arange(25, dtype=np.float32), "float32")  # 100 bytes
    assert (t.held_bytes, t.reduced_bytes) == (0, 0)
    t.contribute(gid, (0,), 0, "sum", "float32", data)
    assert (t.held_bytes, t.reduced_bytes) == (100, 0)
    t.contribute(gid, (0,), 2, "sum", "float32", data)
    assert (t.held_bytes, t.reduced_bytes) == (200, 0)
    t.contribute(gid, (1,), 2, "sum", "float32", data[:40])
    assert (t.held_bytes, t.reduced_bytes) == (240, 0)
    t.contribute(gid, (0,), 1, "sum", "float32", data)
    assert (t.held_bytes, t.reduced_bytes) == (40, 300)
    t.contribute(gid, (1,), 0, "sum", "float32", data[:40])
    t.contribute(gid, (1,), 1, "sum", "float32", data[:40])
    assert (t.held_bytes, t.reduced_bytes) == (0, 300 + 120)


def order_sensitive_float32(members, size=4096, seed=1):
    """float32 data whose sum's last bits depend on the order it is added in."""
    rng = np.random.default_rng(seed)
    scales = np.float32(10.0) ** rng.integers(-4, 5, size=(members, size)).astype(np.float32)
    return [(rng.standard_normal(size).astype(np.float32) * scales[m]).astype(np.float32) for m in range(members)]


@pytest.mark.parametrize("members", [(0, 1, 2, 3), (3, 1, 0, 2), (5, 2, 7)])
def test_result_in_member_order_not_arrival_order(members):
    t = GroupTable()
    gid = ready_group(t, members)
    data = order_sensitive_float32(len(members))
    arrays = {gpu: data[i] for i, gpu in enumerate(members)}
    in_member_order = reduce_in_order([arrays[g] for g in members], "sum")
    naive_reversed = functools.reduce(np.add, [arrays[g] for g in reversed(members)])
    assert naive_reversed.dtype == np.float32
    # the data is such that the order shows in the last bits
    assert in_member_order.tobytes() != naive_reversed.tobytes()
    shuffled = [members[1], members[-1], members[0], *members[2:-1]]
    arrivals = [list(members), list(reversed(members)), sorted(members), shuffled]
    results = [contribute_all(t, gid, (slot,), order, arrays, "sum", "float32")[-1].view(np.float32)
               for slot, order in enumerate(arrivals)]
    for out in results:
        assert out.tobytes() == in_member_order.tobytes()  # bitwise, whatever the arrival order
        assert out.tobytes() != naive_reversed.tobytes()


@pytest.mark.parametrize("dtype, top", [(np.dtype(np.float16), 2048.0), (BF16, 256.0)])
def test_sixteen_bit_floats_accumulate_in_float32_and_round_once(dtype, top):
    # at `top` the dtype's spacing is 2: adding 1 three times in the dtype stays at `top`;
    # in float32 the sum is top + 3, rounded once (ties to even) to top + 4
    t = GroupTable()
    gid = ready_group(t, (0, 1, 2, 3))
    name = "float16" if dtype == np.float16 else "bfloat16"
    arrays = {0: np.array([top, 1.0], dtype), 1: np.array([1.0, 1.0], dtype), 2: np.array([1.0, 1.0], dtype),
              3: np.array([1.0, 1.0], dtype)}
    per_step = functools.reduce(lambda a, b: (a + b).astype(dtype), [arrays[g] for g in range(4)])
    assert float(per_step[0]) == top
    out = contribute_all(t, gid, (0,), [3, 2, 1, 0], arrays, "sum", name)[-1]
    assert out.nbytes == 4
    result = out.view(dtype)
    assert [float(v) for v in result] == [top + 4, 4.0]
    assert result.tobytes() == reduce_in_order([arrays[g] for g in range(4)], "sum", np.float32).tobytes()


@pytest.mark.parametrize("name, dtype", [("float16", np.dtype(np.float16)), ("bfloat16", BF16)])
def test_sixteen_bit_avg_divides_in_float32(name, dtype):
    t = GroupTable()
    gid = ready_group(t, (0, 1, 2))
    arrays = {g: (np.arange(16, dtype=np.float32) * (g + 1) / 7).astype(dtype) for g in range(3)}
    out = contribute_all(t, gid, (0,), [1, 2, 0], arrays, "avg", name)[-1].view(dtype)
    total = arrays[0].astype(np.float32) + arrays[1].astype(np.float32) + arrays[2].astype(np.float32)
    expected = (total / np.float32(3)).astype(dtype)
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name, values, expected", [
    ("float32", [[1.0, 3.0], [2.0, 3.0], [6.0, 0.0]], [3.0, 2.0]),
    ("float64", [[0.5], [1.5], [1.0]], [1.0]),
    ("int32", [[1, -7], [1, 0], [2, 0]], [1, -3]),      # floor: 4 // 3 = 1, -7 // 3 = -3
    ("int64", [[5, -1], [0, 0], [0, 0]], [1, -1]),      # 5 // 3 = 1, -1 // 3 = -1
])
def test_avg_divides_by_member_count(name, values, expected):
    t = GroupTable()
    gid = ready_group(t, (4, 2, 6))
    arrays = {gpu: np.array(v, name) for gpu, v in zip((4, 2, 6), values)}
    out = contribute_all(t, gid, (0,), [6, 4, 2], arrays, "avg", name)[-1]
    np.testing.assert_array_equal(out.view(name), np.array(expected, name))


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "avg"])
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "int32", "int64"])
def test_every_op_and_dtype_equals_reference(op, name):
    dtype = BF16 if name == "bfloat16" else np.dtype(name)
    rng = np.random.default_rng(7)
    members = (1, 0, 3, 2)
    if dtype.kind == "i":
        data = [rng.integers(-50, 50, 33).astype(dtype) for _ in members]
    else:
        data = [rng.uniform(-4, 4, 33).astype(dtype) for _ in members]
    arrays = dict(zip(members, data))
    t = GroupTable()
    gid = ready_group(t, members)
    out = contribute_all(t, gid, (0,), [2, 3, 1, 0], arrays, op, name)[-1]
    accumulate = np.float32 if name in ("float16", "bfloat16") else None
    expected = reduce_in_order(data, op, accumulate=accumulate, out_dtype=dtype)
    assert out.view(dtype).tobytes() == expected.tobytes()


def test_integer_sum_wraps_in_the_switch():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    big = np.iinfo(np.int32).max
    out = contribute_all(t, gid, (0,), [1, 0], {0: np.array([big], np.int32), 1: np.array([2], np.int32)},
                         "sum", "int32")[-1]
    np.testing.assert_array_equal(out.view(np.int32), [np.iinfo(np.int32).min + 1])


def test_single_member_group_reduces_at_once():
    t = GroupTable()
    gid = ready_group(t, (2,))
    out, *_ = t.contribute(gid, (0,), 2, "avg", "float32", as_bytes([3.0, 5.0], "float32"))
    np.testing.assert_array_equal(out.view(np.float32), [3.0, 5.0])
    assert t.reduced_bytes == 8


def test_empty_contribution_reduces_to_empty():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    assert t.contribute(gid, (0,), 0, "sum", "float32", np.empty(0, np.uint8)) is None
    out, *_ = t.contribute(gid, (0,), 1, "sum", "float32", np.empty(0, np.uint8))
    assert out.nbytes == 0 and t.reduced_bytes == 0


def test_contributions_not_modified():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    a, b = as_bytes([1.0, 2.0], "float32"), as_bytes([3.0, 4.0], "float32")
    a_copy, b_copy = a.copy(), b.copy()
    t.contribute(gid, (0,), 0, "sum", "float32", a)
    out, *_ = t.contribute(gid, (0,), 1, "sum", "float32", b)
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(b, b_copy)
    assert not np.shares_memory(out, a) and not np.shares_memory(out, b)


def test_partial_element_contribution_refused_on_arrival():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    with pytest.raises(FabricError, match="GPU 0"):
        t.contribute(gid, (0,), 0, "sum", "float32", np.zeros(6, np.uint8))


def test_contributions_must_agree_on_delivery_and_the_result_carries_it():
    t = GroupTable()
    gid = ready_group(t, (0, 1))
    assert t.contribute(gid, (0,), 0, "sum", "int32", as_bytes([1], "int32"), ((0, 1), ("k", 0))) is None
    with pytest.raises(CollectiveMismatch, match="to"):
        t.contribute(gid, (0,), 1, "sum", "int32", as_bytes([2], "int32"), ((1,), ("k", 0)))
    out, delivery, _ = t.contribute(gid, (0,), 1, "sum", "int32", as_bytes([2], "int32"), ((0, 1), ("k", 0)))
    assert out.view(np.int32).tolist() == [3] and delivery == ((0, 1), ("k", 0))
