"""`nvls`: NVLS as NCCL uses it. Each GPU asks the switch for the reduction of its own 1/N block
(load-reduce: the switch reads that block from every member's bound buffer and reduces), then
multicast-stores the reduced block to every member.

Per-GPU link payload for S bytes on N GPUs:
- allreduce: tx = S (the switch's loads of each of my N blocks) + S/N (my multicast store) = (N+1)/N x S;
  rx = S/N (my reduced block) + S (every member's multicast, mine included) = (N+1)/N x S;
- reduce_scatter (S = input bytes): tx = S, rx = S/N (load-reduce only);
- allgather and broadcast: multicast stores, as in `sharp`.
Requests (LOAD_REDUCE, LOAD) are header-only packets: raw bytes, no payload.
Combine order: members 0, 1, ..., N-1, in the switch's accumulator, as in `sharp`.
"""

import numpy as np

from fabric.reduction import blocks, chunks

from .sharp import allgather, broadcast  # noqa: F401  (multicast stores, the same as sharp's)

LR, MC = 4, 5  # message phases
SOURCE = ("nvls-bound",)


def _load_reduce_own_block(call, window: int, source: np.ndarray, out: np.ndarray, then=None) -> None:
    """out <- reduction of block r over every member's `source` (bound for the switch to read)."""
    gpu, r = call.gpu, call.r
    gpu.bind_buffer(call.key(*SOURCE), source)
    a, b = blocks(source.size, call.n)[r]
    spans = chunks(a, b, call.chunk)
    item = source.dtype.itemsize

    def request(c):
        lo, hi = spans[c]
        call.load_reduce((r, c), SOURCE, lo * item, (hi - lo) * item, (LR, c))

    for c, (lo, hi) in enumerate(spans):
        call.post((LR, c), out[lo - a:hi - a])
    for c in range(min(window, len(spans))):
        request(c)
    for c, (lo, hi) in enumerate(spans):
        call.wait((LR, c), "the switch's load-reduce", out[lo - a:hi - a])
        if then is not None:
            then(c, lo, hi)
        if c + window < len(spans):
            request(c + window)
    return spans


def allreduce(call, array: np.ndarray) -> None:
    n, r = call.n, call.r
    window = call.in_switch_window(n)  # every member's requests are in the switch at once
    parts = blocks(array.size, n)
    for p, (a, b) in enumerate(parts):
        if p != r:
            for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
                call.post((MC, p, c), array[lo:hi])
    a, b = parts[r]
    reduced = np.empty(b - a, array.dtype)

    def store(c, lo, hi):
        # multicast-store my reduced block to every member as soon as each chunk is back
        call.multicast((MC, r, c), reduced[lo - a:hi - a])

    spans = _load_reduce_own_block(call, window, array, reduced, then=store)
    array[a:b] = reduced
    scratch = np.empty(min(call.chunk, b - a), array.dtype)
    for c, (lo, hi) in enumerate(spans):
        call.recv(r, (MC, r, c), scratch[:hi - lo])  # my own copy of the multicast store
    for p, (pa, pb) in enumerate(parts):
        if p != r:
            for c, (lo, hi) in enumerate(chunks(pa, pb, call.chunk)):
                call.wait((MC, p, c), f"GPU {call.peer(p)}'s multicast", array[lo:hi])
    call.flush()
    call.gpu.unbind_buffer(call.key(*SOURCE))


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    _load_reduce_own_block(call, call.in_switch_window(call.n), send, recv)
    # other members may still be loading from our send buffer: keep it bound until all have their blocks
    call.comm.allgather_object(None, "nvls reduce_scatter completion")
    call.flush()
    call.gpu.unbind_buffer(call.key(*SOURCE))
