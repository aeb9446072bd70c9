"""`nvls`: NVLS as NCCL uses it. Each GPU asks the switch for the reduction of its own 1/N block
(load-reduce: the switch reads that block from every member's bound buffer and reduces), then
multicast-stores the reduced block to every member; across nodes the leaves and spines reduce in two
levels. Bytes per link, combine order, the schedule in rounds and the window:
docs/model/algorithms-in-switch.md.
"""

import numpy as np

from nvlink_emu.fabric.reduction import blocks, chunks
from nvlink_emu.fabric.budget import nvls_streams

from .sharp import allgather, broadcast  # noqa: F401  (multicast stores, the same as sharp's)

LR, MC = 4, 5  # message phases
SOURCE = ("nvls-bound",)


def _run(call, source: np.ndarray, reduced: np.ndarray, out: np.ndarray | None) -> None:
    """Load-reduce block r of every member's `source` into `reduced`; with `out`, also multicast it and
    gather every member's reduced block into `out` (allreduce)."""
    gpu, n, r = call.gpu, call.n, call.r
    # pipeline chunks of nvls_chunk_bytes (NCCL's NVLS chunk); every member's requests are in the switch at once
    window = call.in_switch_window(streams(call, source.dtype), least=2, chunk_bytes=gpu.config.nvls_chunk_bytes)
    parts = blocks(source.size, n)
    spans = [chunks(a, b, call.chunk) for a, b in parts]
    own, base = spans[r], parts[r][0]
    item = source.dtype.itemsize
    gpu.bind_buffer(call.key(*SOURCE), source)
    start = gpu.now_ns
    stamps = [gpu.reserve_uplink(0, start) for _ in own]  # header-only requests, all issued at start
    scratch = np.empty(min(call.chunk, max(b - a for a, b in parts)), source.dtype) if out is not None else None
    if out is not None:
        for p, span in enumerate(spans):
            if p != r:
                for c, (lo, hi) in enumerate(span):
                    call.post((MC, p, c), out[lo:hi])

    def request(c):
        lo, hi = own[c]
        call.load_reduce((r, c, r + c), SOURCE, lo * item, (hi - lo) * item, (LR, r, c), stamps[c])
        call.post((LR, r, c), reduced[lo - base:hi - base])

    def take_back(c):
        # my reduced chunk c is back: multicast it, let one more request go
        if c < len(own):
            lo, hi = own[c]
            call.wait((LR, r, c), "the switch's load-reduce", reduced[lo - base:hi - base])
            if out is not None:
                call.multicast((MC, r, c), reduced[lo - base:hi - base])
            if c + window < len(own):
                request(c + window)

    def gather(c):
        # take in every member's multicast of chunk c
        for p, span in enumerate(spans):
            if out is not None and 0 <= c < len(span):
                lo, hi = span[c]
                if p == r:
                    call.recv_switch((MC, r, c), scratch[:hi - lo], "my own multicast copy")
                else:
                    call.wait((MC, p, c), f"GPU {call.peer(p)}'s multicast", out[lo:hi])

    for c in range(min(window, len(own))):
        request(c)
    rounds = max(len(span) for span in spans)
    for c in range(rounds):
        for j, span in enumerate(spans):
            if c < len(span):
                call.serve_load(SOURCE, (j, c, j + c), j)  # its last entry picks the spine
        if c:
            take_back(c - 1)
            gather(c - 2)  # a round behind: waiting for them must not hold back my next multicast
    take_back(rounds - 1)
    gather(rounds - 2)
    gather(rounds - 1)
    call.flush()
    gpu.unbind_buffer(call.key(*SOURCE))


def streams(call, dtype) -> int:
    """Credit streams of a load-reduce (Call.in_switch_window): n (every member's block in flight at once);
    across nodes also enough that every leaf's partials without their result - each requester's window,
    and once more as a notice may trail the next request - fit its buffer share / nodes, a 16-bit
    float's partial counting twice (fabric.budget.nvls_streams is the same rule)."""
    nodes = call.nodes()
    return nvls_streams(call.n, nodes, call.gpu.config.nodes, np.dtype(dtype))


def allreduce(call, array: np.ndarray) -> None:
    a, b = blocks(array.size, call.n)[call.r]
    reduced = np.empty(b - a, array.dtype)
    _run(call, array, reduced, array)
    array[a:b] = reduced


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    _run(call, send, recv, None)
