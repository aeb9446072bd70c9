"""Multi-rank, several nodes: `pxn` (ranks/collectives/pxn.py), NCCL's rail-aligned All2All: every
dtype's bytes where they belong, exact payload bytes on every link of both levels
(fabric.cost_nodes), the same leaf-spine bytes as `direct`, and the layouts it refuses."""

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.errors import UnsupportedOperation

from nodes_helpers import PRESETS, config, run, shape

pytestmark = pytest.mark.mpi(min_size=7)

CHUNK = 4096


def test_every_dtype_lands_where_all2all_puts_it():
    movable = [np.dtype(d) for d in ("uint8", "int32", "float16", "float64", "complex64", "bool", "S7")] + \
              [np.dtype(ml_dtypes.bfloat16), np.dtype([("id", "<u4"), ("w", "<f8")])]

    def main(gpu):
        n, r = gpu.size, gpu.rank
        for i, dtype in enumerate(movable):
            for each in (0, 1, 3 * CHUNK // dtype.itemsize + 1):
                raw = np.random.default_rng(100 * i + each).integers(0, 2 if dtype == np.bool_ else 256,
                                                                     (n, n * each * dtype.itemsize), dtype=np.uint8)
                sent = [raw[m].view(dtype) for m in range(n)]
                got = np.empty(n * each, dtype)
                gpu.world.all2all(sent[r], got, algorithm="pxn")
                expected = np.concatenate([raw[m].reshape(n, -1)[r] for m in range(n)])
                assert got.tobytes() == expected.tobytes(), (dtype, each)

    run(main, chunk_bytes=CHUNK)


@pytest.mark.both_sizes  # PXN's rail relays and the spines' share depend on nodes and spines
@pytest.mark.parametrize("base", PRESETS)
def test_pxn_puts_the_documented_bytes_on_every_link_and_direct_s_on_the_spines(base):
    each = 3 * 1024 + 2  # int32s per block: several MTU packets

    def main(gpu):
        n, r = gpu.size, gpu.rank
        send = gpu.alloc(n * each, "int32")
        send[:] = r * 10 ** 6 + np.arange(n * each)
        recv = gpu.alloc(n * each, "int32")
        gpu.world.all2all(send, recv, algorithm="pxn")
        expected = np.concatenate([m * 10 ** 6 + np.arange(r * each, (r + 1) * each) for m in range(n)])
        assert np.array_equal(recv, expected)
        return n * each * 4

    result = run(main, base)
    if result.role != "gpu":
        return
    topo = config(base).topology
    expected = cost_nodes.link_bytes("all2all", "pxn", topo, result.value)
    got = {name: result.report["links"].get(name, {}).get("payload_bytes", 0) for name in expected}
    assert got == expected
    assert set(result.report["links"]) == set(expected)
    flat = cost_nodes.link_bytes("all2all", "direct", topo, result.value)
    spine = [link.name for link in topo.links if link.level == "leaf-spine"]
    assert {k: got[k] for k in spine} == {k: flat[k] for k in spine} and any(got[k] for k in spine)
    nodes, per_node, _ = shape()
    n, s = nodes * per_node, result.value // (nodes * per_node)
    assert all(got[link.name] == (n - 1) * s + (nodes - 1) * (per_node - 1) * s
               for link in topo.links if link.level == "gpu-leaf")


def test_layouts_it_refuses_and_an_unknown_algorithm():
    nodes, per_node, _ = shape()

    def main(gpu):
        r = gpu.rank
        skew = gpu.world.split(0 if r % per_node == (r >= per_node) else None)
        if skew is not None:
            x, y = gpu.alloc(4 * skew.size, "float32"), gpu.alloc(4 * skew.size, "float32")
            with pytest.raises(UnsupportedOperation, match=rf"GPU {r}: all2all with 'pxn'.*same local indices"):
                skew.all2all(x, y, algorithm="pxn")
            skew.all2all(x, y)  # still in step: direct
        x, y = gpu.alloc(4 * gpu.size, "float32"), gpu.alloc(4 * gpu.size, "float32")
        with pytest.raises(UnsupportedOperation,
                           match=rf"GPU {r}: all2all: unknown algorithm 'ring'; known: auto, direct, pxn"):
            gpu.world.all2all(x, y, algorithm="ring")
        node = gpu.world.split(r // per_node)  # one node: pxn sends every block straight, as direct
        x[:] = r
        node.all2all(x[:4 * node.size], y[:4 * node.size], algorithm="pxn")
        assert np.array_equal(y[:4 * node.size], np.repeat(np.arange(node.size) + r // per_node * per_node, 4))

    run(main)
