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

Schedule, pipelined in messages of chunk_bytes: reduce up, chunk i of both parts before chunk
i+1 (the part in which this member is lower first; fabric.reduction.tree_orders): a member receives each child's partial, folds it into its own, sends the result to its
parent; the root of a part finishes it (avg) and at once sends it down to its children; then (after
the up sends left) broadcast down, chunk by chunk (the part whose root is nearer first): receive from the parent, pass on to the
children. NCCL runs the two directions on split thread groups at once; here a member starts passing
results down once its own up sends are done (the emulated and replayed times, which agree exactly,
include that).

Per-GPU link payload for S bytes (P = S/2 a part, S a multiple of 2 x itemsize), tx = rx: on part
t a member sends P up unless it is the root and P down to each child: a chain member that is not
the head nor the tail 2P each way, the tail P, the head (deg_t(a) + [G > 1]) P, deg_t(a) = tree-t
edges at node a (its parent and children: 1 for both nodes of two). Across nodes, per tree edge P
each way between the heads: leaf a <-> spine (h_t mod spines) deg_t(a) P each way
(fabric.cost_nodes documents every link).
Combine order: part t at member x is x's own data, then each child's partial in fold order (the
chain's next member, then child node 0's head, then child node 1's), in the array's dtype, one
rounding per step; the root's result is finished (avg divides by the member count).
NCCL runs its tree for AllReduce only; so does this module (reduce_scatter, allgather, broadcast,
reduce: ring, direct or hier).
"""

import numpy as np

from nvlink_emu.fabric.reduction import blocks, chunks, combine, finish, tree_orders, tree_parts

from .hier import Grid

UP, DOWN = 30, 31  # message phases


def allreduce(call, array: np.ndarray) -> None:
    grid = Grid(call, "allreduce", "tree")
    rank = grid.rank
    me = (grid.a, grid.j)
    layout = tree_parts(grid.N, grid.G)
    trees = [part[me] for part in layout]
    up_order, down_order = tree_orders(layout, me)
    parts = blocks(array.size, len(trees))
    spans = [chunks(lo, hi, call.chunk) for lo, hi in parts]
    longest = max((hi - lo for lo, hi in parts), default=0)
    scratch = np.empty(min(call.chunk, longest), array.dtype)
    rounds = max(map(len, spans), default=0)
    for i in range(rounds):  # up: fold the children's partials into mine, pass it to the parent
        for k in up_order:
            parent, children = trees[k]
            if i >= len(spans[k]):
                continue
            lo, hi = spans[k][i]
            for a, j in children:
                tmp = scratch[:hi - lo]
                call.recv(rank[a][j], (UP, k, i), tmp)
                combine(call.op, array[lo:hi], tmp)
            if parent is not None:
                call.send(rank[parent[0]][parent[1]], (UP, k, i), array[lo:hi])
            else:  # the root: the result, sent down at once
                finish(call.op, array[lo:hi], call.n, array[lo:hi])
                for a, j in children:
                    call.send(rank[a][j], (DOWN, k, i), array[lo:hi])
    call.flush()  # my partials have left: the results may land on them
    for i in range(rounds):  # down: the parent's result, passed on to the children
        for k in down_order:
            parent, children = trees[k]
            if i >= len(spans[k]) or parent is None:
                continue
            lo, hi = spans[k][i]
            call.recv(rank[parent[0]][parent[1]], (DOWN, k, i), array[lo:hi])
            for a, j in children:
                call.send(rank[a][j], (DOWN, k, i), array[lo:hi])
    call.flush()
