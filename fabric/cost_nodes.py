"""Cost model of the flat and hierarchical algorithms on a multi-node Topology: exact bytes per link,
and time bounds.

Pure (numpy, no MPI). Units: bytes, ns, GB/s (= bytes per ns). Each algorithm is its dependent rounds
(`rounds`: gpus x gpus matrices of payload bytes, summed from its plan where it is one); `link_bytes` routes
them exactly; `round_ns`/`rounds_ns` the bulk-synchronous estimate, `lower_bound_ns` and `occupancy_bound_ns`
bounds, `modeled_ns` the exact replay (fabric.replay) plus NCCL's software latency. Every algorithm's rounds
and bytes per level, and the formulas with their proofs: docs/model/cost-nodes.md.
"""

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from . import hier_plan, plans, replay
from .budget import buffer_share_bytes
from .cost_in_switch import (block_bytes, hier_leaf_link_bytes, hier_leaf_traffic, nvls_link_bytes,
                             sharp_link_bytes, sharp_mcast_link_bytes, sharp_scatter_link_bytes)
from .cost import raw_of
from .errors import FabricError
from .plans.catalog import ACROSS_NODES, IMPLEMENTS
from .software import call_bytes, call_latency_ns
from .reduction import TREE_CHUNK_BYTES
from .topology import Topology

if TYPE_CHECKING:  # for annotations only
    from .config import FabricConfig

Counts = Sequence[Sequence[int]]  # all2allv: counts[i][j] bytes GPU i sends GPU j
Flows = dict[tuple[int, int], int]  # (sender, receiver) -> raw bytes of one round

# the pairs whose GPU-to-GPU rounds `rounds` builds (the rounds model's reach: the bounds and the tuner's pruned
# search use it); the replay times every pair of fabric.plans.catalog (the in-switch ones, with ACROSS_NODES' across
# nodes, have no GPU-to-GPU rounds: link_bytes and modeled_ns cover them)
FLAT = {
    "ring": ("allreduce", "reduce_scatter", "allgather"),
    "direct": ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all"),
    "all2allv": ("all2allv",),
    "hier": IMPLEMENTS["hier"],
    "hier_nvls": IMPLEMENTS["hier_nvls"],
    "pxn": ("all2all",),
    "tree": IMPLEMENTS["tree"],
}


def rounds(collective: str, algorithm: str, topo: Topology, S: int = 0, itemsize: int = 4, root: int = 0,
           counts: Counts | None = None) -> list[np.ndarray]:
    """The dependent rounds of one call on every GPU of `topo`, each a gpus x gpus int64 matrix of
    payload bytes (row: sender, column: receiver), as docs/model/cost-nodes.md derives them.
    collective/algorithm: a pair of FLAT (all2all is `direct`; all2allv is ("all2allv", "all2allv")
    with `counts`, counts[i][j] = bytes GPU i sends GPU j, the diagonal a local copy; hier's GPU
    (a, j) is GPU a x G + j). FabricError for anything else."""
    if not isinstance(topo, Topology):
        raise FabricError(f"cost_nodes: takes a Topology, got {type(topo).__name__}")
    if algorithm not in FLAT or collective not in FLAT[algorithm]:
        known = "; ".join(f"{a}: {', '.join(c)}" for a, c in FLAT.items())
        raise FabricError(f"cost_nodes: no multi-node model for {collective} with {algorithm!r} ({known})")
    n = topo.gpus
    if algorithm in ("hier", "hier_nvls"):
        return _hier_rounds(collective, topo, S, itemsize, root, algorithm == "hier_nvls")
    if algorithm == "pxn":
        block_bytes(S, n, itemsize)  # checks S and itemsize
        layout = plans.registry.grid(topo.nodes, topo.gpus_per_node)
        out = plans.plan_rounds(plans.build("pxn", n, "all2all", layout=layout), int(S), itemsize)
        return out[:1] if len(out) == 2 and not out[1].any() else out  # no forwarded byte: one round
    if collective == "all2allv":
        if counts is None:
            raise FabricError("cost_nodes: all2allv needs counts, a gpus x gpus matrix of bytes")
        matrix = topo._traffic(counts)  # checked: shape, integers, non-negative
        # the call's plan (fabric.plans.registry.all2allv), bytes as elements: one round; a GPU's own block
        # is copied locally, never on a link
        grid = plans.registry.grid(topo.nodes, topo.gpus_per_node) if topo.nodes > 1 else None
        call_plan, elements = plans.registry.all2allv_plan(matrix.tolist(), grid)  # the ranks' choice
        out = plans.plan_rounds(call_plan, elements or 0, 1)
        return out or [np.zeros((n, n), np.int64)]
    if collective == "broadcast":
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < n:
            raise FabricError(f"cost_nodes: broadcast root must be one of GPUs 0..{n - 1}, got {root!r}")
        if not isinstance(S, (int, np.integer)) or isinstance(S, bool) or S < 0:
            raise FabricError(f"cost_nodes: S must be a non-negative number of bytes, got {S!r}")
        return plans.plan_rounds(plans.build("direct", n, "broadcast", int(root)), int(S), 1)  # bytes as elements
    block_bytes(S, n, itemsize)  # checks S and itemsize
    if algorithm == "ring" and topo.nodes > 1:  # its channels' plan on the grid, steps as rounds (plan_rounds)
        return plans.plan_rounds(_ring_channels_plan(collective, topo, S), int(S), itemsize)
    if algorithm == "tree":  # its plan's up and down channels (0, 1 and 2, 3), a round each
        plan = plans.build("tree", n, "allreduce", layout=plans.registry.grid(topo.nodes, topo.gpus_per_node),
                           nbytes=int(S), itemsize=itemsize, chunk_bytes=TREE_CHUNK_BYTES)
        up, down = (plans.plan_traffic(plan, int(S), itemsize, channels) for channels in ((0, 1), (2, 3)))
        return [t for t in (up, down) if t.any()]
    # ring on one node, its plan's steps; direct (all2all: equal blocks, GPU i sends its block j to GPU j), its
    # plan's phases, flush to flush (fabric.plans.plan_rounds)
    return plans.plan_rounds(plans.build(algorithm, n, collective), int(S), itemsize)


def _hier_rounds(collective: str, topo: Topology, S: int, itemsize: int, root: int,
                 in_leaf: bool = False) -> list[np.ndarray]:
    """hier's rounds (in_leaf: hier_nvls's GPU-to-GPU ones) on every GPU of `topo`, checked here and built by
    fabric.plans.hier.rounds, beside the plan they regroup."""
    n = topo.gpus
    if collective == "broadcast":
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < n:
            raise FabricError(f"cost_nodes: broadcast root must be one of GPUs 0..{n - 1}, got {root!r}")
    block_bytes(S, 1, itemsize)  # checks S and itemsize
    return plans.hier.rounds(collective, topo.nodes, topo.gpus_per_node, int(S), itemsize, int(root), in_leaf)


def _ring_channels_plan(collective: str, topo: Topology, S: int) -> plans.Plan:
    """ring's channels' plan across the nodes of `topo` for a call of S bytes (fabric.plans.registry)."""
    layout = plans.registry.grid(topo.nodes, topo.gpus_per_node)
    return plans.build("ring", topo.gpus, collective, layout=layout, nbytes=int(S))


def traffic(collective: str, algorithm: str, topo: Topology, S: int = 0, itemsize: int = 4, root: int = 0,
            counts: Counts | None = None) -> np.ndarray:
    """The call's whole traffic matrix (the sum of its rounds), payload bytes. ring across nodes: its plan's
    sends summed (plan_traffic: the same sends as its rounds, without the walk that puts each in its round;
    2.6 million operations at 32 x 8)."""
    if isinstance(topo, Topology) and algorithm == "ring" and topo.nodes > 1 and collective in FLAT["ring"]:
        block_bytes(S, topo.gpus, itemsize)  # checks S and itemsize, as rounds does
        return plans.plan_traffic(_ring_channels_plan(collective, topo, S), int(S), itemsize)
    total = np.zeros((topo.gpus, topo.gpus), np.int64)
    for t in rounds(collective, algorithm, topo, S, itemsize, root, counts):
        total = total + t
    return total


def link_bytes(collective: str, algorithm: str, topo: Topology, S: int = 0, itemsize: int = 4, root: int = 0,
               counts: Counts | None = None, config: "FabricConfig | None" = None, partial_itemsize: int | None = None) -> dict[str, int]:
    """Exact payload bytes every link of `topo` carries in one call: {link name: bytes}, link order.
    sharp and nvls need `config` (their chunks); their reductions take partial_itemsize (sharp_link_bytes,
    nvls_link_bytes); hier runs its node rings; hier_nvls on N > 1 nodes of G > 1 GPUs its node stages in
    the leaf (hier_leaf_link_bytes: it needs `config`, whose leaves must reduce)."""
    if algorithm == "sharp":
        if config is None or collective not in ACROSS_NODES["sharp"]:
            raise FabricError(f"cost_nodes: sharp's link bytes are for {', '.join(ACROSS_NODES['sharp'])}, and need the "
                              f"config (its chunks)")
        if collective == "reduce_scatter":
            return sharp_scatter_link_bytes(topo, S, config, itemsize, partial_itemsize)
        if collective != "allreduce":
            return sharp_mcast_link_bytes(collective, topo, S, config, itemsize, root)
        return sharp_link_bytes(topo, S, config, itemsize, partial_itemsize)
    if algorithm == "nvls":
        if config is None or collective not in ACROSS_NODES["nvls"]:
            raise FabricError(f"cost_nodes: nvls's link bytes are for {', '.join(ACROSS_NODES['nvls'])}, and need the "
                              f"config (its chunks)")
        if collective in ("allgather", "broadcast"):  # sharp's multicast stores (nvls.py imports them)
            return sharp_mcast_link_bytes(collective, topo, S, config, itemsize, root)
        return nvls_link_bytes(collective, topo, S, config, itemsize, partial_itemsize)
    if algorithm == "hier_nvls" and topo.nodes > 1 and topo.gpus_per_node > 1:
        if config is None:
            raise FabricError("cost_nodes: hier_nvls's link bytes need the config (its slices and chunks)")
        return hier_leaf_link_bytes(collective, topo, S, config, itemsize, root)[0]
    return topo.link_payload_bytes(traffic(collective, algorithm, topo, S, itemsize, root, counts))


def _flows(t: np.ndarray, config: "FabricConfig", itemsize: int) -> dict[tuple[int, int], int]:
    """Raw bytes of each flow of a round, {(src, dst): R(T[src, dst])}: messages of chunk_bytes (whole
    elements), each in MTU packets with a header (fabric.cost.raw_of)."""
    msg = max(1, config.chunk_bytes // itemsize) * itemsize
    cache: dict[int, int] = {}
    flows = {}
    for i, j in zip(*np.nonzero(t)):
        x = int(t[i, j])
        if x not in cache:
            cache[x] = raw_of(x, config, msg)
        flows[(int(i), int(j))] = cache[x]
    return flows


def _hops(topo: Topology, src: int, dst: int) -> tuple[tuple[tuple[str, float, float, float], ...], float, float]:
    """The timed route src -> dst (Topology.timed_route: links, and the GPUs' shares in place of the
    cables between switches) as ((name, pre ns, post ns, GB/s), ...), its latency (ns) and its least
    bandwidth (GB/s). pre: from the flow leaving src to its first byte entering the stage (earlier
    stages and switches); post: from its last byte entering it to dst (its latency, the switch at its
    end and the stages after). Cached in the topology (its routes are fixed)."""
    cache = topo._cache.setdefault("cost_nodes.hops", {})
    hops = cache.get((src, dst))
    if hops is None:
        route = topo.timed_route(src, dst)
        before = [0.0]
        for hop, link in zip(route[:-1], topo.route(src, dst)):  # the switch each stage ends at: a leaf or a spine
            before.append(before[-1] + hop.latency_ns + topo.traversal_ns(link))
        total = before[-1] + route[-1].latency_ns
        hops = cache[(src, dst)] = (tuple((hop.name, before[k], total - before[k], hop.bandwidth_gbytes_per_s)
                                          for k, hop in enumerate(route)),
                                    total, min(hop.bandwidth_gbytes_per_s for hop in route))
    return hops


def _loads(topo: Topology, flows: Flows) -> dict[str, list[float]]:
    """Per timed stage (link or share) the flows cross: [raw bytes W, min pre, min post, GB/s]."""
    load: dict[str, list[float]] = {}
    for (i, j), w in flows.items():
        for name, before, after, bandwidth in _hops(topo, i, j)[0]:
            row = load.get(name)
            if row is None:
                load[name] = [w, before, after, bandwidth]
            else:
                row[0] += w
                row[1] = min(row[1], before)
                row[2] = min(row[2], after)
    return load


def _link_bound(topo: Topology, flows: Flows) -> float:
    """max over timed stages L of min pre + W_L / bw_L + min post (latency_L included) over the flows
    crossing L."""
    return max((pre + w / bandwidth + post for w, pre, post, bandwidth in _loads(topo, flows).values()),
               default=0.0)


def _least_flow_ns(topo: Topology, flows: Flows, latency_only: bool = False) -> float:
    """min over the flows of a round of path latency + raw bytes / the route's least bandwidth (latency
    only: the path latency): no receiver of the round has its data sooner."""
    least = math.inf
    for (i, j), w in flows.items():
        _, latency, bandwidth = _hops(topo, i, j)
        least = min(least, latency + (0.0 if latency_only else w / bandwidth))
    return 0.0 if least == math.inf else least


def _slowest_flow_ns(topo: Topology, flows: Flows) -> float:
    """max over the flows of a round of path latency + raw bytes / the route's least bandwidth."""
    most = 0.0
    for (i, j), w in flows.items():
        _, latency, bandwidth = _hops(topo, i, j)
        most = max(most, latency + w / bandwidth)
    return most


def round_ns(topo: Topology, t: np.ndarray, config: "FabricConfig", itemsize: int = 4) -> float:
    """Lower bound (ns) of one round of payload traffic `t` (gpus x gpus) on `topo`, raw bytes by
    config's mtu_bytes, header_bytes and chunk_bytes (round_ns in docs/model/cost-nodes.md)."""
    flows = _flows(topo._traffic(t), config, itemsize)
    return max(_link_bound(topo, flows), _slowest_flow_ns(topo, flows))


def rounds_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4, root: int = 0,
              counts: Counts | None = None) -> float:
    """Bulk-synchronous estimate (ns) of one call: the sum of its rounds' round_ns. Equals
    fabric.cost.modeled_ns on one node; docs/model/cost-nodes.md says what it assumes elsewhere."""
    return sum(round_ns(topo, t, config, itemsize) for t in rounds(collective, algorithm, topo, S, itemsize, root,
                                                                   counts))


def modeled_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4, root: int = 0,
               counts: Counts | None = None, partial_itemsize: int | None = None) -> float:
    """Modeled ns of one call on every GPU of `topo`, all starting at 0: its links' time (links_ns) plus
    the config's software latency (fabric.software). On one node too (`nvlink-emu model` reports it there);
    fabric.cost.modeled_ns is its oracle there (tests/unit/test_one_node_oracle.py)."""
    return (links_ns(collective, algorithm, topo, S, config, itemsize, root, counts, partial_itemsize)
            + call_latency_ns(collective, algorithm, topo.gpus, topo.nodes, _call_bytes(collective, topo, S, counts),
                              config))


def _call_bytes(collective: str, topo: Topology, S: int, counts: Counts | None) -> int:
    """The bytes the communicator charges software latency on (fabric.software.call_bytes): gather's and scatter's
    a member's block (S / n; S here is the whole output, or the root's input)."""
    nbytes = call_bytes(S, counts)
    return nbytes // topo.gpus if collective in ("gather", "scatter") else nbytes


def links_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4, root: int = 0,
             counts: Counts | None = None, partial_itemsize: int | None = None) -> float:
    """The links' time (ns) of one call on every GPU of `topo`, all starting at 0: exact, the algorithm's
    schedule replayed on the same link clocks as the ranks book (fabric.replay; tests check it against
    emulated runs on every multi-node preset, tests/mpi/test_one_node_replay.py on one node, where
    fabric.cost.links_ns is its oracle: equal where that form is exact, within its documented 1% elsewhere,
    tests/unit/test_one_node_oracle.py). Memoised: `auto`
    asks for it at every call."""
    return _memo(_MODELED, _key(collective, algorithm, topo, S, config, itemsize, root, counts, partial_itemsize),
                 lambda: replay.replay_ns(collective, algorithm, topo, S, config, itemsize, root, counts,
                                          partial_itemsize))


# Point-to-point algorithms (every byte a GPU-to-GPU message: no switch reduces or copies): the least payload all
# GPUs together send in one call, in units of (n - 1) S. Per element: a reduction of the n GPUs' inputs at one GPU
# takes n - 1 messages (each joins two partials: a spanning tree), a copy from one GPU to n - 1 others n - 1
# messages, and an allreduce's sum at every GPU 2(n - 1) (every GPU must hear from every other, through messages
# in time order: one-way gossip, whose least number of calls is 2n - 2; Patarasuk and Yuan, "Bandwidth optimal
# all-reduce algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009, bound allreduce
# by the same 2(n - 1)/n S a process). A message about an element carries its bytes however many inputs it sums.
POINT_TO_POINT = ("ring", "direct", "hier", "tree", "pxn")
_LEAST_SENT = {"allreduce": 2, "reduce_scatter": 1, "allgather": 1, "broadcast": 1, "reduce": 1}


def point_to_point_floor_ns(collective: str, algorithm: str, topo: Topology, S: int, itemsize: int = 4) -> float:
    """A lower bound (ns) of links_ns for a point-to-point algorithm (POINT_TO_POINT) without its plan: all GPUs
    send at least _LEAST_SENT[collective] x (n - 1) x S payload bytes (S in whole elements, as the call's), so
    the busiest uplink at least 1/n of it, busy at its bandwidth B for that / B at least (channel lanes share
    B), and every program ends after its uplink's last byte (occupancy_bound_ns' argument; as that bound, exact
    to float rounding: a config with no headers nor latency can see the replay 1e-15 below it, which
    fastest_across_nodes' SKIP_MARGIN absorbs). 0.0 where it says
    nothing (another algorithm or collective, one GPU). fastest_across_nodes skips a candidate by it before
    building its plan."""
    k, n = _LEAST_SENT.get(collective), topo.gpus
    if algorithm not in POINT_TO_POINT or k is None or n < 2:
        return 0.0
    return k * (n - 1) * (int(S) // itemsize * itemsize) / n / topo.gpu_gbytes_per_s


def occupancy_bound_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                       root: int = 0, counts: Counts | None = None, partial_itemsize: int | None = None) -> float:
    """A lower bound (ns) of links_ns from the raw bytes each GPU's links carry, cheap next to the
    replay (O(rounds x gpus^2) numpy for the point-to-point algorithms, O(slices x gpus + gpus^2) for
    hier_nvls, O(chunks) for nvls; 0.0 where
    it has none: sharp, and what `rounds` does not cover). A LinkClock's intervals are disjoint and
    start at or after 0, so a link that carries W raw bytes at bandwidth bw is busy until at least
    W / bw; the replay's end is at or after every one of them: each program ends with a flush (its
    uplink free), a receive moves the receiver's clock to its downlink's end + a, after its inbound
    share's end, and a sent message's outbound share ends before it reaches the receiver. Raw bytes
    per flow of a round of p payload bytes: at least p + header x ceil(p / MTU) (no split of the flow
    into messages takes fewer packets). So per GPU the largest of its uplink / B, its downlink / B + a,
    and across nodes its outbound share / (U / G) and inbound share / (U / G) + a (a channel lane of a
    link, at B / C, is busy until at least its own bytes / (B / C): the largest lane's is at least the
    link's bytes / B). ring and direct also run step by step (a GPU sends round k + 1 once it has
    received all of round k; ring's channels across nodes, each its part of round k): the chain, the sum
    over rounds of the round's fastest flow (2a + s, across nodes + 2u + 2s, + its raw bytes / its
    slowest stage), bounds them too (the latest receiver of round k + 1 ends after the earliest of round
    k's, plus that). hier takes all its rounds (node rings and rails: all GPU to GPU). hier_nvls on N > 1
    nodes of G > 1 GPUs, whose node stages are not GPU to GPU: per GPU its uplink's raw bytes / B and its
    downlink's / B + a, exactly as hier_leaf_link_bytes counts them (hier_leaf_traffic), and its
    messages' (the rails', the scatter's, the chain's) outbound share / (U / G) and inbound share /
    (U / G) + a. It bounds hier_nvls's replay (its leaf plan, fabric.plans.timing_leaf), which books every one of those bytes on those clocks
    from 0 on: a GPU's program ends with a flush (its uplink free: requests, answers, stores and rail
    messages all left); a take (a result or a store) and a rail receive move its clock to its downlink's
    end + a; a LOAD booked on its downlink is answered from its end + a on the uplink, so it ends before
    the uplink does; the shares as above. nvls across nodes: fabric.replay.nvls_lower_bound_ns. Memoised
    as modeled_ns. `fastest` skips a candidate by it."""
    return _memo(_BOUNDS, _key(collective, algorithm, topo, S, config, itemsize, root, counts, partial_itemsize),
                 lambda: _occupancy_bound_ns(collective, algorithm, topo, S, config, itemsize, root, counts,
                                             partial_itemsize))


def _occupancy_bound_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int,
                        root: int, counts: Counts | None, partial_itemsize: int | None) -> float:
    if algorithm == "nvls" and collective in ("allreduce", "reduce_scatter") and topo.nodes > 1 and topo.spines:
        return replay.nvls_lower_bound_ns(collective, topo, int(S) // itemsize, config, itemsize, partial_itemsize)
    if algorithm not in FLAT or collective not in FLAT[algorithm]:
        return 0.0
    n, G = topo.gpus, topo.gpus_per_node
    B, a = topo.gpu_gbytes_per_s, topo.gpu_latency_ns
    node = np.arange(n) // G  # GPU order is node-major
    across = (node[:, None] != node[None, :]) if topo.spines and topo.nodes > 1 else np.zeros((n, n), bool)
    if algorithm == "hier_nvls" and topo.nodes > 1 and G > 1:
        return _hier_leaf_bound_ns(collective, topo, S, config, itemsize, root, across)
    # a flow's least time: GPU link latencies and its leaf (2a + s), across nodes its shares, the other leaf and
    # the spine (2u + s + the spine's own latency)
    # (the cross-node figures are set where a flow crosses nodes; on one node `across` is all False)
    spine_ns, uplink_ns = cast(float, topo.spine_latency_ns), cast(float, topo.uplink_latency_ns)
    share = cast(float, topo.share_gbytes_per_s)
    lat = np.where(across, 2 * a + 2 * topo.switch_latency_ns + spine_ns + 2 * uplink_ns, 2 * a + topo.switch_latency_ns)
    slowest = np.where(across, min(B, share), B)
    total, chain = np.zeros((n, n), np.int64), 0.0
    for t in rounds(collective, algorithm, topo, S, itemsize, root, counts):  # GPU-to-GPU rounds
        flows = t + (-(-t // config.mtu_bytes)) * config.header_bytes  # 0 for no flow
        total += flows
        if algorithm in ("ring", "direct") and flows.any():  # step by step: a round's sends after the last's receives
            chain += float((lat + flows / slowest)[flows > 0].min())
    bound = max(chain, float(total.sum(axis=1).max(initial=0)) / B,
                float(total.sum(axis=0).max(initial=0)) / B + a if total.any() else 0.0)
    cross = np.where(across, total, 0)
    if cross.any():
        bound = max(bound, float(cross.sum(axis=1).max()) / share, float(cross.sum(axis=0).max()) / share + a)
    return bound


def _hier_leaf_bound_ns(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int, root: int,
                        across: npt.NDArray[np.bool_]) -> float:
    """occupancy_bound_ns of hier_nvls on N > 1 nodes of G > 1 GPUs: its GPU links' raw bytes exactly
    (hier_leaf_traffic: the rails', the scatter's and the chain's messages and the node stages' requests,
    LOADs, answers, results and stores) and its messages' shares across nodes."""
    B, a, share = topo.gpu_gbytes_per_s, topo.gpu_latency_ns, cast(float, topo.share_gbytes_per_s)  # N > 1: set
    sent, sent_raw, _, up_raw, _, down_raw = hier_leaf_traffic(collective, topo, S, config, itemsize, root)
    tx = [int(x) + u for x, u in zip(sent_raw.sum(axis=1), up_raw)]
    rx = [int(x) + d for x, d in zip(sent_raw.sum(axis=0), down_raw)]
    bound = max(max(tx) / B, max(rx) / B + a if max(rx) else 0.0)
    cross = np.where(across, sent_raw, 0)
    if cross.any():
        bound = max(bound, int(cross.sum(axis=1).max()) / share, int(cross.sum(axis=0).max()) / share + a)
    return float(bound)  # a Python float already (ints over floats); said for the type checker


def _key(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int, root: int,
         counts: Counts | None, partial_itemsize: int | None) -> tuple[object, ...]:
    """What a replay's result depends on: the call and the config's fields the replay reads."""
    return (collective, algorithm, topo, int(S), config.mtu_bytes, config.header_bytes, config.chunk_bytes, itemsize,
            root, None if counts is None else tuple(tuple(int(x) for x in row) for row in counts), partial_itemsize,
            config.timing, config.uplink_latency_ns, config.switch_buffer_bytes, len(config.partitions), config.nodes,
            config.nvls_chunk_bytes, config.mode, config.sharp)


def _memo(memo: dict[tuple[object, ...], float], key: tuple[object, ...], compute: Callable[[], float]) -> float:
    value = memo.get(key)
    if value is None:
        if len(memo) >= 4096:
            memo.clear()
        value = memo[key] = compute()
    return value


_MODELED: dict[tuple[object, ...], float] = {}
_BOUNDS: dict[tuple[object, ...], float] = {}


def lower_bound_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                   root: int = 0, counts: Counts | None = None) -> float:
    """A lower bound (ns) of one call however its rounds overlap: the larger of the link bound of all
    its rounds' flows together (each round's flows separate messages) and the dependency chain, the
    sum over rounds of each round's fastest flow (a GPU sends round k + 1's data only once it has
    received round k's, in every schedule here)."""
    steps = [_flows(t, config, itemsize) for t in rounds(collective, algorithm, topo, S, itemsize, root, counts)]
    merged = _merged(steps)
    chain = sum(_least_flow_ns(topo, f, _hier_pipelined(collective, algorithm, topo, S, config, itemsize))
                for f in steps)
    return max(_link_bound(topo, merged), _slowest_flow_ns(topo, merged), chain)


def _hier_pipelined(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int) -> bool:
    """Whether the call is hier or hier_nvls in several slices (fabric.hier_plan): its rounds then overlap,
    and only their latencies chain (each slice still passes the rounds in order)."""
    if algorithm not in ("hier", "hier_nvls"):
        return False
    count, N, G = int(S) // itemsize, topo.nodes, topo.gpus_per_node
    share = buffer_share_bytes(config) if algorithm == "hier_nvls" else None
    P = hier_plan.slice_elements(max(1, config.chunk_bytes // itemsize), itemsize, N, G, share)
    return hier_plan.slices(hier_plan.ranges(collective, N, G, count), N, G, P) > 1


def _merged(steps: list[Flows]) -> Flows:
    """The flows of several rounds together: raw bytes summed per (src, dst)."""
    total: dict[tuple[int, int], int] = {}
    for flows in steps:
        for key, w in flows.items():
            total[key] = total.get(key, 0) + w
    return total


def bottleneck(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4, root: int = 0,
               counts: Counts | None = None) -> tuple[str, float]:
    """(name, ns) of the timed stage (a link, or a GPU's share "gpu3:out" / "gpu3:in") with the most raw
    bytes over bandwidth in the whole call: where the time goes (W_L / bw_L, ns, without latencies);
    ("", 0.0) for a call that sends nothing. hier_nvls: its GPU-to-GPU rounds only (rounds: the rails'),
    not its node stages in the leaf."""
    flows = _merged([_flows(t, config, itemsize) for t in rounds(collective, algorithm, topo, S, itemsize, root,
                                                                  counts)])
    times = {name: w / bandwidth for name, (w, _, _, bandwidth) in _loads(topo, flows).items()}
    name = max(times, key=lambda link: times[link], default="")
    return name, times.get(name, 0.0)
