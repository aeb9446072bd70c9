"""Multi-rank, several nodes: a spine whose switch latency is not the leaf's (an InfiniBand spine's 130 ns under
NVLink leaves of 250, `spine_switch_latency_ns`) is timed alike by the ranks and the replays: every in-switch
algorithm across nodes (sharp's reduction at the spines and its multicast stores, nvls's load-reduce passed on
by a spine) and the point-to-point ones, on superpod-h100-nvlink whose spines reduce, each call's emulated
modeled time equal to cost_nodes.modeled_ns' (the replay) exactly, and shorter than at the leaf's latency."""

import dataclasses

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.reduction import blocks

from nodes_helpers import check_bytes_and_times, config, dtype_of, run, timed

pytestmark = pytest.mark.mpi(min_size=7)

SPINE_NS = 130.0  # the ib-ndr profile's switch: NVIDIA Quantum QM8790's "sub-130ns" (fabric/profiles.py)


def one(algorithm):
    def call(gpu, collective, name, nbytes, root):
        x = np.ones(nbytes // dtype_of(name).itemsize, dtype_of(name))
        lo, hi = blocks(x.size, gpu.size)[gpu.rank]
        if collective == "reduce_scatter":
            out = np.empty(hi - lo, x.dtype)
            gpu.world.reduce_scatter(x, out, algorithm=algorithm)
        elif collective == "allreduce":
            out = x
            gpu.world.allreduce(x, algorithm=algorithm)
        elif collective == "allgather":
            out = np.zeros_like(x)
            gpu.world.allgather(x[lo:hi], out, algorithm=algorithm)
        else:
            out = x if gpu.rank == root else np.zeros_like(x)
            gpu.world.broadcast(out, root=root, algorithm=algorithm)
        assert np.all(out == (gpu.size if collective in ("reduce_scatter", "allreduce") else 1)), collective
    return call


CALLS = {
    "sharp": [("allreduce", "float32", 5 * (1 << 12) + 40, 0), ("allreduce", "float16", 3 * (1 << 12) + 2, 0),
              ("reduce_scatter", "float32", 4 * 8 * 700, 0), ("allgather", "float32", 4 * 8 * 700, 0),
              ("broadcast", "float32", 5 * (1 << 12) + 8, 1)],
    "nvls": [("reduce_scatter", "float32", 5 * (1 << 12) + 40, 1), ("allreduce", "float32", 5 * (1 << 12) + 40, 1),
             ("allreduce", "float16", 3 * (1 << 12) + 2 * 6, 1)],
    "ring": [("allreduce", "float32", 4 * 8 * 3000, 0), ("allgather", "float32", 4 * 8 * 700, 0)],
    "direct": [("allreduce", "float32", 4 * 8 * 700, 0)],
}


@pytest.mark.parametrize("algorithm", list(CALLS))
def test_a_spine_s_own_latency_is_timed_alike_by_the_ranks_and_the_replay(algorithm):
    cfg = config(chunk_bytes=1 << 12, spine_switch_latency_ns=SPINE_NS)
    assert [sw.latency_ns for sw in cfg.topology.switches[cfg.nodes:]] == [SPINE_NS] * cfg.spines
    calls = CALLS[algorithm]
    result = run(timed(calls, one(algorithm)), timeout_s=120, chunk_bytes=cfg.chunk_bytes,
                 spine_switch_latency_ns=SPINE_NS)
    if result.role != "gpu":
        return
    check_bytes_and_times(result, cfg, algorithm, calls)
    leafs = dataclasses.replace(cfg, spine_switch_latency_ns=None)  # every switch the leaf's 250 ns
    for (collective, name, nbytes, root), got in zip(calls, result.value):
        item = dtype_of(name).itemsize
        slower = cost_nodes.modeled_ns(collective, algorithm, leafs.topology, nbytes, leafs, item, root,
                                       partial_itemsize=4 if name == "float16" else item)
        assert got < slower, (collective, name, nbytes)
