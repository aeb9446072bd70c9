"""All2All and All2Allv: every GPU sends block j of its send buffer to GPU j, through the switch.

Per-GPU link payload for S send bytes on N GPUs (equal blocks): tx = rx = (N-1)/N x S; a GPU's own
block never leaves it (copied locally). All2Allv moves exactly the counts given, own block excluded.
Equal, packed blocks (all2all) run as direct's plan (fabric.plans.registry.direct): the same exchange.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.reduction import chunks

from . import plan

A2A = 6  # message phase


def all2allv(call, send: np.ndarray, send_offsets, send_counts, recv: np.ndarray, recv_offsets,
             recv_counts) -> None:
    n, r = call.n, call.r
    each = send_counts[0] if n else 0
    if send.size == recv.size == n * each and all(c == each for c in (*send_counts, *recv_counts)):
        # all2all's equal, packed blocks: direct's plan (the same exchange, fabric.plans.registry.direct)
        plan.execute(call, plans.build("direct", n, "all2all", layout=node_layout(call)), send, recv)
        return
    for shift in range(1, n):
        # post every receive first, so peers' blocks land in place
        p = (r - shift) % n
        base = recv_offsets[p]
        for c, (lo, hi) in enumerate(chunks(base, base + recv_counts[p], call.chunk)):
            call.post((A2A, p, c), recv[lo:hi], p)
    for shift in range(1, n):
        # step s: send to member r+s (a shifted order spreads the load over the switch's ports)
        p = (r + shift) % n
        base = send_offsets[p]
        for c, (lo, hi) in enumerate(chunks(base, base + send_counts[p], call.chunk)):
            call.send(p, (A2A, r, c), send[lo:hi])
    recv[recv_offsets[r]:recv_offsets[r] + recv_counts[r]] = send[send_offsets[r]:send_offsets[r] + send_counts[r]]
    for shift in range(1, n):
        p = (r - shift) % n
        base = recv_offsets[p]
        for c, (lo, hi) in enumerate(chunks(base, base + recv_counts[p], call.chunk)):
            call.wait((A2A, p, c), f"GPU {call.peer(p)}", recv[lo:hi], p)
    call.flush()


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
