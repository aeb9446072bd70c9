"""`ring`: every GPU passes blocks to the next GPU around a ring, every hop through the switch.

Per-GPU link payload for S bytes on N GPUs (S a multiple of N x itemsize), tx = rx:
- allreduce: reduce-scatter then all-gather, 2(N-1)/N x S;
- reduce_scatter (S = input bytes) and allgather (S = output bytes): (N-1)/N x S;
- broadcast: a pipelined chain from the root, S on every GPU's uplink but the last one's, and S on
  every downlink but the root's.
- reduce: a pipelined chain root+1, root+2, ..., root (as NCCL's ring Reduce): each member folds
  its own data into the partial it received and passes it on; S on every uplink but the root's, and
  S on every downlink but root+1's.
Combine order: block b is folded b+1, b+2, ..., b+N-1, b (members mod N) in the array's dtype, one
rounding per hop (16-bit floats included), as NCCL's ring does; reduce folds the whole buffer
root+1, root+2, ..., root+N-1, root the same way.
"""

import numpy as np

from nvlink_emu.fabric.reduction import blocks, chunks, combine, finish

RS, AG, BC, RD = 0, 1, 2, 3  # message phases


def _reduce_scatter_inplace(call, work: np.ndarray) -> list[tuple[int, int]]:
    """After this, block r of `work` holds the reduction (not yet finished) of every member's block r."""
    n, r = call.n, call.r
    parts = blocks(work.size, n)
    scratch = np.empty(min(call.chunk, max((b - a for a, b in parts), default=0)), work.dtype)
    for step in range(n - 1):
        # step s: push block r-1-s to the next GPU, fold block r-2-s from the previous one into ours
        a, b = parts[(r - 1 - step) % n]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.send(r + 1, (RS, step, c), work[lo:hi])
        a, b = parts[(r - 2 - step) % n]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            tmp = scratch[:hi - lo]
            call.recv(r - 1, (RS, step, c), tmp)
            combine(call.op, work[lo:hi], tmp)
        call.flush()
    return parts


def _allgather_inplace(call, work: np.ndarray, parts: list[tuple[int, int]]) -> None:
    """Block r of `work` is final on member r; afterwards every block is, on every member."""
    n, r = call.n, call.r
    for step in range(n - 1):
        # step s: pass block r-s on, receive block r-1-s straight into place
        a, b = parts[(r - step) % n]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.send(r + 1, (AG, step, c), work[lo:hi])
        a, b = parts[(r - 1 - step) % n]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.recv(r - 1, (AG, step, c), work[lo:hi])
    call.flush()


def allreduce(call, array: np.ndarray) -> None:
    parts = _reduce_scatter_inplace(call, array)
    a, b = parts[call.r]
    finish(call.op, array[a:b], call.n, array[a:b])
    _allgather_inplace(call, array, parts)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    parts = _reduce_scatter_inplace(call, work)
    a, b = parts[call.r]
    finish(call.op, work[a:b], call.n, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    _allgather_inplace(call, recv, call.own_block_in_place(send, recv))


def broadcast(call, array: np.ndarray, root: int) -> None:
    n, position = call.n, (call.r - root) % call.n
    for c, (lo, hi) in enumerate(chunks(0, array.size, call.chunk)):
        # chunk c moves down the chain root, root+1, ..., root+N-1; each GPU forwards as soon as it has it
        if position:
            call.recv(call.r - 1, (BC, c), array[lo:hi])
        if position < n - 1:
            call.send(call.r + 1, (BC, c), array[lo:hi])
    call.flush()


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    n, r = call.n, call.r
    position = (r - root - 1) % n  # 0: root+1, the chain's start; n-1: the root, its end
    work = send if position == 0 else np.empty(send.size, send.dtype)
    for c, (lo, hi) in enumerate(chunks(0, send.size, call.chunk)):
        # chunk c: fold my part into the partial from the previous member, pass it on (root: finish)
        if position:
            call.recv(r - 1, (RD, c), work[lo:hi])
            combine(call.op, work[lo:hi], send[lo:hi])
        if position < n - 1:
            call.send(r + 1, (RD, c), work[lo:hi])
        else:
            finish(call.op, work[lo:hi], n, recv[lo:hi])
    call.flush()
