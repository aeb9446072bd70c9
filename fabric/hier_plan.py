"""`hier`'s pipelined schedule as pure data: one member's operations in program order.

ranks/collectives/hier.py executes it and fabric.replay replays it, so emulated and replayed modeled
times are the same schedule by construction. Members are hier's grid: N nodes x G positions, a member
named by its coordinates (a, j); ranges[a][j] its element range (hier.py's docstring).

**Slices** (the pipeline's unit, NCCL's chunk): each range (a, j) (broadcast: each part j) is cut into
pieces of P elements from its start, P = slice_elements(chunk, itemsize) = min(chunk_bytes, 256 KiB)
of whole elements (SLICE_BYTES: NCCL's COLLNET_CHAIN chunk ceiling, NVIDIA/nccl src/enqueue.cc,
chunkSize = min(256 KiB, stepSize x chunkSteps); at most one message of chunk_bytes each); slice i is
piece i of every range, K = the most pieces of any range. K = 1 on one node, with one member a node,
or when every range fits in one piece: then the schedule is the phases one after the other, exactly.
Each element keeps its range, so every element is folded in hier's documented order whatever K is,
and every link carries the same payload bytes (message boundaries move: raw bytes can differ by the
headers of a few more, shorter messages).

**Stages** of a slice, each a ring of ranks/collectives/ring.py's steps (step s, position p sends
segment p-1-s (reduce-scatter) or p-s (all-gather) to p+1) over that slice's pieces only:
allreduce: node RS, rail RS, rail AG, node AG; reduce_scatter: node RS, rail RS; allgather: rail AG,
node AG; broadcast: scatter (the root's node: the root sends piece i of part k to position k), rail
chain (piece i of part j down rail j from the root's node, a pipelined chain), node AG. Tick t runs
stage s of slice t - s for every stage s (K + stages - 1 ticks), so slice i's rail (inter-node) steps
run while slice i+1's node (NVLink) steps do, as NCCL's pipelined hierarchical algorithms overlap
their intra- and inter-node steps on different links (all_reduce.h, runTreeSplit, NVLS_TREE,
COLLNET_CHAIN: each chunk flows through the intra- and inter-node steps while the next one follows).
Inside a tick the rail stages run together step by step (step x: their sends, then the tick's node
steps floor(x M / X) .. floor((x + 1) M / X) - 1 of M, each whole, then step x's receives, X = rail
steps): a NIC transfer is in flight while NVLink carries the node rings. A slice's own piece is
finished (avg) at the end of the tick of its rail RS. Every member of a node has the same node steps
and every member the same rail steps (empty messages skipped on both sides), so each wait is for a
message its sender sends earlier in the same order: deadlock-free.

Operations: ("send", (b, k), key, lo, hi): elements [lo, hi) to member (b, k); ("recv", (b, k), key,
lo, hi, reduce): from (b, k) into [lo, hi), folded into it after what is there (reduce) or written;
("finish", lo, hi): [lo, hi) is fully reduced; ("flush",): wait until the sends so far have left.
Keys: (phase, slice, step, segment, chunk) for the rings, (phase, slice, 0, chunk) for the scatter,
(phase, slice, chunk) for the chain.
"""

from .reduction import blocks, chunks, merged_columns, two_level_blocks

SLICE_BYTES = 256 * 1024  # NCCL's COLLNET_CHAIN chunk ceiling (src/enqueue.cc)
NODE_RS, RAIL_RS, RAIL_AG, NODE_AG, SCATTER, CHAIN = 20, 21, 22, 23, 24, 25  # message phases
STAGES = {"allreduce": ("node rs", "rail rs", "rail ag", "node ag"), "reduce_scatter": ("node rs", "rail rs"),
          "allgather": ("rail ag", "node ag"), "broadcast": ("scatter", "chain", "node ag")}


def slice_elements(chunk: int, itemsize: int) -> int:
    """P: elements of a slice's piece of one range, for messages of `chunk` elements of `itemsize` bytes."""
    return max(1, min(chunk, SLICE_BYTES // itemsize))


def ranges(collective: str, N: int, G: int, count: int, rank=None) -> list[list[tuple[int, int]]]:
    """ranges[a][j]: allreduce's two-level split; reduce_scatter's and allgather's blocks(count, NG)[rank of
    (a, j)] (rank[a][j]; default a G + j, node-major); broadcast: part j = blocks(count, G)[j] on every node."""
    if collective == "allreduce":
        return two_level_blocks(count, N, G)
    if collective == "broadcast":
        return [blocks(count, G)] * N
    own = blocks(count, N * G)
    return [[own[rank[a][j] if rank is not None else a * G + j] for j in range(G)] for a in range(N)]


def slices(spans, N: int, G: int, P: int) -> int:
    """K: slices of a call whose ranges are `spans` (K = 1 on one node or with one member a node)."""
    if N == 1 or G == 1:
        return 1
    return max(1, max(-(-(hi - lo) // P) for row in spans for lo, hi in row))


def _piece(span: tuple[int, int], i: int, P: int, K: int) -> tuple[int, int]:
    if K == 1:
        return span
    lo, hi = span
    return min(lo + i * P, hi), min(lo + (i + 1) * P, hi)


def _slotted(rail: list, node_steps: list):
    """One tick's steps: the rail stages' steps x together (their sends, then node steps floor(x M / X)
    .. floor((x + 1) M / X) - 1 of M, whole, then their receives), X = the most rail steps."""
    X, M = max(map(len, rail), default=0), len(node_steps)
    if X == 0:
        for step in node_steps:
            yield from step.whole()
    for x in range(X):
        live = [steps[x] for steps in rail if x < len(steps)]
        for step in live:
            yield from step.sends
        for step in node_steps[x * M // X:(x + 1) * M // X]:
            yield from step.whole()
        for step in live:
            yield from step.recvs
            yield from step.posts
        if any(step.flush for step in live):
            yield ("flush",)


class _Step:
    """One step of a stage: sends, then receives, then sends of what was received (the chain), then a
    flush if `flush`."""

    __slots__ = ("sends", "recvs", "posts", "flush")

    def __init__(self, sends=(), recvs=(), posts=(), flush=False):
        self.sends, self.recvs, self.posts, self.flush = sends, recvs, posts, flush

    def whole(self):
        yield from self.sends
        yield from self.recvs
        yield from self.posts
        if self.flush:
            yield ("flush",)


def _ring(ring, pos, segments, phase, i, chunk, reduce: bool) -> list[_Step]:
    """ring.py's ring over `ring` (this member at `pos`) passing `segments` (lists of ranges) of slice
    i: reduce-scatter (a flush after each step) or all-gather (a flush after the last)."""
    m = len(ring)
    nxt, prv = ring[(pos + 1) % m], ring[(pos - 1) % m]
    steps = []
    for step in range(m - 1):
        sent, taken = ((pos - 1 - step) % m, (pos - 2 - step) % m) if reduce else ((pos - step) % m,
                                                                                    (pos - 1 - step) % m)
        sends = [("send", nxt, (phase, i, step, k, c), lo, hi)
                 for k, (a, b) in enumerate(segments[sent]) for c, (lo, hi) in enumerate(chunks(a, b, chunk))]
        recvs = [("recv", prv, (phase, i, step, k, c), lo, hi, reduce)
                 for k, (a, b) in enumerate(segments[taken]) for c, (lo, hi) in enumerate(chunks(a, b, chunk))]
        steps.append(_Step(sends, recvs, (), reduce or step == m - 2))
    return steps


def program(collective: str, N: int, G: int, a: int, j: int, count: int, chunk: int, itemsize: int,
            root: tuple[int, int] | None = None, rank=None):
    """Member (a, j)'s operations (the module docstring) for one call of `count` elements, messages of at
    most `chunk` elements of `itemsize` bytes; root: the broadcast root's coordinates; rank: as ranges'."""
    spans = ranges(collective, N, G, count, rank)
    P = slice_elements(chunk, itemsize)
    K = slices(spans, N, G, P)
    node_ring, rail_ring = [(a, k) for k in range(G)], [(b, j) for b in range(N)]

    def pieces(i):
        return [[_piece(span, i, P, K) for span in row] for row in spans]

    def stage(name: str, i: int) -> list[_Step]:
        if name in ("node rs", "node ag"):  # broadcast's segment k: part k's piece (its rows are one)
            segments = [[p] for p in pieces(i)[0]] if collective == "broadcast" else merged_columns(pieces(i))
            return _ring(node_ring, j, segments, NODE_RS if name == "node rs" else NODE_AG, i, chunk,
                         name == "node rs")
        if name in ("rail rs", "rail ag"):
            return _ring(rail_ring, a, [[row[j]] for row in pieces(i)], RAIL_RS if name == "rail rs" else RAIL_AG,
                         i, chunk, name == "rail rs")
        parts = pieces(i)[0]
        a_root, j_root = root
        if name == "scatter":  # the root's node only; every member of it flushes
            if a != a_root:
                return []
            if j == j_root:
                sends = [("send", (a, k), (SCATTER, i, 0, c), lo, hi)
                         for k in range(G) if k != j_root for c, (lo, hi) in enumerate(chunks(*parts[k], chunk))]
                return [_Step(sends, flush=True)]
            return [_Step((), [("recv", root, (SCATTER, i, 0, c), lo, hi, False)
                               for c, (lo, hi) in enumerate(chunks(*parts[j], chunk))], flush=True)]
        # chain: one step a chunk, as many steps on every rail (the longest part's chunks)
        position = (a - a_root) % N  # 0: the chain's start, node a_root
        prv, nxt = rail_ring[(a - 1) % N], rail_ring[(a + 1) % N]
        mine = chunks(*parts[j], chunk)
        longest = max(len(chunks(*part, chunk)) for part in parts)
        steps = []
        for c in range(longest):
            recv, send = [], []
            if c < len(mine):
                lo, hi = mine[c]
                if position:
                    recv = [("recv", prv, (CHAIN, i, c), lo, hi, False)]
                if position < N - 1:
                    send = [("send", nxt, (CHAIN, i, c), lo, hi)]
            steps.append(_Step((), recv, send, c == longest - 1) if position else _Step(send, (), (), c == longest - 1))
        return steps

    names = STAGES[collective]
    if K < deferred_depth(collective, N):
        yield from _zipped(names, stage, K, spans[a][j], P)
    else:
        yield from _deferred(names, stage, K, spans[a][j], P, N)
    yield ("flush",)


def deferred_depth(collective: str, N: int) -> int:
    """Rail ticks a slice spends in the deferred schedule: allreduce 2N - 1, reduce_scatter and allgather
    N (broadcast: none, its chain is one stage either way); the deferred schedule runs when K is at
    least this (the pipeline then holds a slice at every rail tick), the zipped one otherwise."""
    return {"allreduce": 2 * N - 1, "reduce_scatter": N, "allgather": N}.get(collective, 1)


def _zipped(names, stage, K: int, own: tuple[int, int], P: int):
    """Tick t: stage s of slice t - s; the rail stages' steps x together with a share of the node steps
    (_slotted); the slice whose rail RS ran finishes its piece at the tick's end."""
    for t in range(K + len(names) - 1):
        node, rail, finish = [], [], []
        for s, name in enumerate(names):
            i = t - s
            if not 0 <= i < K:
                continue
            (rail if name in ("rail rs", "rail ag", "chain") else node).append(stage(name, i))
            if name == "rail rs":
                finish.append(_piece(own, i, P, K))
        yield from _slotted(rail, [step for steps in node for step in steps])
        for lo, hi in finish:
            yield ("finish", lo, hi)


def _deferred(names, stage, K: int, own: tuple[int, int], P: int, N: int):
    """Every rail ring step a stage of its own: its sends in one tick, its receives in the next, right
    before the next step's sends (the data received passes on at once; the rail RS's last receive, the
    finish and the rail AG's first send are one stage). A tick: the sends that need no receive, the node
    steps (and the chain, _slotted), then each stage's receives and sends, then a flush: every wait is
    for a message sent a tick earlier, so the NIC has this tick's transfers queued while it waits."""
    plan: list[tuple] = []  # ("node", name) or ("rail", [(ring, step received or None, step sent or None)])
    for name in names:
        if name not in ("rail rs", "rail ag"):
            plan.append(("node", name))
            continue
        m = N - 1
        units = [(name, s - 1 if s else None, s if s < m else None) for s in range(m + 1)] if m else [(name, None, None)]
        if plan and plan[-1][0] == "rail" and plan[-1][1][-1][2] is None and units[0][1] is None:
            plan[-1] = ("rail", plan[-1][1] + [units[0]])  # the rail RS's last receive, the rail AG's first send
            units = units[1:]
        plan += [("rail", [u]) for u in units]
    cache: dict[tuple, list[_Step]] = {}

    def steps(name, i):
        if (name, i) not in cache:
            cache[(name, i)] = stage(name, i)
        return cache[(name, i)]

    def run(units, i):
        for name, received, sent in units:
            if received is not None:
                yield from steps(name, i)[received].recvs
            if name == "rail rs" and sent is None:
                yield ("finish", *_piece(own, i, P, K))
            if sent is not None:
                yield from steps(name, i)[sent].sends

    for t in range(K + len(plan) - 1):
        fresh, waits, node, chain = [], [], [], []
        for idx, (kind, what) in enumerate(plan):
            i = t - idx
            if not 0 <= i < K:
                continue
            if kind == "rail":
                (fresh if what[0][1] is None and len(what) == 1 else waits).append((what, i))
            elif what == "chain":
                chain.append(stage(what, i))
            else:
                node += stage(what, i)
        for what, i in fresh:
            yield from run(what, i)
        yield from _slotted(chain, node)
        for what, i in waits:
            yield from run(what, i)
        if waits:
            yield ("flush",)
        for key in [key for key in cache if key[1] <= t - len(plan)]:
            del cache[key]
