"""`tree`: NCCL's double binary tree across nodes (allreduce), each node's part a chain over NVLink, pipelined
in 512 KiB pieces. Run as a plan (fabric.plans.registry.tree, ranks/collectives/plan.py). Schedule, per-GPU bytes,
combine order and NCCL's sources: docs/model/algorithms-ring-tree.md."""

import numpy as np

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def allreduce(call, array: np.ndarray) -> None:
    grid = Grid(call, "allreduce", "tree")  # UnsupportedOperation before any byte moves if not a grid
    layout = tuple(tuple(row) for row in grid.rank)
    item = array.dtype.itemsize
    schedule = plans.build("tree", call.n, "allreduce", layout=layout, nbytes=array.size * item, itemsize=item,
                           chunk_bytes=call.gpu.config.chunk_bytes)
    # the partials are reduced in a copy (they may still be leaving it when results land in `array`)
    plan.execute(call, schedule, array.copy(), array)
