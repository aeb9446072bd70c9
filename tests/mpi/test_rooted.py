"""Multi-rank: the rooted collectives reduce, gather and scatter - results against numpy (reduce
bitwise against reduce_in_order in each algorithm's documented order), exact per-link bytes and
modeled time against their closed forms, the in-switch buffer bound, and misuse."""

import math

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricError, UnsupportedOperation
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.reduction import blocks, chunks, reduce_in_order, switch_accumulator
from nvlink_emu.fabric.software import call_latency_ns

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

ALGORITHMS = ["direct", "ring", "sharp"]
OPS = ["sum", "avg", "max", "min", "prod"]
CHUNK = 4096


def dtype_of(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def contribution(rank, count, dtype, op, salt=0):
    """Member `rank`'s data: integers (small for prod) or floats whose last bits show the combine order."""
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
    if dtype.kind in "iu":
        top = 3 if op == "prod" else 100
        low = 0 if dtype.kind == "u" else -top
        return rng.integers(low, top, count).astype(dtype)
    if dtype.kind == "c":
        scale = 1.5 if op == "prod" else 100.0
        return (rng.uniform(-scale, scale, count) + 1j * rng.uniform(-scale, scale, count)).astype(dtype)
    scale = 1.5 if op == "prod" else 100.0
    return rng.uniform(-scale, scale, count).astype(dtype)


def expected_reduce(algorithm, op, inputs, root):
    """reduce_in_order in the algorithm's documented order (ring: root+1, ..., root; else 0..N-1),
    accumulating as the switch does for sharp."""
    n, dtype = len(inputs), inputs[0].dtype
    order = [(root + 1 + i) % n for i in range(n)] if algorithm == "ring" else list(range(n))
    accumulate = switch_accumulator(dtype) if algorithm == "sharp" else dtype
    return reduce_in_order([inputs[m] for m in order], op, accumulate, dtype)


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.both_sizes  # the fold order around a root depends on n (odd at 3, a power of two at 8)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_equals_reduce_in_order_bitwise(algorithm):
    n = gpus()
    cases = [(op, "float32") for op in OPS] + [(op, "int32") for op in OPS] + \
            [("sum", d) for d in ("float16", "bfloat16", "float64", "int64")] + [("avg", "float16")]

    def main(gpu):
        wrong = []
        for i, (op, name) in enumerate(cases):
            dtype = dtype_of(name)
            for count in (0, 1, n - 1, 2 * n + 1, 3000):
                root = (i + count) % n
                inputs = [contribution(m, count, dtype, op) for m in range(n)]
                send = inputs[gpu.rank].copy()
                recv = np.full(count, 7, dtype) if gpu.rank == root or gpu.rank % 2 else None
                gpu.world.reduce(send, recv, root=root, op=op, algorithm=algorithm)
                assert same_bits(send, inputs[gpu.rank])  # the send buffer is left as it was
                if gpu.rank == root and not same_bits(recv, expected_reduce(algorithm, op, inputs, root)):
                    wrong.append((op, name, count, root))
                if gpu.rank != root and recv is not None:
                    assert (recv == 7).all()  # a non-root's recv is not written
        assert not wrong, f"{algorithm}: reduce differs from reduce_in_order for {wrong}"

    run(main, chunk_bytes=CHUNK)


def test_gather_and_scatter_place_every_block_for_every_root():
    n = gpus()

    def main(gpu):
        r = gpu.rank
        for name in ("float32", "int64", "float16", "bfloat16"):
            dtype = dtype_of(name)
            for count in (0, 1, 777, 3 * CHUNK):
                for root in {0, count % n, n - 1}:
                    mine = contribution(r, count, dtype, "sum")
                    recv = np.empty(n * count, dtype) if r == root else None
                    gpu.world.gather(mine, recv, root=root)
                    if r == root:
                        assert same_bits(recv, np.concatenate([contribution(m, count, dtype, "sum")
                                                               for m in range(n)]).astype(dtype))
                    whole = contribution(100 + root, n * count, dtype, "sum")
                    part = np.empty(count, dtype)
                    gpu.world.scatter(whole if r == root else None, part, root=root)
                    assert same_bits(part, whole[r * count:(r + 1) * count]), (name, count, root)

    run(main, chunk_bytes=CHUNK)


def test_rooted_collectives_move_exactly_their_closed_form_bytes():
    n = gpus()
    count = 3 * n * CHUNK // 4 + 5  # float32 elements: uneven blocks, several chunks each
    item = 4

    def delta(gpu, fn):
        before = gpu.link_counters()
        fn()
        gpu.world.barrier()
        after = gpu.link_counters()
        return after["tx_bytes"] - before["tx_bytes"], after["rx_bytes"] - before["rx_bytes"]

    def main(gpu):
        r, root = gpu.rank, 1
        S = count * item
        b = [(hi - lo) * item for lo, hi in blocks(count, n)]
        x = np.ones(count, np.float32)
        out = np.empty(count, np.float32) if r == root else None
        for algorithm in ALGORITHMS:
            got = delta(gpu, lambda: gpu.world.reduce(x, out, root, "sum", algorithm))
            want = {"direct": (S - b[r] + (b[r] if r != root else 0), (n - 1) * b[r] + (S - b[r] if r == root else 0)),
                    "ring": (0 if r == root else S, 0 if r == (root + 1) % n else S),
                    "sharp": (S, S if r == root else 0)}[algorithm]
            assert got == want, (algorithm, r, got, want)
            assert r != root or (out == n).all()
        s = count * item  # bytes each member sends (gather) or receives (scatter)
        whole = np.empty(n * count, np.float32) if r == root else None
        assert delta(gpu, lambda: gpu.world.gather(x, whole, root)) == \
            ((0, (n - 1) * s) if r == root else (s, 0))
        part = np.empty(count, np.float32)
        assert delta(gpu, lambda: gpu.world.scatter(whole, part, root)) == \
            (((n - 1) * s, 0) if r == root else (0, s))
        assert (part == 1).all()

    run(main, chunk_bytes=CHUNK)


@pytest.mark.both_sizes  # rooted trees and rings have n-dependent depth and step counts
def test_rooted_modeled_times_equal_their_closed_forms():
    n = gpus()

    def main(gpu):
        config, t = gpu.config, gpu.config.timing
        B, a, s, p = t.bandwidth_gbytes_per_s, t.link_latency_ns, t.switch_latency_ns, t.reduction_latency_ns
        hop = 2 * a + s

        def R(nbytes):  # raw bytes of nbytes in chunk_bytes messages, over B
            return sum(raw_bytes(hi - lo, config.mtu_bytes, config.header_bytes)
                       for lo, hi in chunks(0, nbytes, config.chunk_bytes)) / B

        S = n * 1024 * 1024  # N MiB: several 256 KiB chunks a block
        c = min(S, config.chunk_bytes)
        forms = {("reduce", "direct"): 2 * ((n - 1) * R(S // n) + hop),
                 ("reduce", "ring"): R(S) + (n - 1) * hop + (n - 2) * R(c),
                 ("gather", "direct"): (n - 1) * R(S // n) + hop,
                 ("scatter", "direct"): (n - 1) * R(S // n) + hop}
        if gpu.config.sharp:
            E = t.reduction_gbytes_per_s  # the result streams at the slower of the link and the engine
            forms = {("reduce", "sharp"): R(S) * B / min(B, E) + hop + p}
        for (collective, algorithm), want in forms.items():
            gpu.world.barrier()
            start = gpu.now_ns
            if collective == "reduce":
                gpu.world.reduce(np.ones(S // 4, np.float32), np.empty(S // 4, np.float32), 0, "sum", algorithm)
            elif collective == "gather":
                gpu.world.gather(np.ones(S // n // 4, np.float32), np.empty(S // 4, np.float32), 0)
            else:
                gpu.world.scatter(np.ones(S // 4, np.float32), np.empty(S // n // 4, np.float32), 0)
            got = max(gpu.world.allgather_object(gpu.now_ns - start))
            # plus NCCL's software latency where the preset has it (dgx-h100): gather's and scatter's bytes are a
            # member's block, as the communicator takes them
            want += call_latency_ns(collective, algorithm, n, 1, S if collective == "reduce" else S // n, config)
            assert math.isclose(got, want, rel_tol=0.01), (collective, algorithm, got, want)

    run(main, base="h100-ib", chunk_bytes=256 << 10, switch_buffer_bytes=1 << 30)
    run(main, base="dgx-h100", chunk_bytes=256 << 10, switch_buffer_bytes=1 << 30)


def test_sharp_reduce_holds_a_bounded_amount_in_the_switch_with_credits_from_the_root():
    n = gpus()
    chunk, window = 4096, 2
    bound = n * window * chunk

    def main(gpu):
        for root in (0, n - 1):
            x = contribution(gpu.rank, 1 << 18, np.dtype("float32"), "sum", salt=root)  # 1 MiB, 256 chunks
            out = np.empty_like(x) if gpu.rank == root else None
            gpu.world.reduce(x, out, root, "sum", "sharp")
            if gpu.rank == root:
                inputs = [contribution(m, 1 << 18, np.dtype("float32"), "sum", salt=root) for m in range(n)]
                assert same_bits(out, reduce_in_order(inputs, "sum"))

    report = run(main, chunk_bytes=chunk, switch_buffer_bytes=bound).report
    assert 0 < report["switch"]["peak_held_bytes"] <= bound
    assert report["switch"]["reduced_bytes"] == 2 * n * (1 << 20)


def test_rooted_collectives_on_a_sub_communicator_use_its_ranks():
    def main(gpu):
        half = gpu.world.split(gpu.rank % 2, key=-gpu.rank)
        m = half.size
        for algorithm in ALGORITHMS:
            out = np.empty(5, np.int64)
            half.reduce(np.full(5, gpu.rank, np.int64), out, root=m - 1, algorithm=algorithm)
            if half.rank == m - 1:
                assert (out == sum(half.members)).all()
        whole = np.empty(2 * m, np.int32) if half.rank == 0 else None
        half.gather(np.array([gpu.rank, half.rank], np.int32), whole)
        if half.rank == 0:
            assert list(whole) == [v for i, g in enumerate(half.members) for v in (g, i)]
        part = np.empty(1, np.int32)
        half.scatter(np.arange(m, dtype=np.int32) * 10 if half.rank == 0 else None, part)
        assert part[0] == 10 * half.rank

    run(main)


def test_rooted_misuse_raises_on_every_member_and_the_communicator_stays_usable():
    n = gpus()

    def main(gpu):
        r, comm = gpu.rank, gpu.world
        x = np.ones(8, np.float32)
        # members naming different roots
        with pytest.raises(CollectiveMismatch, match="'root': 1.*'root': 0|'root': 0.*'root': 1"):
            comm.reduce(x, np.empty(8, np.float32), root=1 if r == 2 else 0)
        # a wrong-sized recv at the root
        with pytest.raises(CollectiveMismatch, match="GPU 0's reduce recv at the root has 7 elements; member 0 "
                                                     "of .* needs 8"):
            comm.reduce(x, np.empty(7 if r == 0 else 8, np.float32), root=0)
        with pytest.raises(CollectiveMismatch, match="gather recv at the root has 8 elements"):
            comm.gather(x, np.empty(8, np.float32), root=0)
        with pytest.raises(CollectiveMismatch, match="scatter send at the root has 9 elements"):
            comm.scatter(np.empty(9, np.float32), np.empty(8 // n or 1, np.float32), root=0)
        with pytest.raises(CollectiveMismatch, match="members called different collectives or arguments"):
            comm.gather(np.ones(3 if r == 1 else 2, np.float32), np.empty(2 * n, np.float32), root=0)
        with pytest.raises(CollectiveMismatch, match="reduce send is float32, recv is float64"):
            comm.reduce(x, np.empty(8, np.float64 if r == 0 else np.float32))
        # one member's bad root: its own error there, a CollectiveMismatch naming it elsewhere
        for bad in (n, -1, 0.5, None):
            expected = (FabricError, rf"root {bad!r} is not a member rank 0\.\.{n - 1}") if r == 1 else \
                (CollectiveMismatch, "GPU 1's FabricError")
            with pytest.raises(expected[0], match=expected[1]):
                comm.gather(x, np.empty(8 * n, np.float32), root=bad if r == 1 else 0)
        with pytest.raises(FabricError if r == 0 else CollectiveMismatch, match="contiguous numpy array"):
            comm.reduce(x, None, root=0)  # the root needs its recv
        with pytest.raises(UnsupportedOperation, match="'nvls' does not implement it"):
            comm.reduce(x, np.empty(8, np.float32), algorithm="nvls")
        out = np.empty(8, np.float32)
        comm.reduce(x, out, root=0, algorithm="direct")  # still in step
        assert r != 0 or (out == n).all()

    run(main)


def test_reduce_auto_runs_on_every_fabric():
    def main(gpu):
        out = np.empty(3, np.float64)
        gpu.world.reduce(np.full(3, 1.5), out, root=gpu.size - 1)
        if gpu.rank == gpu.size - 1:
            assert (out == 1.5 * gpu.size).all()
        return gpu.raw_port().calls[-1].algorithm

    for base in ("dgx-h100", "dgx-a100"):
        result = run(main, base=base)
        if result.role == "gpu":
            assert result.value in ALGORITHMS


def test_rooted_i_forms_return_requests_and_point_to_point_waits_its_turn():
    n = gpus()

    def main(gpu):
        r, comm = gpu.rank, gpu.world
        out = np.empty(6, np.int64) if r == 0 else None
        whole = np.empty(2 * n, np.int32) if r == 1 else None
        part = np.empty(3, np.float32)
        requests = [comm.ireduce(np.full(6, r, np.int64), out, root=0, algorithm="ring"),
                    comm.igather(np.array([r, -r], np.int32), whole, root=1),
                    comm.iscatter(np.arange(3 * n, dtype=np.float32) if r == 2 else None, part, root=2)]
        # a point-to-point exchange issued while they are pending: they move their bytes first
        got = np.empty(2, np.uint8)
        comm.sendrecv(np.array([r, 7], np.uint8), (r + 1) % n, got, (r - 1) % n)
        assert list(got) == [(r - 1) % n, 7]
        gpu.wait_all(requests)
        assert r != 0 or (out == sum(range(n))).all()
        assert r != 1 or list(whole) == [v for m in range(n) for v in (m, -m)]
        assert list(part) == [3 * r, 3 * r + 1, 3 * r + 2]

    run(main)
