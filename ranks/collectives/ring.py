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
bit); so does broadcast across nodes (its channels' chains, a plan for the call's size); reduce's
channels are below.
"""

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import blocks, channel_rings, chunks, combine, finish, ring_channel_count

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid

# message phases: 0 to 3 were the one ring's, its broadcast chain's and its reduce chain's, 4 to 6 the
# channels' allreduce, reduce_scatter, allgather and broadcast across nodes, now plans (ranks/collectives/plan.py)
CH_RD = 7  # reduce's channels' phase across nodes


def _grid(call):
    """hier's Grid of a communicator that spans several nodes in it; None on one node or when its nodes do
    not line up (the one ring)."""
    try:
        grid = Grid(call, "ring")
    except UnsupportedOperation:
        return None
    return None if grid.N == 1 else grid


def _channels(call, count: int) -> list[list[int]] | None:
    """The rings (communicator ranks in ring order) of a call of `count` elements on a communicator that
    spans several nodes as hier's Grid: the first ring_channel_count of the G rails' rings; None (the
    one ring) on one node or when its nodes do not line up."""
    grid = _grid(call)
    if grid is None:
        return None
    return channel_rings(grid.rank)[:ring_channel_count(count * call.dtype.itemsize, grid.G)]


def _flush_channels(call, C: int) -> None:
    """Wait until every send left; each channel's clock moves to when its own last byte left."""
    for c in range(C):
        with call.channel(c, C):
            call.flush()


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


def _channel_chains(call, rings, root: int, count: int):
    """Per channel c: (part c of blocks(count, C), this member's ring-c position counted from the root,
    ring c). The chunk loop runs every channel's chunk i before any channel's chunk i+1."""
    n = call.n
    return [(part, (ring.index(call.r) - ring.index(root)) % n, ring)
            for part, ring in zip(blocks(count, len(rings)), rings)]


def _channel_steps(call, chains):
    """(c, i, lo, hi, position, previous, next) for chunk i of channel c of `chains` (_channel_chains'
    form), every channel's chunk i before any channel's chunk i+1; previous/next: the members before
    and after this one on ring c."""
    n = call.n
    spans = [chunks(*part, call.chunk) for part, _, _ in chains]
    for i in range(max(map(len, spans), default=0)):
        for c, (_, position, ring) in enumerate(chains):
            if i < len(spans[c]):
                q = ring.index(call.r)
                yield (c, i, *spans[c][i], position, ring[(q - 1) % n], ring[(q + 1) % n])


def broadcast(call, array: np.ndarray, root: int) -> None:
    plan.execute(call, _plan(call, "broadcast", array.size, root), array, array)


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    n, r = call.n, call.r
    rings = _channels(call, send.size)
    if rings is not None:
        # part c: a chain along ring c from the root's successor to the root, every channel at once
        chains = [(part, (position - 1) % n, ring) for part, position, ring in _channel_chains(call, rings, root,
                                                                                              send.size)]
        work = np.empty(send.size, send.dtype)
        for c, i, lo, hi, position, previous, following in _channel_steps(call, chains):
            with call.channel(c, len(rings)):
                if position:
                    call.recv(previous, (CH_RD, c, i), work[lo:hi])
                    combine(call.op, work[lo:hi], send[lo:hi])
                else:
                    work[lo:hi] = send[lo:hi]
                if position < n - 1:
                    call.send(following, (CH_RD, c, i), work[lo:hi])
                else:
                    finish(call.op, work[lo:hi], n, recv[lo:hi])
        _flush_channels(call, len(rings))
        call.join_channels()
        return
    out = recv if r == root else send[:0]  # only the root's output is written
    plan.execute(call, plans.build("ring", n, "reduce", root), send, out)
