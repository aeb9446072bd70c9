"""`hier` and `hier_nvls`: NCCL's hierarchical collectives on DGX clusters: NVLink inside the node (node
rings, or NVLS in the leaf), one ring per rail across nodes (every NIC at work at once).

Members form hier's grid (Grid: N nodes x G positions, the same local indices in every node, else
UnsupportedOperation before any byte moves). `hier` (and `hier_nvls` on one node or with one member a
node) runs its plan (fabric.plans.hier: fabric.hier_plan's pipelined schedule as a plan, for the call's
size), executed by ranks/collectives/plan.py and timed by fabric.plans.timing; `hier_nvls`'s node stages
in the leaf execute fabric.hier_plan's program here (_execute), which fabric.replay.hier_ns replays. The
schedules, ranges, bytes per link, combine orders and measurements are in docs/model/algorithms-hier.md.
"""

import numpy as np

from nvlink_emu.fabric import hier_plan, plans
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.reduction import blocks, combine, finish, two_level_blocks
from nvlink_emu.fabric.budget import buffer_share_bytes

from . import plan


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


def _plan(call, collective: str, count: int, root: int, form: str):
    """The plan this member runs for a call of `count` elements (the buffer hier_plan cuts): hier's, on the
    communicator's grid, unless `form` is "nvls" on N > 1 nodes of G > 1 members (None: _execute's node
    stages in the leaf). The grid is checked first (UnsupportedOperation before any byte moves)."""
    grid = Grid(call, collective, FORMS[form])
    if form == "nvls" and grid.N > 1 and grid.G > 1:
        return None
    item = call.dtype.itemsize
    return plans.build("hier", call.n, collective, root, layout=tuple(tuple(row) for row in grid.rank),
                       nbytes=count * item, itemsize=item, chunk_bytes=call.chunk * item)


def _execute(call, collective: str, work: np.ndarray, count: int, root: int | None = None,
             finished: np.ndarray | None = None, form: str = "nvls") -> Grid:
    """Run fabric.hier_plan's program with the node stages in the leaf (`hier_nvls` on N > 1 nodes of G > 1
    members; fabric.tuner.allowed admits it only where hier_plan.in_leaf) for this member on `work` (`count`
    elements); finished: where a finished piece goes (reduce_scatter's recv, at offsets from this member's
    range), else in place."""
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
    run = _plan(call, "allreduce", array.size, 0, form)
    if run is None:
        _execute(call, "allreduce", array, array.size, form=form)
    else:
        plan.execute(call, run, array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    run = _plan(call, "reduce_scatter", send.size, 0, form)
    if run is None:
        _execute(call, "reduce_scatter", work, send.size, finished=recv, form=form)
    else:
        plan.execute(call, run, work, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    run = _plan(call, "allgather", recv.size, 0, form)
    if run is None:
        call.own_block_in_place(send, recv)
        _execute(call, "allgather", recv, recv.size, form=form)
    else:
        plan.execute(call, run, send, recv)


def broadcast(call, array: np.ndarray, root: int, form: str = "rings") -> None:
    run = _plan(call, "broadcast", array.size, root, form)
    if run is None:
        _execute(call, "broadcast", array, array.size, root, form=form)
    else:
        plan.execute(call, run, array, array)
