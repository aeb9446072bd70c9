"""Exact modeled time of one collective call on any topology: the call's plan (fabric.plans.catalog.call_plan,
the plan the ranks run) timed on the link and switch clocks the ranks book (fabric.plans.timing).

Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns). Modeled time does not depend on the host
(fabric.topology, Shares): every link and share is booked in one GPU's program order, so one process
computes it by running each GPU's program against the same clocks, with the same arithmetic, as the ranks do
(point to point: fabric.programs; in the switches: fabric.switch_clocks; in the leaves, mixed with messages:
fabric.plans.timing_leaf); tests/nodes/test_replay.py and tests/mpi/test_one_node_replay.py check it equals
the emulated time. How each kind of operation is booked: docs/design/plans.md and docs/model/time.md.
`nvls_lower_bound_ns` bounds nvls's replay from below in O(chunks), so that `auto`
(fabric.tuner.fastest_across_nodes) need not replay it where it cannot win.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from .plans import timing
from .plans.catalog import call_plan
from .budget import nvls_streams_wide, in_switch_chunk
from .errors import FabricError
from .packets import raw_bytes
from .reduction import blocks, chunks
from .topology import Topology

if TYPE_CHECKING:  # for annotations only
    from .config import FabricConfig


def nvls_chunks(topo: Topology, count: int, config: "FabricConfig", itemsize: int,
                partial_itemsize: int | None = None) -> list[list[tuple[int, int]]]:
    """Each member's block (fabric.reduction.blocks of `count` elements over every GPU of `topo`) in the
    pipeline chunks nvls.py sends (elements, ranges): nvls_chunk_bytes shrunk as Call.in_switch_window does."""
    n = topo.gpus
    wide = (partial_itemsize or itemsize) // itemsize
    streams = nvls_streams_wide(n, topo.nodes, config.nodes, wide)
    chunk = in_switch_chunk(config, n, streams, 2, config.nvls_chunk_bytes, itemsize) // itemsize
    return [chunks(a, b, chunk) for a, b in blocks(count, n)]


def nvls_lower_bound_ns(collective: str, topo: Topology, count: int, config: "FabricConfig", itemsize: int = 4,
                        partial_itemsize: int | None = None) -> float:
    """A lower bound (ns) of nvls's replay_ns, from each GPU's links alone, in O(chunks) (the replay is O(n x
    chunks) bookings): a LinkClock's intervals are disjoint and each starts at or after its transfer is
    ready, so a link whose transfers are all ready from T is busy until at least T + their raw bytes / B;
    and the replay's end is at or after every booking's end on a GPU's links (+ a on its downlink: a
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
    s, u, p = t.switch_latency_ns, cast(float, config.uplink_latency_ns), t.reduction_latency_ns  # spines: set
    sp = cast(float, topo.spine_latency_ns)  # a spine's traversal (s: a leaf's)
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
        return float(bound)  # Python floats (numpy's int64 sums, converted above); said for the type checker
    G, fewest = topo.gpus_per_node, min(len(span) for span in spans)
    store_down = cast(float, topo.share_gbytes_per_s) * G / (P * (n - G))  # the replay's store_down: a sender's part
    chain = ((fewest - 1) // 2 + 1) * (2 * a + 2 * s + sp + 2 * u + least / store_down) if fewest else 0.0
    return float(max(bound, t_s + stores / B + a, chain))


def replay_ns(collective: str, algorithm: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
              root: int = 0, counts: Sequence[Sequence[int]] | None = None, partial_itemsize: int | None = None) -> float:
    """Modeled ns of one call on every GPU of `topo`, all starting at 0: the latest GPU's clock at the end of
    its plan (fabric.plans.catalog.call_plan: S, root, counts and partial_itemsize as it takes them)."""
    if not isinstance(topo, Topology):
        raise FabricError(f"replay: takes a Topology, got {type(topo).__name__}")
    plan, nbytes = call_plan(collective, algorithm, topo.nodes, topo.gpus_per_node, S, config, itemsize, root, counts,
                             partial_itemsize)
    return timing.plan_ns(plan, topo, nbytes, config, itemsize, partial_itemsize=partial_itemsize)
