"""Exact modeled time of the point-to-point algorithms on any topology, by replaying their schedules.

Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns). Modeled time does not depend on the host
(fabric.topology, Shares): every link and share is booked in one GPU's program order. So a call's
modeled time is a function of the members' programs alone, and one process can compute it by
running each member's schedule as a sequence of operations against the same link clocks, with the
same arithmetic, as the ranks do (ranks/gpu.py, fabric/switch.py):

- send(peer, key, nbytes) at the GPU's clock: its uplink books raw bytes (raw_bytes of the MTU and
  header) from the clock, + a; its leaf adds s; to another node, the sender's outbound share books it
  (+ u), the spine adds s + u and the destination's leaf s; within the node the leaf sends it down.
- recv(peer, key): wait for it; on another node's transfer the receiver books its inbound share, then
  its downlink, in its program order; the clock moves to the last byte's arrival (+ a).
- flush(): the clock moves to when the uplink is free (a collective's sends have left).
- ring's channels across nodes (its plan's lanes, Plan.lanes, and its broadcast's chains): each op
  carries its channel's lane (c, C), so it runs on channel c's clock and books lane c of the GPU's
  uplink and downlink at 1 / C of their bandwidth, the shares whole; Join moves the GPU's clock to the
  latest channel's (fabric.programs; docs/model/time.md, "Channels").
`sharp` across nodes (its plans, fabric.plans.in_switch: allreduce, reduce_scatter and the multicast stores
of allgather and broadcast, timed by fabric.plans.timing.switch_plan_ns on fabric.switch_clocks) is not point to point: its partials, results and multicast stores are
booked by the switches (fabric.switch, Spanning groups), slot by slot in the order the members'
programs fix (a member's part of a partial and its stores on its own share of the uplink to each
spine, a result on the group's shares of the destination node's, a store down on its sender's part
of those); each is replayed slot by slot on the same clocks (GPU links, each leaf's and spine's
reduction engine, those shares). nvls's reduce_scatter and allreduce across nodes (`nvls_ns`) are
the same kind, their plans too: load-reduces, answers and multicast stores; `nvls_lower_bound_ns` bounds
them from below in O(chunks), so
that `auto` (fabric.tuner.fastest_across_nodes) need not replay it where it cannot win. The schedules (`PROGRAMS`) are those of ranks/collectives ring (on one node its plan,
fabric.plans.registry.ring, timed by fabric.plans.timing; on several nodes its channels, one ring per rail,
also its plan, built for the call's size, but for broadcast's chains), direct and pxn
(their plans, fabric.plans.registry), all2all, hier (node rings: its plan, fabric.plans.hier, for the call's
size), hier_nvls (its node stages in the leaf: its plan, fabric.plans.hier.hier_nvls, timed by
fabric.plans.timing_leaf) and tree: the same messages,
chunks (chunk_bytes of whole elements) and order (a schedule changed there must change here: the test
below fails otherwise); `tests/nodes/test_replay.py` checks that replayed
and emulated times agree on every algorithm and multi-node preset. `replay_ns` runs the programs
round-robin, each until it waits for a message not yet sent: sends never wait, so every
deadlock-free schedule completes, in O(messages) link bookings (a 256-GPU ring allreduce of 1 GiB:
about half a million).
"""

from typing import cast

import numpy as np

from . import hier_plan
from .plans import build, in_switch, registry, timing
from .plans.hier import hier_nvls_pieces
from .budget import nvls_streams_wide, buffer_share_bytes, in_switch_chunk
from .errors import FabricError
from .packets import raw_bytes
from .reduction import blocks, chunks
from .programs import Fabric, run_programs
from .topology import Topology


# -- the programs: iterators of fabric.programs.Send, Recv, Flush (and Join) ---------------------------------

def _stuck(collective: str, algorithm: str, n: int, waiting) -> FabricError:
    """The error of a replay in which no member can go on: `waiting`, the members that wait (a schedule
    changed in ranks/collectives but not here, or not deadlock-free)."""
    return FabricError(f"replay: {collective} {algorithm} on {n} GPUs waits for ever: members {sorted(waiting)} "
                       f"wait for what nobody sends")


def _program(collective: str, algorithm: str, topo: Topology, r: int, count: int, chunk: int, item: int,
             root: int, counts):
    """Member r's operations for one call of `count` elements (all2allv: `counts`, the call's (plan, elements)
    from fabric.plans.registry.all2allv_plan)."""
    n = topo.gpus
    if algorithm in ("hier", "hier_nvls") and collective in PROGRAMS[algorithm]:  # hier_nvls: N = 1 or G = 1 (hier's)
        plan = build("hier", n, collective, root, registry.grid(topo.nodes, topo.gpus_per_node), nbytes=count * item,
                     itemsize=item, chunk_bytes=chunk * item)
        yield from timing.messages(plan, count * item, item, chunk)[r]
        return
    if (collective, algorithm) == ("all2all", "pxn"):
        plan = build("pxn", n, collective, layout=registry.grid(topo.nodes, topo.gpus_per_node))
        yield from timing.messages(plan, count * item, item, chunk)[r]
        return
    if (collective, algorithm) == ("allreduce", "tree"):  # its plan for this size, pieces of tree_chunk
        plan = build("tree", n, collective, layout=registry.grid(topo.nodes, topo.gpus_per_node), nbytes=count * item,
                     itemsize=item, chunk_bytes=chunk * item)
        yield from timing.messages(plan, count * item, item, chunk)[r]
        return
    if (collective, algorithm) == ("all2allv", "all2allv"):  # counts: (the call's plan, elements), replay_ns's
        call_plan, elements = counts
        yield from timing.messages(call_plan, (elements or 0) * item, item, chunk)[r]
    elif algorithm == "ring" and collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
        # across nodes, its channels on the grid (a plan of the call's size: fabric.plans.registry.ring_channels)
        layout = registry.grid(topo.nodes, topo.gpus_per_node) if topo.nodes > 1 else None
        plan = build("ring", n, collective, root, layout, nbytes=count * item, itemsize=item, chunk_bytes=chunk * item)
        yield from timing.messages(plan, count * item, item, chunk)[r]
    elif algorithm == "direct" and collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all"):
        layout = registry.grid(topo.nodes, topo.gpus_per_node) if collective == "all2all" and topo.nodes > 1 else None
        yield from timing.messages(build("direct", n, collective, root, layout), count * item, item, chunk)[r]
    else:
        raise FabricError(f"replay: no schedule for {collective} with {algorithm!r}; known: "
                          f"{', '.join(f'{c} {a}' for a, cs in PROGRAMS.items() for c in cs)}")


def nvls_chunks(topo: Topology, count: int, config, itemsize: int, partial_itemsize: int | None = None):
    """Each member's block (fabric.reduction.blocks of `count` elements over every GPU of `topo`) in the
    pipeline chunks nvls.py sends (elements, ranges): nvls_chunk_bytes shrunk as Call.in_switch_window does."""
    n = topo.gpus
    wide = (partial_itemsize or itemsize) // itemsize
    streams = nvls_streams_wide(n, topo.nodes, config.nodes, wide)
    chunk = in_switch_chunk(config, n, streams, 2, config.nvls_chunk_bytes, itemsize) // itemsize
    return [chunks(a, b, chunk) for a, b in blocks(count, n)]


def nvls_ns(collective: str, topo: Topology, count: int, config, itemsize: int = 4,
            partial_itemsize: int | None = None) -> float:
    """Modeled ns of nvls's reduce_scatter (count: the input's elements) or allreduce by every GPU of `topo`
    (one node, or several nodes and spines), all starting at 0: its plan (fabric.plans.in_switch.nvls, the
    schedule) timed on the switches' clocks (fabric.plans.timing.switch_plan_ns; fabric.switch_clocks, what the
    switches do with it). partial_itemsize: the bytes of an element of a leaf's partial (default itemsize)."""
    if collective not in ("reduce_scatter", "allreduce"):
        raise FabricError(f"replay: nvls's load-reduce is reduce_scatter's and allreduce's, not {collective}")
    wide = (partial_itemsize or itemsize) // itemsize
    S = count * itemsize
    plan = build("nvls", topo.gpus, collective,
                 shape=in_switch.shape("nvls", topo.gpus, collective, topo.nodes, config, S, itemsize, wide))
    return timing.plan_ns(plan, topo, S, config, itemsize, partial_itemsize=partial_itemsize)


def nvls_lower_bound_ns(collective: str, topo: Topology, count: int, config, itemsize: int = 4,
                        partial_itemsize: int | None = None) -> float:
    """A lower bound (ns) of nvls_ns, from each GPU's links alone, in O(chunks) (the replay is O(n x
    chunks) bookings): a LinkClock's intervals are disjoint and each starts at or after its transfer is
    ready, so a link whose transfers are all ready from T is busy until at least T + their raw bytes / B;
    and nvls_ns's end is at or after every booking's end on a GPU's links (+ a on its downlink: a
    result or store moves the clock to end + a, a LOAD's answer leaves the uplink after end + a, and
    the call ends once the uplink is free). With B, a the GPU link's, s the switch's, u the uplink's
    and p the engines' latency, h the raw bytes of a header-only packet, per GPU the largest of:
    - its uplink (requests, answers, its stores) / B, all from 0;
    - its downlink (LOADs, its results, every store) / B + a, all ready from t0 = h/B + a + s (a
      request's end at the leaf);
    - its results and the stores / B + a, ready from T_r = 2h/B + 3a + 3s + s' + 2p + 2u (s' the spine's
      latency; a request, a LOAD, an answer's first byte, the leaf's engine, the spine's, the cable down
      and the leaf);
    - the stores / B + a, ready from T_s = T_r + r/B + 2a + s (r: the least raw chunk: a result
      taken back, then stored through the leaf);
    - allreduce, the stores' chain: a GPU stores its chunk x in round x + 1, after it took in every
      member's store of chunk x - 2 (round x), so its clock then is at least a remote member's store
      of chunk x - 2 issued plus D = 2a + 2s + s' + 2u + r / (U G / (P (n - G))) (its uplink + a, its leaf,
      its share to the spine + u, the spine (+ s'), its part of the other node's shares down + u, that leaf,
      the receiver's downlink + a); with m the fewest chunks of a block, the last of them is taken in
      at least (floor((m - 1) / 2) + 1) x D after 0. It is what holds nvls back at scale (256 GPUs,
      1 MiB: 13.5 of its 18.1 us, against 5.5 from the links).
    fabric.tuner.fastest_across_nodes skips nvls where this already exceeds an earlier candidate's time."""
    N, P, n = topo.nodes, topo.spines, topo.gpus
    if N < 2 or not P:
        raise FabricError(f"replay: nvls across nodes needs a topology of several nodes and spines, got {N} nodes")
    if collective not in ("reduce_scatter", "allreduce"):
        raise FabricError(f"replay: nvls's load-reduce is reduce_scatter's and allreduce's, not {collective}")
    spans = nvls_chunks(topo, count, config, itemsize, partial_itemsize)
    t = config.timing
    B, a = topo.gpu_gbytes_per_s, topo.gpu_latency_ns
    s, u, p = t.switch_latency_ns, config.uplink_latency_ns, t.reduction_latency_ns
    sp = topo.spine_latency_ns  # a spine's traversal (s: a leaf's)
    mtu, head = config.mtu_bytes, config.header_bytes
    h = raw_bytes(0, mtu, head)
    # raw bytes of each block's chunks: np arrays, one per block (a block of no chunk sends nothing)
    raws = [np.array([raw_bytes((hi - lo) * itemsize, mtu, head) for lo, hi in span], np.int64) for span in spans]
    own = np.array([int(r.sum()) for r in raws], np.int64)              # each GPU's own block: its results
    loads = sum(len(span) for span in spans) * h                         # one LOAD per chunk of every block
    answers = int(own.sum())                                             # it answers every chunk of every block
    stores = answers if collective == "allreduce" else 0                 # every member's stores come down
    up = np.array([len(span) for span in spans], np.int64) * h + answers + (own if stores else 0)
    t0 = h / B + a + s
    t_r = 2 * h / B + 3 * a + 3 * s + sp + 2 * p + 2 * u
    least = min((int(r.min()) for r in raws if r.size), default=0)
    t_s = t_r + least / B + 2 * a + s
    if not loads:  # nothing is sent: the replay's 0
        return 0.0
    taken = own + stores  # a GPU with neither result nor store books nothing from T_r on
    bound = max(float(up.max()) / B, t0 + float((loads + taken).max()) / B + a,
                t_r + float(taken.max()) / B + a if taken.max() else 0.0)
    if not stores:
        return bound
    G, fewest = topo.gpus_per_node, min(len(span) for span in spans)
    store_down = cast(float, topo.share_gbytes_per_s) * G / (P * (n - G))  # nvls_ns's store_down: a sender's part
    chain = ((fewest - 1) // 2 + 1) * (2 * a + 2 * s + sp + 2 * u + least / store_down) if fewest else 0.0
    return max(bound, t_s + stores / B + a, chain)


def sharp_stores_plan(collective: str, topo: Topology, S: int, config, itemsize: int = 4, root: int = 0):
    """sharp's allgather (S: the output's bytes) or broadcast (from GPU `root`) plan of multicast stores
    (fabric.plans.in_switch) for every GPU of `topo` (one node, or several nodes and spines), as the replay and
    fabric.cost_nodes time and count it."""
    if collective == "broadcast" and (not isinstance(root, int) or isinstance(root, bool) or
                                      not 0 <= root < topo.gpus):
        raise FabricError(f"replay: broadcast root must be one of GPUs 0..{topo.gpus - 1}, got {root!r}")
    nodes = tuple(topo.locate(g)[0] for g in range(topo.gpus))
    shape = in_switch.shape("sharp", topo.gpus, collective, topo.nodes, config, S, itemsize, member_nodes=nodes)
    return build("sharp", topo.gpus, collective, root, shape=shape)


def hier_nvls_plan(collective: str, topo: Topology, S: int, config, itemsize: int = 4, root: int = 0):
    """hier_nvls's plan (fabric.plans.hier.hier_nvls: its node stages in the leaf, a leaf plan) for a call of S
    bytes (as replay_ns takes them) on every GPU of `topo` (N > 1 nodes of G > 1 GPUs), with the partition's
    in-switch buffer share, as the ranks build it; timed by fabric.plans.timing_leaf."""
    layout = registry.grid(topo.nodes, topo.gpus_per_node)
    shape = hier_nvls_pieces(topo.gpus, layout, int(S), itemsize, config.chunk_bytes, buffer_share_bytes(config))
    return build("hier_nvls", topo.gpus, collective, root, layout, shape=shape)


PROGRAMS = {
    "ring": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "direct": ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all"),
    "all2allv": ("all2allv",),
    "hier": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "hier_nvls": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "pxn": ("all2all",),
    "tree": ("allreduce",),
}


def replay_ns(collective: str, algorithm: str, topo: Topology, S: int, config, itemsize: int = 4, root: int = 0,
              counts=None, partial_itemsize: int | None = None) -> float:
    """Modeled ns of one call on every GPU of `topo`, all starting at 0: the latest member's clock at
    the end. S: bytes, as fabric.cost_nodes takes them (all2all: each member's send buffer;
    reduce_scatter: the input; allgather: the output); all2allv: counts[i][j] bytes GPU i sends GPU j;
    sharp allreduce and nvls reduce_scatter and allreduce (several nodes): partial_itemsize, the bytes
    of an element of a leaf's partial (the switch's accumulator: 4 for float16/bfloat16; default itemsize)."""
    if not isinstance(topo, Topology):
        raise FabricError(f"replay: takes a Topology, got {type(topo).__name__}")
    if algorithm == "sharp" and collective in ("allreduce", "reduce_scatter"):  # its plan, on the switches' clocks
        wide = (partial_itemsize or itemsize) // itemsize
        plan = build("sharp", topo.gpus, collective,
                     shape=in_switch.shape("sharp", topo.gpus, collective, topo.nodes, config, S, itemsize, wide))
        return timing.plan_ns(plan, topo, S, config, itemsize, partial_itemsize=partial_itemsize)
    if algorithm == "nvls" and collective in ("reduce_scatter", "allreduce"):
        return nvls_ns(collective, topo, int(S) // itemsize, config, itemsize, partial_itemsize)
    if collective in ("allgather", "broadcast") and algorithm in ("sharp", "nvls"):
        return timing.plan_ns(sharp_stores_plan(collective, topo, S, config, itemsize, root), topo, S, config,
                              itemsize)  # sharp's multicast stores (nvls.py runs sharp's)
    if algorithm == "hier_nvls" and collective in PROGRAMS["hier_nvls"] and topo.nodes > 1 and topo.gpus_per_node > 1:
        if not hier_plan.in_leaf(config):
            raise FabricError(f"replay: {collective} hier_nvls on {topo.nodes} nodes of {topo.gpus_per_node} GPUs "
                              f"runs its node stages in the leaf, and the leaves of {config.name!r} do not reduce "
                              f"(NVLink Network mode with sharp); hier runs node rings")
        return timing.plan_ns(hier_nvls_plan(collective, topo, S, config, itemsize, root), topo, S, config, itemsize)
    n = topo.gpus
    chunk = max(1, config.chunk_bytes // itemsize)
    count = int(S) // itemsize
    if counts is not None:  # the call's plan, once for every member: registry.all2allv_plan, the ranks' choice
        layout = registry.grid(topo.nodes, topo.gpus_per_node) if topo.nodes > 1 else None
        counts = registry.all2allv_plan([[int(x) // itemsize for x in row] for row in counts], layout)
    fabric = Fabric(topo, config.mtu_bytes, config.header_bytes)
    programs = {r: _program(collective, algorithm, topo, r, count, chunk, itemsize, root, counts) for r in range(n)}
    return run_programs(fabric, programs, lambda waiting: _stuck(collective, algorithm, n, waiting))
