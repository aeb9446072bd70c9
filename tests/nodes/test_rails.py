"""Multi-rank, several nodes: `ring` across nodes (one ring per rail, ranks/collectives/ring.py) and `tree`
(NCCL's double binary tree, tree.py): bitwise against numpy in their documented combine orders for every
op and reduction dtype, data moved for every kind of element, exact payload bytes on every link of both
levels (fabric.cost_nodes), and the layouts: one node (ring unchanged), nodes that do not line up (ring's
one ring; tree refuses)."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import (DTYPES, OPS, RING_CHANNEL_BYTES, blocks, channel_rings, combine, finish,
                                         rail_ranges, ring_channel_count, tree_parts)

from nodes_helpers import config, run, shape
from nodes_helpers import fold_contribution, same_bits

pytestmark = pytest.mark.mpi(min_size=7)

CHUNK = 4096  # small messages: every size below streams in several chunks
LONG = 2 * RING_CHANNEL_BYTES  # bytes from which ring runs two channels (one per rail of the 2-GPU nodes)


def grid():
    nodes, per_node, _ = shape()
    return [[a * per_node + j for j in range(per_node)] for a in range(nodes)]  # the world is node-major


def fold(op, inputs, order, lo, hi):
    acc = inputs[order[0]][lo:hi].copy()
    for m in order[1:]:
        combine(op, acc, inputs[m][lo:hi])
    return acc


def rings_of(count, itemsize):
    """ring's channels for a call of `count` elements: ring_channel_count of the rails' rings."""
    return channel_rings(grid())[:ring_channel_count(count * itemsize, shape()[1])]


def ring_reference(collective, op, inputs, root=0):
    """ring's documented fold across nodes: member m's range of channel c in ring c's order after m
    (reduce: part c of blocks(count, C) in ring c's order after the root); avg divides by n."""
    n, count = len(inputs), inputs[0].size
    rings = rings_of(count, inputs[0].dtype.itemsize)
    out = np.empty(count, inputs[0].dtype)
    if collective == "reduce":
        for (lo, hi), ring in zip(blocks(count, len(rings)), rings):
            q = ring.index(root)
            finish(op, fold(op, inputs, [ring[(q + 1 + i) % n] for i in range(n)], lo, hi), n, out[lo:hi])
        return out
    for m, row in enumerate(rail_ranges(count, n, len(rings))):
        for (lo, hi), ring in zip(row, rings):
            q = ring.index(m)
            finish(op, fold(op, inputs, [ring[(q + 1 + i) % n] for i in range(n)], lo, hi), n, out[lo:hi])
    return out


def tree_reference(op, inputs):
    """tree's documented fold: part t at member x = x's own data, then each child's partial in order."""
    n, count = len(inputs), inputs[0].size
    rank = grid()
    out = np.empty(count, inputs[0].dtype)
    for part, (lo, hi) in zip(tree_parts(len(rank), len(rank[0])), blocks(count, 2)):
        def partial(at):
            acc = inputs[rank[at[0]][at[1]]][lo:hi].copy()
            for child in part[at][1]:
                combine(op, acc, partial(child))
            return acc
        root = next(at for at, (parent, _) in part.items() if parent is None)
        finish(op, partial(root), n, out[lo:hi])
    return out


def test_reductions_equal_the_documented_folds_bitwise_for_every_op_and_dtype():
    # with two channels every op on float32, sum and avg on int32 and float16;
    # with one ring every op on float32, sum and avg on every other dtype (messages of 16 KiB: two a part
    # of the broadcast, reduce and tree at two channels)
    cases = [(op, "float32", "long") for op in OPS] + \
            [(op, name, "long") for op in ("sum", "avg") for name in ("int32", "float16")] + \
            [(op, "float32", "odd") for op in OPS] + \
            [(op, name, "odd") for op in ("sum", "avg") for name in DTYPES if name not in ("float32", "int32",
                                                                                            "float16")]

    def main(gpu):
        n, r, wrong = gpu.size, gpu.rank, []
        for op, name, size in cases:
            dtype = DTYPES[name]
            for count in ((2 * n + 1,) if size == "odd" else (LONG // dtype.itemsize + 5,)):
                inputs = [fold_contribution(m, count, dtype, op) for m in range(n)]
                for algorithm, want in (("ring", ring_reference("allreduce", op, inputs)),
                                        ("tree", tree_reference(op, inputs))):
                    array = inputs[r].copy()
                    gpu.world.allreduce(array, op, algorithm)
                    if not same_bits(array, want):
                        wrong.append(("allreduce", algorithm, op, name, count))
                lo, hi = blocks(count, n)[r]
                block = np.empty(hi - lo, dtype)
                gpu.world.reduce_scatter(inputs[r], block, op, "ring")
                if not same_bits(block, ring_reference("reduce_scatter", op, inputs)[lo:hi]):
                    wrong.append(("reduce_scatter", op, name, count))
                root = (count + len(name)) % n
                out = np.empty(count, dtype) if r == root else None
                gpu.world.reduce(inputs[r], out, root, op, "ring")
                if r == root and not same_bits(out, ring_reference("reduce", op, inputs, root)):
                    wrong.append(("reduce", op, name, count, root))
        assert not wrong, wrong

    run(main, chunk_bytes=4 * CHUNK, timeout_s=120)


def test_ring_allgather_and_broadcast_move_every_kind_of_element():
    movable = [np.dtype(d) for d in ("uint8", "float16", "complex128", ">f4", "S7")] + \
              [np.dtype([("id", "<u4"), ("w", "<f8")])]

    def main(gpu):
        n, r = gpu.size, gpu.rank
        for i, dtype in enumerate(movable):
            long = (LONG // dtype.itemsize + 1,) if i % 2 == 0 else ()  # two channels, for every other dtype
            for count in (0, 1, 2 * n + 1, 3 * CHUNK // dtype.itemsize + 1, *long):
                rng = np.random.default_rng(i * 100 + count)
                raw = rng.integers(0, 256, (n, count * dtype.itemsize), dtype=np.uint8)
                whole = [raw[m].view(dtype) for m in range(n)]
                parts = blocks(count, n)
                gathered = np.empty(count, dtype)
                gpu.world.allgather(whole[r][slice(*parts[r])].copy(), gathered, algorithm="ring")
                expected = np.concatenate([whole[m].view(np.uint8)[parts[m][0] * dtype.itemsize:
                                                                   parts[m][1] * dtype.itemsize] for m in range(n)])
                assert gathered.tobytes() == expected.tobytes(), (dtype, count)
                for root in {(i + count) % n, n - 1}:
                    array = whole[r].copy()
                    gpu.world.broadcast(array, root=root, algorithm="ring")
                    assert same_bits(array, whole[root]), (dtype, count, root)

    run(main, chunk_bytes=CHUNK)


S = LONG + 24  # bytes: two ring channels, uneven ranges, several MTU packets each


def calls(gpu):
    """One call of each collective ring runs across nodes, and tree's allreduce, each checked against
    numpy; returns (collective, algorithm, bytes, root) of each, for fabric.cost_nodes."""
    n, rank, count = gpu.size, gpu.rank, S // 4
    base = np.arange(count, dtype=np.float32)
    done = []
    x = gpu.alloc(count, "float32")
    for algorithm in ("ring", "tree"):
        x[:] = base + rank
        gpu.world.allreduce(x, algorithm=algorithm)
        assert np.array_equal(x, n * base + n * (n - 1) / 2)
        done.append(("allreduce", algorithm, S, 0))
    parts = blocks(count, n)
    out = gpu.alloc(parts[rank][1] - parts[rank][0], "float32")
    x[:] = base * (rank + 1)
    gpu.world.reduce_scatter(x, out, algorithm="ring")
    assert np.array_equal(out, base[slice(*parts[rank])] * (n * (n + 1) / 2))
    done.append(("reduce_scatter", "ring", S, 0))
    mine = gpu.alloc(len(out), "float32")
    mine[:] = rank
    gathered = gpu.alloc(count, "float32")
    gpu.world.allgather(mine, gathered, algorithm="ring")
    assert np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.float32), [b - a for a, b in parts]))
    done.append(("allgather", "ring", S, 0))
    _, per_node, _ = shape()
    for root in (n - 1, per_node):  # the last node's last GPU; node 1's first, where ring 0 enters node 1
        x[:] = base if rank == root else -1
        gpu.world.broadcast(x, root=root, algorithm="ring")
        assert np.array_equal(x, base)
        done.append(("broadcast", "ring", S, root))
    return done


@pytest.mark.both_sizes  # ring and tree over 3 nodes (odd) vs 2 put other bytes on each level
def test_ring_and_tree_put_the_documented_bytes_on_every_link_of_both_levels():
    result = run(calls)
    if result.role != "gpu":
        return
    cfg = config()
    topo = cfg.topology
    expected = {link.name: 0 for link in topo.links}
    for collective, algorithm, nbytes, root in result.value:
        if collective == "broadcast":  # not in cost_nodes' FLAT: its replayed program's sends, summed here
            t = np.zeros((topo.gpus, topo.gpus), np.int64)
            rings = rings_of(nbytes // 4, 4)
            for (lo, hi), ring in zip(blocks(nbytes // 4, len(rings)), rings):
                q = ring.index(root)
                for i in range(topo.gpus - 1):  # the chain root, its successor, ...: every hop but the last's
                    t[ring[(q + i) % topo.gpus], ring[(q + i + 1) % topo.gpus]] += (hi - lo) * 4
            per_link = topo.link_payload_bytes(t)
        else:
            per_link = cost_nodes.link_bytes(collective, algorithm, topo, nbytes, 4, root)
        for name, value in per_link.items():
            expected[name] += value
    got = {name: result.report["links"].get(name, {}).get("payload_bytes", 0) for name in expected}
    assert got == expected
    assert set(result.report["links"]) == set(expected)
    levels = topo.totals_by_level(got)
    assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"] > 0
    # every GPU's own NIC carries traffic both ways (ring: one channel out, one in, each; tree: its heads)
    for g in range(topo.gpus):
        leaf = f"sw{g // shape()[1]}"
        assert got[f"gpu{g}->{leaf}"] > 0 and got[f"{leaf}->gpu{g}"] > 0


def test_one_node_and_layouts_that_do_not_line_up():
    nodes, per_node, _ = shape()

    def main(gpu):
        r = gpu.rank
        local = r % per_node
        # one node: ring is the one ring, bit for bit as hier's one-node case (ring.py's own schedule)
        node = gpu.world.split(r // per_node)
        data = fold_contribution(r, 1001, np.dtype(np.float32), "sum")
        a, b = data.copy(), data.copy()
        node.allreduce(a, algorithm="ring")
        node.allreduce(b, algorithm="hier")
        assert same_bits(a, b)
        # tree on one node: its two chains; the sum of small integers is exact in any order
        y = gpu.alloc(9, "float32")
        y[:] = r
        node.allreduce(y, algorithm="tree")
        assert np.all(y == sum(range(r - local, r - local + per_node)))
        # the last GPU left out: its node holds fewer members; ring runs its one ring, tree refuses
        short = gpu.world.split(None if r == gpu.size - 1 else 0)
        if short is not None:
            z = gpu.alloc(37, "float32")
            z[:] = r
            short.allreduce(z, algorithm="ring")
            assert np.all(z == sum(range(gpu.size - 1)))
            with pytest.raises(UnsupportedOperation, match=rf"GPU {r}: allreduce with 'tree'.*same number of "
                                                           rf"members"):
                short.allreduce(z, algorithm="tree")
            short.allreduce(z, algorithm="ring")  # still in step
        with pytest.raises(UnsupportedOperation, match="'tree' does not implement it"):
            gpu.world.broadcast(gpu.alloc(4, "float32"), 0, algorithm="tree")

    run(main)
