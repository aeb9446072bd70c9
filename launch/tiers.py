"""The test tiers' shapes (launch/tiers.toml): which world sizes tests/mpi and tests/nodes run at, the
multi-node shape of each world size, and the presets tests/nodes checks; read once, at import."""

import tomllib
from pathlib import Path

with open(Path(__file__).with_name("tiers.toml"), "rb") as _file:
    _TIERS = tomllib.load(_file)

# tier -> its world sizes (the first runs every test, the second the both_sizes ones)
TIER_WORLD_SIZES: dict[str, tuple[int, ...]] = {tier: tuple(_TIERS[tier]["world_sizes"]) for tier in ("mpi", "nodes")}
# world size -> (nodes, GPUs per node, spines) of tests/nodes
NODE_SHAPES: dict[int, tuple[int, int, int]] = {int(world): tuple(shape)
                                                for world, shape in _TIERS["nodes"]["shapes"].items()}
NODE_PRESETS: tuple[str, ...] = tuple(_TIERS["nodes"]["presets"])


def validated_shapes() -> list[tuple[int, int, int]]:
    """(nodes, GPUs per node, spines) of every shape the emulated tiers run: one node of each tests/mpi
    world size's GPUs, and tests/nodes' shapes at its world sizes."""
    return ([(1, world - 1, 0) for world in TIER_WORLD_SIZES["mpi"]]
            + [NODE_SHAPES[world] for world in TIER_WORLD_SIZES["nodes"]])
