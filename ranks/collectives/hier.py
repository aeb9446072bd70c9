"""`hier` and `hier_nvls`: NCCL's hierarchical collectives on DGX clusters: NVLink inside the node (node
rings, or NVLS in the leaf), one ring per rail across nodes (every NIC at work at once).

Members form hier's grid (Grid: N nodes x G positions, the same local indices in every node, else
UnsupportedOperation before any byte moves). Both run their plan for the call's size (fabric.plans.hier:
fabric.hier_plan's pipelined schedule as a plan), executed by ranks/collectives/plan.py and timed by
fabric.plans.timing: `hier`'s node rings, and `hier_nvls`'s node stages in the leaf on N > 1 nodes of G > 1
members (a leaf plan, timed by fabric.plans.timing_leaf; on one node or with one member a node it runs
hier's). The schedules, ranges, bytes per link, combine orders and measurements are in
docs/model/algorithms-hier.md.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.budget import buffer_share_bytes
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.fabric.plans.hier import hier_nvls_pieces

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


FORMS = {"rings": "hier", "nvls": "hier_nvls"}  # form -> the algorithm's registered name


def _plan(call, collective: str, count: int, root: int, form: str):
    """The plan this member runs for a call of `count` elements (the buffer hier_plan cuts), on the
    communicator's grid: hier's, or, `form` "nvls" on N > 1 nodes of G > 1 members, hier_nvls's (node stages
    in the leaf; fabric.tuner.allowed admits it only where hier_plan.in_leaf), built with the partition's
    in-switch buffer share. The grid is checked first (UnsupportedOperation before any byte moves)."""
    grid = Grid(call, collective, FORMS[form])
    item = call.dtype.itemsize
    layout = tuple(tuple(row) for row in grid.rank)
    if form == "nvls" and grid.N > 1 and grid.G > 1:
        shape = hier_nvls_pieces(call.n, layout, count * item, item, call.chunk * item,
                                 buffer_share_bytes(call.gpu.config))
        return plans.build("hier_nvls", call.n, collective, root, layout=layout, shape=shape)
    return plans.build("hier", call.n, collective, root, layout=layout, nbytes=count * item, itemsize=item,
                       chunk_bytes=call.chunk * item)


def allreduce(call, array: np.ndarray, form: str = "rings") -> None:
    plan.execute(call, _plan(call, "allreduce", array.size, 0, form), array, array)


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    work = send.copy()  # the send buffer stays as the caller left it
    plan.execute(call, _plan(call, "reduce_scatter", send.size, 0, form), work, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray, form: str = "rings") -> None:
    plan.execute(call, _plan(call, "allgather", recv.size, 0, form), send, recv)


def broadcast(call, array: np.ndarray, root: int, form: str = "rings") -> None:
    plan.execute(call, _plan(call, "broadcast", array.size, root, form), array, array)
