"""Which algorithm a collective call runs: the one place that decides, pure (no MPI), so that the
ranks (ranks/comm.py), `nvlink-emu model` and bench make the same pick without loading MPI.

`auto` takes the candidate the cost model says is fastest (fabric.cost on one node, fabric.cost_nodes'
replay for every GPU of several nodes), with one tie rule for every collective (`least`): times within
TIE of the least are a tie, and a tie goes to the earliest candidate in ALGORITHMS order (ALL2ALL's for
an All2All). What each algorithm implements is IMPLEMENTS (fabric.plans.catalog's table); the ranks' algorithm modules
(ranks/collectives) must define exactly those collectives (tests/unit/test_tuner.py).

On one node `auto` keeps choosing by fabric.cost's closed forms, as NCCL's tuner chooses by its own closed-form
model, although `nvlink-emu model` reports the replay of the chosen plan there (fabric.cost_nodes.modeled_ns,
equal to the emulated time; the closed forms are its oracle, exact or within their documented tolerance,
tests/unit/test_one_node_oracle.py): a choice is cheap, and no pick changed when `model`'s one-node times
became the replay's.
"""

import heapq
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from . import cost, cost_in_switch, cost_nodes, hier_plan
from .errors import UnsupportedOperation
# what runs, where: the one table (fabric.plans.catalog), re-exported where the tuner's callers read it
from .plans.catalog import ACROSS_NODES as ACROSS_NODES, ALGORITHMS as ALGORITHMS, ALL2ALL as ALL2ALL
from .plans.catalog import IMPLEMENTS as IMPLEMENTS, IN_SWITCH as IN_SWITCH
from .software import call_latency_ns

if TYPE_CHECKING:  # for annotations only
    from .config import FabricConfig
SMALL_BYTES = 64 * 1024  # fallback rule: below this, `direct` (fewer steps) before `ring` on a forwarding switch
# relative difference of two modeled times taken for a tie: the replay's sums of the same bookings in another
# order differ in the last bits (4 MiB on 2 x 2 GPUs of superpod-h100-nvlink: direct 16204.826666666631 ns,
# pxn 16204.82666666669)
TIE = 1e-9
# the pruned search skips a candidate only when its bound exceeds the best time by more than this (relative):
# a LinkClock may end a transfer up to 1e-12 x its start early (a fit within float rounding), so a bound could
# exceed the replay by such amounts over many transfers, never by this much (and it is far above TIE)
SKIP_MARGIN = 1e-6


def least(times: dict[str, float]) -> str | None:
    """The tie rule: the first key of `times` (candidates in tie order) whose time is within TIE of the
    least; None for no times."""
    if not times:
        return None
    floor = min(times.values())
    return next(name for name, ns in times.items() if ns <= floor * (1 + TIE))


def allowed(config: "FabricConfig", nodes: int = 1, collective: str | None = None) -> tuple[str, ...]:
    """Algorithms the fabric can run (for `collective`, if given) for members in `nodes` nodes: the
    in-switch ones need NVLink Network mode with SHARP switches; across nodes, what ACROSS_NODES lists,
    on spines that reduce and multicast too (config.spine_sharp: superpod-h100-nvlink) and no fault plan
    on a link between switches (fabric.faults): sharp's
    allreduce and reduce_scatter two-level (leaves reduce their node, spines the leaves, results down;
    reduce_scatter's block j to member j's leaf and member j only), allgather and broadcast (a store
    copied at its leaf, once up to a spine, once down to every other leaf); nvls's allreduce and
    reduce_scatter (a load-reduce through both levels, then allreduce's stores as sharp's), its
    allgather and broadcast sharp's. Without `collective` an algorithm listed there counts as allowed.
    hier_nvls (hier's node stages in the leaf) only where the leaves reduce (fabric.hier_plan.in_leaf)."""
    in_switch = config.mode == "network" and config.sharp

    def fits(name: str) -> bool:
        if name == "hier_nvls":
            return hier_plan.in_leaf(config)
        if name not in IN_SWITCH or nodes == 1:
            return True
        # in-switch reduction across a faulted link between switches is not modeled (docs/model/faults.md)
        return config.spine_sharp and name in ACROSS_NODES and (collective is None or collective in ACROSS_NODES[name]) \
            and not config.fault_plan.between_switches()
    return tuple(name for name in ALGORITHMS if (name not in IN_SWITCH and name != "hier_nvls")
                 or (in_switch and fits(name)))


def choose(collective: str, algorithm: str, config: "FabricConfig", nbytes: int, members: int | None = None,
           nodes: int | None = None) -> str:
    """The algorithm a call on `nbytes` bytes by `members` GPUs in `nodes` nodes (default: all of the
    fabric's) runs (All2All: all2all_algorithm).

    `auto`: among the algorithms that implement the collective and that the fabric allows for it
    (allowed(config, nodes, collective): across nodes ACROSS_NODES on spines that reduce), the
    one the cost model says is fastest (fabric.cost.modeled_ns; for every GPU of a fabric of several
    nodes fabric.cost_nodes.modeled_ns, which replays ring, direct, hier, hier_nvls, tree and sharp's and
    nvls's collectives across nodes; fastest_across_nodes skips the replay of a candidate whose lower
    bound already exceeds a time replayed: the same pick), by `least` (fabric.cost has no form for hier,
    hier_nvls or tree, so on one node auto never picks them). For a collective or a group the cost model
    does not cover (a communicator of some of several nodes' GPUs), a fixed rule: where sharp is allowed
    for it, the first of sharp, nvls, direct, ring that implements it; otherwise direct, then ring below
    64 KiB (SMALL_BYTES), ring, then direct from there on."""
    if collective == "all2all":
        return all2all_algorithm(algorithm, config, nbytes, members, nodes)
    n = config.gpus if members is None else members
    nodes = config.nodes if members is None or nodes is None else nodes
    if algorithm == "auto":
        candidates = [name for name in allowed(config, nodes, collective) if collective in IMPLEMENTS[name]]
        if nodes == 1:
            best = fastest_one_node(collective, candidates, nbytes, n, config)
        else:
            best = fastest_across_nodes(collective, candidates, nbytes, config) if n == config.gpus else None
        if best is not None:
            return best
        order: tuple[str, ...]
        if "sharp" in allowed(config, nodes, collective):
            order = ("sharp", "nvls", "direct", "ring")
        else:
            order = ("direct", "ring") if nbytes < SMALL_BYTES else ("ring", "direct")
        for name in order:
            if name in candidates:
                return name
        raise UnsupportedOperation(f"{collective}: no algorithm implements it on fabric {config.name!r}")
    if algorithm not in IMPLEMENTS:
        raise UnsupportedOperation(f"{collective}: unknown algorithm {algorithm!r}; known: auto, "
                                   f"{', '.join(ALGORITHMS)}")
    if collective not in IMPLEMENTS[algorithm]:
        raise UnsupportedOperation(f"{collective}: algorithm {algorithm!r} does not implement it")
    if algorithm not in allowed(config):
        instead = "; hier runs the node stages as rings" if algorithm == "hier_nvls" else ""
        raise UnsupportedOperation(f"{collective} with {algorithm!r}: fabric {config.name!r} has no in-switch "
                                   f"reduction or multicast (needs NVLink Network mode with a SHARP switch){instead}")
    if algorithm not in allowed(config, nodes, collective):
        runs = "; ".join(f"{name}'s {', '.join(ops)}" for name, ops in ACROSS_NODES.items())
        why = ("its fault plan has faults on links between switches, and in-switch reduction across them is "
               "not modeled (docs/model/faults.md)" if config.spine_sharp and config.fault_plan.between_switches()
               else f"across nodes the switches run {runs} only so far" if config.spine_sharp else
               "its spines do not reduce (spine_sharp false: an InfiniBand spine here)")
        raise UnsupportedOperation(f"{collective} with {algorithm!r}: its {n} members are in {nodes} nodes of fabric "
                                   f"{config.name!r}, and {why}; use ring, direct or hier (or auto)")
    return algorithm


def all2all_algorithm(algorithm: str, config: "FabricConfig", nbytes: int, members: int | None = None, nodes: int | None = None,
                      itemsize: int = 4) -> str:
    """The algorithm (a name of ALL2ALL) an all2all of `nbytes` bytes per member's send buffer by `members`
    GPUs in `nodes` nodes (default: all of the fabric's) runs. `auto`: for every GPU of a fabric of several
    nodes, the one fabric.cost_nodes.modeled_ns says is fastest, by `least` in ALL2ALL order (direct, pxn);
    otherwise direct (on one node pxn's schedule is direct's; for some of the GPUs the cost model has no
    form). UnsupportedOperation for a name that is not an all2all's."""
    if algorithm == "auto":
        n = config.gpus if members is None else members
        nodes = config.nodes if members is None or nodes is None else nodes
        covered = [name for name in ALL2ALL if "all2all" in cost_nodes.FLAT.get(name, ())]
        if nodes > 1 and n == config.gpus and nbytes > 0 and covered:
            return cast(str, least({name: cost_nodes.modeled_ns("all2all", name, config.topology, nbytes, config,
                                                                itemsize)
                                    for name in covered}))  # covered is not empty: a name
        return "direct"
    if algorithm not in ALL2ALL:
        raise UnsupportedOperation(f"all2all: unknown algorithm {algorithm!r}; known: auto, {', '.join(ALL2ALL)}")
    return algorithm


def fastest_one_node(collective: str, candidates: Iterable[str], S: int, n: int, config: "FabricConfig",
                     itemsize: int = 4) -> str | None:
    """The candidate fabric.cost.modeled_ns says is fastest for S bytes on n members of one switch, by
    `least`; None if the model covers none of them."""
    times: dict[str, float] = {}
    for algorithm in candidates:
        try:
            times[algorithm] = cost.modeled_ns(collective, algorithm, S, n, config, itemsize)
        except ValueError:
            continue
    return least(times)


def fastest_across_nodes(collective: str, candidates: Iterable[str], S: int, config: "FabricConfig",
                         itemsize: int = 4) -> str | None:
    """The candidate fabric.cost_nodes.modeled_ns says is fastest for S bytes on every GPU of config's
    topology, by `least`; None if the model covers none of them. The candidates are replayed in the order
    of their lower bound (occupancy_bound_ns, or a point-to-point algorithm's plan-free floor
    cost_nodes.point_to_point_floor_ns if larger, plus the call's software latency; least first), and one
    whose bound exceeds the least time replayed so far by more than SKIP_MARGIN is not replayed: it could not
    be faster, nor tie, so the pick is the one replaying every candidate gives (at 256 GPUs nvls's replay is
    minutes of CPU, and hier_nvls's at 1 GiB; ring's and hier's there tens of seconds, and building their
    plans for the occupancy bound seconds, which the floor spares where an in-switch time already beats it)."""
    covered = [algorithm for algorithm in candidates if collective in cost_nodes.FLAT.get(algorithm, ())
               or collective in ACROSS_NODES.get(algorithm, ())]
    if len(covered) == 1:  # nothing to compare: no replay
        return covered[0]
    cost_in_switch.check_elements(S, itemsize)
    topo = config.topology

    def latency(algorithm: str) -> float:
        return call_latency_ns(collective, algorithm, topo.gpus, topo.nodes, S, config)

    # best first on lower bounds: a candidate's key is its plan-free floor (point_to_point_floor_ns) until it
    # comes first, then the larger of that and its occupancy bound (which builds its plan), and it is
    # replayed when it comes first again; every key is at most the candidate's time, so one not replayed
    # could not win nor tie, and a candidate whose floor already exceeds the best time is never built
    queue = [(cost_nodes.point_to_point_floor_ns(collective, algorithm, topo, S, itemsize) + latency(algorithm),
              order, False, algorithm) for order, algorithm in enumerate(covered)]
    heapq.heapify(queue)  # ties in candidate order (the second field)
    times: dict[str, float]
    times, best_ns = {}, math.inf
    while queue:
        bound, order, bounded, algorithm = heapq.heappop(queue)
        if bound > best_ns * (1 + SKIP_MARGIN):
            break  # and every later one's bound is as large
        if not bounded:
            bound = max(bound, cost_nodes.occupancy_bound_ns(collective, algorithm, topo, S, config, itemsize)
                        + latency(algorithm))
            heapq.heappush(queue, (bound, order, True, algorithm))
            continue
        times[algorithm] = cost_nodes.modeled_ns(collective, algorithm, topo, S, config, itemsize)
        best_ns = min(best_ns, times[algorithm])
    return least({algorithm: times[algorithm] for algorithm in covered if algorithm in times})
