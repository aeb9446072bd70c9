"""`direct`: the A100 NVSwitch way, "read and reduce, then broadcast"; the switch only forwards.

GPU j owns the j-th 1/N block: it gathers block j from every peer, reduces it, then sends the
reduced block to every peer. Per-GPU link payload for S bytes on N GPUs, tx = rx:
- allreduce: (N-1)/N x S in the reduce phase + (N-1)/N x S in the broadcast phase = 2(N-1)/N x S;
- reduce_scatter (S = input bytes) and allgather (S = output bytes): (N-1)/N x S;
- broadcast: the root sends S to each of the N-1 others (root tx (N-1) x S, every other rx S).
- reduce (S = input bytes; b_j = bytes of block j, blocks as fabric.reduction.blocks): the
  reduce-scatter above, then every member but the root sends its reduced block to the root. Member
  r tx = S - b_r, plus b_r if r is not the root (= S); rx = (N-1) b_r, plus S - b_root at the root
  (= 2(N-1)/N x S for equal blocks).
- gather (s = bytes each member sends): every other member tx s, the root rx (N-1) s.
- scatter (s = bytes each member receives): the root tx (N-1) s, every other member rx s.
In step k = 1..N-1 GPU r sends to GPU r+k and takes in from GPU r-k, so every link carries one
block per step; the root takes the gathered blocks in from members root+1, root+2, ... in turn.
Combine order: members 0, 1, ..., N-1, in the array's dtype.
allreduce, reduce_scatter, allgather, broadcast and reduce are plans (fabric.plans.registry.direct, run
by ranks/collectives/plan.py, timed by fabric.replay from the same plan; reduce's root finishes the
whole result at the end, the same values each block's owner finished before); gather and scatter are
written out below.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.reduction import chunks

from . import plan

GATHER, SCATTER = 4, 5  # message phases (0 to 3 were the reductions and broadcasts now run as plans)


def allreduce(call, array: np.ndarray) -> None:
    plan.execute(call, plans.build("direct", call.n, "allreduce"), array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    plan.execute(call, plans.build("direct", call.n, "reduce_scatter"), send, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    plan.execute(call, plans.build("direct", call.n, "allgather"), send, recv)


def broadcast(call, array: np.ndarray, root: int) -> None:
    plan.execute(call, plans.build("direct", call.n, "broadcast", root), array, array)


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    out = recv if call.r == root else np.empty(send.size, send.dtype)  # a member's own reduced block lands here
    plan.execute(call, plans.build("direct", call.n, "reduce", root), send, out)


def gather(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    n, r = call.n, call.r
    if r != root:
        for c, (lo, hi) in enumerate(chunks(0, send.size, call.chunk)):
            call.send(root, (GATHER, r, c), send[lo:hi])
    else:
        parts = [(p * send.size, (p + 1) * send.size) for p in range(n)]
        recv[slice(*parts[r])] = send
        _take_blocks(call, recv, parts, GATHER)
    call.flush()


def scatter(call, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    n, r = call.n, call.r
    if r == root:
        for k in range(1, n):
            p = (root + k) % n
            for c, (lo, hi) in enumerate(chunks(p * recv.size, (p + 1) * recv.size, call.chunk)):
                call.send(p, (SCATTER, c), send[lo:hi])
        recv[:] = send[r * recv.size:(r + 1) * recv.size]
    else:
        for c, (lo, hi) in enumerate(chunks(0, recv.size, call.chunk)):
            call.recv(root, (SCATTER, c), recv[lo:hi])
    call.flush()


def _take_blocks(call, out: np.ndarray, parts, phase: int) -> None:
    """The root: block p of `out` <- member p's block (message phase `phase`), from root+1, root+2, ..."""
    n, r = call.n, call.r
    spans = {p: list(enumerate(chunks(*parts[p], call.chunk))) for p in range(n) if p != r}
    for k in range(1, n):  # post every receive first, so blocks land in place as they come
        p = (r + k) % n
        for c, (lo, hi) in spans[p]:
            call.post((phase, p, c), out[lo:hi], p)
    for k in range(1, n):
        p = (r + k) % n
        for c, (lo, hi) in spans[p]:
            call.wait((phase, p, c), f"GPU {call.peer(p)}", out[lo:hi], p)
