"""The rows of `nvlink-emu model` (launch/commands/model.py): the cost model's prediction of a collective's
call on a fabric of any shape, as bench reports it, computed in this process (no MPI rank is started), and
the shapes emulated runs validated the model on (launch/tiers.toml)."""

import numpy as np

from nvlink_emu.fabric import cost, cost_nodes
from nvlink_emu.fabric.plans import catalog
from nvlink_emu.fabric.cost import bus_factor
from nvlink_emu.fabric.plans import plan_link_bytes, plan_ns
from nvlink_emu.fabric.errors import FabricError, UnsupportedOperation
from nvlink_emu.fabric.reduction import DTYPES
from nvlink_emu.fabric.topology import Topology
from nvlink_emu.fabric.tuner import all2all_algorithm, choose

from .sweeps import REDUCING, ROOT, element_count
from .tiers import NODE_PRESETS, validated_shapes


def shape_of(config) -> tuple[int, int, int]:
    return config.nodes, config.gpus_per_node, config.spines


def shape_text(shape: tuple[int, int, int]) -> str:
    nodes, per_node, spines = shape
    if nodes == 1:
        return f"{per_node} GPUs"
    return f"{nodes} nodes x {per_node} GPUs ({spines} spine{'s' if spines > 1 else ''})"


def is_validated(collective: str, algorithm: str, config) -> bool:
    """Whether an emulated test runs this shape and algorithm: tests/nodes/test_replay.py every point-to-point
    pair of fabric.plans.catalog on NODE_PRESETS (hier_nvls on those whose leaves reduce, the only ones that run it),
    tests/mpi/test_one_node_replay.py (emulated = this replay) and test_modeled_time.py (= fabric.cost's closed
    form, within 1%) every pair of fabric.cost."""
    if shape_of(config) not in validated_shapes():
        return False
    if config.nodes == 1:
        return collective in cost.IMPLEMENTS.get(algorithm, ())
    # sharp and nvls across nodes: tests/nodes/test_sharp_nodes.py, test_nvls_nodes.py, on the preset whose spines reduce
    if algorithm in catalog.IN_SWITCH:
        return collective in catalog.ACROSS_NODES.get(algorithm, ()) and config.spine_sharp
    return catalog.runs(collective, algorithm)


def validation_note(config) -> str:
    """Which shapes emulated runs validated the model on, and whether `config`'s is one of them."""
    one = [s for s in validated_shapes() if s[0] == 1]
    several = [s for s in validated_shapes() if s[0] > 1]
    pairs = sorted([a for a in catalog.IMPLEMENTS if a not in catalog.IN_SWITCH and a != "hier_nvls"] + ["pxn"])
    mine = shape_text(shape_of(config))
    verdict = (f"this shape, {mine}, is one of them" if shape_of(config) in validated_shapes()
               else f"this shape, {mine}, was not emulated: a prediction")
    return (f"# validated by emulation: several nodes, emulated time = this replay (fabric.cost_nodes.modeled_ns) to "
            f"1e-9 for {', '.join(pairs)} on {', '.join(map(shape_text, several))} of {', '.join(NODE_PRESETS)} "
            f"(and hier_nvls on those whose leaves reduce), "
            f"and for sharp's {', '.join(catalog.ACROSS_NODES['sharp'])} and nvls's {', '.join(catalog.ACROSS_NODES['nvls'])} on those of the presets whose spines reduce (tests/nodes); one node, the same replay "
            f"(sharp and nvls on the leaf's engine) to 1e-12 for ring, direct, sharp and nvls on {' and '.join(map(shape_text, one))} "
            f"(tests/mpi; fabric.cost's closed forms its oracle); {verdict}")


def modeled_ns(collective: str, algorithm: str, config, S: int, itemsize: int) -> float:
    """Modeled ns of one call on S bytes by every GPU of `config`, all starting together: the replay of its
    plan, fabric.cost_nodes.modeled_ns, on one node as on several (the code tests/mpi/test_one_node_replay.py
    and tests/nodes check emulated runs against; sharp and nvls on one node on the leaf's engine,
    fabric.switch_clocks.OneSwitch). fabric.cost's closed forms are its oracle on one node
    (tests/unit/test_one_node_oracle.py), and `auto`'s choice there (fabric.tuner). UnsupportedOperation for an
    algorithm it does not cover."""
    try:
        return cost_nodes.modeled_ns(collective, algorithm, config.topology, S, config, itemsize, root=ROOT)
    except FabricError as exc:
        raise UnsupportedOperation(f"model {collective} with {algorithm!r} on {config.name!r} "
                                   f"({shape_text(shape_of(config))}): no cost model: {exc}") from None


def gpu0_bytes(collective: str, algorithm: str, config, S: int, itemsize: int) -> tuple[int | None, int | None]:
    """(tx, rx) link payload bytes of GPU 0 in one call, as bench's tx/rx columns: exact per link from
    fabric.cost_nodes (fabric.cost on one node where it has no form); (None, None) if neither has one."""
    try:
        links = cost_nodes.link_bytes(collective, algorithm, config.topology, S, itemsize, root=ROOT,
                                      config=config if config.nodes > 1 else None)  # sharp: across nodes only
    except FabricError:
        if config.nodes > 1:
            return None, None
        try:
            return cost.payload_bytes(collective, algorithm, S, config.gpus, 0, ROOT)
        except ValueError:
            return None, None
    return (sum(b for name, b in links.items() if name.startswith("gpu0->")),
            sum(b for name, b in links.items() if name.endswith("->gpu0")))


def predict(collective: str, algorithm: str, config, size: int, dtype: str) -> dict:
    """One row: bench's keys for a call of `size` bytes (rounded as bench rounds it) of `dtype` on every
    GPU of `config`, the algorithm as bench would run it (auto resolved), modeled, not emulated."""
    item = np.dtype(DTYPES[dtype]).itemsize
    n = config.gpus
    count = element_count(collective, size, item, n)
    S = count * item
    chosen = (all2all_algorithm(algorithm, config, S, itemsize=item) if collective == "all2all"
              else choose(collective, algorithm, config, S))
    ns = modeled_ns(collective, chosen, config, S, item)
    tx, rx = gpu0_bytes(collective, chosen, config, S, item)
    algbw = S / ns if ns else None  # bytes per ns = GB/s; one GPU moves nothing
    return {"size_bytes": S, "count": count, "dtype": dtype, "op": "sum" if collective in REDUCING else "none",
            "root": ROOT if collective == "broadcast" else None, "algorithm": chosen,
            "modeled_us": round(ns / 1e3, 4), "algbw_gbps": None if algbw is None else round(algbw, 3),
            "busbw_gbps": None if algbw is None else round(algbw * bus_factor(collective, n), 3),
            "tx_bytes_per_gpu": tx, "rx_bytes_per_gpu": rx,
            "validated_by_emulation": is_validated(collective, chosen, config)}


def predict_plan(plan, config, size: int, dtype: str) -> dict:
    """predict's row for `plan` (fabric.plans): its replayed time (plan_ns) and GPU 0's uplink and
    downlink payload summed from its messages (plan_link_bytes)."""
    item = np.dtype(DTYPES[dtype]).itemsize
    n = config.gpus
    count = element_count(plan.collective, size, item, n)
    S = count * item
    topo = config.topology if config.nodes > 1 else Topology.single(config)
    ns = plan_ns(plan, topo, S, config, item)
    links = plan_link_bytes(plan, topo, S, config, item)
    up, down = (topo.route(0, 1)[0].name, topo.route(1, 0)[-1].name) if n > 1 else (None, None)
    algbw = S / ns if ns else None
    return {"size_bytes": S, "count": count, "dtype": dtype,
            "op": "sum" if plan.collective in REDUCING else "none",
            "root": ROOT if plan.collective == "broadcast" else None, "algorithm": "plan",
            "plan": plan.name, "modeled_us": round(ns / 1e3, 4), "algbw_gbps": None if algbw is None else round(algbw, 3),
            "busbw_gbps": None if algbw is None else round(algbw * bus_factor(plan.collective, n), 3),
            # up and down are None on one GPU: no link, so the default
            "tx_bytes_per_gpu": links.get(up, (0, 0))[0], "rx_bytes_per_gpu": links.get(down, (0, 0))[0],  # type: ignore[arg-type]
            "validated_by_emulation": False}
