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
Every collective here is a plan (fabric.plans.registry.direct, run by ranks/collectives/plan.py, timed by
fabric.replay from the same plan where the replay times it; reduce's root finishes the whole result at
the end, the same values each block's owner finished before).
"""

import numpy as np

from nvlink_emu.fabric import plans

from . import plan


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
    assert out is not None  # the root's output, checked by the communicator
    plan.execute(call, plans.build("direct", call.n, "reduce", root), send, out)


def gather(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    out = recv if call.r == root else send[:0]  # only the root's output is written
    assert out is not None  # the root's output, checked by the communicator
    plan.execute(call, plans.build("direct", call.n, "gather", root), send, out)


def scatter(call, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    inp = send if call.r == root else recv[:0]  # only the root's input is read
    assert inp is not None  # the root's input, checked by the communicator
    plan.execute(call, plans.build("direct", call.n, "scatter", root), inp, recv)
