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
(fabric.cost_nodes documents every link).
Combine order: part t at member x is x's own data, then each child's partial in fold order (the
chain's next member, then child node 0's head, then child node 1's), in the array's dtype, one
rounding per step; the root's result is finished (avg divides by the member count).
NCCL runs its tree for AllReduce only; so does this module (reduce_scatter, allgather, broadcast,
reduce: ring, direct or hier).
"""

import numpy as np

from nvlink_emu.fabric.reduction import blocks, chunks, combine, finish, tree_chunk, tree_parts, tree_steps

from .hier import Grid

UP, DOWN = 30, 31  # message phases


def allreduce(call, array: np.ndarray) -> None:
    grid = Grid(call, "allreduce", "tree")
    rank = grid.rank
    me = (grid.a, grid.j)
    layout = tree_parts(grid.N, grid.G)
    trees = [part[me] for part in layout]
    offsets = tree_steps(layout, me)
    call.chunk = tree_chunk(call.gpu.config.chunk_bytes, array.dtype.itemsize)
    parts = blocks(array.size, len(trees))
    spans = [chunks(lo, hi, call.chunk) for lo, hi in parts]
    longest = max((hi - lo for lo, hi in parts), default=0)
    scratch = np.empty(min(call.chunk, longest), array.dtype)
    result = np.empty(array.size, array.dtype)  # results land here: my partials may still be leaving `array`
    steps = max((len(span) + down for span, (_, down) in zip(spans, offsets)), default=0)
    for step in range(steps):
        for k, (parent, children) in enumerate(trees):  # up: chunk i's partials folded into mine, passed on
            i = step - offsets[k][0]
            if not 0 <= i < len(spans[k]):
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
        for k, (parent, children) in enumerate(trees):  # down: the parent's result of chunk i, passed on
            i = step - offsets[k][1]
            if parent is None or not 0 <= i < len(spans[k]):
                continue
            lo, hi = spans[k][i]
            call.recv(rank[parent[0]][parent[1]], (DOWN, k, i), result[lo:hi])
            for a, j in children:
                call.send(rank[a][j], (DOWN, k, i), result[lo:hi])
    call.flush()
    for k, (parent, _) in enumerate(trees):
        if parent is not None:
            array[slice(*parts[k])] = result[slice(*parts[k])]
