"""Multi-rank, one node: every collective's plan takes exactly its replayed time (fabric.cost_nodes.modeled_ns:
fabric.replay.replay_ns, fabric.plans.timing; to the rounding of a clock difference), as across nodes (tests/nodes): the point-to-point plans (ring,
direct) on the link clocks of fabric.programs, the in-switch ones (sharp, nvls) on the leaf's engine and ports
(fabric.switch_clocks.OneSwitch). Each call starts with every GPU at the same modeled time; its time is the
slowest member's, software latency included on both sides."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.reduction import blocks

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

DTYPES = {"float32": np.float32, "float16": np.float16}
# a few KiB (one message), uneven blocks and chunks, and several chunk_bytes messages (the overrides below)
SIZES = (3 * 1024, 4 * 15001, 4 * 60007)
# in-switch: 16 KiB chunks and a 128 KiB switch buffer, so the calls above run in several chunks and windows
# (3 GPUs, float32: sharp allreduce 4096-element chunks, 4 a window; reduce_scatter 2730, 2; nvls 2730, 2)
SMALL_SWITCH = dict(chunk_bytes=1 << 14, switch_buffer_bytes=1 << 17)


def values(lo, hi, dtype):
    """Elements lo..hi-1 of a buffer whose every value a 16-bit float holds exactly."""
    return (np.arange(lo, hi) % 2048).astype(dtype)


def one_call(gpu, collective, algorithm, name, nbytes, root):
    """One call of `collective` on `nbytes` (allreduce, broadcast, reduce: the buffer; reduce_scatter: the input;
    allgather and gather: the output; scatter: the root's input; all2all: the send buffer) of `name` elements."""
    dtype, n = DTYPES[name], gpu.size
    count = nbytes // np.dtype(dtype).itemsize
    lo, hi = blocks(count, n)[gpu.rank]
    if collective == "allreduce":
        x = np.ones(count, dtype)
        gpu.world.allreduce(x, "sum", algorithm)
        assert np.all(x == n)
    elif collective == "reduce_scatter":
        recv = np.empty(hi - lo, dtype)
        gpu.world.reduce_scatter(np.ones(count, dtype), recv, "sum", algorithm)
        assert np.all(recv == n)
    elif collective == "allgather":
        recv = np.empty(count, dtype)
        gpu.world.allgather(values(lo, hi, dtype), recv, algorithm)
        assert np.array_equal(recv, values(0, count, dtype))
    elif collective == "broadcast":
        x = values(0, count, dtype) if gpu.rank == root else np.zeros(count, dtype)
        gpu.world.broadcast(x, root, algorithm)
        assert np.array_equal(x, values(0, count, dtype))
    elif collective == "reduce":
        recv = np.empty(count, dtype) if gpu.rank == root else None
        gpu.world.reduce(np.ones(count, dtype), recv, root, "sum", algorithm)
        assert recv is None or np.all(recv == n)
    elif collective == "gather":  # nbytes: the root's output, n blocks
        recv = np.empty(count // n * n, dtype) if gpu.rank == root else None
        gpu.world.gather(values(0, count // n, dtype), recv, root)
        assert recv is None or np.array_equal(recv, np.tile(values(0, count // n, dtype), n))
    elif collective == "scatter":  # nbytes: the root's input, n blocks
        recv = np.empty(count // n, dtype)
        gpu.world.scatter(values(0, count // n * n, dtype) if gpu.rank == root else None, recv, root)
        assert np.array_equal(recv, values(count // n * gpu.rank, count // n * (gpu.rank + 1), dtype))
    else:
        gpu.world.all2all(np.ones(count, dtype), np.empty(count, dtype))


def emulated_and_replayed(calls, base, **overrides):
    """[(call, emulated ns, replayed ns)] of `calls` ((collective, algorithm, dtype name, bytes, root)) on
    `base` with `overrides`, on the GPU ranks (None on the switch rank)."""

    def main(gpu):
        times = []
        for call in calls:
            gpu.world.barrier()  # every member leaves at the same modeled time, its links idle
            start = gpu.now_ns
            one_call(gpu, *call)
            times.append(max(gpu.world.allgather_object(gpu.now_ns - start)))
        return times

    result = run(main, timeout_s=120, base=base, **overrides)
    if result.role != "gpu":
        return None
    config = preset(base, gpus=gpus(), **overrides)
    out = []
    for call, got in zip(calls, result.value):
        collective, algorithm, name, nbytes, root = call
        want = cost_nodes.modeled_ns(collective, algorithm, config.topology, nbytes, config,
                                     np.dtype(DTYPES[name]).itemsize, root)
        out.append((call, got, want))
    return out


def calls_of(algorithms, collectives, sizes=SIZES, dtypes=("float32", "float16")):
    n = gpus()
    out = []
    for algorithm in algorithms:
        for collective in collectives:
            for name in dtypes:
                item = np.dtype(DTYPES[name]).itemsize
                for nbytes in sizes:
                    if collective in ("all2all", "gather", "scatter"):  # n blocks of one size
                        nbytes = nbytes // (n * item) * n * item
                    roots = (0, n - 1) if collective in ("broadcast", "reduce", "gather", "scatter") else (0,)
                    out += [(collective, algorithm, name, nbytes, root) for root in roots]
    return out


def assert_exact(rows):
    """Emulated = replayed, to the rounding of a clock difference: an emulated call starts at the clock the
    barrier left (microseconds in), the replay at 0, so their last bits differ (1e-14 relative seen); the
    tolerance is tests/nodes' (nodes_helpers.check_bytes_and_times)."""
    if rows is None:
        return  # the switch rank
    wrong = [(call, got, want) for call, got, want in rows if got != pytest.approx(want, rel=1e-12, abs=1e-9)]
    assert not wrong, "\n".join(f"{call}: emulated {got!r} ns, replayed {want!r} ns" for call, got, want in wrong)


@pytest.mark.both_sizes  # launch.model marks one node's rows validated at both tier sizes (3 and 8 GPUs)
def test_ring_and_direct_on_one_node_take_their_replayed_time_exactly():
    """ring and direct, every collective they run (all2all, gather and scatter: direct), on dgx-h100 at its default chunk and with
    16 KiB messages (several a block), float32 and float16, broadcast from the first and the last GPU."""
    collectives = ("allreduce", "reduce_scatter", "allgather", "broadcast")
    calls = (calls_of(("ring", "direct"), collectives + ("reduce",)) + calls_of(("direct",), ("all2all",))
             + calls_of(("direct",), ("gather", "scatter")))
    assert_exact(emulated_and_replayed(calls, "dgx-h100"))
    assert_exact(emulated_and_replayed(calls, "dgx-h100", chunk_bytes=1 << 14))


@pytest.mark.both_sizes
def test_sharp_and_nvls_on_one_node_take_their_replayed_time_exactly():
    """sharp (allreduce, reduce_scatter, allgather, broadcast and reduce: pushes, paced by the root's credits in
    reduce, and multicast stores) and nvls
    (load-reduces; its allgather and broadcast are sharp's stores) on dgx-h100, in one chunk and in several
    chunks and windows of a small switch buffer, float32 and float16 (the engine finishes 16-bit floats in
    their own width on one node), on the calibrated engine (slower than the link) and at line rate."""
    collectives = ("allreduce", "reduce_scatter", "allgather", "broadcast")
    calls = calls_of(("sharp", "nvls"), collectives) + calls_of(("sharp",), ("reduce",))
    assert_exact(emulated_and_replayed(calls, "dgx-h100"))
    assert_exact(emulated_and_replayed(calls, "dgx-h100", **SMALL_SWITCH))
    assert_exact(emulated_and_replayed(calls_of(("sharp", "nvls"), ("allreduce", "reduce_scatter")), "dgx-h100-line",
                                       **SMALL_SWITCH))
