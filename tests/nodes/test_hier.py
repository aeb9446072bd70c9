"""Multi-rank, several nodes: `hier` (ranks/collectives/hier.py, node rings) and `hier_nvls` (its node
stages in the leaf), NCCL's hierarchical collectives: bitwise against numpy in the documented combine
order for every op and reduction dtype, hier with node rings (superpod-a100-ib, whose switches only
forward) and hier_nvls (NVLS on superpod-h100-ib: positions 0..G-1 in the leaf's accumulator, then the
rail ring), every movable dtype moved, exact payload bytes on every link of both levels (and raw bytes
in the leaf; fabric.cost_nodes) for hier on superpod-a100-ib and superpod-h100-ib and hier_nvls on the
two H100 presets, emulated time the replay's, a node group's trust, the layouts they refuse, and one
node's and one GPU a node's degenerate cases (exactly the ring; the rail ring)."""

import collections

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes, hier_plan
from nvlink_emu.fabric.errors import AccessViolation, UnsupportedOperation
from nvlink_emu.fabric.packets import Kind, LoadInfo
from nvlink_emu.fabric.reduction import DTYPES, OPS, blocks, combine, finish, switch_accumulator
from nvlink_emu.ranks.collectives import plan as executor

from nodes_helpers import PRESETS, config, fold_contribution, run, same_bits, shape
from trust_helpers import refusals

pytestmark = pytest.mark.mpi(min_size=7)

CHUNK = 4096  # small messages: every size below streams in several chunks; the largest, of n x 2 or 3
# chunks, runs in 2 or 3 pipeline slices of CHUNK bytes a range (fabric.hier_plan)
S = 3 * 4096 + 8  # bytes of the byte-count calls: uneven blocks, several MTU packets each
BYTES_CHUNK = 1024  # S's ranges then run in two slices; a call of S_ONE bytes in one
S_ONE = 8 * 4 * 9 + 4


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


def reference(collective, op, inputs, leaf=False):
    """hier's documented fold of range (a, j): inside node m over positions j+1, ..., j (partial P_m;
    leaf: the leaf's, positions 0..G-1 in the switch's accumulator, avg as a sum, rounded once), then
    P_{a+1}, ..., P_a over the nodes; one rounding per step in the dtype; avg divides by n."""
    nodes, per_node, _ = shape()
    out = np.empty(inputs[0].size, inputs[0].dtype)
    wide = switch_accumulator(inputs[0].dtype)
    for a, row in enumerate(ranges(collective, inputs[0].size)):
        for j, (lo, hi) in enumerate(row):
            partials = []
            for m in range(nodes):
                if leaf:
                    acc = inputs[m * per_node][lo:hi].astype(wide)
                    for g in range(m * per_node + 1, (m + 1) * per_node):
                        combine(op, acc, inputs[g][lo:hi].astype(wide))
                    partials.append(acc.astype(inputs[0].dtype))
                    continue
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


CASES = [(op, name) for op in OPS for name in ("float32", "int32", "float16", "uint8")] + \
        [(op, name) for op in ("sum", "avg") for name in DTYPES if name not in ("float32", "int32", "float16", "uint8")]


def reductions(gpu, leaf, counts=lambda n, item: (1, 2 * n + 1, 3 * CHUNK // item + 5, 3 * n * CHUNK // item + 5)):
    """allreduce and reduce_scatter of every case of CASES at `counts`, against the documented fold; returns
    the cases that differ and (collective, bytes, itemsize) of each call."""
    n, r, wrong, calls = gpu.size, gpu.rank, [], []
    algorithm = "hier_nvls" if leaf else "hier"
    for op, name in CASES:
        dtype = DTYPES[name]
        for count in counts(n, dtype.itemsize):
            inputs = [fold_contribution(m, count, dtype, op) for m in range(n)]
            array = inputs[r].copy()
            gpu.world.allreduce(array, op, algorithm)
            if not same_bits(array, reference("allreduce", op, inputs, leaf)):
                wrong.append(("allreduce", op, name, count))
            lo, hi = blocks(count, n)[r]
            block = np.empty(hi - lo, dtype)
            gpu.world.reduce_scatter(inputs[r], block, op, algorithm)
            if not same_bits(block, reference("reduce_scatter", op, inputs, leaf)[lo:hi]):
                wrong.append(("reduce_scatter", op, name, count))
            calls += [("allreduce", count * dtype.itemsize, dtype.itemsize),
                      ("reduce_scatter", count * dtype.itemsize, dtype.itemsize)]
    return wrong, calls


@pytest.mark.both_sizes  # the two-level fold order changes with 3 nodes instead of 2
def test_reductions_equal_the_documented_fold_bitwise_for_every_op_and_dtype():
    def main(gpu):
        wrong, _ = reductions(gpu, leaf=False)
        assert not wrong, wrong

    run(main, "superpod-a100-ib", chunk_bytes=CHUNK)  # its switches only forward: node rings


def test_node_stages_in_the_leaf_are_the_documented_fold_take_the_replayed_time_and_exact_bytes():
    """superpod-h100-ib (the leaves reduce, the spines do not): allreduce and reduce_scatter of every op and
    dtype bitwise the leaf's fold; allgather and broadcast of float16 and int64;
    each call's modeled time, from a barrier, cost_nodes.modeled_ns' (the replay: its leaf plan, fabric.plans.timing_leaf) exactly; and
    the payload and raw bytes of every link over the whole run cost_nodes.hier_leaf_link_bytes' sums."""
    cfg = config("superpod-h100-ib", chunk_bytes=CHUNK)
    assert hier_plan.in_leaf(cfg)

    def main(gpu):
        n, r = gpu.size, gpu.rank
        small = lambda n, item: (1, 2 * n + 1, n * CHUNK // item + 5)  # the last in two slices
        first, calls = reductions(gpu, True, small)
        assert not first, first
        timed = []
        for name in ("float16", "int64"):
            dtype = DTYPES[name]
            for count in (2 * n + 1, 5 * n * CHUNK // dtype.itemsize + 3):
                x = fold_contribution(r, count, dtype, "sum")
                parts = blocks(count, n)
                for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
                    gpu.world.barrier()
                    start = gpu.now_ns
                    if collective == "allreduce":
                        y = x.copy()
                        gpu.world.allreduce(y, "sum", "hier_nvls")
                    elif collective == "reduce_scatter":
                        y = np.empty(parts[r][1] - parts[r][0], dtype)
                        gpu.world.reduce_scatter(x, y, "sum", "hier_nvls")
                    elif collective == "allgather":
                        y = np.empty(count, dtype)
                        gpu.world.allgather(x[slice(*parts[r])].copy(), y, algorithm="hier_nvls")
                        assert same_bits(y, np.concatenate([fold_contribution(m, count, dtype, "sum")[slice(*parts[m])]
                                                            for m in range(n)]))
                    else:
                        y = x.copy()
                        gpu.world.broadcast(y, root=n - 1, algorithm="hier_nvls")
                        assert same_bits(y, fold_contribution(n - 1, count, dtype, "sum"))
                    gpu.world.barrier()
                    root = n - 1 if collective == "broadcast" else 0
                    timed.append((collective, count * dtype.itemsize, dtype.itemsize, root, gpu.now_ns - start))
        return calls, timed

    result = run(main, "superpod-h100-ib", chunk_bytes=CHUNK, timeout_s=120)
    if result.role != "gpu":
        return
    calls, timed = result.value
    topo = cfg.topology
    payload, raw = dict.fromkeys((link.name for link in topo.links), 0), dict.fromkeys((link.name for link in topo.links), 0)
    for collective, nbytes, item, root, got in timed:
        assert got == pytest.approx(cost_nodes.modeled_ns(collective, "hier_nvls", topo, nbytes, cfg, item, root),
                                    rel=1e-9, abs=1e-6), (collective, nbytes, item)
    for (collective, nbytes, item, root), times in collections.Counter([(*call, 0) for call in calls] +
                                                                       [call[:4] for call in timed]).items():
        p, w = cost_nodes.hier_leaf_link_bytes(collective, topo, nbytes, cfg, item, root)
        for name in payload:
            payload[name] += times * p[name]
            raw[name] += times * w[name]
    links = result.report["links"]
    assert {name: links.get(name, {}).get("payload_bytes", 0) for name in payload} == payload
    assert {name: links.get(name, {}).get("raw_bytes", 0) for name in raw} == raw
    assert all(port["refused"] == 0 for port in result.report["ports"].values())


def test_a_node_group_is_its_node_s_alone_and_its_loads_stay_in_its_buffers():
    """A GPU of node 1 asking for a load-reduce through node 0's group of the world (its id, learned out of
    band) is refused at its own leaf, which holds no such group (AccessViolation; group ids never collide
    between leaves); a load-reduce by GPU 0 through its node's group past the bound buffers is refused by
    each member asked to serve it (AccessViolation naming GPU 0); the world's hier stays exact after
    both (hier_nvls: the node stages in the leaf). The group's members, partitions and limit are the group
    machinery's own (comm.node_group_id)."""
    nodes, per_node, _ = shape()

    def exact(comm):
        x = np.full(4 * comm.size + 1, comm.rank, np.float32)
        comm.allreduce(x, algorithm="hier_nvls")
        assert np.all(x == sum(range(comm.size)))

    def main(gpu):
        comm = gpu.world
        exact(comm)  # makes the node groups
        gid = np.array([comm.node_group_id()], np.int64)
        gpu.native("broadcast", gid.copy(), gid, root=0)  # node 0's group id, out of band
        gid = int(gid[0])
        key = (comm.name, 99, *executor.SOURCE)  # the input every member binds for the leaf's LOADs
        if gpu.rank == per_node:  # node 1's first GPU
            info = LoadInfo(gid, (99, 0, 0), "sum", "float32", (gpu.rank,), (comm.name, 99, 20, 0, 0), key)
            gpu.switch_request(Kind.LOAD_REDUCE, info, None, 0, 64, stamp=gpu.reserve_uplink(0, gpu.now_ns))
            (error,) = refusals(gpu, 1)
            assert type(error).__name__ == "AccessViolation" and f"no live group {gid}" in str(error)
        if gpu.rank < per_node:  # node 0: every member bound 64 bytes; GPU 0 asks for 64 bytes 1 MiB in
            gpu.bind_buffer(key, np.zeros(16, np.float32))
            if gpu.rank == 0:
                info = LoadInfo(gid, (99, 0, 1), "sum", "float32", (0,), (comm.name, 99, 20, 1, 1), key)
                gpu.switch_request(Kind.LOAD_REDUCE, info, None, 1 << 20, 64, stamp=gpu.reserve_uplink(0, gpu.now_ns))
            with pytest.raises(AccessViolation, match=r"GPU 0's load-reduce .* of a bound buffer of 64; not served"):
                gpu.serve_load(gid, key, (99, 0, 1), "GPU 0")
            gpu.unbind_buffer(key)
        comm.barrier()
        exact(comm)
        return "done"

    result = run(main, "superpod-h100-ib", timeout_s=30)
    if result.role == "gpu":
        assert result.value == "done"
    ports = result.report["ports"]
    assert ports[per_node]["refused"] == ports[per_node]["violations"] == 1
    assert all(ports[g]["refused"] == 0 for g in ports if g != per_node)


def hier_calls(gpu, S=S, algorithm="hier"):
    """One call of each collective with `algorithm` on S bytes, each checked against numpy; returns
    (collective, bytes, root) of each, for fabric.cost_nodes."""
    n, rank, count = gpu.size, gpu.rank, S // 4
    base = np.arange(count, dtype=np.float32)
    calls = []
    x = gpu.alloc(count, "float32")
    x[:] = base + rank
    gpu.world.allreduce(x, algorithm=algorithm)
    assert np.array_equal(x, n * base + n * (n - 1) / 2)
    calls.append(("allreduce", S, 0))
    parts = blocks(count, n)
    out = gpu.alloc(parts[rank][1] - parts[rank][0], "float32")
    x[:] = base * (rank + 1)
    gpu.world.reduce_scatter(x, out, algorithm=algorithm)
    assert np.array_equal(out, base[slice(*parts[rank])] * (n * (n + 1) / 2))
    calls.append(("reduce_scatter", S, 0))
    mine = gpu.alloc(len(out), "float32")
    mine[:] = rank
    gathered = gpu.alloc(count, "float32")
    gpu.world.allgather(mine, gathered, algorithm=algorithm)
    assert np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.float32), [b - a for a, b in parts]))
    calls.append(("allgather", S, 0))
    _, per_node, _ = shape()
    for root in (n - 1, per_node):  # the last node's last GPU; node 1's first (rail 0)
        x[:] = base if rank == root else -1
        gpu.world.broadcast(x, root=root, algorithm=algorithm)
        assert np.array_equal(x, base)
        calls.append(("broadcast", S, root))
    return calls


# hier_nvls where the leaves reduce (superpod-h100-*), hier (node rings) on superpod-a100-ib and on one H100 preset
FORMS = [(base, "hier_nvls" if base != "superpod-a100-ib" else "hier") for base in PRESETS] + \
        [("superpod-h100-ib", "hier")]


@pytest.mark.both_sizes  # per-level bytes depend on the node count and the spines (2 vs 1)
@pytest.mark.parametrize("base, algorithm", FORMS)
def test_hier_is_exact_and_puts_the_documented_bytes_on_every_link_of_both_levels(base, algorithm):
    assert hier_plan.in_leaf(config(base)) == (base != "superpod-a100-ib")
    result = run(lambda gpu: hier_calls(gpu, S, algorithm) + hier_calls(gpu, S_ONE, algorithm), base,
                 chunk_bytes=BYTES_CHUNK)
    if result.role != "gpu":
        return
    topo = config(base).topology
    expected = {link.name: 0 for link in topo.links}
    leaf = algorithm == "hier_nvls"  # node stages in the leaf; hier: node rings
    raw = dict(expected)
    for collective, nbytes, root in result.value:
        for name, value in cost_nodes.link_bytes(collective, algorithm, topo, nbytes, 4, root,
                                                 config=config(base, chunk_bytes=BYTES_CHUNK)).items():
            expected[name] += value
        if leaf:
            for name, value in cost_nodes.hier_leaf_link_bytes(collective, topo, nbytes,
                                                               config(base, chunk_bytes=BYTES_CHUNK), 4, root)[1].items():
                raw[name] += value
    got = {name: result.report["links"].get(name, {}).get("payload_bytes", 0) for name in expected}
    assert got == expected
    if leaf:
        assert {name: result.report["links"].get(name, {}).get("raw_bytes", 0) for name in raw} == raw
    assert set(result.report["links"]) == set(expected)
    levels = topo.totals_by_level(got)
    assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"] > 0


def test_layouts_it_refuses_and_sub_communicators_it_runs():
    nodes, per_node, _ = shape()

    def main(gpu):
        r = gpu.rank
        local = r % per_node
        x = gpu.alloc(64, "float32")
        # one member per node (a rail): the rail ring alone (hier_nvls too: no node stage to put in the leaf)
        rail = gpu.world.split(local)
        for algorithm in ("hier", "hier_nvls"):
            x[:] = r
            rail.allreduce(x, algorithm=algorithm)
            assert np.all(x == sum(range(local, nodes * per_node, per_node)))
        # one node: exactly the ring, bit for bit (hier_nvls: hier's node ring there)
        node = gpu.world.split(r // per_node)
        data = fold_contribution(r, 1001, np.dtype(np.float32), "sum")
        a, b, c = data.copy(), data.copy(), data.copy()
        node.allreduce(a, algorithm="hier")
        node.allreduce(c, algorithm="hier_nvls")
        node.allreduce(b, algorithm="ring")
        assert same_bits(a, b) and same_bits(c, b)
        # the last GPU left out: its node holds fewer members than the others
        short = gpu.world.split(None if r == gpu.size - 1 else 0)
        # one GPU a node, at local index 0 in node 0 and local index 1 elsewhere: rails do not line up
        skew = gpu.world.split(0 if local == (r >= per_node) else None)
        for comm, why in ((short, r"node 0: \[0, 1\].*node %d: \[0\]" % (nodes - 1)),
                          (skew, r"node 0: \[0\]; node 1: \[1\]")):
            if comm is None:
                continue
            y = gpu.alloc(8, "float32")
            for algorithm in ("hier", "hier_nvls"):
                with pytest.raises(UnsupportedOperation, match=rf"GPU {r}: allreduce with '{algorithm}'.*same number "
                                                               rf"of members.*{why}"):
                    comm.allreduce(y, algorithm=algorithm)
            y[:] = 1
            comm.allreduce(y, algorithm="ring")  # still in step
            assert np.all(y == comm.size)

    run(main)
