"""`sharp`: NVLink SHARP as a push. Every GPU sends its buffer to the switch once; the switch reduces
the contributions and multicasts the result (one packet in, a copy out of every member port); across
nodes the leaves reduce their node's members and the spines the leaves' partials. Bytes per link,
combine order and the windows that bound the switches' memory: docs/model/algorithms-in-switch.md.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.plans import in_switch
from nvlink_emu.fabric.reduction import switch_accumulator

from . import plan


def allreduce(call, array: np.ndarray) -> None:
    """Its plan (fabric.plans.in_switch.sharp, for the call's size and the fabric's switch buffer), run by the
    one executor (ranks/collectives/plan.py)."""
    item = array.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "allreduce", call.nodes(), call.gpu.config, array.size * item, item,
                            _wide(array.dtype))
    plan.execute(call, plans.build("sharp", call.n, "allreduce", shape=shape), array, array)


def _wide(dtype) -> int:
    """How many times as wide as an element of `dtype` the switch's accumulator is."""
    return switch_accumulator(np.dtype(dtype)).itemsize // np.dtype(dtype).itemsize


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    """Its plan (fabric.plans.in_switch.sharp), as allreduce's."""
    item = send.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "reduce_scatter", call.nodes(), call.gpu.config, send.size * item, item,
                            _wide(send.dtype))
    plan.execute(call, plans.build("sharp", call.n, "reduce_scatter", shape=shape), send, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    """Its plan of multicast stores (fabric.plans.in_switch.sharp), run by the one executor."""
    per_node, item = call.gpu.config.gpus_per_node, recv.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "allgather", call.nodes(), call.gpu.config, recv.size * item, item,
                            member_nodes=tuple(call.peer(p) // per_node for p in range(call.n)))
    plan.execute(call, plans.build("sharp", call.n, "allgather", shape=shape), send, recv)


def broadcast(call, array: np.ndarray, root: int) -> None:
    """Its plan of multicast stores (fabric.plans.in_switch.sharp) from `root`, run by the one executor."""
    item = array.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "broadcast", call.nodes(), call.gpu.config, array.size * item, item)
    plan.execute(call, plans.build("sharp", call.n, "broadcast", root, shape=shape), array, array)


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    """Its plan (fabric.plans.in_switch.sharp): every member's contributions to the root's results, paced by
    the root's credits (out of band), so that at most the window's chunks of each member are in the switch."""
    item = send.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "reduce", call.nodes(), call.gpu.config, send.size * item, item)
    out = recv if call.r == root else send[:0]  # only the root's output is written
    assert out is not None  # the root's output, checked by the communicator
    plan.execute(call, plans.build("sharp", call.n, "reduce", root, shape=shape), send, out)
