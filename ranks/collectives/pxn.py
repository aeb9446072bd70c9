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
than `direct`'s (8 KiB on superpod-h100-ib, 2 x 4 GPUs: 2.90 us against 2.40); since `direct` sends its
remote blocks in a Latin square of steps (fabric.plans.registry._all2all_order) it is at its occupancy
bound across nodes and large pxn All2Alls are slower too (their extra NVLink bytes: 8 MiB, 98.8 us against
91.4; before that order `direct`'s senders of a node all started with the same remote GPU, and pxn won
from 1 MiB on the IB presets). The gain NCCL gets on real clusters from rail-optimized networks
(traffic of rail k stays under rail k's leaf switch) and from fewer network connections per GPU has
no counterpart in this topology. comm.all2all's `auto` picks pxn or direct by that modeled time
(fabric.tuner.all2all_algorithm).
All2Allv is not offered: a proxy would need every sender's counts to size what it forwards.
"""

import numpy as np

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def all2all(call, send: np.ndarray, send_offsets, send_counts, recv: np.ndarray, recv_offsets, recv_counts) -> None:
    """comm.all2all's call in all2allv form: every block of `send_counts` (and `recv_counts`) equal, packed
    in member order: fabric.plans.registry.pxn's plan on this communicator's grid."""
    grid = Grid(call, "all2all", "pxn")
    layout = tuple(tuple(row) for row in grid.rank)
    plan.execute(call, plans.build("pxn", call.n, "all2all", layout=layout), send, recv)
