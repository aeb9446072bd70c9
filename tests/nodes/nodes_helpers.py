"""Helpers of the multi-node tier: every test is one emulated run of several nodes on MPI_COMM_WORLD,
its shape taken from the world size (SHAPES); the numpy oracle of in-switch reductions in two levels;
the communicators the in-switch tests run on; the check of a run's link bytes and modeled times
against the cost model."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.reduction import BFLOAT16
from nvlink_emu.launch.tiers import NODE_PRESETS as PRESETS  # noqa: F401 (the nodes tests take it from here)
from nvlink_emu.launch.tiers import NODE_SHAPES as SHAPES  # `nvlink-emu model` names these shapes as validated
from nvlink_emu.ranks.session import run_fabric
from nvlink_emu.ranks.transport import world_size

# SHAPES: world size -> (nodes, GPUs per node, spines): world = nodes x (GPUs per node + 1) + spines

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "uint8")
OPS = ("sum", "avg", "max", "min", "prod")
UFUNC = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def shape() -> tuple[int, int, int]:
    """(nodes, GPUs per node, spines) of this world size."""
    return SHAPES[world_size()]


def config(base: str = "superpod-h100-nvlink", **overrides):
    """The preset `base` in this world size's shape."""
    nodes, per_node, spines = shape()
    return preset(base, nodes=nodes, gpus=nodes * per_node, spines=spines, **overrides)


def run(main, base: str = "superpod-h100-nvlink", timeout_s: float = 30.0, **overrides):
    """Run main(gpu) on `base` in this world size's shape; returns this rank's RunResult, after checking
    that both ends of every link counted the same."""
    result = run_fabric(config(base, **overrides), main, timeout_s=timeout_s, abort_on_error=False)
    assert result.report["conservation"] == {}, result.report["conservation"]
    return result


def peak_in_flight(monkeypatch, dest: int, in_bytes: bool = False):
    """Count what a GPU that does not receive costs the ranks that send to it: every rank's transport
    (ranks/transport.Transport._keep, patched) records the most sends it keeps in flight to rank `dest` at
    once, or their bytes (in_bytes); the leaf of `dest` is the rank that matters. Returns most(): the
    largest over every rank of the world (collective: every rank calls it, after the run, so that a test
    fails alike on every rank)."""
    from mpi4py import MPI

    from nvlink_emu.ranks.transport import Transport

    peak, keep = [0], Transport._keep

    def counted(self, to, requests, buffers):
        out = keep(self, to, requests, buffers)
        if to == dest:
            peak[0] = max(peak[0], self.pending_bytes_to[to] if in_bytes else len(self._pending.get(to, ())))
        return out

    monkeypatch.setattr(Transport, "_keep", counted)
    return lambda: MPI.COMM_WORLD.allreduce(peak[0], MPI.MAX)


def dtype_of(name: str) -> np.dtype:
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def contribution(gpu_index: int, name: str, op: str, count: int) -> np.ndarray:
    """GPU `gpu_index`'s input of `count` elements: random floats whose sums round differently in other
    orders; small integers (prod near 1, so that products stay finite)."""
    rng = np.random.default_rng(1000 + gpu_index)
    if name in ("int32", "uint8"):
        values = rng.integers(0, 3 if op == "prod" else 100, count)
    elif op == "prod":
        values = rng.uniform(0.5, 1.5, count)
    else:
        values = rng.standard_normal(count) * 100
    return values.astype(dtype_of(name))


def two_level(members: list[int], per_node: int, name: str, op: str, count: int) -> np.ndarray:
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


def world_and_rail(gpu):
    """(communicator, its members' GPU indices) for the world and for a communicator of one GPU per node
    (GPU gpu's local index's: partials of a single GPU at every leaf)."""
    per_node = gpu.config.gpus_per_node
    rail = gpu.world.split(gpu.rank % per_node)
    return [(comm, [comm.members[r] for r in range(comm.size)]) for comm in (gpu.world, rail)]


def every_op_and_dtype(gpu):
    """(communicator, its members, dtype name, op) for every op and dtype on each of world_and_rail(gpu)."""
    for comm, members in world_and_rail(gpu):
        for name in DTYPES:
            for op in OPS:
                yield comm, members, name, op


def timed(calls, one):
    """main(gpu) for run(): one(gpu, *call) for each of `calls`, every GPU starting together (a barrier
    before: every member starts at the latest clock, its links idle by then); returns each call's
    modeled time in ns, up to the barrier after it."""
    def main(gpu):
        times = []
        for call in calls:
            gpu.world.barrier()
            start = gpu.now_ns
            one(gpu, *call)
            gpu.world.barrier()
            times.append(gpu.now_ns - start)
        return times
    return main


def check_bytes_and_times(result, cfg, algorithm: str, calls, rel: float = 1e-12, abs_ns: float = 1e-9) -> dict:
    """Each call's modeled time in `result` (a run of timed(calls, ...)) is cost_nodes.modeled_ns' (the
    replay), and every link's payload over the calls is cost_nodes.link_bytes' summed, a 16-bit float's
    partial counted in float32; calls are (collective, dtype name, bytes, root). Returns the payload
    bytes per link (every link of the topology)."""
    topo = cfg.topology
    expected = dict.fromkeys((link.name for link in topo.links), 0)
    for (collective, name, nbytes, root), got in zip(calls, result.value):
        item = dtype_of(name).itemsize
        wide = 4 if name == "float16" else item
        for link, value in cost_nodes.link_bytes(collective, algorithm, topo, nbytes, item, root, config=cfg,
                                                 partial_itemsize=wide).items():
            expected[link] += value
        want = cost_nodes.modeled_ns(collective, algorithm, topo, nbytes, cfg, item, root, partial_itemsize=wide)
        assert got == pytest.approx(want, rel=rel, abs=abs_ns), (collective, name, nbytes, root)
    got = {link: result.report["links"].get(link, {}).get("payload_bytes", 0) for link in expected}
    assert got == expected
    return got


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def fold_contribution(rank, count, dtype, op):
    """GPU `rank`'s data: random integers, or floats whose last bits show the combine order."""
    rng = np.random.default_rng(1000 * rank + count)
    if dtype.kind in "iu":
        if op == "prod":
            return rng.integers(-3 if dtype.kind == "i" else 0, 4, count).astype(dtype)
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)  # sums wrap
    scale = 1.5 if op == "prod" else 100.0
    return rng.uniform(-scale, scale, count).astype(dtype)
