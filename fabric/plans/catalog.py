"""The one table of collective algorithms (what each runs, where) and the plan a call of a whole fabric runs.

The ranks (ranks/collectives: a module per algorithm defining exactly IMPLEMENTS' collectives), the tuner
(fabric.tuner: `auto` among them), the replay (fabric.replay: call_plan's plan, timed) and the cost model
(fabric.cost_nodes) read it; fabric.cost's one-node closed forms are the replay's oracle, not a table of
what runs.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import hier_plan
from ..budget import buffer_share_bytes
from ..errors import FabricError
from . import in_switch
from .format import ROOTED, Plan
from .hier import hier_nvls_pieces
from .registry import Shape, all2allv_plan, build, grid

if TYPE_CHECKING:
    from ..config import FabricConfig

ALGORITHMS = ("ring", "direct", "sharp", "nvls", "hier", "hier_nvls", "tree")  # also `auto`'s tie order
# the collectives each algorithm runs (all2all apart: ALL2ALL)
IMPLEMENTS = {
    "ring": ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"),
    "direct": ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter"),
    "sharp": ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"),
    "nvls": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "hier": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "hier_nvls": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "tree": ("allreduce",),
}
IN_SWITCH = ("sharp", "nvls")  # reduce or multicast in the switches (NVLink Network mode with SHARP switches)
# what the in-switch algorithms run for members in several nodes (groups spanning leaves and spines)
ACROSS_NODES = {"sharp": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
                "nvls": ("allreduce", "reduce_scatter", "allgather", "broadcast")}
ALL2ALL = ("direct", "pxn")  # all2all's algorithms, in tie order; all2allv runs direct's exchange (its counts' plan)


def runs(collective: str, algorithm: str) -> bool:
    """Whether `algorithm` runs `collective` (all2allv: with the algorithm "all2allv", as the cost model names it)."""
    if collective == "all2all":
        return algorithm in ALL2ALL
    if collective == "all2allv":
        return algorithm == "all2allv"
    return collective in IMPLEMENTS.get(algorithm, ())


def call_plan(collective: str, algorithm: str, nodes: int, gpus_per_node: int, S: int, config: "FabricConfig",
              itemsize: int = 4, root: int = 0, counts: Sequence[Sequence[int]] | None = None,
              partial_itemsize: int | None = None) -> tuple[Plan, int]:
    """The plan one call runs when every GPU of a fabric of `nodes` x `gpus_per_node` (GPU a G + j at node a)
    takes part, as the ranks build it, and the bytes its timing takes (S, or all2allv's: its plan's elements
    x itemsize). S: bytes as fabric.cost_nodes takes them (all2all: each member's send buffer; reduce_scatter:
    the input; allgather and gather: the output; scatter: the root's input); all2allv: counts[i][j] bytes GPU
    i sends GPU j; partial_itemsize: the bytes of an element of a switch's partial (sharp, nvls; default
    itemsize). FabricError for a pair the table does not list, or hier_nvls's node stages on leaves that do
    not reduce."""
    if not runs(collective, algorithm):
        known = "; ".join(f"{a}: {', '.join(cs)}" for a, cs in IMPLEMENTS.items())
        raise FabricError(f"no schedule for {collective} with {algorithm!r}; known: {known}; all2all: "
                          f"{', '.join(ALL2ALL)}; all2allv: all2allv")
    if nodes > 1 and algorithm in IN_SWITCH and collective not in ACROSS_NODES.get(algorithm, ()):
        runs_there = "; ".join(f"{a}: {', '.join(cs)}" for a, cs in ACROSS_NODES.items())
        raise FabricError(f"no schedule for {collective} with {algorithm!r} across nodes: the switches run "
                          f"{runs_there} there")
    n, layout = nodes * gpus_per_node, grid(nodes, gpus_per_node)
    across = layout if nodes > 1 else None
    S = int(S) // itemsize * itemsize  # whole elements, and messages of whole elements: the ranks' call
    chunk_bytes = max(1, config.chunk_bytes // itemsize) * itemsize
    root = root if collective in ROOTED else 0  # one plan (and cache entry) whatever a non-rooted call says
    if collective == "all2allv":  # the call's plan, as the ranks choose it (registry.all2allv_plan)
        if counts is None:
            raise FabricError("all2allv needs counts, a gpus x gpus matrix of bytes")
        plan, elements = all2allv_plan([[int(x) // itemsize for x in row] for row in counts], across)
        return plan, (elements or 0) * itemsize
    wide = (partial_itemsize or itemsize) // itemsize
    if algorithm == "sharp" or (algorithm == "nvls" and collective in ("allgather", "broadcast")):
        # nvls's allgather and broadcast are sharp's multicast stores
        member_nodes = tuple(g // gpus_per_node for g in range(n)) if collective == "allgather" else None
        # build's shape (sharp's; hier_nvls' pieces below)
        shape: Shape = in_switch.shape("sharp", n, collective, nodes, config, S, itemsize, wide, member_nodes)
        return build("sharp", n, collective, root, shape=shape), S
    if algorithm == "nvls":
        return build("nvls", n, collective, shape=in_switch.shape("nvls", n, collective, nodes, config, S, itemsize,
                                                                   wide)), S
    if algorithm == "hier_nvls" and nodes > 1 and gpus_per_node > 1:  # its node stages in the leaf: a leaf plan
        if not hier_plan.in_leaf(config):
            raise FabricError(f"{collective} hier_nvls on {nodes} nodes of {gpus_per_node} GPUs runs its node stages "
                              f"in the leaf, and the leaves of {config.name!r} do not reduce (NVLink Network mode "
                              f"with sharp); hier runs node rings")
        shape = hier_nvls_pieces(n, layout, S, itemsize, config.chunk_bytes, buffer_share_bytes(config))
        return build("hier_nvls", n, collective, root, layout, shape=shape), S
    if algorithm in ("hier", "hier_nvls", "tree", "pxn"):  # on the grid (hier_nvls on one node or a GPU a node: hier's)
        name = "hier" if algorithm == "hier_nvls" else algorithm
        return build(name, n, collective, root, layout, nbytes=S, itemsize=itemsize, chunk_bytes=chunk_bytes), S
    # ring (its channels across nodes, on the grid) and direct (all2all across nodes in the grid's order)
    on_grid = across if algorithm == "ring" or collective == "all2all" else None
    return build(algorithm, n, collective, root, on_grid, nbytes=S, itemsize=itemsize, chunk_bytes=chunk_bytes), S
