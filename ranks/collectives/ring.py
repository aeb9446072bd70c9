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

**Across nodes: one ring per rail** (NCCL's rings on DGX clusters, NVIDIA/nccl src/graph/rings.cc
and search.cc: every channel is a ring through every GPU, entering each node on one NIC and leaving
it on another, and the data is split over the channels so that every NIC carries traffic at once).
When the members span several nodes and are laid out as hier's Grid (N nodes x G positions, the
same local indices in every node), `ring` runs C channels c = 0..C-1 instead of the one ring above,
C = min(G, S // 32 KiB) and at least 1 (fabric.reduction.ring_channel_count: NCCL's rule, fewer
channels while S < channels x 512 threads x 64 bytes; with one channel it is the node-major ring):
ring c visits, in node order a = 0..N-1, the positions c, c+1, ..., c+G-1 (mod G) of each node, so it
enters node a+1 at position c from node a's position c-1 (mod G): with C = G every GPU's NIC carries
exactly one channel out and one in. Member m's range of channel c is block c of blocks(|block m|, C)
inside block m = blocks(count, n)[m] (so reduce_scatter and allgather keep the API's blocks, and
allreduce uses the same ranges); broadcast and reduce split the buffer as blocks(count, C), part c
on ring c. The channels are independent pipelines, as NCCL's (one thread block per channel, each
looping over its own part: NVIDIA/nccl src/device/all_reduce.h runRing): the program issues step s
of every channel (its sends, then its receives) before step s + 1, but each channel runs in
`call.channel(c, C)`, with its own clock and its own lane of the GPU's uplink and downlink at 1 / C
of their bandwidth (docs/model/time.md, "Channels"), so a channel's step waits for its own receive
and its own sends only, not for the slowest channel's crossing; the GPU's clock is the latest
channel's at the end (call.join_channels). With one channel (below 64 KiB) that is the GPU's clock
and whole links, as before.
Per-GPU payload is the one ring's figures above; across nodes, with C = G, each GPU sends its
channel's crossing: allreduce 2(n-1)/n x S/G on its own outbound and inbound share
(docs/model/cost-nodes.md documents every link). Combine order across nodes: member m's
range of channel c is folded in ring c's order after m (q+1, q+2, ..., q for m at ring position q),
reduce's part c in ring c's order after the root. A communicator on one node, or whose nodes do not
line up, runs the one ring above (and broadcast's and reduce's one chain), unchanged: as a plan
(fabric.plans.registry.ring, run by ranks/collectives/plan.py and timed by fabric.plans.timing: the same
messages and order; reduce's fold partial (op) own is the plan's incoming_first). allreduce,
reduce_scatter and allgather across nodes run their channels as a plan too (registry.ring with
ring_channels: the channel count of the call's size; Plan.lanes: each channel in call.channel(c, C)); an
allreduce's avg is then finished on the whole output at the end (the same sum divided by n, bit for
bit); so do broadcast and reduce across nodes (their channels' chains, plans for the call's size:
fabric.plans.registry._chain_plan, _chain_reduce_plan; reduce's fold partial (op) own, incoming_first).
"""

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def _grid(call):
    """hier's Grid of a communicator that spans several nodes in it; None on one node or when its nodes do
    not line up (the one ring)."""
    try:
        grid = Grid(call, "ring")
    except UnsupportedOperation:
        return None
    return None if grid.N == 1 else grid


def _plan(call, collective: str, count: int, root: int = 0):
    """ring's plan for a call of `count` elements (of the buffer fabric.replay sizes): across nodes, on the
    communicator's grid, its channels (fabric.plans.registry.ring_channels); otherwise the one ring."""
    grid = _grid(call)
    layout = None if grid is None else tuple(tuple(row) for row in grid.rank)
    item = call.dtype.itemsize
    return plans.build("ring", call.n, collective, root, layout=layout, nbytes=count * item, itemsize=item,
                       chunk_bytes=call.chunk * item)


def allreduce(call, array: np.ndarray) -> None:
    plan.execute(call, _plan(call, "allreduce", array.size), array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    plan.execute(call, _plan(call, "reduce_scatter", send.size), work, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    plan.execute(call, _plan(call, "allgather", recv.size), send, recv)


def broadcast(call, array: np.ndarray, root: int) -> None:
    plan.execute(call, _plan(call, "broadcast", array.size, root), array, array)


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    out = recv if call.r == root else send[:0]  # only the root's output is written
    assert out is not None  # the root's output, checked by the communicator
    plan.execute(call, _plan(call, "reduce", send.size, root), send, out)
