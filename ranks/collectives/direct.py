"""`direct`: the A100 NVSwitch way, "read and reduce, then broadcast"; the switch only forwards.

GPU j owns the j-th 1/N block: it gathers block j from every peer, reduces it, then sends the
reduced block to every peer. Per-GPU link payload for S bytes on N GPUs, tx = rx:
- allreduce: (N-1)/N x S in the reduce phase + (N-1)/N x S in the broadcast phase = 2(N-1)/N x S;
- reduce_scatter (S = input bytes) and allgather (S = output bytes): (N-1)/N x S;
- broadcast: the root sends S to each of the N-1 others (root tx (N-1) x S, every other rx S).
In step k = 1..N-1 GPU r sends to GPU r+k and takes in from GPU r-k, so every link carries one
block per step. Combine order: members 0, 1, ..., N-1, in the array's dtype.
"""

import numpy as np

from nvlink_emu.fabric.reduction import blocks, chunks, combine, finish

RED, BCAST, ROOT = 0, 1, 2  # message phases


def _reduce_own_block(call, source: np.ndarray, parts, out: np.ndarray) -> None:
    """out <- finished reduction of block r over every member, in member order."""
    n, r = call.n, call.r
    for k in range(1, n):
        a, b = parts[(r + k) % n]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.send(r + k, (RED, r, c), source[lo:hi])
    a, b = parts[r]
    spans = chunks(a, b, call.chunk)
    received = {}
    for k in range(1, n):
        p = (r - k) % n
        received[p] = np.empty(b - a, source.dtype)
        for c, (lo, hi) in enumerate(spans):
            call.recv(p, (RED, p, c), received[p][lo - a:hi - a])
    received[r] = source[a:b]
    acc = received[0].copy()
    for p in range(1, n):
        combine(call.op, acc, received[p])
    finish(call.op, acc, n, out)
    call.flush()


def _broadcast_own_block(call, work: np.ndarray, parts) -> None:
    n, r = call.n, call.r
    for k in range(1, n):
        for c, (lo, hi) in enumerate(chunks(*parts[r], call.chunk)):
            call.send(r + k, (BCAST, r, c), work[lo:hi])
    for k in range(1, n):
        p = (r - k) % n
        for c, (lo, hi) in enumerate(chunks(*parts[p], call.chunk)):
            call.recv(p, (BCAST, p, c), work[lo:hi])
    call.flush()


def allreduce(call, array: np.ndarray) -> None:
    parts = blocks(array.size, call.n)
    a, b = parts[call.r]
    reduced = np.empty(b - a, array.dtype)
    _reduce_own_block(call, array, parts, reduced)
    array[a:b] = reduced
    _broadcast_own_block(call, array, parts)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    _reduce_own_block(call, send, blocks(send.size, call.n), recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    _broadcast_own_block(call, recv, call.own_block_in_place(send, recv))


def broadcast(call, array: np.ndarray, root: int) -> None:
    spans = chunks(0, array.size, call.chunk)
    if call.r == root:
        for k in range(1, call.n):
            for c, (lo, hi) in enumerate(spans):
                call.send(root + k, (ROOT, c), array[lo:hi])
    else:
        for c, (lo, hi) in enumerate(spans):
            call.recv(root, (ROOT, c), array[lo:hi])
    call.flush()
