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
here, Plan.lanes 0), so that a pair's messages of two phases never match each other.
"""

from .. import hier_plan
from ..errors import PlanError
from ..reduction import blocks, chunks, merged_columns
from .format import GpuProgram, Op, Plan, Ref

# hier_plan's message phases -> the plan's channel (a phase's messages between a pair match in order)
CHANNELS = {hier_plan.NODE_RS: 0, hier_plan.RAIL_RS: 1, hier_plan.RAIL_AG: 2, hier_plan.NODE_AG: 3,
            hier_plan.SCATTER: 4, hier_plan.CHAIN: 5}
COLLECTIVES = tuple(hier_plan.STAGES)  # allreduce, reduce_scatter, allgather, broadcast


def hier_pieces(gpus: int, layout, nbytes: int | None, itemsize: int,
                chunk_bytes: int | None) -> tuple[int, int, int, int] | None:
    """What hier's plan for a call of `nbytes` in elements of `itemsize` bytes is built from: (elements,
    elements a message: chunk_bytes // itemsize, itemsize, elements a slice's piece: hier_plan.slice_elements,
    which hier_plan.program takes from the first three; here so that the registry's cache key holds it);
    None without them."""
    if nbytes is None or chunk_bytes is None:
        return None
    chunk = max(1, int(chunk_bytes) // itemsize)
    return int(nbytes) // itemsize, chunk, int(itemsize), hier_plan.slice_elements(chunk, int(itemsize))


def hier(gpus: int, collective: str, root: int = 0, layout=None,
         pieces: tuple[int, int, int, int] | None = None) -> Plan:
    """hier's `collective` (COLLECTIVES) on the grid `layout` (layout[a][j]: the GPU at node a, position j;
    default one node), for `pieces` = (elements, elements a message, itemsize, elements a slice's piece)
    (hier_pieces): hier_plan's operations of every member (module docstring); broadcast from `root`."""
    if collective not in COLLECTIVES:
        raise PlanError(f"hier plan: no {collective}; hier builds {', '.join(COLLECTIVES)}")
    if pieces is None:
        raise PlanError("hier plan: it is built for a call's size (nbytes, itemsize and chunk_bytes)")
    n = gpus
    layout = layout or (tuple(range(n)),)
    N, G = len(layout), len(layout[0])
    at = {m: (a, j) for a, row in enumerate(layout) for j, m in enumerate(row)}
    if sorted(at) != list(range(n)) or any(len(row) != G for row in layout):
        raise PlanError(f"hier plan: layout {layout} is not a grid of the {n} GPUs")
    count, chunk, itemsize, P = pieces
    rank = [list(row) for row in layout]
    by_block = collective in ("reduce_scatter", "allgather")
    sizes, first, after = _cut(_bounds(collective, N, G, count, chunk, P, rank),
                               blocks(count, n) if by_block else [(0, count)])
    k = len(sizes) // n if by_block else len(sizes)
    whole = tuple(sizes)
    buf = "i" if collective == "reduce_scatter" else "o"
    refs: dict[tuple[int, int], Ref] = {}
    flush = Op("flush")
    memo: dict = {}  # hier_plan's: what every member's program builds alike, once
    out = []
    for g in range(n):
        ops = [Op("copy", src=Ref("i", 0, k), dst=Ref("o", g * k, k))] if collective == "allgather" else []
        add = ops.append
        for op in hier_plan.program(collective, N, G, *at[g], count, chunk, itemsize, at[root], rank, None, memo):
            kind = op[0]
            if kind == "send" or kind == "recv":
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
            elif kind != "finish":  # the executor finishes the whole output at the end
                raise PlanError(f"hier plan: hier_plan's operation {kind!r} is not one of the node rings'")
        if collective == "reduce_scatter":  # my block of the reduced input is my output
            add(Op("copy", src=Ref("i", g * k, k), dst=Ref("o", 0, k)))
        mine = whole[g * k:(g + 1) * k] if by_block else whole
        elements = {"reduce_scatter": (whole, mine, ()), "allgather": (mine, whole, ())}.get(collective, (whole, whole, ()))
        out.append(GpuProgram(g, tuple(ops), len(elements[0]), len(elements[1]), 0, elements))
    return Plan("hier", collective, n, tuple(out), inplace=collective in ("allreduce", "broadcast"), root=root)


def _bounds(collective: str, N: int, G: int, count: int, chunk: int, P: int, rank) -> list[int]:
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


def _cut(bounds: list[int], parts) -> tuple[list[int], dict[int, int], dict[int, int]]:
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
