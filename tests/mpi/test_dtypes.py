"""Multi-rank: data-movement collectives take every fixed-size dtype (they move bytes); reductions take
the integer and float widths (every algorithm, bitwise against numpy) and refuse bool and complex
with a typed error on every member; call records and the run report name any dtype."""

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricError
from nvlink_emu.fabric.reduction import OPS, blocks, reduce_in_order
from nvlink_emu.launch.report import report_json

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

MOVABLE = [np.dtype(d) for d in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16",
                                 "float32", "float64", "complex64", "complex128", "bool", ">f4", "datetime64[ns]",
                                 "S7", "U3")] + \
          [np.dtype(ml_dtypes.bfloat16), np.dtype([("id", "<u4"), ("w", "<f8")])]
NEW_INTEGERS = ["int8", "uint8", "int16", "uint16", "uint32", "uint64"]
CHUNK = 4096


def pattern(dtype, count, seed):
    """`count` elements of `dtype` with random bytes (0/1 for bool, numpy's only values)."""
    raw = np.random.default_rng(seed).integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype)


def join(arrays, dtype):
    """The arrays' bytes one after another, as `dtype` (np.concatenate would convert a byte order)."""
    pieces = [np.ascontiguousarray(a).view(np.uint8) for a in arrays]
    return np.concatenate(pieces + [np.empty(0, np.uint8)]).view(dtype)


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("algorithm", ["ring", "direct", "sharp", "nvls"])
def test_allgather_and_broadcast_move_every_fixed_size_dtype(algorithm):
    n = gpus()

    def main(gpu):
        r = gpu.rank
        for i, dtype in enumerate(MOVABLE):
            for count in (0, 1, 2 * n + 1, 3 * CHUNK // dtype.itemsize + 1):
                parts = blocks(count, n)
                whole = [pattern(dtype, count, 50 * i + m) for m in range(n)]
                gathered = np.empty(count, dtype)
                gpu.world.allgather(whole[r][slice(*parts[r])].copy(), gathered, algorithm=algorithm)
                expected = join([whole[m][slice(*parts[m])] for m in range(n)], dtype)
                assert same_bits(gathered, expected), (dtype, count)
                root = (i + count) % n
                array = whole[r].copy()
                gpu.world.broadcast(array, root=root, algorithm=algorithm)
                assert same_bits(array, whole[root]), (dtype, count, root)

    run(main, chunk_bytes=CHUNK)


def test_all2all_all2allv_gather_scatter_move_every_fixed_size_dtype():
    n = gpus()

    def main(gpu):
        r = gpu.rank
        for i, dtype in enumerate(MOVABLE):
            for each in (0, 1, 700):
                sent = [pattern(dtype, n * each, 70 * i + m) for m in range(n)]
                got = np.empty(n * each, dtype)
                gpu.world.all2all(sent[r], got)
                expected = join([sent[m][r * each:(r + 1) * each] for m in range(n)], dtype)
                assert same_bits(got, expected), ("all2all", dtype, each)
                counts = [(r + j + each) % 4 for j in range(n)]  # elements from r to j
                recv_counts = [(m + r + each) % 4 for m in range(n)]
                send = pattern(dtype, sum(counts), 90 * i + r)
                recv = np.empty(sum(recv_counts), dtype)
                gpu.world.all2allv(send, counts, recv, recv_counts)
                theirs = [pattern(dtype, sum((m + j + each) % 4 for j in range(n)), 90 * i + m) for m in range(n)]
                offsets = [sum((m + j + each) % 4 for j in range(r)) for m in range(n)]
                expected = join([theirs[m][offsets[m]:offsets[m] + recv_counts[m]]
                                           for m in range(n)], dtype)
                assert same_bits(recv, expected), ("all2allv", dtype, each)
                root = (i + each) % n
                whole = np.empty(n * each, dtype) if r == root else None
                gpu.world.gather(sent[r][:each].copy(), whole, root=root)
                if r == root:
                    assert same_bits(whole, join([sent[m][:each] for m in range(n)], dtype))
                part = np.empty(each, dtype)
                gpu.world.scatter(sent[root] if r == root else None, part, root=root)
                assert same_bits(part, sent[root][r * each:(r + 1) * each]), ("scatter", dtype, each)

    run(main, chunk_bytes=CHUNK)


def integers(rank, count, dtype, op):
    rng = np.random.default_rng(31 * rank + count)
    info = np.iinfo(dtype)
    if op == "prod":
        return rng.integers(max(info.min, -3), 4, count).astype(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)  # sums wrap


@pytest.mark.parametrize("algorithm", ["ring", "direct", "sharp", "nvls"])
def test_every_integer_width_reduces_with_every_op_bitwise(algorithm):
    n = gpus()

    def main(gpu):
        r = gpu.rank
        wrong = []
        for name in NEW_INTEGERS:
            dtype = np.dtype(name)
            for op in OPS:
                for count in (1, 3 * n + 1) + ((2 * CHUNK + 3,) if op == "sum" else ()):  # several chunks once
                    inputs = [integers(m, count, dtype, op) for m in range(n)]
                    # integer sum, prod (both modular), max, min and floored avg do not depend on the order
                    want = reduce_in_order(inputs, op)
                    array = inputs[r].copy()
                    gpu.world.allreduce(array, op, algorithm)
                    a, b = blocks(count, n)[r]
                    block = np.empty(b - a, dtype)
                    gpu.world.reduce_scatter(inputs[r], block, op, algorithm)
                    ok = same_bits(array, want) and same_bits(block, want[a:b])
                    if algorithm != "nvls":
                        root = count % n
                        out = np.empty(count, dtype) if r == root else None
                        gpu.world.reduce(inputs[r], out, root, op, algorithm)
                        ok = ok and (r != root or same_bits(out, want))
                    if not ok:
                        wrong.append((name, op, count))
        assert not wrong, f"{algorithm}: {wrong}"

    run(main, chunk_bytes=CHUNK)


def test_bool_and_complex_reductions_are_refused_on_every_member():
    n = gpus()

    def main(gpu):
        r = gpu.rank
        for dtype, hint in ((np.bool_, "bool has no sum or average"), (np.complex64, "complex has no order")):
            x = np.zeros(4, dtype)
            with pytest.raises(FabricError, match=rf"GPU {r}: allreduce: dtype .*: {hint}.*reductions support int8"):
                gpu.world.allreduce(x)
            with pytest.raises(FabricError, match=hint):
                gpu.world.reduce(x, x.copy(), root=0)
            with pytest.raises(FabricError, match=hint):
                gpu.world.reduce_scatter(np.zeros(n, dtype), np.zeros(1, dtype))
        # one member's complex among float64s: its own error there, a mismatch naming it elsewhere
        y = np.zeros(4, np.complex128 if r == 1 else np.float64)
        with pytest.raises(FabricError if r == 1 else CollectiveMismatch,
                           match="complex has no order" if r == 1 else "GPU 1's FabricError"):
            gpu.world.allreduce(y)
        # members moving different dtypes of the same size are told apart
        z = np.zeros(4, np.uint16 if r == 0 else np.int16)
        with pytest.raises(CollectiveMismatch, match="'dtype': 'uint16'.*'dtype': 'int16'|'dtype': 'int16'.*'uint16'"):
            gpu.world.broadcast(z)
        with pytest.raises(FabricError, match="fixed-size binary elements; this one has Python objects"):
            gpu.world.broadcast(np.zeros(2, object))
        w = np.ones(4)
        gpu.world.allreduce(w)  # still in step
        assert (w == n).all()

    run(main)


def test_call_records_and_the_run_report_name_any_dtype():
    n = gpus()
    record = np.dtype([("id", "<u4"), ("w", "<f8")])

    def main(gpu):
        gpu.world.broadcast(np.zeros(5, np.bool_))
        gpu.world.allgather(np.zeros(2, record), np.zeros(2 * n, record))
        gpu.world.allreduce(np.zeros(3, np.uint16))

    report = run(main).report
    if report is None:
        return
    calls = report_json(report)["collectives"]
    mine = [(c["collective"], c["dtype"], c["size_bytes"]) for c in calls if c["gpu"] == 0]
    assert mine == [("broadcast", "bool", 5), ("allgather", "V12:[('id', '<u4'), ('w', '<f8')]", 24 * n),
                    ("allreduce", "uint16", 6)]
