"""Multi-rank, several nodes: `sharp` allreduce in two levels of switches (fabric.switch, Spanning
groups) on superpod-h100-nvlink - against a numpy oracle of the same two-level combine order for every
op and dtype, bitwise the same run to run, exact bytes on every link of both levels, and modeled time
equal to fabric.replay's (cost_nodes.modeled_ns). World size 8 has two spines, 10 one."""

import numpy as np
import pytest

from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import blocks
from nvlink_emu.ranks.collectives import choose

from nodes_helpers import (DTYPES, check_bytes_and_times, config, contribution, dtype_of, every_op_and_dtype, run,
                           shape, timed, two_level, world_and_rail)

pytestmark = pytest.mark.mpi(min_size=7)

COUNT = 3000 + 7  # elements: several 4 KiB chunks, the last one short


@pytest.mark.both_sizes  # the spine folds 3 leaves' partials instead of 2: another order
def test_sharp_allreduce_across_nodes_is_the_two_level_order_for_every_op_and_dtype():
    """Every op and dtype on the world and on a communicator of one GPU per node (world size 10: one of
    two per node), twice each, bitwise equal to the oracle both times; sharp's (rooted) reduce stays refused
    across nodes."""
    _, per_node, _ = shape()

    def main(gpu):
        for comm, members, name, op in every_op_and_dtype(gpu):
            want = two_level(members, per_node, name, op, COUNT)
            for _ in range(2):
                x = contribution(gpu.rank, name, op, COUNT)
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
        for comm, members, name, op in every_op_and_dtype(gpu):
            lo, hi = blocks(COUNT, comm.size)[comm.rank]
            recv = np.empty(hi - lo, dtype_of(name))
            comm.reduce_scatter(contribution(gpu.rank, name, op, COUNT), recv, op=op, algorithm="sharp")
            assert recv.tobytes() == two_level(members, per_node, name, op, COUNT)[lo:hi].tobytes(), (comm.size, name, op)
        return True

    result = run(main, chunk_bytes=4096, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True


@pytest.mark.both_sizes  # spine bytes and the replayed time depend on leaves per spine
def test_sharp_allreduce_across_nodes_puts_exact_bytes_on_both_levels_and_takes_the_replayed_time():
    """One chunk and several (chunk c to spine c mod P), float32 and float16 (whose partials go up in
    float32): every link's payload is cost_nodes.link_bytes', and each call's modeled time, every GPU
    starting together, is cost_nodes.modeled_ns' (the replay) exactly. auto picks sharp by that model
    for a large allreduce on this fabric."""
    cfg = config(chunk_bytes=1 << 14)
    calls = [("allreduce", "float32", 4096, 0), ("allreduce", "float32", 5 * (1 << 14) + 40, 0),
             ("allreduce", "float16", 3 * (1 << 14) + 2, 0)]

    def one(gpu, collective, name, nbytes, root):
        x = np.ones(nbytes // dtype_of(name).itemsize, dtype_of(name))
        gpu.world.allreduce(x, algorithm="sharp")
        assert np.all(x == gpu.size)

    result = run(timed(calls, one), timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role != "gpu":
        return
    topo = cfg.topology
    got = check_bytes_and_times(result, cfg, "sharp", calls)
    # by hand: per GPU S each way over the three calls; chunk c of each call to spine c mod P
    total = sum(nbytes for _, _, nbytes, _ in calls)
    assert all(got[link.name] == total for link in topo.links if link.level == "gpu-leaf")
    levels = topo.totals_by_level(got)
    up, down = levels["leaf-spine"]["up"], levels["leaf-spine"]["down"]
    assert down == topo.nodes * total and up == topo.nodes * (total + calls[2][2])  # float16: float32 up
    assert choose("allreduce", "auto", cfg, 1 << 24) == "sharp"


def test_sharp_allgather_and_broadcast_across_nodes_deliver_every_block_for_every_dtype():
    """Multicast stores across nodes (a copy to the node's members at the sender's leaf, one up to spine
    (p + c) mod P, one down to every other leaf): allgather of uneven blocks (fabric.reduction.blocks)
    and broadcast from a root in the first and in the last node, on the world and on one GPU per node,
    every dtype, bitwise against numpy."""
    def main(gpu):
        for comm, members in world_and_rail(gpu):
            for name in DTYPES:
                # the output: every member's block of its own data, blocks as the collective cuts COUNT
                want = np.concatenate([contribution(g, name, "sum", COUNT)[lo:hi]
                                       for g, (lo, hi) in zip(members, blocks(COUNT, comm.size))])
                lo, hi = blocks(COUNT, comm.size)[comm.rank]
                recv = np.empty(COUNT, dtype_of(name))
                comm.allgather(contribution(gpu.rank, name, "sum", COUNT)[lo:hi], recv, algorithm="sharp")
                assert recv.tobytes() == want.tobytes(), (comm.size, name)
                for root in (0, comm.size - 1):
                    sent = contribution(members[root], name, "sum", COUNT)
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

    def one(gpu, collective, name, nbytes, root):
        dtype = dtype_of(name)
        count = nbytes // dtype.itemsize
        lo, hi = blocks(count, gpu.size)[gpu.rank]
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

    result = run(timed(calls, one), timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role != "gpu":
        return
    topo = cfg.topology
    got = check_bytes_and_times(result, cfg, "sharp", calls)
    # by hand. reduce_scatter: every GPU tx S, rx S / n; up each cable the partials once (float16's in
    # float32: twice the bytes), down each node only its members' blocks. allgather, broadcast: every
    # downlink S; up each cable a node's stores once, down the other nodes' stores
    rs = [(nbytes, 2 if name == "float16" else 1) for c, name, nbytes, _ in calls if c == "reduce_scatter"]
    mc = [nbytes for c, _, nbytes, _ in calls if c != "reduce_scatter"]
    levels = topo.totals_by_level(got)
    assert levels["gpu-leaf"]["down"] == sum(b for b, _ in rs) + n * sum(mc)
    assert levels["leaf-spine"]["up"] == topo.nodes * sum(b * w for b, w in rs) + sum(mc)
    assert levels["leaf-spine"]["down"] == sum(b for b, _ in rs) + (topo.nodes - 1) * sum(mc)
