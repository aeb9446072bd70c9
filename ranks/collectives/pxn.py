"""`pxn`: NCCL's rail-aligned All2All (PXN, "PCI x NVLink", NCCL 2.12): a block for a GPU of another
node first crosses NVLink to the GPU of the sender's node on the destination's rail (the same local
index as the destination), which sends it across in one hop on that rail; so every block that leaves
a node leaves it on the destination's rail.

Members are grouped as hier.py's Grid (nodes a, positions j; every node the same local indices in the
same order, else UnsupportedOperation). GPU (a, j) sends its block for (b, k):
- straight to (b, k) when b = a (inside the node) or k = j (already on the destination's rail);
- otherwise to its proxy (a, k) over NVLink, which forwards it to (b, k); the proxy forwards its
  sources' blocks in a fixed order (source position, then destination node).
Per-GPU link payload for S send bytes on N nodes x G GPUs (blocks s = S / (N G)), tx = rx:
(G-1) s + (N-1) s + 2 (N-1)(G-1) s = `direct`'s (NG-1) s + (N-1)(G-1) s: a GPU's own blocks leave
it once either way (to the proxy instead of the destination), and as a proxy it takes in and sends
on (N-1)(G-1) blocks of its node's other GPUs. Leaf-spine bytes equal `direct`'s all2all: (a, ·) -> (b, k)
crosses spine k mod spines in both (the Topology routes by the destination's local index), k_i
(N-1) S / N on each leaf <-> spine i link each way (k_i: the rails spine i carries).
Modeled time (fabric.replay, exact): an extra NVLink hop costs latency, so small All2Alls are slower
than `direct`'s (8 KiB on superpod-h100-ib, 2 x 4 GPUs: 2.90 us against 2.40); large ones can be faster,
because `direct`'s senders of a node all start their remote blocks with the same GPU and queue on its
inbound share, while the proxies spread them (8 MiB: 106 us against 158 on superpod-h100-ib, 36.0
against 36.0 on superpod-h100-nvlink). The gain NCCL gets on real clusters from rail-optimized
networks (traffic of rail k stays under rail k's leaf switch) and from fewer network connections per
GPU has no counterpart in this topology. comm.all2all's `auto` picks pxn or direct by that modeled
time (comm.all2all_algorithm).
All2Allv is not offered: a proxy would need every sender's counts to size what it forwards.
"""

import numpy as np

from nvlink_emu.fabric.reduction import chunks

from .hier import Grid

DIRECT, HOP, FORWARD = 30, 31, 32  # message phases


def all2all(call, send: np.ndarray, send_offsets, send_counts, recv: np.ndarray, recv_offsets, recv_counts) -> None:
    """comm.all2all's call in all2allv form: every block of `send_counts` (and `recv_counts`) equal."""
    grid = Grid(call, "all2all", "pxn")
    n, r, each = call.n, call.r, send_counts[0]
    node = {m: (a, j) for a, row in enumerate(grid.rank) for j, m in enumerate(row)}
    a, j = grid.a, grid.j

    def spans(base):
        return list(enumerate(chunks(base, base + each, call.chunk)))

    # every block for me: straight from a node peer or a sender on my rail, else from the sender's proxy
    incoming = []
    for shift in range(1, n):
        p = (r - shift) % n
        b, k = node[p]
        direct = b == a or k == j
        frm, phase = (p, DIRECT) if direct else (grid.rank[b][j], FORWARD)
        for c, (lo, hi) in spans(recv_offsets[p]):
            call.post((phase, p, c), recv[lo:hi], frm)
            incoming.append(((phase, p, c), frm, recv[lo:hi]))
    # as a proxy: the blocks of my node's other positions for the other nodes' GPUs on my rail
    forwards = []
    for k in range(grid.G):
        if k == j:
            continue
        source = grid.rank[a][k]
        for b in range(grid.N):
            if b == a:
                continue
            dest = grid.rank[b][j]
            staged = np.empty(each, send.dtype)
            for c, (lo, hi) in enumerate(chunks(0, each, call.chunk)):
                call.post((HOP, source, dest, c), staged[lo:hi], source)
            forwards.append((source, dest, staged))
    for shift in range(1, n):
        # a shifted order spreads the load, as all2all.py's
        p = (r + shift) % n
        b, k = node[p]
        for c, (lo, hi) in spans(send_offsets[p]):
            if b == a or k == j:
                call.send(p, (DIRECT, r, c), send[lo:hi])
            else:
                call.send(grid.rank[a][k], (HOP, r, p, c), send[lo:hi])
    recv[recv_offsets[r]:recv_offsets[r] + each] = send[send_offsets[r]:send_offsets[r] + each]
    for source, dest, staged in forwards:
        for c, (lo, hi) in enumerate(chunks(0, each, call.chunk)):
            call.wait((HOP, source, dest, c), f"GPU {call.peer(source)}", staged[lo:hi], source)
            call.send(dest, (FORWARD, source, c), staged[lo:hi])
    for parts, frm, out in incoming:
        call.wait(parts, f"GPU {call.peer(frm)}", out, frm)
    call.flush()
