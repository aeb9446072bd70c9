"""`hier`: NCCL's hierarchical collectives on DGX clusters: NVLink inside the node, one ring per rail
across nodes (every NIC, i.e. every local index, at work at once).

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
One node (N = 1): allreduce, reduce_scatter and allgather are exactly ring.py's (same ranges, same
messages' bytes, same combine order); broadcast is the root's scatter plus the node-ring all-gather.
One member per node (G = 1): the rail ring alone.

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
"""

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import blocks, chunks, combine, finish, merged_columns, two_level_blocks

NODE_RS, RAIL_RS, RAIL_AG, NODE_AG, SCATTER, CHAIN = 20, 21, 22, 23, 24, 25  # message phases


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


def _send_segment(call, to: int, parts: tuple, work: np.ndarray, segment) -> None:
    for k, (a, b) in enumerate(segment):
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.send(to, (*parts, k, c), work[lo:hi])


def _ring_reduce_scatter(call, work: np.ndarray, ring: list[int], pos: int, segments, phase: int) -> None:
    """Ring reduce-scatter over members `ring` (this member at `pos`): afterwards segment `pos` of
    `work` holds the fold (not finished) of every ring member's, over positions pos+1, ..., pos."""
    m = len(ring)
    nxt, prv = ring[(pos + 1) % m], ring[(pos - 1) % m]
    longest = max((b - a for segment in segments for a, b in segment), default=0)
    scratch = np.empty(min(call.chunk, longest), work.dtype)
    for step in range(m - 1):
        _send_segment(call, nxt, (phase, step), work, segments[(pos - 1 - step) % m])
        for k, (a, b) in enumerate(segments[(pos - 2 - step) % m]):
            for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
                tmp = scratch[:hi - lo]
                call.recv(prv, (phase, step, k, c), tmp)
                combine(call.op, work[lo:hi], tmp)
        call.flush()


def _ring_allgather(call, work: np.ndarray, ring: list[int], pos: int, segments, phase: int) -> None:
    """Ring all-gather over members `ring`: segment `pos` is final here; afterwards every segment is."""
    m = len(ring)
    nxt, prv = ring[(pos + 1) % m], ring[(pos - 1) % m]
    for step in range(m - 1):
        _send_segment(call, nxt, (phase, step), work, segments[(pos - step) % m])
        for k, (a, b) in enumerate(segments[(pos - 1 - step) % m]):
            for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
                call.recv(prv, (phase, step, k, c), work[lo:hi])
    call.flush()


def _reduce_scatter_inplace(call, work: np.ndarray, grid: Grid, ranges) -> tuple[int, int]:
    """Node-ring then rail-ring reduce-scatter; returns this member's range, reduced (not finished)."""
    _ring_reduce_scatter(call, work, grid.node_ring(), grid.j, merged_columns(ranges), NODE_RS)
    _ring_reduce_scatter(call, work, grid.rail_ring(), grid.a, [[row[grid.j]] for row in ranges], RAIL_RS)
    return ranges[grid.a][grid.j]


def _allgather_inplace(call, work: np.ndarray, grid: Grid, ranges) -> None:
    """This member's range of `work` is final; afterwards every range is (rail ring, then node ring)."""
    _ring_allgather(call, work, grid.rail_ring(), grid.a, [[row[grid.j]] for row in ranges], RAIL_AG)
    _ring_allgather(call, work, grid.node_ring(), grid.j, merged_columns(ranges), NODE_AG)


def allreduce(call, array: np.ndarray) -> None:
    grid = Grid(call, "allreduce")
    ranges = grid.two_level(array.size)
    lo, hi = _reduce_scatter_inplace(call, array, grid, ranges)
    finish(call.op, array[lo:hi], call.n, array[lo:hi])
    _allgather_inplace(call, array, grid, ranges)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    grid = Grid(call, "reduce_scatter")
    work = send.copy()  # the send buffer stays as the caller left it
    lo, hi = _reduce_scatter_inplace(call, work, grid, grid.by_rank(send.size, call.n))
    finish(call.op, work[lo:hi], call.n, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    grid = Grid(call, "allgather")
    ranges = grid.by_rank(recv.size, call.n)
    lo, hi = ranges[grid.a][grid.j]
    recv[lo:hi] = send
    _allgather_inplace(call, recv, grid, ranges)


def broadcast(call, array: np.ndarray, root: int) -> None:
    grid = Grid(call, "broadcast")
    parts = blocks(array.size, grid.G)
    a_root, j_root = next((a, j) for a, row in enumerate(grid.rank) for j, r in enumerate(row) if r == root)
    if grid.a == a_root:  # scatter: the root's node gets part j at position j
        if call.r == root:
            for j in range(grid.G):
                if j != j_root:
                    _send_segment(call, grid.rank[a_root][j], (SCATTER,), array, [parts[j]])
        else:
            for c, (lo, hi) in enumerate(chunks(*parts[grid.j], call.chunk)):
                call.recv(root, (SCATTER, 0, c), array[lo:hi])
        call.flush()
    rail, position = grid.rail_ring(), (grid.a - a_root) % grid.N  # 0: the chain's start, node a_root
    for c, (lo, hi) in enumerate(chunks(*parts[grid.j], call.chunk)):
        # chunk c moves down rail j; each member forwards it as soon as it has it
        if position:
            call.recv(rail[(grid.a - 1) % grid.N], (CHAIN, c), array[lo:hi])
        if position < grid.N - 1:
            call.send(rail[(grid.a + 1) % grid.N], (CHAIN, c), array[lo:hi])
    call.flush()
    _ring_allgather(call, array, grid.node_ring(), grid.j, [[p] for p in parts], NODE_AG)
