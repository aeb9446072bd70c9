"""Multi-rank: every collective and algorithm against a numpy reference (bitwise, in each algorithm's
documented combine order) and MPI's own collectives, exact per-link bytes, and misuse."""

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricTimeout, ResourceExhausted, UnsupportedOperation
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.reduction import blocks

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

ALGORITHMS = ["ring", "direct", "sharp", "nvls"]
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "avg", "max", "min", "prod"]
NP_OPS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
CHUNK = 4096  # small chunks, so every size above a few KiB streams through the switch in pieces


def dtype_of(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def contribution(rank, count, dtype, op, salt=0):
    """Member `rank`'s data: small integers (exact in every dtype) plus, for floats, fractions that
    make the combine order show in the last bits."""
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
    if dtype.kind in "iu":
        top = 3 if op == "prod" else 1000
        return rng.integers(-top, top, count).astype(dtype)
    scale = 1.5 if op == "prod" else 100.0
    return rng.uniform(-scale, scale, count).astype(dtype)


def order(algorithm, block, n):
    """The documented combine order of a block: ring starts after the block's index; others 0..N-1."""
    return [(block + 1 + i) % n for i in range(n)] if algorithm == "ring" else list(range(n))


def accumulator(algorithm, dtype):
    in_switch_wide = algorithm in ("sharp", "nvls") and dtype.itemsize == 2 and dtype.kind != "i"
    return np.dtype(np.float32) if in_switch_wide else dtype


def reference(algorithm, op, inputs, dtype):
    """The expected reduction of `inputs` (one array per member), block by block, in numpy."""
    n, count = len(inputs), inputs[0].size
    out = np.empty(count, dtype)
    acc_dtype = accumulator(algorithm, dtype)
    for b, (lo, hi) in enumerate(blocks(count, n)):
        ranks = order(algorithm, b, n)
        acc = inputs[ranks[0]][lo:hi].astype(acc_dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            for m in ranks[1:]:
                acc = NP_OPS[op](acc, inputs[m][lo:hi].astype(acc_dtype)).astype(acc_dtype)
            if op == "avg":
                acc = acc // n if acc_dtype.kind in "iu" else (acc / acc_dtype.type(n)).astype(acc_dtype)
        out[lo:hi] = acc.astype(dtype)
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.both_sizes  # 3 GPUs split blocks unevenly, 8 evenly: the chunking and fold order differ
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_equals_reference_bitwise_for_every_op_dtype_and_count(algorithm):
    n = gpus()
    counts = [0, 1, n - 1, 2 * n + 1, 3000]
    cases = [(op, "float32") for op in OPS] + [(op, "int32") for op in OPS] + \
            [("sum", d) for d in DTYPES] + [("avg", d) for d in DTYPES]

    def main(gpu):
        wrong = []
        for op, name in cases:
            dtype = dtype_of(name)
            for count in counts:
                inputs = [contribution(m, count, dtype, op) for m in range(n)]
                array = gpu.alloc(count, dtype)
                array[:] = inputs[gpu.rank]
                gpu.world.allreduce(array, op=op, algorithm=algorithm)
                if not same_bits(array, reference(algorithm, op, inputs, dtype)):
                    wrong.append((op, name, count))
                gpu.free(array)
        assert not wrong, f"{algorithm}: results differ from the reference for {wrong}"

    run(main, chunk_bytes=CHUNK)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_allgather_broadcast_equal_reference(algorithm):
    n = gpus()

    def main(gpu):
        for op, name in [("sum", "float32"), ("avg", "float16"), ("max", "int64"), ("prod", "float64"),
                         ("min", "bfloat16"), ("sum", "int32")]:
            dtype = dtype_of(name)
            for count in [0, 1, n + 1, 5000]:
                inputs = [contribution(m, count, dtype, op) for m in range(n)]
                a, b = blocks(count, n)[gpu.rank]
                recv = np.empty(b - a, dtype)
                send = inputs[gpu.rank].copy()
                gpu.world.reduce_scatter(send, recv, op=op, algorithm=algorithm)
                assert same_bits(recv, reference(algorithm, op, inputs, dtype)[a:b]), (op, name, count)
                assert same_bits(send, inputs[gpu.rank])  # the send buffer is left as it was
                gathered = np.empty(count, dtype)
                gpu.world.allgather(inputs[gpu.rank][a:b].copy(), gathered, algorithm=algorithm)
                expected = np.concatenate([inputs[m][slice(*blocks(count, n)[m])] for m in range(n)])
                assert same_bits(gathered, expected.astype(dtype)), ("allgather", name, count)
                root = count % n
                array = inputs[gpu.rank].copy()
                gpu.world.broadcast(array, root=root, algorithm=algorithm)
                assert same_bits(array, inputs[root]), ("broadcast", name, count, root)

    run(main, chunk_bytes=CHUNK)


def test_results_match_mpi_native_collectives():
    n = gpus()

    def main(gpu):
        count = 10 * n
        x = contribution(gpu.rank, count, np.dtype("int64"), "sum")
        for algorithm in ALGORITHMS:
            mine, native = x.copy(), np.empty_like(x)
            gpu.world.allreduce(mine, "sum", algorithm)
            gpu.native("allreduce", x, native, "sum")
            assert np.array_equal(mine, native), algorithm
            rs, rs_native = np.empty(10, np.int64), np.empty(10, np.int64)
            gpu.world.reduce_scatter(x, rs, "max", algorithm)
            gpu.native("reduce_scatter", x, rs_native, "max")
            assert np.array_equal(rs, rs_native), algorithm
        out, out_native = np.empty_like(x), np.empty_like(x)
        gpu.world.all2all(x, out)
        gpu.native("all2all", x, out_native)
        assert np.array_equal(out, out_native)

    run(main)


@pytest.mark.both_sizes  # the closed forms are in n: (n-1)/n with a remainder at 3, none at 8
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_per_gpu_link_bytes_match_the_closed_forms_exactly(algorithm):
    n = gpus()
    S = n * 3 * CHUNK  # bytes; a multiple of N x itemsize, streamed in several chunks per block

    def delta(gpu, fn):
        before = gpu.link_counters()
        fn()
        gpu.world.barrier()
        after = gpu.link_counters()
        return after["tx_bytes"] - before["tx_bytes"], after["rx_bytes"] - before["rx_bytes"], \
            after["tx_raw_bytes"] - before["tx_raw_bytes"]

    def main(gpu):
        r = gpu.rank
        x = np.ones(S // 4, np.float32)
        got = {"allreduce": delta(gpu, lambda: gpu.world.allreduce(x, "sum", algorithm))}
        block = np.ones(S // 4 // n, np.float32)
        got["reduce_scatter"] = delta(gpu, lambda: gpu.world.reduce_scatter(x, block, "sum", algorithm))
        full = np.empty(S // 4, np.float32)
        got["allgather"] = delta(gpu, lambda: gpu.world.allgather(block, full, algorithm))
        got["broadcast"] = delta(gpu, lambda: gpu.world.broadcast(full, root=1, algorithm=algorithm))
        got["all2all"] = delta(gpu, lambda: gpu.world.all2all(x, full))

        ring_like = algorithm in ("ring", "direct")
        expect = {
            "allreduce": {"ring": 2 * (n - 1) * S // n, "direct": 2 * (n - 1) * S // n, "sharp": S,
                          "nvls": (n + 1) * S // n}[algorithm],
            "reduce_scatter": ((n - 1) * S // n, (n - 1) * S // n) if ring_like else (S, S // n),
            "allgather": ((n - 1) * S // n, (n - 1) * S // n) if ring_like else (S // n, S),
            "all2all": ((n - 1) * S // n, (n - 1) * S // n),
        }
        assert got["allreduce"][:2] == (expect["allreduce"], expect["allreduce"])
        assert got["reduce_scatter"][:2] == expect["reduce_scatter"]
        assert got["allgather"][:2] == expect["allgather"]
        assert got["all2all"][:2] == expect["all2all"]
        position = (r - 1) % n  # broadcast root is GPU 1
        bc = {"ring": (S if position < n - 1 else 0, S if position else 0),
              "direct": ((n - 1) * S if r == 1 else 0, 0 if r == 1 else S),
              "sharp": (S if r == 1 else 0, S), "nvls": (S if r == 1 else 0, S)}[algorithm]
        assert got["broadcast"][:2] == bc
        if algorithm == "sharp":
            # S bytes of contributions in CHUNK transfers: one header per MTU-sized packet
            assert got["allreduce"][2] == (S // CHUNK) * raw_bytes(CHUNK, gpu.config.mtu_bytes,
                                                                   gpu.config.header_bytes)
        return got

    run(main, chunk_bytes=CHUNK)


def test_all2allv_moves_uneven_blocks_exactly():
    n = gpus()

    def main(gpu):
        r = gpu.rank
        send_counts = [(r + j) % 3 + j for j in range(n)]          # elements from r to j
        recv_counts = [(i + r) % 3 + r for i in range(n)]          # elements from i to r
        send = np.concatenate([np.full(c, 100 * r + j, np.float64) for j, c in enumerate(send_counts)])
        recv = np.full(sum(recv_counts) + 3, -1.0)                 # slack at the end stays untouched
        before = gpu.link_counters()
        gpu.world.all2allv(send, send_counts, recv, recv_counts)
        after = gpu.link_counters()
        expected = np.concatenate([np.full(c, 100 * i + r, np.float64) for i, c in enumerate(recv_counts)])
        assert np.array_equal(recv[:sum(recv_counts)], expected) and (recv[-3:] == -1).all()
        assert after["tx_bytes"] - before["tx_bytes"] == 8 * (sum(send_counts) - send_counts[r])
        assert after["rx_bytes"] - before["rx_bytes"] == 8 * (sum(recv_counts) - recv_counts[r])

    run(main)


def test_results_are_identical_run_after_run():
    def main(gpu):
        outputs = []
        for algorithm in ALGORITHMS:
            x = contribution(gpu.rank, 7777, np.dtype("float32"), "sum", salt=5)
            gpu.world.allreduce(x, "sum", algorithm)
            outputs.append(x.tobytes())
        return outputs

    first, second = run(main, chunk_bytes=CHUNK), run(main, chunk_bytes=CHUNK)
    if first.role == "gpu":
        assert first.value == second.value


def test_mismatched_calls_raise_on_every_member_and_write_nothing():
    def main(gpu):
        count = 11 if gpu.rank == 1 else 10
        x = np.full(count, 5.0, np.float32)
        with pytest.raises(CollectiveMismatch, match=r"GPU 0: .*'count': 10.*GPU 1: .*'count': 11"):
            gpu.world.allreduce(x, "sum", "ring")
        assert (x == 5.0).all()
        op = "max" if gpu.rank == 2 else "sum"
        with pytest.raises(CollectiveMismatch, match="'op': 'max'"):
            gpu.world.allreduce(np.ones(4, np.float32), op, "sharp")
        bad = [1] * gpu.size
        with pytest.raises(CollectiveMismatch, match="member 0 sends 1 elements to member 1, which expects 2"):
            gpu.world.all2allv(np.zeros(gpu.size), bad, np.zeros(2 * gpu.size),
                               [2] * gpu.size if gpu.rank == 1 else bad)
        y = np.ones(8, np.float32)
        gpu.world.allreduce(y, "sum", "ring")  # the communicator still works afterwards
        assert (y == gpu.size).all()

    run(main)


def test_a_gpu_that_never_joins_ends_the_collective_with_a_timeout_naming_it():
    def main(gpu):
        if gpu.rank != gpu.size - 1:
            with pytest.raises(FabricTimeout, match=rf"allreduce call check #0 .* waiting for GPUs .*{gpu.size - 1}\]"):
                gpu.world.allreduce(np.ones(16, np.float32), "sum", "sharp")

    run(main, timeout_s=1.0)


def test_in_switch_algorithms_need_nvlink_network_with_sharp():
    def main(gpu):
        for algorithm in ("sharp", "nvls"):
            with pytest.raises(UnsupportedOperation, match="dgx-a100"):
                gpu.world.allreduce(np.ones(4, np.float32), "sum", algorithm)
        x = np.ones(4, np.float32)
        gpu.world.allreduce(x)  # auto picks a forwarding algorithm here
        assert (x == gpu.size).all()

    run(main, base="dgx-a100")


def test_sub_communicators_reduce_within_their_members():
    def main(gpu):
        half = gpu.world.split(color=gpu.rank % 2, key=-gpu.rank)
        assert half.members == tuple(sorted((g for g in range(gpu.size) if g % 2 == gpu.rank % 2), reverse=True))
        for algorithm in ALGORITHMS:
            x = np.full(10, gpu.rank, np.int64)
            half.allreduce(x, "sum", algorithm)
            assert (x == sum(half.members)).all()
        assert gpu.world.split(None) is None

    run(main)


def test_the_switch_holds_at_most_128_groups():
    def main(gpu):
        comms = []
        for i in range(128):
            comm = gpu.world.split(0)
            comm.group_id()
            comms.append(comm)
        extra = gpu.world.split(0)
        with pytest.raises(ResourceExhausted, match="limit is 128"):
            extra.group_id()
        comms[0].release_group()
        x = np.ones(4, np.float32)
        extra.allreduce(x, "sum", "sharp")  # a released group makes room
        assert (x == gpu.size).all()

    run(main, timeout_s=60)


def test_the_switch_holds_a_bounded_amount_however_large_the_buffer():
    n = gpus()
    chunk, window = 4096, 2
    bound = n * window * chunk  # switch_buffer_bytes: each member keeps `window` chunks in flight
    count = 1 << 16  # 256 KiB of float32, 64 chunks per member, 32 times the window

    def main(gpu):
        x = np.ones(count, np.float32)
        gpu.world.allreduce(x, "sum", "sharp")
        y = np.empty(count // n, np.float32)
        gpu.world.reduce_scatter(np.ones(count // n * n, np.float32), y, "sum", "nvls")
        assert (x == n).all() and (y == n).all()

    report = run(main, chunk_bytes=chunk, switch_buffer_bytes=bound).report
    assert 0 < report["switch"]["peak_held_bytes"] <= bound
    assert report["switch"]["reduced_bytes"] == n * count * 4 + n * (count // n * n * 4)
