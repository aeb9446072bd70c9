"""`hier` and `hier_nvls`: NCCL's hierarchical collectives on DGX clusters: NVLink inside the node (node
rings, or NVLS in the leaf), one ring per rail across nodes (every NIC, i.e. every local index, at work
at once).

Members are grouped by node (config.topology.locate): nodes in node order a = 0..N-1 (the nodes
present), within a node its G members in communicator rank order at positions j = 0..G-1. Every
node present must hold G members with the same local indices in the same order (rails line up);
otherwise UnsupportedOperation, before any byte moves. The *node ring* of node a is its members in
position order; the *rail ring* of position j is the members at position j of nodes 0, 1, ..., N-1.
The buffer is cut into N x G element ranges, range (a, j) owned by the member at (a, j):
- allreduce: part j = blocks(count, G)[j], then range (a, j) = block a of blocks(|part j|, N) inside
  it (so each position's data is one contiguous part);
- reduce_scatter, allgather: range (a, j) = blocks(count, n)[rank of (a, j)], as the API requires.
Column j = the ranges (0, j), ..., (N-1, j). Schedules (each ring as ranks/collectives/ring.py: step
s, position p sends segment p-1-s (reduce-scatter) or p-s (all-gather) to p+1):
- allreduce: node-ring reduce-scatter of the columns (member j ends with its node's partial of
  column j), rail-ring reduce-scatter of column j's ranges, finish, rail-ring all-gather, node-ring
  all-gather of the columns: 2(G-1) + 2(N-1) steps;
- reduce_scatter: the first two phases (the member at (a, j) keeps range (a, j));
- allgather: rail-ring all-gather of column j, then node-ring all-gather of the columns;
- broadcast (root at (aR, jR); parts as allreduce's, P_j = blocks(count, G)[j]): the root sends part
  j to position j of its node (scatter), part j goes down rail j from node aR in a pipelined chain
  aR, aR+1, ..., aR+N-1 (chunk by chunk, as ring.py's broadcast), then a node-ring all-gather of the
  parts in every node (the root's node included).
Pipelined (fabric.hier_plan, which this module executes and fabric.replay replays): every range
(broadcast: every part) is cut into slices of min(chunk_bytes, 256 KiB) (NCCL's COLLNET_CHAIN chunk
ceiling), each slice runs the phases above on its pieces, one ring step a tick, slice i starting at
tick i: slice i's rail (NIC) steps run while slice i+1's node (NVLink) steps do; each element keeps
its range, so the combine order and every link's payload bytes are the unpipelined schedule's; only
modeled time changes (and raw bytes by a few headers). A call whose ranges fit in one slice runs the
phases' steps one after the other, as do one node and one member a node.
One node (N = 1): allreduce, reduce_scatter and allgather are exactly ring.py's (same ranges, same
messages' bytes, same combine order); broadcast is the root's scatter plus the node-ring all-gather.
One member per node (G = 1): the rail ring alone.

`hier` runs the node rings on every fabric (the only form superpod-a100-ib, whose switches only
forward, can run). `hier_nvls` (ranks/collectives/hier_nvls.py, this module's
code with form "nvls") runs the **node stages in the leaf** instead (NCCL's NVLS_TREE on H100 clusters:
NVLS inside the node, the rails over the NICs), allowed only where the leaf switches reduce
(fabric.hier_plan.in_leaf: NVLink Network mode with config.sharp, i.e. superpod-h100-ib and
superpod-h100-nvlink, not superpod-a100-ib), as NCCL's tuner weighs NVLS_TREE against RING; `auto`
weighs the two by the cost model. With N > 1 and G > 1 (one node, or one member a node: exactly what
`hier` runs there) the node's members are a switch group at their leaf
(Communicator.node_group_id: made once per communicator, through the group machinery, so partitions,
the 128-group limit and the buffer share hold unchanged); each binds its work buffer (allreduce: its
array; reduce_scatter: a copy of its input). The node reduce-scatter of a slice is member j's
load-reduce of its column-j piece from the leaf (one LOAD_REDUCE a chunk, as nvls.py; every member
serves the leaf's LOADs in one order, column by column), its all-gather member j's multicast store of
its reduced column-j piece (broadcast: of part j's) to the node group, taking in the others' (its own
copy too); each takes one tick of the pipeline (fabric.hier_plan). The rail rings are as above.
Per-GPU link payload then (cost_nodes.hier_leaf_link_bytes, which has every link's payload and raw
bytes exactly): allreduce tx = rx = S + S/G (node RS: my answers to every column's loads, S, my
reduced column back, S/G; node AG: my store, S/G, every member's stores, S) + 2(N-1)/(NG) S across;
reduce_scatter tx S, rx S/G, allgather tx S/G, rx S, each + (N-1)/(NG) S each way across; broadcast:
S/G tx and S rx in the node AG, plus the scatter and the chain as above. Header-only packets: a
request per chunk of my column up, a LOAD per chunk of every column down.

Per-GPU link payload for S bytes (S a multiple of N x G x itemsize), tx = rx, on N nodes x G GPUs:
- allreduce: 2(G-1)/G x S inside the node + 2(N-1)/(NG) x S across = 2(NG-1)/(NG) x S (the flat
  ring's), of which only 2(N-1)/(NG) x S leaves the node, on the member's own rail;
- reduce_scatter (S = input bytes), allgather (S = output bytes): (G-1)/G x S + (N-1)/(NG) x S;
- broadcast: every GPU (G-1)/G x S in the node-ring all-gather; plus S/G across nodes, tx on every
  node but the chain's last (aR-1), rx on every node but aR; plus the scatter, root tx (G-1)/G x S,
  each other member of the root's node rx S/G.
Leaf-spine bytes (fabric.cost_nodes documents them per link): rail j crosses spine j mod spines.
Combine order: range (a, j) is folded first inside each node m over positions j+1, j+2, ..., j+G-1,
j (mod G), giving partial P_m, then over the rail, P_{a+1}, P_{a+2}, ..., P_{a+N-1}, P_a (mod N),
in the array's dtype, one rounding per step; avg divides the result by the member count, as ring.py.
With the node stages in the leaf (hier_nvls), P_m is the leaf's: positions 0, 1, ..., G-1 in the switch's
accumulator (float32 for float16 and bfloat16, the dtype itself otherwise; avg summed), rounded once
to the dtype; then the rail as above.
"""

import numpy as np

from nvlink_emu.fabric import hier_plan
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import blocks, combine, finish, two_level_blocks
from nvlink_emu.fabric.budget import buffer_share_bytes


class Grid:
    """The communicator as N nodes x G positions: rank[a][j] = communicator rank of the member at
    (node a, position j); (a, j) = this member's coordinates."""

    def __init__(self, call, collective: str, algorithm: str = "hier"):
        topology = call.gpu.config.topology
        by_node: dict[int, list[tuple[int, int]]] = {}
        for rank, gpu in enumerate(call.comm.members):
            node, local = topology.locate(gpu)
            by_node.setdefault(node, []).append((rank, local))
        nodes = sorted(by_node)
        locals_ = {node: tuple(local for _, local in by_node[node]) for node in nodes}
        if any(locals_[node] != locals_[nodes[0]] for node in nodes):
            listing = "; ".join(f"node {node}: {list(locals_[node])}" for node in nodes)
            raise UnsupportedOperation(
                f"GPU {call.gpu.rank}: {collective} with {algorithm!r} on communicator {call.comm.name!r}: every node "
                f"must hold the same number of members with the same local indices in the same rank order (one "
                f"ring per rail); its members' local indices are {listing}; use ring or direct")
        self.rank = [[rank for rank, _ in by_node[node]] for node in nodes]
        self.N, self.G = len(nodes), len(locals_[nodes[0]])
        self.a, self.j = next((a, j) for a, row in enumerate(self.rank) for j, r in enumerate(row) if r == call.r)

    def node_ring(self) -> list[int]:
        return self.rank[self.a]

    def rail_ring(self) -> list[int]:
        return [row[self.j] for row in self.rank]

    def two_level(self, count: int) -> list[list[tuple[int, int]]]:
        """ranges[a][j]: block a of part j = blocks(count, G)[j] (allreduce's split)."""
        return two_level_blocks(count, self.N, self.G)

    def by_rank(self, count: int, n: int) -> list[list[tuple[int, int]]]:
        """ranges[a][j] = blocks(count, n)[rank of (a, j)] (reduce_scatter's and allgather's split)."""
        parts = blocks(count, n)
        return [[parts[r] for r in row] for row in self.rank]


SOURCE = ("hier-bound",)  # the key each node member binds its work buffer under (node RS in the leaf)


FORMS = {"rings": "hier", "nvls": "hier_nvls"}  # form -> the algorithm's registered name


def _execute(call, collective: str, work: np.ndarray, count: int, root: int | None = None,
             finished: np.ndarray | None = None, form: str = "rings") -> Grid:
    """Run fabric.hier_plan's program for this member on `work` (`count` elements); finished: where a
    finished piece goes (reduce_scatter's recv, at offsets from this member's range), else in place;
    form: "rings" (node rings, `hier`) or "nvls" (node stages in the leaf on N > 1 nodes of G > 1
    members, `hier_nvls`; fabric.tuner.allowed admits it only where hier_plan.in_leaf)."""
    grid = Grid(call, collective, FORMS[form])
    at = None if root is None else next((a, j) for a, row in enumerate(grid.rank) for j, r in enumerate(row)
                                        if r == root)
    own = hier_plan.ranges(collective, grid.N, grid.G, count, grid.rank)[grid.a][grid.j][0]
    gpu, item = call.gpu, work.dtype.itemsize
    leaf = form == "nvls" and grid.N > 1 and grid.G > 1
    share = buffer_share_bytes(gpu.config) if leaf else None
    group = call.comm.node_group_id() if leaf else None  # collective: every member, whatever its share
    bound = leaf and collective in ("allreduce", "reduce_scatter")
    if bound:
        gpu.bind_buffer(call.key(*SOURCE), work)
    # the switch sums a node's partial (avg divides once, at the rail's finish, by every member)
    leaf_op = "sum" if call.op == "avg" else call.op
    node = grid.node_ring()
    scratch = np.empty(min(call.chunk, count), work.dtype)
    for op in hier_plan.program(collective, grid.N, grid.G, grid.a, grid.j, count, call.chunk, item, at, grid.rank,
                                share):
        kind = op[0]
        if kind == "load_reduce":
            key, lo, hi = op[1:]
            call.load_reduce(hier_plan.leaf_slot(key), SOURCE, lo * item, (hi - lo) * item, key,
                             gpu.reserve_uplink(0, gpu.now_ns), group, leaf_op)
        elif kind == "serve":
            k, key = op[1:3]
            call.serve_load(SOURCE, hier_plan.leaf_slot(key), node[k], group)
        elif kind == "mcast":
            key, lo, hi = op[1:]
            call.multicast(key, work[lo:hi], group)
        elif kind == "take":
            key, lo, hi, mine = op[1:]
            out = scratch[:hi - lo] if mine else work[lo:hi]
            what = "my own multicast copy" if mine else (
                "the leaf's load-reduce" if key[0] == hier_plan.NODE_RS else f"GPU {call.peer(node[key[2]])}'s store")
            call.recv_switch(key, out, what, group)
        elif kind == "send":
            (b, k), key, lo, hi = op[1:]
            call.send(grid.rank[b][k], key, work[lo:hi])
        elif kind == "recv":
            (b, k), key, lo, hi, reduce = op[1:]
            if reduce:
                tmp = scratch[:hi - lo]
                call.recv(grid.rank[b][k], key, tmp)
                combine(call.op, work[lo:hi], tmp)
            else:
                call.recv(grid.rank[b][k], key, work[lo:hi])
        elif kind == "finish":
            lo, hi = op[1:]
            out = work[lo:hi] if finished is None else finished[lo - own:hi - own]
            finish(call.op, work[lo:hi], call.n, out)
        else:
            call.flush()
    if bound:
        gpu.unbind_buffer(call.key(*SOURCE))
    return grid


def allreduce(call, array: np.ndarray, form: str = "rings") -> None:
    _execute(call, "allreduce", array, array.size, form=form)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    _execute(call, "reduce_scatter", work, send.size, finished=recv, form=form)


def allgather(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    call.own_block_in_place(send, recv)
    _execute(call, "allgather", recv, recv.size, form=form)


def broadcast(call, array: np.ndarray, root: int, form: str = "rings") -> None:
    _execute(call, "broadcast", array, array.size, root, form=form)
