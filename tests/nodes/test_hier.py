"""Multi-rank, several nodes: `hier` (ranks/collectives/hier.py), NCCL's hierarchical collectives:
bitwise against numpy in its documented combine order for every op and reduction dtype, every
movable dtype moved, exact payload bytes on every link of both levels (fabric.cost_nodes), the
layouts it refuses, and one node's degenerate case (exactly the ring)."""

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import DTYPES, OPS, blocks, combine, finish

from nodes_helpers import PRESETS, config, run, shape

pytestmark = pytest.mark.mpi(min_size=7)

CHUNK = 4096  # small messages: every size below streams in several chunks; the largest, of n x 2 or 3
# chunks, runs in 2 or 3 pipeline slices of CHUNK bytes a range (fabric.hier_plan)
S = 3 * 4096 + 8  # bytes of the byte-count calls: uneven blocks, several MTU packets each
BYTES_CHUNK = 1024  # S's ranges then run in two slices; a call of S_ONE bytes in one
S_ONE = 8 * 4 * 9 + 4


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def contribution(rank, count, dtype, op):
    """GPU `rank`'s data: random integers, or floats whose last bits show the combine order."""
    rng = np.random.default_rng(1000 * rank + count)
    if dtype.kind in "iu":
        if op == "prod":
            return rng.integers(-3 if dtype.kind == "i" else 0, 4, count).astype(dtype)
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)  # sums wrap
    scale = 1.5 if op == "prod" else 100.0
    return rng.uniform(-scale, scale, count).astype(dtype)


def ranges(collective, count):
    """Element range of the member at (node a, position j): [a][j], the world being node-major."""
    nodes, per_node, _ = shape()
    if collective == "allreduce":  # part j = blocks(count, G)[j], then block a of it
        out = [[None] * per_node for _ in range(nodes)]
        for j, (lo, hi) in enumerate(blocks(count, per_node)):
            for a, (x, y) in enumerate(blocks(hi - lo, nodes)):
                out[a][j] = (lo + x, lo + y)
        return out
    parts = blocks(count, nodes * per_node)
    return [[parts[a * per_node + j] for j in range(per_node)] for a in range(nodes)]


def reference(collective, op, inputs):
    """hier's documented fold of range (a, j): inside node m over positions j+1, ..., j (partial P_m),
    then P_{a+1}, ..., P_a over the nodes; one rounding per step in the dtype; avg divides by n."""
    nodes, per_node, _ = shape()
    out = np.empty(inputs[0].size, inputs[0].dtype)
    for a, row in enumerate(ranges(collective, inputs[0].size)):
        for j, (lo, hi) in enumerate(row):
            partials = []
            for m in range(nodes):
                order = [m * per_node + (j + 1 + i) % per_node for i in range(per_node)]
                acc = inputs[order[0]][lo:hi].copy()
                for g in order[1:]:
                    combine(op, acc, inputs[g][lo:hi])
                partials.append(acc)
            acc = partials[(a + 1) % nodes].copy()
            for i in range(2, nodes + 1):
                combine(op, acc, partials[(a + i) % nodes])
            finish(op, acc, nodes * per_node, out[lo:hi])
    return out


def test_reductions_equal_the_documented_fold_bitwise_for_every_op_and_dtype():
    cases = [(op, name) for op in OPS for name in ("float32", "int32", "float16", "uint8")] + \
            [(op, name) for op in ("sum", "avg") for name in DTYPES if name not in ("float32", "int32", "float16",
                                                                                     "uint8")]

    def main(gpu):
        n, r, wrong = gpu.size, gpu.rank, []
        for op, name in cases:
            dtype = DTYPES[name]
            for count in (1, 2 * n + 1, 3 * CHUNK // dtype.itemsize + 5, 3 * n * CHUNK // dtype.itemsize + 5):
                inputs = [contribution(m, count, dtype, op) for m in range(n)]
                array = inputs[r].copy()
                gpu.world.allreduce(array, op, "hier")
                if not same_bits(array, reference("allreduce", op, inputs)):
                    wrong.append(("allreduce", op, name, count))
                lo, hi = blocks(count, n)[r]
                block = np.empty(hi - lo, dtype)
                gpu.world.reduce_scatter(inputs[r], block, op, "hier")
                if not same_bits(block, reference("reduce_scatter", op, inputs)[lo:hi]):
                    wrong.append(("reduce_scatter", op, name, count))
        assert not wrong, wrong

    run(main, chunk_bytes=CHUNK)


def test_allgather_and_broadcast_move_every_kind_of_element():
    movable = [np.dtype(d) for d in ("uint8", "float16", "float64", "complex128", "bool", ">f4", "S7")] + \
              [np.dtype(ml_dtypes.bfloat16), np.dtype([("id", "<u4"), ("w", "<f8")])]

    def main(gpu):
        n, r = gpu.size, gpu.rank
        for i, dtype in enumerate(movable):
            for count in (0, 1, 2 * n + 1, 3 * CHUNK // dtype.itemsize + 1, 2 * n * CHUNK // dtype.itemsize + 3):
                rng = np.random.default_rng(i * 100 + count)
                raw = rng.integers(0, 2 if dtype == np.bool_ else 256, (n, count * dtype.itemsize), dtype=np.uint8)
                whole = [raw[m].view(dtype) for m in range(n)]
                parts = blocks(count, n)
                gathered = np.empty(count, dtype)
                gpu.world.allgather(whole[r][slice(*parts[r])].copy(), gathered, algorithm="hier")
                expected = np.concatenate([whole[m].view(np.uint8)[parts[m][0] * dtype.itemsize:
                                                                   parts[m][1] * dtype.itemsize] for m in range(n)])
                assert gathered.tobytes() == expected.tobytes(), (dtype, count)
                for root in {0, (i + count) % n, n - 1}:
                    array = whole[r].copy()
                    gpu.world.broadcast(array, root=root, algorithm="hier")
                    assert same_bits(array, whole[root]), (dtype, count, root)

    run(main, chunk_bytes=CHUNK)


def hier_calls(gpu, S=S):
    """One call of each collective with 'hier' on S bytes, each checked against numpy; returns
    (collective, bytes, root) of each, for fabric.cost_nodes."""
    n, rank, count = gpu.size, gpu.rank, S // 4
    base = np.arange(count, dtype=np.float32)
    calls = []
    x = gpu.alloc(count, "float32")
    x[:] = base + rank
    gpu.world.allreduce(x, algorithm="hier")
    assert np.array_equal(x, n * base + n * (n - 1) / 2)
    calls.append(("allreduce", S, 0))
    parts = blocks(count, n)
    out = gpu.alloc(parts[rank][1] - parts[rank][0], "float32")
    x[:] = base * (rank + 1)
    gpu.world.reduce_scatter(x, out, algorithm="hier")
    assert np.array_equal(out, base[slice(*parts[rank])] * (n * (n + 1) / 2))
    calls.append(("reduce_scatter", S, 0))
    mine = gpu.alloc(len(out), "float32")
    mine[:] = rank
    gathered = gpu.alloc(count, "float32")
    gpu.world.allgather(mine, gathered, algorithm="hier")
    assert np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.float32), [b - a for a, b in parts]))
    calls.append(("allgather", S, 0))
    _, per_node, _ = shape()
    for root in (n - 1, per_node):  # the last node's last GPU; node 1's first (rail 0)
        x[:] = base if rank == root else -1
        gpu.world.broadcast(x, root=root, algorithm="hier")
        assert np.array_equal(x, base)
        calls.append(("broadcast", S, root))
    return calls


@pytest.mark.parametrize("base", PRESETS)
def test_hier_is_exact_and_puts_the_documented_bytes_on_every_link_of_both_levels(base):
    result = run(lambda gpu: hier_calls(gpu) + hier_calls(gpu, S_ONE), base, chunk_bytes=BYTES_CHUNK)
    if result.role != "gpu":
        return
    topo = config(base).topology
    expected = {link.name: 0 for link in topo.links}
    for collective, nbytes, root in result.value:
        for name, value in cost_nodes.link_bytes(collective, "hier", topo, nbytes, 4, root).items():
            expected[name] += value
    got = {name: result.report["links"].get(name, {}).get("payload_bytes", 0) for name in expected}
    assert got == expected
    assert set(result.report["links"]) == set(expected)
    levels = topo.totals_by_level(got)
    assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"] > 0


def test_layouts_it_refuses_and_sub_communicators_it_runs():
    nodes, per_node, _ = shape()

    def main(gpu):
        r = gpu.rank
        local = r % per_node
        x = gpu.alloc(64, "float32")
        # one member per node (a rail): the rail ring alone
        rail = gpu.world.split(local)
        x[:] = r
        rail.allreduce(x, algorithm="hier")
        assert np.all(x == sum(range(local, nodes * per_node, per_node)))
        # one node: exactly the ring, bit for bit
        node = gpu.world.split(r // per_node)
        data = contribution(r, 1001, np.dtype(np.float32), "sum")
        a, b = data.copy(), data.copy()
        node.allreduce(a, algorithm="hier")
        node.allreduce(b, algorithm="ring")
        assert same_bits(a, b)
        # the last GPU left out: its node holds fewer members than the others
        short = gpu.world.split(None if r == gpu.size - 1 else 0)
        # one GPU a node, at local index 0 in node 0 and local index 1 elsewhere: rails do not line up
        skew = gpu.world.split(0 if local == (r >= per_node) else None)
        for comm, why in ((short, r"node 0: \[0, 1\].*node %d: \[0\]" % (nodes - 1)),
                          (skew, r"node 0: \[0\]; node 1: \[1\]")):
            if comm is None:
                continue
            y = gpu.alloc(8, "float32")
            with pytest.raises(UnsupportedOperation, match=rf"GPU {r}: allreduce with 'hier'.*same number of "
                                                           rf"members.*{why}"):
                comm.allreduce(y, algorithm="hier")
            y[:] = 1
            comm.allreduce(y, algorithm="ring")  # still in step
            assert np.all(y == comm.size)

    run(main)
