"""Helpers of the multi-node tier: every test is one emulated run of several nodes on MPI_COMM_WORLD,
its shape taken from the world size (SHAPES)."""

from nvlink_emu.fabric.config import preset
from nvlink_emu.launch.model import NODE_PRESETS as PRESETS
from nvlink_emu.launch.model import NODE_SHAPES as SHAPES  # `nvlink-emu model` names these shapes as validated
from nvlink_emu.ranks.session import run_fabric
from nvlink_emu.ranks.transport import world_size

# SHAPES: world size -> (nodes, GPUs per node, spines): world = nodes x (GPUs per node + 1) + spines


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
