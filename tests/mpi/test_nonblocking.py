"""Multi-rank: non-blocking collectives (ranks/requests.py). Results equal the blocking forms'; in
modeled time a request overlaps the compute issued after it - a step issued at t0 with compute C
ends at t0 + max(C, T), T the collective's closed form - and requests of one GPU run one after
another (one stream); wait/test/wait_all/wait_any answer in modeled time, the same run after run."""

import math

import numpy as np
import pytest

from nvlink_emu.fabric import CollectiveMismatch, FabricError, cost, preset
from nvlink_emu.fabric.reduction import blocks

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

S = gpus() * (256 << 10)  # bytes per call: bandwidth-bound, whole MTU packets per block (closed form)


def same(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-6)


@pytest.mark.parametrize("algorithm", ["ring", "direct", "sharp", "nvls", "auto"])
def test_every_i_form_gives_the_blocking_result(algorithm):
    def main(gpu):
        comm, n, r = gpu.world, gpu.size, gpu.rank
        x = np.arange(4096, dtype=np.float32) * (r + 1)
        want = np.arange(4096, dtype=np.float32) * sum(range(1, n + 1))
        reqs = [comm.iallreduce(x, "sum", algorithm)]
        a, b = blocks(4096, n)[r]
        rs = np.empty(b - a, np.float32)
        reqs.append(comm.ireduce_scatter(np.arange(4096, dtype=np.float32), rs, "max", algorithm))
        ag = np.empty(4096, np.float32)
        reqs.append(comm.iallgather(np.full(b - a, r, np.float32), ag, algorithm))
        bc = np.full(1000, r, np.int64)
        reqs.append(comm.ibroadcast(bc, 1, algorithm))
        sent = np.repeat(np.arange(n, dtype=np.int32) + 10 * r, 3)
        got = np.empty_like(sent)
        reqs.append(comm.iall2all(sent, got))
        counts = [p + 1 for p in range(n)]
        vsend = np.full(sum(counts), r, np.float64)
        vrecv = np.empty((r + 1) * n, np.float64)
        reqs.append(comm.iall2allv(vsend, counts, vrecv, [r + 1] * n))
        gpu.wait_all(reqs)
        assert np.array_equal(x, want)
        assert np.array_equal(rs, np.arange(a, b, dtype=np.float32))
        assert np.array_equal(ag, np.concatenate([np.full(q - p, m, np.float32)
                                                  for m, (p, q) in enumerate(blocks(4096, n))]))
        assert np.array_equal(bc, np.full(1000, 1, np.int64))
        assert np.array_equal(got, np.repeat(np.arange(n, dtype=np.int32) * 10 + r, 3))
        assert np.array_equal(vrecv, np.repeat(np.arange(n, dtype=np.float64), r + 1))
        return True

    base = "dgx-h100" if algorithm in ("sharp", "nvls", "auto") else "h100-ib"
    result = run(main, base=base)
    assert result.role != "gpu" or result.value


@pytest.mark.parametrize("base, algorithm", [("h100-ib", "ring"), ("dgx-h100", "sharp"), ("dgx-h100", "nvls")])
def test_compute_overlaps_the_collective_issued_before_it(base, algorithm):
    """t0 + max(C, T): C below, equal to and above the collective's own time T."""

    def main(gpu):
        comm = gpu.world
        x = np.ones(S // 4, np.float32)
        comm.barrier()
        t0 = gpu.now_ns
        comm.allreduce(x, "sum", algorithm)
        T = max(comm.allgather_object(gpu.now_ns - t0))  # every member's clock: the slowest's
        ends = []
        for C in (0.25 * T, T, 3.0 * T):
            comm.barrier()
            t0 = gpu.now_ns
            req = comm.iallreduce(x, "sum", algorithm)
            assert gpu.now_ns == t0  # issuing takes no modeled time
            gpu.compute(C)
            req.wait()
            ends.append((C, max(comm.allgather_object(gpu.now_ns - t0))))
        return T, ends

    result = run(main, base=base)
    if result.role == "gpu":
        T, ends = result.value
        if algorithm != "nvls":  # nvls's form is a bound where the switch's engine is slower than the link
            assert same(T, cost.modeled_ns("allreduce", algorithm, S, gpus(), preset(base, gpus=gpus())))
        for C, step in ends:
            assert same(step, max(C, T)), (C, T, step)


def test_requests_run_one_after_another_and_a_blocking_call_queues_behind_them():
    def main(gpu):
        comm = gpu.world
        a, b, c = (np.ones(S // 4, np.float32) for _ in range(3))
        comm.barrier()
        t0 = gpu.now_ns
        comm.allreduce(a, "sum", "ring")
        T = max(comm.allgather_object(gpu.now_ns - t0))
        comm.barrier()
        t0 = gpu.now_ns
        r1, r2 = comm.iallreduce(a, "sum", "ring"), comm.iallreduce(b, "sum", "ring")
        gpu.compute(0.5 * T)
        gpu.wait_all([r1, r2])
        two = max(comm.allgather_object(gpu.now_ns - t0))
        starts = (r1.start_ns - t0, r2.start_ns - t0)
        comm.barrier()
        t0 = gpu.now_ns
        r3 = comm.iallreduce(a, "sum", "ring")
        comm.allreduce(c, "sum", "ring")  # blocking: runs after r3 on the stream
        three = max(comm.allgather_object(gpu.now_ns - t0))
        r3.wait()
        assert np.array_equal(c, np.full(S // 4, gpu.size, np.float32))
        return T, two, starts, three

    result = run(main, base="h100-ib")
    if result.role == "gpu":
        T, two, (s1, s2), three = result.value
        assert same(s1, 0.0) and same(s2, T)
        assert same(two, 2 * T) and same(three, 2 * T)


def test_test_and_wait_any_answer_in_modeled_time():
    def main(gpu):
        comm = gpu.world
        x = np.ones(S // 4, np.float32)
        comm.barrier()
        t0 = gpu.now_ns
        comm.allreduce(x, "sum", "direct")
        T = gpu.now_ns - t0  # this GPU's own time
        comm.barrier()
        t0 = gpu.now_ns
        req = comm.iallreduce(x, "sum", "direct")
        polls = 0
        while not req.test():
            gpu.compute(T / 2.5)
            polls += 1
        waited_at = gpu.now_ns
        req.wait()
        assert gpu.now_ns == waited_at  # test() said done: wait does not move the clock
        small, big = np.ones(256, np.float32), np.ones(S // 4, np.float32)
        comm.barrier()
        order = [comm.iallreduce(big, "sum", "direct"), comm.iallreduce(small, "sum", "direct")]
        first = gpu.wait_any(order)
        gpu.wait_all(order)
        return polls, 3, first  # 2.5 steps of compute cover T: the third poll sees it done

    result = run(main, base="h100-ib")
    if result.role == "gpu":
        polls, want, first = result.value
        assert polls == want
        assert first == 0  # the stream runs them in issue order: the big one ends first


def test_overlap_with_the_compute_model():
    """A layer's gradient allreduce hidden behind the next layer's backward kernel (bf16 GEMM)."""

    def main(gpu):
        comm = gpu.world
        grad = np.ones(S // 4, np.float32)
        comm.barrier()
        t0 = gpu.now_ns
        req = comm.iallreduce(grad, "avg", "ring")
        kernel = gpu.compute(flops=2 * 4096 ** 3, bytes=3 * 4096 * 4096 * 2, dtype="bfloat16")
        req.wait()
        comm_ns = req.end_ns - req.start_ns
        return gpu.now_ns - t0, kernel, comm_ns

    result = run(main, base="h100-ib")
    if result.role == "gpu":
        step, kernel, comm_ns = result.value
        assert same(kernel, preset("h100-ib").compute_ns(2 * 4096 ** 3, 3 * 4096 * 4096 * 2, "bfloat16"))
        assert same(step, max(kernel, comm_ns))


def test_a_mismatch_raises_at_wait_on_every_member_and_later_calls_still_work():
    def main(gpu):
        comm = gpu.world
        x = np.ones(1024 if gpu.rank else 2048, np.float32)
        req = comm.iallreduce(x, "sum", "ring")  # issuing checks only this member's own arguments
        with pytest.raises(CollectiveMismatch, match="different collectives or arguments"):
            req.wait()
        with pytest.raises(CollectiveMismatch):
            req.wait()  # a failed request stays failed
        y = np.ones(512, np.float32)
        comm.allreduce(y)
        return float(y[0])

    result = run(main, base="h100-ib")
    assert result.role != "gpu" or result.value == gpus()


def test_a_bad_argument_raises_at_issue_and_every_member_fails_the_call():
    def main(gpu):
        comm = gpu.world
        pending = comm.iallreduce(np.ones(256, np.float32), "sum", "ring")
        if gpu.rank == 1:
            with pytest.raises(FabricError, match="contiguous"):
                comm.iallreduce(np.ones((8, 8), np.float32)[:, ::2])
        else:
            req = comm.iallreduce(np.ones(256, np.float32))
            with pytest.raises(CollectiveMismatch, match="GPU 1's FabricError"):
                req.wait()
        pending.wait()
        return True

    result = run(main, base="h100-ib")
    assert result.role != "gpu" or result.value


def test_pending_requests_move_their_bytes_before_point_to_point_traffic_and_at_the_end():
    def main(gpu):
        n, r = gpu.size, gpu.rank
        x = np.ones(4096, np.float32)
        req = gpu.world.iallreduce(x, "sum", "sharp")
        msg = np.full(64, r, np.int32)
        sends = gpu.send_message((r + 1) % n, ("hello",), msg)  # drains the allreduce first
        got = np.empty(64, np.int32)
        gpu.receive_message(("hello",), got, (r - 1) % n)
        gpu.wait_sent([sends], "hello")
        assert req.end_ns is not None and np.array_equal(x, np.full(4096, n, np.float32))
        assert np.array_equal(got, np.full(64, (r - 1) % n, np.int32))
        req.wait()
        gpu.world.iallreduce(np.ones(4096, np.float32), "sum", "ring")  # never waited: runs at the end
        return True

    result = run(main)
    calls = result.report["collectives"]
    assert all(len(calls[g]) == 2 and calls[g][1]["algorithm"] == "ring" for g in range(gpus()))


def test_control_calls_progress_pending_requests_whichever_order_members_wait_in():
    """MPI progresses inside every call: GPU 0 waits after an allgather_object, the others before it."""

    def main(gpu):
        comm = gpu.world
        x = np.ones(1024, np.float32)
        req = comm.iallreduce(x, "sum", "ring")
        if gpu.rank == 0:
            got = comm.allgather_object(gpu.rank)
            req.wait()
        else:
            req.wait()
            got = comm.allgather_object(gpu.rank)
        sub = comm.split(gpu.rank % 2)  # split progresses them too
        sub_req = sub.iallreduce(x, "sum", "direct")
        comm.barrier()
        sub_req.wait()
        return got == list(range(gpu.size)) and float(x[0]) == gpu.size * sub.size

    result = run(main, base="h100-ib")
    assert result.role != "gpu" or result.value


def test_free_runs_the_requests_that_own_the_memory_first():
    def main(gpu):
        x = gpu.alloc(1024)
        x[:] = 1
        req = gpu.world.iallreduce(x, "sum", "ring")
        gpu.free(x)  # the allreduce ran before the memory went back
        y = gpu.alloc(1024)
        y[:] = 7
        req.wait()
        return bool(np.all(y == 7))

    result = run(main, base="h100-ib")
    assert result.role != "gpu" or result.value


def test_a_request_never_waited_for_counts_in_the_elapsed_time():
    def main(gpu):
        gpu.world.iallreduce(np.ones(S // 4, np.float32), "sum", "ring")
        gpu.compute(1000.0)

    result = run(main, base="h100-ib")
    report = result.report
    record = report["collectives"][0][0]
    assert report["elapsed_ns"] >= record["m_end_ns"] > 1000.0
    assert all(link["busy_ns"] <= report["elapsed_ns"] for link in report["links"].values())


def test_wait_all_waits_for_every_request_before_it_raises_the_first_failure():
    def main(gpu):
        comm = gpu.world
        good = np.ones(S // 4, np.float32)
        bad = comm.iallreduce(np.ones(64 if gpu.rank else 128, np.float32))
        ok = comm.iallreduce(good, "sum", "ring")
        with pytest.raises(CollectiveMismatch):
            gpu.wait_all([bad, ok])
        assert gpu.now_ns >= ok.end_ns and float(good[0]) == gpu.size
        with pytest.raises(FabricError, match="not a Request of this GPU"):
            gpu.wait_all([None])
        with pytest.raises(FabricError, match="wait_any of no requests"):
            gpu.wait_any([])
        return True

    result = run(main, base="h100-ib")
    assert result.role != "gpu" or result.value


def test_compute_arguments_are_checked():
    def main(gpu):
        for call, match in ((lambda: gpu.compute(5, dtype="fp8"), "not both"), (lambda: gpu.compute(), "give ns"),
                            (lambda: gpu.compute(10 ** 400), "finite"),
                            (lambda: gpu.compute(flops=1, dtype="int4"), "compute takes one of")):
            with pytest.raises(FabricError, match=match):
                call()
        return gpu.now_ns

    result = run(main)
    assert result.role != "gpu" or result.value == 0.0
