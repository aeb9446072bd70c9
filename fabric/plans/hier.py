"""`hier` as a plan: fabric.hier_plan's pipelined schedule (node rings, rail rings; slices, stages and ticks:
docs/model/algorithms-hier.md) translated operation by operation, in its order, into the plan format.

Each member's operations are hier_plan.program's for it (node rings: share None): a send becomes `send`, a
receive `recv` or `recv_reduce` (dst (op) message: hier's fold order), a flush `flush`; "finish" becomes
nothing (the executor finishes an allreduce's or reduce_scatter's average on the whole output at the end:
the same sum divided by n, bit for bit). Its messages' element ranges are runs of chunks of one cut of the
buffer shared by every GPU (every range's bounds: GpuProgram.elements), so each operation is one message
of at most chunk_bytes, as in hier_plan. reduce_scatter's and allgather's buffers are cut block by block
(blocks(count, n)), each block padded with chunks of no element to the most chunks of any block, so that
the input is n x the output (the validator's shape); a chunk of no element needs no contribution. A
phase's messages go on a channel of their own (channels are operation streams on the GPU's one clock
here, Plan.lanes 0), so that a pair's messages of two phases never match each other. The program is read as
hier_plan.program_runs gives it, a ring step's messages to or from one peer as one Run, translated at once
(its chunk runs cut once per segment for every member): the same operations, without a tuple a message
(hier's allreduce at 32 x 8 GPUs and 1 GiB is 4.2 million operations).
"""

from collections.abc import Hashable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from .. import hier_plan
from ..errors import PlanError
from ..reduction import Grid, blocks, chunks, merged_columns
from .format import FABRICS, GpuProgram, Op, Plan, Ref

# hier_plan's message phases -> the plan's channel (a phase's messages between a pair match in order)
CHANNELS = {hier_plan.NODE_RS: 0, hier_plan.RAIL_RS: 1, hier_plan.RAIL_AG: 2, hier_plan.NODE_AG: 3,
            hier_plan.SCATTER: 4, hier_plan.CHAIN: 5}
COLLECTIVES = tuple(hier_plan.STAGES)  # allreduce, reduce_scatter, allgather, broadcast


def hier_pieces(gpus: int, layout: Grid | None, nbytes: int | None, itemsize: int,
                chunk_bytes: int | None) -> tuple[int, int, int, int] | None:
    """What hier's plan for a call of `nbytes` in elements of `itemsize` bytes is built from: (elements,
    elements a message: chunk_bytes // itemsize, itemsize, elements a slice's piece: hier_plan.slice_elements,
    which hier_plan.program takes from the first three; here so that the registry's cache key holds it);
    None without them."""
    if nbytes is None or chunk_bytes is None:
        return None
    chunk = max(1, int(chunk_bytes) // itemsize)
    return int(nbytes) // itemsize, chunk, int(itemsize), hier_plan.slice_elements(chunk, int(itemsize))


def hier(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
         pieces: tuple[int, int, int, int] | None = None) -> Plan:
    """hier's `collective` (COLLECTIVES) on the grid `layout` (layout[a][j]: the GPU at node a, position j;
    default one node), for `pieces` = (elements, elements a message, itemsize, elements a slice's piece)
    (hier_pieces): hier_plan's operations of every member (module docstring); broadcast from `root`."""
    return _translate("hier", gpus, collective, root, layout, pieces, None)


def hier_nvls_pieces(gpus: int, layout: Grid | None, nbytes: int, itemsize: int, chunk_bytes: int,
                     share: int) -> tuple[int, int, int, int, int]:
    """What hier_nvls's plan (node stages in the leaf) for a call of `nbytes` is built from: hier_pieces' with
    the slice's piece bounded by the partition's in-switch buffer `share` (bytes,
    fabric.budget.buffer_share_bytes; hier_plan.slice_elements), and the share (hier_plan.program's)."""
    layout = layout or (tuple(range(gpus)),)
    chunk = max(1, int(chunk_bytes) // itemsize)
    P = hier_plan.slice_elements(chunk, int(itemsize), len(layout), len(layout[0]), int(share))
    return int(nbytes) // itemsize, chunk, int(itemsize), P, int(share)


def hier_nvls(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
              pieces: tuple[int, int, int, int, int] | None = None) -> Plan:
    """hier_nvls's `collective` on N > 1 nodes of G > 1 GPUs (the grid `layout`), its node stages in the leaf
    (a leaf plan, Plan.leaf), for `pieces` = hier_nvls_pieces' (..., share): hier_plan's program with the
    share, translated as hier's (module docstring) and its leaf operations as the format's in-switch
    kinds, slot (node a, *hier_plan.leaf_slot(key)) (the leaf's slot names the requester's position first):
    "load_reduce" a load_reduce of its chunks of the input ("i"); "serve" (position k's request) a
    switch_contribute of the same chunks to k's GPU; "mcast" a multicast_store; "take" a switch_recv into
    its chunks, or, of its own store (the data is already there), into scratch chunks of the same sizes
    (one run a distinct run of sizes, reused)."""
    if pieces is None:
        raise PlanError("hier_nvls plan: it is built for a call's size and the leaf's buffer share")
    layout = layout or (tuple(range(gpus)),)
    if len(layout) < 2 or len(layout[0]) < 2:
        raise PlanError(f"hier_nvls plan: its node stages run in the leaf on N > 1 nodes of G > 1 GPUs, not "
                        f"{len(layout)} x {len(layout[0])} (hier's plan runs there)")
    return _translate("hier_nvls", gpus, collective, root, layout, pieces[:4], pieces[4])


def _translate(name: str, gpus: int, collective: str, root: int, layout: Grid | None,
               pieces: tuple[int, int, int, int] | None, share: int | None) -> Plan:
    """hier's or hier_nvls's plan (share: None, node rings; else the leaf's buffer share, node stages in
    the leaf): hier_plan.program of every member, operation by operation."""
    if collective not in COLLECTIVES:
        raise PlanError(f"{name} plan: no {collective}; {name} builds {', '.join(COLLECTIVES)}")
    if pieces is None:
        raise PlanError(f"{name} plan: it is built for a call's size (nbytes, itemsize and chunk_bytes)")
    n = gpus
    layout = layout or (tuple(range(n)),)
    N, G = len(layout), len(layout[0])
    at = {m: (a, j) for a, row in enumerate(layout) for j, m in enumerate(row)}
    if sorted(at) != list(range(n)) or any(len(row) != G for row in layout):
        raise PlanError(f"{name} plan: layout {layout} is not a grid of the {n} GPUs")
    count, chunk, itemsize, P = pieces
    rank = [list(row) for row in layout]
    by_block = collective in ("reduce_scatter", "allgather")
    sizes, first, after = _cut(_bounds(collective, N, G, count, chunk, P, rank),
                               blocks(count, n) if by_block else [(0, count)])
    k = len(sizes) // n if by_block else len(sizes)
    whole = tuple(sizes)
    buf = "i" if collective == "reduce_scatter" else "o"
    refs: dict[tuple[int, int], Ref] = {}
    inputs: dict[tuple[int, int], Ref] = {}  # a load-reduce's and its answers' chunks: of the input, "i"
    flush = Op("flush")
    memo: hier_plan.Memo = {}  # hier_plan's: what every member's program builds alike, once
    runs: dict[Hashable, list[Ref]] = {}  # a ring segment's cuts (hier_plan.Run.cut) -> their chunk runs
    out = []
    for g in range(n):
        a = at[g][0]
        ops = [Op("copy", src=Ref("i", 0, k), dst=Ref("o", g * k, k))] if collective == "allgather" else []
        add = ops.append
        scratch: dict[tuple[int, ...], Ref] = {}  # a run of chunk sizes -> its scratch run (own stores' copies)
        for op in hier_plan.program_runs(collective, N, G, *at[g], count, chunk, itemsize, at[root], rank, share,
                                         memo):
            kind = op[0]
            if kind == "sends" or kind == "recvs":  # a ring step's messages to or from one peer: Run.ops' each
                step = cast(hier_plan.Run, op)
                cut = runs.get(step.cut)
                if cut is None:
                    cut = runs[step.cut] = [_run(refs, buf, lo, hi, first, after) for _, _, lo, hi in step.cuts]
                channel, (b, c) = CHANNELS[step.key[0]], step.peer
                peer = layout[b][c]
                if kind == "sends":
                    ops += [Op("send", channel, ref, None, peer) for ref in cut]
                else:
                    recv = "recv_reduce" if step.reduce else "recv"
                    ops += [Op(recv, channel, None, ref, None, peer) for ref in cut]
            elif kind == "send" or kind == "recv":
                lo, hi = op[3], op[4]
                ref = refs.get((lo, hi))
                if ref is None:
                    ref = refs[(lo, hi)] = Ref(buf, first[lo], after[hi] - first[lo])
                b, c = op[1]
                if kind == "send":
                    add(Op("send", CHANNELS[op[2][0]], ref, None, layout[b][c]))
                else:
                    add(Op("recv_reduce" if op[5] else "recv", CHANNELS[op[2][0]], None, ref, None, layout[b][c]))
            elif kind == "flush":
                add(flush)
            elif kind == "finish":  # the executor finishes the whole output at the end
                continue
            elif share is None:
                raise PlanError(f"hier plan: hier_plan's operation {kind!r} is not one of the node rings'")
            elif kind == "serve":  # position k's request: answer the leaf's read of my same chunks
                _, k_, key, lo, hi = op
                add(Op("switch_contribute", 0, _run(inputs, "i", lo, hi, first, after), send_to=layout[a][k_],
                       slot=(a, *hier_plan.leaf_slot(key))))
            elif kind == "take":
                _, key, lo, hi, mine = op
                ref = _run(refs, buf, lo, hi, first, after)
                if mine:  # my own store's copy: the data is here already
                    run = whole[ref.off:ref.off + ref.cnt]
                    ref = scratch.get(run) or scratch.setdefault(run, Ref("s", sum(map(len, scratch)), ref.cnt))
                add(Op("switch_recv", 0, None, ref, slot=(a, *hier_plan.leaf_slot(key))))
            elif kind == "load_reduce":
                _, key, lo, hi = op
                add(Op("load_reduce", 0, _run(inputs, "i", lo, hi, first, after), slot=(a, *hier_plan.leaf_slot(key))))
            elif kind == "mcast":
                _, key, lo, hi = op
                add(Op("multicast_store", 0, _run(refs, buf, lo, hi, first, after),
                       slot=(a, *hier_plan.leaf_slot(key))))
            else:
                raise PlanError(f"{name} plan: hier_plan's operation {kind!r} is not one the plan knows")
        if collective == "reduce_scatter":  # my block of the reduced input is my output
            add(Op("copy", src=Ref("i", g * k, k), dst=Ref("o", 0, k)))
        mine = whole[g * k:(g + 1) * k] if by_block else whole
        spare = tuple(x for run in scratch for x in run)
        elements = {"reduce_scatter": (whole, mine, spare), "allgather": (mine, whole, spare)}.get(
            collective, (whole, whole, spare))
        out.append(GpuProgram(g, tuple(ops), len(elements[0]), len(elements[1]), len(spare), elements))
    return Plan(name, collective, n, tuple(out), inplace=collective in ("allreduce", "broadcast"), root=root,
                fabrics=("network",) if share is not None else FABRICS,
                leaf=tuple(tuple(row) for row in layout) if share is not None else ())


def _run(refs: dict[tuple[int, int], Ref], buf: str, lo: int, hi: int, first: dict[int, int],
         after: dict[int, int]) -> Ref:
    """The run of chunks of buffer `buf` that [lo, hi) is (kept in `refs`, one Ref a range)."""
    ref = refs.get((lo, hi))
    if ref is None:
        ref = refs[(lo, hi)] = Ref(buf, first[lo], after[hi] - first[lo])
    return ref


def _bounds(collective: str, N: int, G: int, count: int, chunk: int, P: int, rank: Grid) -> list[int]:
    """Every bound of a message hier_plan.program's members send (sorted; more do no harm: a finer cut):
    the chunks (of `chunk` elements) of each slice's pieces of every range (the rail rings', the scatter's,
    the chain's messages) and of each node segment (a column's pieces, adjacent ones merged: the node
    rings')."""
    spans = hier_plan.ranges(collective, N, G, count, rank)
    K = hier_plan.slices(spans, N, G, P)
    out = {0, count}
    for i in range(K):
        pieces = hier_plan.slice_pieces(spans, i, P, K)
        segments = merged_columns(pieces) if collective != "broadcast" else []
        for lo, hi in [p for row in pieces for p in row] + [p for segment in segments for p in segment]:
            for x, y in chunks(lo, hi, chunk):
                out.add(x)
                out.add(y)
    return sorted(out)


def _cut(bounds: list[int], parts: Sequence[tuple[int, int]]) -> tuple[list[int], dict[int, int], dict[int, int]]:
    """The buffer's chunks: every part (a block, or the whole buffer) cut at `bounds` (sorted) inside it and
    padded with chunks of no element to the most chunks of any part (at least one). Returns (each chunk's
    elements, bound -> the chunk that starts there, bound -> the chunk after the one that ends there)."""
    cuts = []
    i = 0
    for lo, hi in parts:
        while i < len(bounds) and bounds[i] <= lo:
            i += 1
        inner = [lo]
        while i < len(bounds) and bounds[i] < hi:
            inner.append(bounds[i])
            i += 1
        cuts.append(inner + [hi] if hi > lo else [lo])
    k = max(1, max(len(c) - 1 for c in cuts))
    sizes: list[int] = []
    first: dict[int, int] = {}
    after: dict[int, int] = {}
    for inner in cuts:
        for x, y in zip(inner, inner[1:]):
            first[x] = len(sizes)
            sizes.append(y - x)
            after[y] = len(sizes)
        sizes += [0] * (k - (len(inner) - 1))
    return sizes, first, after


def rounds(collective: str, N: int, G: int, S: int, itemsize: int, root: int = 0,
           in_leaf: bool = False) -> list[npt.NDArray[np.int64]]:
    """hier's schedule unpipelined, as dependent rounds (fabric.cost_nodes.rounds: the bulk-synchronous
    estimate's), each an n x n int64 matrix of payload bytes on N nodes of G GPUs (GPU a G + j at node a,
    position j): node ring, rail ring, as docs/model/cost-nodes.md derives them; their sum is the plan's
    traffic (fabric.plans.plan_traffic of `hier`'s plan: tests/unit/test_cost_nodes_hier.py). in_leaf:
    hier_nvls's GPU-to-GPU rounds on N > 1 nodes of G > 1 GPUs (its node rings run in the leaf: load-reduces
    and multicast stores, whose bytes its plan counts), i.e. the rail rounds (broadcast: the scatter and the
    chain)."""
    n = N * G
    count = S // itemsize
    if collective == "reduce_scatter" or collective == "allgather":
        own = [(hi - lo) * itemsize for lo, hi in blocks(count, n)]
        size = [[own[a * G + j] for j in range(G)] for a in range(N)]
    else:  # allreduce's two-level split; broadcast's parts are its columns
        size = [[0] * G for _ in range(N)]
        for j, (lo, hi) in enumerate(blocks(count, G)):
            for a, (x, y) in enumerate(blocks(hi - lo, N)):
                size[a][j] = (y - x) * itemsize
    column = [sum(size[a][j] for a in range(N)) for j in range(G)]

    def ring(phase: str, level: str) -> list[npt.NDArray[np.int64]]:
        m = G if level == "node" else N
        out = []
        for s in range(m - 1):
            t = np.zeros((n, n), np.int64)
            for a in range(N):
                for j in range(G):
                    p = j if level == "node" else a
                    seg = (p - 1 - s) % m if phase == "rs" else (p - s) % m
                    if level == "node":
                        t[a * G + j, a * G + (j + 1) % G] = column[seg]
                    else:
                        t[a * G + j, ((a + 1) % N) * G + j] = size[seg][j]
            out.append(t)
        return out

    leaf = in_leaf and N > 1 and G > 1  # the node rings run in the leaf: not GPU to GPU
    node_rs, node_ag = ([], []) if leaf else (ring("rs", "node"), ring("ag", "node"))
    if collective == "allreduce":
        return node_rs + ring("rs", "rail") + ring("ag", "rail") + node_ag
    if collective == "reduce_scatter":
        return node_rs + ring("rs", "rail")
    if collective == "allgather":
        return ring("ag", "rail") + node_ag
    a_root, j_root = divmod(root, G)
    out = []
    if G > 1:  # the root scatters part j to position j of its node
        t = np.zeros((n, n), np.int64)
        for j in range(G):
            if j != j_root:
                t[root, a_root * G + j] = column[j]
        out.append(t)
    if N > 1:  # rail j's pipelined chain from node a_root: one round, every hop streaming at once
        t = np.zeros((n, n), np.int64)
        for q in range(N - 1):
            a = (a_root + q) % N
            for j in range(G):
                t[a * G + j, ((a + 1) % N) * G + j] = column[j]
        out.append(t)
    return out + node_ag
