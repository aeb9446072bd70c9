"""`ring`: every GPU passes blocks to the next GPU around a ring, every hop through the switch; across nodes one
ring per rail (C channels, each on its own lane). Run as plans (fabric.plans.registry.ring, ranks/collectives/
plan.py). Per-GPU bytes, combine order, channels and NCCL's sources: docs/model/algorithms-ring-tree.md."""

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def _grid(call):
    """hier's Grid of a communicator that spans several nodes in it; None on one node or when its nodes do
    not line up (the one ring)."""
    try:
        grid = Grid(call, "ring")
    except UnsupportedOperation:
        return None
    return None if grid.N == 1 else grid


def _plan(call, collective: str, count: int, root: int = 0):
    """ring's plan for a call of `count` elements (of the buffer fabric.replay sizes): across nodes, on the
    communicator's grid, its channels (fabric.plans.registry.ring_channels); otherwise the one ring."""
    grid = _grid(call)
    layout = None if grid is None else tuple(tuple(row) for row in grid.rank)
    item = call.dtype.itemsize
    return plans.build("ring", call.n, collective, root, layout=layout, nbytes=count * item, itemsize=item,
                       chunk_bytes=call.chunk * item)


def allreduce(call, array: np.ndarray) -> None:
    plan.execute(call, _plan(call, "allreduce", array.size), array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    plan.execute(call, _plan(call, "reduce_scatter", send.size), work, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    plan.execute(call, _plan(call, "allgather", recv.size), send, recv)


def broadcast(call, array: np.ndarray, root: int) -> None:
    plan.execute(call, _plan(call, "broadcast", array.size, root), array, array)


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    out = recv if call.r == root else send[:0]  # only the root's output is written
    assert out is not None  # the root's output, checked by the communicator
    plan.execute(call, _plan(call, "reduce", send.size, root), send, out)
