"""All2All and All2Allv: every GPU sends block j of its send buffer to GPU j, through the switch.

Per-GPU link payload for S send bytes on N GPUs (equal blocks): tx = rx = (N-1)/N x S; a GPU's own
block never leaves it (copied locally). All2Allv moves exactly the counts given, own block excluded.
Equal blocks (every member's every count the same: all2all, and all2allv with such counts; the cost
models take the same rule) run as direct's plan (fabric.plans.registry.direct): the same exchange, in
_all2all_order's steps across nodes; uneven counts run the call's plan (fabric.plans.registry.all2allv:
direct's one-node order, block r+1, r+2, ... out, r-1, r-2, ... in, chunks sized by the counts).
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.errors import UnsupportedOperation

from . import plan


def all2allv(call, send: np.ndarray, send_offsets, send_counts, recv: np.ndarray, recv_offsets,
             recv_counts) -> None:
    # every member's counts (the call check): one decision, the cost models' (registry.all2allv_plan)
    call_plan, elements = plans.registry.all2allv_plan(call.counts, node_layout(call))
    if elements is not None:  # all2all's equal, packed blocks: direct's plan (the same exchange)
        plan.execute(call, call_plan, send[:elements], recv[:elements])
        return
    if list(send_offsets) != offsets(send_counts) or list(recv_offsets) != offsets(recv_counts):
        raise UnsupportedOperation(f"GPU {call.gpu.rank}: all2allv runs packed blocks (offsets {offsets(send_counts)}, "
                                   f"{offsets(recv_counts)}), got {list(send_offsets)}, {list(recv_offsets)}")
    # uneven counts: the call's plan, its chunks sized by every member's counts (from the call check)
    plan.execute(call, call_plan, send, recv)


def node_layout(call) -> tuple[tuple[int, ...], ...] | None:
    """The communicator's ranks by node (nodes in fabric order, each node's in rank order): direct's
    all2all layout (fabric.plans.registry.direct); None when every member is on one node."""
    topology = call.gpu.config.topology
    by_node: dict[int, list[int]] = {}
    for rank, gpu in enumerate(call.comm.members):
        by_node.setdefault(topology.locate(gpu)[0], []).append(rank)
    return tuple(tuple(by_node[node]) for node in sorted(by_node)) if len(by_node) > 1 else None


def offsets(counts) -> list[int]:
    """Start of each block when blocks of `counts` elements are packed one after another."""
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts)[:-1]))] if len(counts) else []
