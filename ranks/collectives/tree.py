"""`tree`: NCCL's double binary tree across nodes (allreduce), each node's part a chain over NVLink.

Members as hier's Grid (N nodes x G positions, the same local indices in every node; otherwise
UnsupportedOperation before any byte moves). The buffer is cut in two halves, part t =
blocks(count, 2)[t], each reduced and broadcast on its own tree (fabric.reduction.tree_parts):
between nodes, tree t of NCCL's double binary tree over the node indices (ncclGetDtree,
NVIDIA/nccl src/graph/trees.cc: tree 1 is tree 0 mirrored for an even node count, shifted by one
for an odd one, so a node that is a leaf in one tree is inside the other); inside each node a chain
over NVLink, positions 0, 1, ..., G-1 for tree 0 and G-1, ..., 0 for tree 1 (its head h_t = t (G-1));
the head both receives from and sends to the other nodes' heads over its own NIC (NCCL's pattern
NCCL_TOPO_PATTERN_TREE), so the two trees cross nodes on two rails. NCCL runs each tree on several
channels, one thread block each, which never wait for each other; a GPU's program here is one
sequence, in which every further tree would add its chain's latency to the others', so there are
two (measured with one tree per rail on superpod-h100-ib 2 x 4 at 4 KiB: 22.7 us against 11.3).
One node: the two chains alone.

Schedule, pipelined in messages of min(chunk_bytes, 512 KiB) (fabric.reduction.TREE_CHUNK_BYTES:
NCCL's tree chunk, one step of its 4 MiB buffer), in steps (fabric.reduction.tree_steps): at step
s a member reduces chunk s - h of each part, h its height in that part's tree (receives each
child's partial, folds it into its own, sends the result to its parent; the root finishes it (avg)
and at once sends it down to its children), then passes chunk s - H - d down (H the tree's height,
d its depth: receive from the parent, pass on to the children). Every message a step waits for was
sent at an earlier step, so chunks stream up and down at once, as NCCL runs the two directions on
split thread groups.

Per-GPU link payload for S bytes (P = S/2 a part, S a multiple of 2 x itemsize), tx = rx: on part
t a member sends P up unless it is the root and P down to each child: a chain member that is not
the head nor the tail 2P each way, the tail P, the head (deg_t(a) + [G > 1]) P, deg_t(a) = tree-t
edges at node a (its parent and children: 1 for both nodes of two). Across nodes, per tree edge P
each way between the heads: leaf a <-> spine (h_t mod spines) deg_t(a) P each way
(docs/model/cost-nodes.md documents every link).
Combine order: part t at member x is x's own data, then each child's partial in fold order (the
chain's next member, then child node 0's head, then child node 1's), in the array's dtype, one
rounding per step; the root's result is finished (avg divides by the member count).
NCCL runs its tree for AllReduce only; so does this module (reduce_scatter, allgather, broadcast,
reduce: ring, direct or hier). The schedule is a plan (fabric.plans.registry.tree, built for the call's
size: its chunks are the pipeline's pieces), run by ranks/collectives/plan.py and timed by
fabric.plans.timing: the same messages in the same order; the root's average is finished with everyone
else's, on the whole output at the end (the same sum divided by n, bit for bit).
"""

import numpy as np

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def allreduce(call, array: np.ndarray) -> None:
    grid = Grid(call, "allreduce", "tree")  # UnsupportedOperation before any byte moves if not a grid
    layout = tuple(tuple(row) for row in grid.rank)
    item = array.dtype.itemsize
    schedule = plans.build("tree", call.n, "allreduce", layout=layout, nbytes=array.size * item, itemsize=item,
                           chunk_bytes=call.gpu.config.chunk_bytes)
    # the partials are reduced in a copy (they may still be leaving it when results land in `array`)
    plan.execute(call, schedule, array.copy(), array)
