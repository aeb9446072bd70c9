"""`nvls`: NVLS as NCCL uses it. Each GPU asks the switch for the reduction of its own 1/N block
(load-reduce: the switch reads that block from every member's bound buffer and reduces), then
multicast-stores the reduced block to every member; across nodes the leaves and spines reduce in two
levels. Bytes per link, combine order, the schedule in rounds and the window:
docs/model/algorithms-in-switch.md. reduce_scatter and allreduce are plans (fabric.plans.in_switch.nvls),
run by the one executor (ranks/collectives/plan.py); allgather and broadcast are sharp's multicast stores.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.budget import nvls_streams
from nvlink_emu.fabric.plans import in_switch
from nvlink_emu.fabric.reduction import switch_accumulator

from . import plan
from .sharp import allgather, broadcast  # noqa: F401  (multicast stores, the same as sharp's)


def streams(call, dtype) -> int:
    """Credit streams of a load-reduce (Call.in_switch_window): n (every member's block in flight at once);
    across nodes also enough that every leaf's partials without their result - each requester's window,
    and once more as a notice may trail the next request - fit its buffer share / nodes, a 16-bit
    float's partial counting twice (fabric.budget.nvls_streams is the same rule; in_switch.shape sizes the
    plan by it)."""
    nodes = call.nodes()
    return nvls_streams(call.n, nodes, call.gpu.config.nodes, np.dtype(dtype))


def _execute(call, collective: str, send: np.ndarray, recv: np.ndarray) -> None:
    item = send.dtype.itemsize
    wide = switch_accumulator(send.dtype).itemsize // item
    shape = in_switch.shape("nvls", call.n, collective, call.nodes(), call.gpu.config, send.size * item, item, wide)
    plan.execute(call, plans.build("nvls", call.n, collective, shape=shape), send, recv)


def allreduce(call, array: np.ndarray) -> None:
    _execute(call, "allreduce", array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    _execute(call, "reduce_scatter", send, recv)
