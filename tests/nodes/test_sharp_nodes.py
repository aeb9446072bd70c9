"""Multi-rank, several nodes: `sharp` allreduce in two levels of switches (fabric.switch, Spanning
groups) on superpod-h100-nvlink - against a numpy oracle of the same two-level combine order for every
op and dtype, bitwise the same run to run, exact bytes on every link of both levels, and modeled time
equal to fabric.replay's (cost_nodes.modeled_ns). World size 8 has two spines, 10 one."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import BFLOAT16, blocks
from nvlink_emu.ranks.collectives import choose

from nodes_helpers import config, run, shape

pytestmark = pytest.mark.mpi(min_size=7)

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "uint8")
OPS = ("sum", "avg", "max", "min", "prod")
UFUNC = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
COUNT = 3000 + 7  # elements: several 4 KiB chunks, the last one short


def dtype_of(name: str) -> np.dtype:
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def contribution(gpu_index: int, name: str, op: str, count: int = COUNT) -> np.ndarray:
    """GPU `gpu_index`'s input: random floats whose sums round differently in other orders; small integers
    (prod near 1, so that products stay finite)."""
    rng = np.random.default_rng(1000 + gpu_index)
    if name in ("int32", "uint8"):
        values = rng.integers(0, 3 if op == "prod" else 100, count)
    elif op == "prod":
        values = rng.uniform(0.5, 1.5, count)
    else:
        values = rng.standard_normal(count) * 100
    return values.astype(dtype_of(name))


def two_level(members: list[int], per_node: int, name: str, op: str, count: int = COUNT) -> np.ndarray:
    """The oracle: each node's members folded in rank order, then the node partials in node order, in
    float32 for 16-bit floats (the dtype otherwise), rounded once; avg divides once by the member count."""
    dtype = dtype_of(name)
    wide = np.dtype(np.float32) if name in ("float16", "bfloat16") else dtype
    partials = []
    for node in sorted({g // per_node for g in members}):
        acc = None
        for g in [m for m in members if m // per_node == node]:
            x = contribution(g, name, op, count).astype(wide)
            acc = x if acc is None else UFUNC[op](acc, x, dtype=wide)
        partials.append(acc)
    total = partials[0]
    for partial in partials[1:]:
        total = UFUNC[op](total, partial, dtype=wide)
    if op == "avg":
        total = total // len(members) if wide.kind in "iu" else total / np.asarray(len(members), wide)
    return total.astype(dtype)


def test_sharp_allreduce_across_nodes_is_the_two_level_order_for_every_op_and_dtype():
    """Every op and dtype on the world and on a communicator of one GPU per node (world size 10: one of
    two per node), twice each, bitwise equal to the oracle both times; sharp's (rooted) reduce stays refused
    across nodes."""
    _, per_node, _ = shape()

    def main(gpu):
        rail = gpu.world.split(gpu.rank % per_node)  # one member per node: partials of a single GPU
        for comm in (gpu.world, rail):
            members = [comm.members[r] for r in range(comm.size)]
            for name in DTYPES:
                for op in OPS:
                    want = two_level(members, per_node, name, op)
                    for _ in range(2):
                        x = contribution(gpu.rank, name, op)
                        comm.allreduce(x, op=op, algorithm="sharp")
                        assert x.tobytes() == want.tobytes(), (comm.size, name, op)
        x = np.ones(64, np.float32)
        with pytest.raises(UnsupportedOperation, match="reduce with 'sharp'.*nodes"):
            gpu.world.reduce(np.ones(8, np.float32), np.empty(8, np.float32), root=0, algorithm="sharp")
        return True

    result = run(main, chunk_bytes=4096, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True


def test_sharp_reduce_scatter_across_nodes_is_the_two_level_order_for_every_op_and_dtype():
    """Block j reduced as the allreduce's (each leaf its node's members in rank order, the spine the
    leaves' partials in node order) and sent by the spine to member j's leaf only, by that leaf to
    member j only: every op and dtype on the world and on one GPU per node, bitwise the oracle's."""
    _, per_node, _ = shape()

    def main(gpu):
        rail = gpu.world.split(gpu.rank % per_node)
        for comm in (gpu.world, rail):
            members = [comm.members[r] for r in range(comm.size)]
            lo, hi = blocks(COUNT, comm.size)[comm.rank]
            for name in DTYPES:
                for op in OPS:
                    recv = np.empty(hi - lo, dtype_of(name))
                    comm.reduce_scatter(contribution(gpu.rank, name, op), recv, op=op, algorithm="sharp")
                    assert recv.tobytes() == two_level(members, per_node, name, op)[lo:hi].tobytes(), (comm.size, name, op)
        return True

    result = run(main, chunk_bytes=4096, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True


def test_sharp_allreduce_across_nodes_puts_exact_bytes_on_both_levels_and_takes_the_replayed_time():
    """One chunk and several (chunk c to spine c mod P), float32 and float16 (whose partials go up in
    float32): every link's payload is cost_nodes.link_bytes', and each call's modeled time, every GPU
    starting together, is cost_nodes.modeled_ns' (the replay) exactly. auto picks sharp by that model
    for a large allreduce on this fabric."""
    cfg = config(chunk_bytes=1 << 14)
    calls = [("float32", 4096), ("float32", 5 * (1 << 14) + 40), ("float16", 3 * (1 << 14) + 2)]

    def main(gpu):
        times = []
        for name, nbytes in calls:
            x = np.ones(nbytes // dtype_of(name).itemsize, dtype_of(name))
            gpu.world.barrier()  # every member starts at the latest clock, its links idle by then
            start = gpu.now_ns
            gpu.world.allreduce(x, algorithm="sharp")
            assert np.all(x == gpu.size)
            gpu.world.barrier()
            times.append(gpu.now_ns - start)
        return times

    result = run(main, timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role != "gpu":
        return
    topo = cfg.topology
    expected = dict.fromkeys((link.name for link in topo.links), 0)
    for (name, nbytes), got in zip(calls, result.value):
        item = dtype_of(name).itemsize
        wide = 4 if name == "float16" else item
        for link, value in cost_nodes.link_bytes("allreduce", "sharp", topo, nbytes, item, config=cfg,
                                                 partial_itemsize=wide).items():
            expected[link] += value
        want = cost_nodes.modeled_ns("allreduce", "sharp", topo, nbytes, cfg, item, partial_itemsize=wide)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-9), (name, nbytes)
    got = {link: result.report["links"].get(link, {}).get("payload_bytes", 0) for link in expected}
    assert got == expected
    # by hand: per GPU S each way over the three calls; chunk c of each call to spine c mod P
    total = sum(nbytes for _, nbytes in calls)
    assert all(got[link.name] == total for link in topo.links if link.level == "gpu-leaf")
    levels = topo.totals_by_level(got)
    up, down = levels["leaf-spine"]["up"], levels["leaf-spine"]["down"]
    assert down == topo.nodes * total and up == topo.nodes * (total + calls[2][1])  # float16: float32 up
    assert choose("allreduce", "auto", cfg, 1 << 24) == "sharp"


def test_sharp_allgather_and_broadcast_across_nodes_deliver_every_block_for_every_dtype():
    """Multicast stores across nodes (a copy to the node's members at the sender's leaf, one up to spine
    (p + c) mod P, one down to every other leaf): allgather of uneven blocks (fabric.reduction.blocks)
    and broadcast from a root in the first and in the last node, on the world and on one GPU per node,
    every dtype, bitwise against numpy."""
    _, per_node, _ = shape()

    def main(gpu):
        rail = gpu.world.split(gpu.rank % per_node)
        for comm in (gpu.world, rail):
            members = [comm.members[r] for r in range(comm.size)]
            for name in DTYPES:
                # the output: every member's block of its own data, blocks as the collective cuts COUNT
                want = np.concatenate([contribution(g, name, "sum")[lo:hi]
                                       for g, (lo, hi) in zip(members, blocks(COUNT, comm.size))])
                lo, hi = blocks(COUNT, comm.size)[comm.rank]
                recv = np.empty(COUNT, dtype_of(name))
                comm.allgather(contribution(gpu.rank, name, "sum")[lo:hi], recv, algorithm="sharp")
                assert recv.tobytes() == want.tobytes(), (comm.size, name)
                for root in (0, comm.size - 1):
                    sent = contribution(members[root], name, "sum")
                    x = sent.copy() if comm.rank == root else np.zeros(COUNT, dtype_of(name))
                    comm.broadcast(x, root=root, algorithm="sharp")
                    assert x.tobytes() == sent.tobytes(), (comm.size, name, root)
        return True

    result = run(main, chunk_bytes=1024, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True


def test_sharp_reduce_scatter_allgather_and_broadcast_across_nodes_put_exact_bytes_and_take_the_replayed_time():
    """One chunk and several per block (reduce_scatter: chunk c of every block to spine c mod P, block j's
    result to member j's leaf only; a float16 partial goes up in float32; allgather, broadcast: chunk c
    of member p's stores to spine (p + c) mod P), a broadcast from the first and from the last GPU:
    every link's payload is cost_nodes.link_bytes' and each call's modeled time, every GPU starting
    together, cost_nodes.modeled_ns' (the replay) exactly."""
    cfg = config(chunk_bytes=1 << 12)
    n = cfg.gpus
    calls = [("reduce_scatter", "float32", 4 * n * 256, 0), ("reduce_scatter", "float32", 4 * n * 3000 + 4 * 3, 0),
             ("reduce_scatter", "float16", 2 * n * 5000, 0),
             ("allgather", "float32", 4 * n * 256, 0), ("allgather", "float32", 4 * n * 3000 + 4 * 3, 0),
             ("broadcast", "float32", 4 * 1000, 0), ("broadcast", "float32", 5 * (1 << 12) + 8, n - 1)]

    def main(gpu):
        times = []
        for collective, name, nbytes, root in calls:
            dtype = dtype_of(name)
            count = nbytes // dtype.itemsize
            lo, hi = blocks(count, gpu.size)[gpu.rank]
            gpu.world.barrier()  # every member starts at the latest clock, its links idle by then
            start = gpu.now_ns
            if collective == "reduce_scatter":
                recv = np.empty(hi - lo, dtype)
                gpu.world.reduce_scatter(np.ones(count, dtype), recv, algorithm="sharp")
                assert np.all(recv == gpu.size)
            elif collective == "allgather":
                recv = np.empty(count, dtype)
                gpu.world.allgather(np.arange(lo, hi, dtype=dtype), recv, algorithm="sharp")
                assert np.array_equal(recv, np.arange(count, dtype=dtype))
            else:
                x = np.arange(count, dtype=dtype) if gpu.rank == root else np.zeros(count, dtype)
                gpu.world.broadcast(x, root=root, algorithm="sharp")
                assert np.array_equal(x, np.arange(count, dtype=dtype))
            gpu.world.barrier()
            times.append(gpu.now_ns - start)
        return times

    result = run(main, timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role != "gpu":
        return
    topo = cfg.topology
    expected = dict.fromkeys((link.name for link in topo.links), 0)
    for (collective, name, nbytes, root), got in zip(calls, result.value):
        item = dtype_of(name).itemsize
        wide = 4 if name == "float16" else item
        for link, value in cost_nodes.link_bytes(collective, "sharp", topo, nbytes, item, root, config=cfg,
                                                 partial_itemsize=wide).items():
            expected[link] += value
        want = cost_nodes.modeled_ns(collective, "sharp", topo, nbytes, cfg, item, root, partial_itemsize=wide)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-9), (collective, name, nbytes, root)
    got = {link: result.report["links"].get(link, {}).get("payload_bytes", 0) for link in expected}
    assert got == expected
    # by hand. reduce_scatter: every GPU tx S, rx S / n; up each cable the partials once (float16's in
    # float32: twice the bytes), down each node only its members' blocks. allgather, broadcast: every
    # downlink S; up each cable a node's stores once, down the other nodes' stores
    rs = [(nbytes, 2 if name == "float16" else 1) for c, name, nbytes, _ in calls if c == "reduce_scatter"]
    mc = [nbytes for c, _, nbytes, _ in calls if c != "reduce_scatter"]
    levels = topo.totals_by_level(got)
    assert levels["gpu-leaf"]["down"] == sum(b for b, _ in rs) + n * sum(mc)
    assert levels["leaf-spine"]["up"] == topo.nodes * sum(b * w for b, w in rs) + sum(mc)
    assert levels["leaf-spine"]["down"] == sum(b for b, _ in rs) + (topo.nodes - 1) * sum(mc)
