"""`hier`'s pipelined schedule as pure data: one member's operations in program order.

hier's node rings and hier_nvls's node stages in the leaf are plans (fabric.plans.hier translates this
program; run by ranks/collectives/plan.py, timed by fabric.plans.timing and, a leaf plan,
fabric.plans.timing_leaf): emulated and replayed modeled times are the same schedule by construction. Members are hier's grid, N nodes x G positions, a member
named by its coordinates (a, j). Slices (min(chunk_bytes, 256 KiB), NCCL's COLLNET_CHAIN chunk), the
stages of a slice, the ticks that pipeline them, the node stages in the leaf (hier_nvls), the operations
("send", "recv", "finish", "flush", "load_reduce", "serve", "mcast", "take") and their keys:
docs/model/algorithms-hier.md.
"""

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from .reduction import Grid, blocks, chunks, merged_columns, two_level_blocks

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from .config import FabricConfig

SLICE_BYTES = 256 * 1024  # NCCL's COLLNET_CHAIN chunk ceiling (src/enqueue.cc)
NODE_RS, RAIL_RS, RAIL_AG, NODE_AG, SCATTER, CHAIN = 20, 21, 22, 23, 24, 25  # message phases
STAGES = {"allreduce": ("node rs", "rail rs", "rail ag", "node ag"), "reduce_scatter": ("node rs", "rail rs"),
          "allgather": ("rail ag", "node ag"), "broadcast": ("scatter", "chain", "node ag")}

# an operation: (kind, *its fields), the fields the kind's (docs/model/algorithms-hier.md), e.g. ("send", peer
# (b, k), key, lo, hi); Any: the kind says which, and narrowing each op would cost fabric.plans.hier's loop over
# millions of them
HierOp = tuple[Any, ...]
Span = tuple[int, int]  # an element range [lo, hi)
Spans = Sequence[Sequence[Span]]  # ranges[a][j] (ranges'), or segments[k]: a position's or segment's ranges
# what the programs of one call's members build alike, once: ("pieces" | "segments" | "flat" | "serves", slice)
# or "cuts" -> a slice's pieces, node segments, their chunks, the leaf's serves; a ring's segments' cuts by label (_ring)
Memo = dict[str | tuple[str, int], Any]
Cut = tuple[int, int, int, int]  # a ring segment's message: (its range k, the range's chunk c, lo, hi)


class Run(NamedTuple):
    """A ring step's messages to or from one peer, in order, as one item of program_runs: the operations
    ("send", peer, (*key, k, c), lo, hi) (kind "sends") or ("recv", peer, (*key, k, c), lo, hi, reduce) (kind
    "recvs") for each (k, c, lo, hi) of `cuts` (Run.ops). A ring step of a large call is many messages (32
    nodes' pieces of a column, one a node); one item a step, not one a message, is what lets
    fabric.plans.hier translate a step at once. `cut` names `cuts` among the call's: the same segment's
    cuts, shared by every member passing it (one list, built once)."""

    kind: str  # "sends" or "recvs"
    peer: tuple[int, int]  # (node, position)
    key: tuple[int, int, int]  # (phase, slice, ring step)
    cut: Hashable
    cuts: Sequence[Cut]
    reduce: bool = False  # recvs: fold into what is there (reduce-scatter)

    def ops(self) -> Iterator[HierOp]:
        """The run's operations, one a message (program's)."""
        peer, (phase, i, step) = self.peer, self.key
        if self.kind == "sends":
            for k, c, lo, hi in self.cuts:
                yield ("send", peer, (phase, i, step, k, c), lo, hi)
        else:
            for k, c, lo, hi in self.cuts:
                yield ("recv", peer, (phase, i, step, k, c), lo, hi, self.reduce)


def in_leaf(config: "FabricConfig") -> bool:
    """Whether hier's node stages can run in the leaf switch (NVLS, `hier_nvls`): an NVLink Network fabric
    whose switches reduce (config.sharp: superpod-h100-ib, superpod-h100-nvlink; not superpod-a100-ib)."""
    return config.mode == "network" and config.sharp


def slice_elements(chunk: int, itemsize: int, N: int = 1, G: int = 1, share: int | None = None) -> int:
    """P: elements of a slice's piece of one range, for messages of `chunk` elements of `itemsize` bytes;
    share: with node stages in the leaf, the partition's in-switch buffer (bytes), which bounds P too."""
    P = max(1, min(chunk, SLICE_BYTES // itemsize))
    if share is not None and N > 1 and G > 1:
        P = max(1, min(P, share // (2 * (G - 1) * N * G * itemsize)))
    return P


def ranges(collective: str, N: int, G: int, count: int, rank: Grid | None = None) -> list[list[tuple[int, int]]]:
    """ranges[a][j]: allreduce's two-level split; reduce_scatter's and allgather's blocks(count, NG)[rank of
    (a, j)] (rank[a][j]; default a G + j, node-major); broadcast: part j = blocks(count, G)[j] on every node."""
    if collective == "allreduce":
        return two_level_blocks(count, N, G)
    if collective == "broadcast":
        return [blocks(count, G)] * N
    own = blocks(count, N * G)
    return [[own[rank[a][j] if rank is not None else a * G + j] for j in range(G)] for a in range(N)]


def slices(spans: Spans, N: int, G: int, P: int) -> int:
    """K: slices of a call whose ranges are `spans` (K = 1 on one node or with one member a node)."""
    if N == 1 or G == 1:
        return 1
    return max(1, max(-(-(hi - lo) // P) for row in spans for lo, hi in row))


def _piece(span: tuple[int, int], i: int, P: int, K: int) -> tuple[int, int]:
    if K == 1:
        return span
    lo, hi = span
    return min(lo + i * P, hi), min(lo + (i + 1) * P, hi)


def slice_pieces(spans: Spans, i: int, P: int, K: int) -> list[list[tuple[int, int]]]:
    """Slice i's piece of every range of `spans` (ranges' layout; K slices of P elements: program's)."""
    return [[_piece(span, i, P, K) for span in row] for row in spans]


class _Step:
    """One step of a stage: sends, then receives, then sends of what was received (the chain), then a
    flush if `flush`."""

    __slots__ = ("sends", "recvs", "posts", "flush")

    def __init__(self, sends: Sequence[HierOp] = (), recvs: Sequence[HierOp] = (), posts: Sequence[HierOp] = (),
                 flush: bool = False):
        self.sends, self.recvs, self.posts, self.flush = sends, recvs, posts, flush

    def whole(self) -> Iterator[HierOp]:
        yield from self.sends
        yield from self.recvs
        yield from self.posts
        if self.flush:
            yield ("flush",)


def leaf_slot(key: tuple[int, ...]) -> tuple[int, ...]:
    """The leaf's slot of node RS key (NODE_RS, slice, position, chunk): (position, NODE_RS, slice, chunk),
    the requester's position first, so second after the call's seq: fabric.switch refuses a load-reduce
    whose slot does not name its requester's rank in the group there, and the node group's members are
    the node's in communicator rank order (Communicator.node_group_id), as the positions are."""
    phase, i, position, c = key
    return (position, phase, i, c)


def _flat_chunks(segment: Sequence[Span], chunk: int) -> list[tuple[int, int]]:
    return [span for a, b in segment for span in chunks(a, b, chunk)]


def _leaf_rs(j: int, G: int, segments: Spans, i: int, chunk: int, memo: Memo | None = None) -> list[_Step]:
    """Node RS in the leaf, one step: my requests of column j, then the loads of every position's (in
    position order), then (received) my reduced chunks. memo: program's (the serves are every member's)."""
    flat = _flat_segments(segments, chunk, memo, i)
    mine = flat[j]
    sends = [("load_reduce", (NODE_RS, i, j, c), lo, hi) for c, (lo, hi) in enumerate(mine)]
    serves: list[HierOp] | None = memo.get(("serves", i)) if memo is not None else None
    if serves is None:
        serves = [("serve", k, (NODE_RS, i, k, c), lo, hi) for k in range(G) for c, (lo, hi) in enumerate(flat[k])]
        if memo is not None:
            memo[("serves", i)] = serves
    takes = [("take", (NODE_RS, i, j, c), lo, hi, False) for c, (lo, hi) in enumerate(mine)]
    return [_Step(sends + serves, takes, (), True)]


def _leaf_ag(j: int, G: int, segments: Spans, i: int, chunk: int, memo: Memo | None = None) -> list[_Step]:
    """Node AG in the leaf, one step: multicast-store my segment, then (received) every position's stores,
    mine too, in position order."""
    flat = _flat_segments(segments, chunk, memo, i)
    sends = [("mcast", (NODE_AG, i, j, c), lo, hi) for c, (lo, hi) in enumerate(flat[j])]
    takes = [("take", (NODE_AG, i, k, c), lo, hi, k == j) for k in range(G) for c, (lo, hi) in enumerate(flat[k])]
    return [_Step(sends, takes, (), True)]


def _flat_segments(segments: Spans, chunk: int, memo: Memo | None, i: int) -> list[list[tuple[int, int]]]:
    """Each node segment's chunks (_flat_chunks), once per slice i for every member (memo: program's)."""
    flat: list[list[tuple[int, int]]] | None = memo.get(("flat", i)) if memo is not None else None
    if flat is None:
        flat = [_flat_chunks(segment, chunk) for segment in segments]
        if memo is not None:
            memo[("flat", i)] = flat
    return flat


def _ring(ring: Sequence[tuple[int, int]], pos: int, segments: Spans, phase: int, i: int, chunk: int, reduce: bool,
          memo: Memo | None = None, label: Hashable = None) -> list[_Step]:
    """ring.py's ring over `ring` (this member at `pos`) passing `segments` (lists of ranges) of slice
    i: reduce-scatter (a flush after each step) or all-gather (a flush after the last), each step's sends
    and receives one Run. memo: program's; label: what names `segments` among the call's (the same for
    every member passing them), so that a segment is cut into its messages once for all of them."""
    m = len(ring)
    nxt, prv = ring[(pos + 1) % m], ring[(pos - 1) % m]
    made: dict[Hashable, list[list[Cut] | None]] = {} if memo is None else memo.setdefault("cuts", {})
    cut = made.get(label) or made.setdefault(label, [None] * len(segments))  # segment s -> its cuts

    def cuts(s: int) -> list[Cut]:
        got = cut[s]
        if got is None:
            got = cut[s] = [(k, c, lo, hi) for k, (a, b) in enumerate(segments[s])
                            for c, (lo, hi) in enumerate(chunks(a, b, chunk))]
        return got

    steps: list[_Step] = []
    for step in range(m - 1):
        sent, taken = ((pos - 1 - step) % m, (pos - 2 - step) % m) if reduce else ((pos - step) % m,
                                                                                    (pos - 1 - step) % m)
        key = (phase, i, step)
        steps.append(_Step([Run("sends", nxt, key, (label, sent), cuts(sent))],
                           [Run("recvs", prv, key, (label, taken), cuts(taken), reduce)], (), reduce or step == m - 2))
    return steps


def program(collective: str, N: int, G: int, a: int, j: int, count: int, chunk: int, itemsize: int,
            root: tuple[int, int] | None = None, rank: Grid | None = None, share: int | None = None,
            memo: Memo | None = None) -> Iterator[HierOp]:
    """Member (a, j)'s operations (docs/model/algorithms-hier.md) for one call of `count` elements, messages of at
    most `chunk` elements of `itemsize` bytes; root: the broadcast root's coordinates; rank: as ranges';
    share: None for node rings, else the node stages run in the leaf (in_leaf) and share is the
    partition's in-switch buffer (bytes, fabric.budget.buffer_share_bytes). memo: a dict shared by the
    programs of every member of one call (the same arguments but a, j), so that what every member's
    program builds alike (a slice's pieces, node segments, serves) is built once. program_runs' items, each
    Run its operations one by one."""
    for op in program_runs(collective, N, G, a, j, count, chunk, itemsize, root, rank, share, memo):
        if type(op) is Run:
            yield from op.ops()
        else:
            yield op


def program_runs(collective: str, N: int, G: int, a: int, j: int, count: int, chunk: int, itemsize: int,
                 root: tuple[int, int] | None = None, rank: Grid | None = None, share: int | None = None,
                 memo: Memo | None = None) -> Iterator[HierOp]:
    """program's operations (the same arguments), a ring step's messages to or from one peer as one Run (what
    fabric.plans.hier translates: one item a step, not one a message)."""
    spans = ranges(collective, N, G, count, rank)
    leaf = share is not None and N > 1 and G > 1
    P = slice_elements(chunk, itemsize, N, G, share if leaf else None)
    K = slices(spans, N, G, P)
    node_ring, rail_ring = [(a, k) for k in range(G)], [(b, j) for b in range(N)]
    memo = {} if memo is None else memo  # (what, slice) -> the same for every member of the call

    def pieces(i: int) -> list[list[tuple[int, int]]]:
        got: list[list[tuple[int, int]]] | None = memo.get(("pieces", i))
        if got is None:
            got = memo[("pieces", i)] = slice_pieces(spans, i, P, K)
        return got

    def node_segments(i: int) -> list[list[tuple[int, int]]]:
        got: list[list[tuple[int, int]]] | None = memo.get(("segments", i))
        if got is None:  # broadcast's segment k: part k's piece (its rows are one)
            got = [[p] for p in pieces(i)[0]] if collective == "broadcast" else merged_columns(pieces(i))
            memo[("segments", i)] = got
        return got

    def stage(name: str, i: int) -> list[_Step]:
        if name in ("node rs", "node ag"):
            segments = node_segments(i)
            if leaf:
                return (_leaf_rs if name == "node rs" else _leaf_ag)(j, G, segments, i, chunk, memo)
            return _ring(node_ring, j, segments, NODE_RS if name == "node rs" else NODE_AG, i, chunk,
                         name == "node rs", memo, ("node", i))  # every node's segments alike
        if name in ("rail rs", "rail ag"):
            return _ring(rail_ring, a, [[row[j]] for row in pieces(i)], RAIL_RS if name == "rail rs" else RAIL_AG,
                         i, chunk, name == "rail rs", memo, ("rail", i, j))
        parts = pieces(i)[0]
        a_root, j_root = cast(tuple[int, int], root)  # scatter and chain: broadcast's stages, which has a root
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
        steps: list[_Step] = []
        for c in range(longest):
            recv: list[HierOp] = []
            send: list[HierOp] = []
            if c < len(mine):
                lo, hi = mine[c]
                if position:
                    recv = [("recv", prv, (CHAIN, i, c), lo, hi, False)]
                if position < N - 1:
                    send = [("send", nxt, (CHAIN, i, c), lo, hi)]
            steps.append(_Step((), recv, send, c == longest - 1) if position else _Step(send, (), (), c == longest - 1))
        return steps

    names = STAGES[collective]
    if collective != "broadcast":
        yield from _stepwise(names, stage, K, spans[a][j], P, N, 1 if leaf else G - 1)
    elif N > 1 and G > 1:
        yield from _stepwise_broadcast(stage, K, (a - cast(tuple[int, int], root)[0]) % N)  # broadcast: a root
    else:  # one slice: the scatter, the chain chunk by chunk, the node ring, one after the other
        yield from _zipped(names, stage, K)
    yield ("flush",)


# a stage's steps of a slice: program's stage(name, i)
Stage = Callable[[str, int], list[_Step]]


def _stepwise(names: Sequence[str], stage: Stage, K: int, own: tuple[int, int], P: int, N: int,
              node_steps: int) -> Iterator[HierOp]:
    """Every ring step of every stage a tick of its own: tick t runs, for each slice i in the pipeline,
    its receives of the step it sent in tick t - 1, then its sends of the next step (the last receive
    of one ring and the first send of the next are one tick; the rail RS's last receive finishes the
    piece), then a flush. node_steps: a node stage's steps (G - 1 for a ring, 1 in the leaf)."""
    # a slice's ticks: [(stage, step received or None, step sent or None)]
    plan: list[list[tuple[str, int | None, int | None]]] = []
    for name in names:
        m = node_steps if name.startswith("node") else N - 1
        units = [(name, s - 1 if s else None, s if s < m else None) for s in range(m + 1)] if m else [(name, None, None)]
        if plan and plan[-1][-1][2] is None and units[0][1] is None:
            plan[-1] = plan[-1] + [units[0]]  # one ring's last receive, the next one's first send
            units = units[1:]
        plan += [[u] for u in units]
    cache: dict[tuple[str, int], list[_Step]] = {}

    def steps(name: str, i: int) -> list[_Step]:
        if (name, i) not in cache:
            cache[(name, i)] = stage(name, i)
        return cache[(name, i)]

    for t in range(K + len(plan) - 1):
        # the leaf's loads this tick: answered last, so they queue behind the tick's rail sends
        serves: list[HierOp] = []
        for idx in range(max(0, t - K + 1), min(len(plan), t + 1)):  # the slices i = t - idx in the pipeline
            i = t - idx
            for name, received, sent in plan[idx]:
                if received is not None:
                    yield from steps(name, i)[received].recvs
                if name == "rail rs" and sent is None:
                    yield ("finish", *_piece(own, i, P, K))
                if sent is not None:
                    for op in steps(name, i)[sent].sends:
                        if op[0] == "serve":
                            serves.append(op)
                        else:
                            yield op
        yield from serves
        yield ("flush",)
        for key in [key for key in cache if key[1] <= t - len(plan) + 1]:
            del cache[key]


def _stepwise_broadcast(stage: Stage, K: int, position: int) -> Iterator[HierOp]:
    """Broadcast's ticks on the node `position` hops down the chain from the root's: slice i's scatter
    sends at tick i and is received at i + 1; its chain piece arrives at tick T = i + 1 + position (the
    root's node sends it at i + 1) and goes on in the same tick; node AG step s sends at T + s and is
    received at T + s + 1. Every receive waits for a message of an earlier tick; a flush ends each tick."""
    ticks: dict[int, list[HierOp]] = {}

    def at(t: int, ops: Iterable[HierOp]) -> None:
        ticks.setdefault(t, []).extend(ops)

    for i in range(K):
        for step in stage("scatter", i):
            at(i, step.sends)
            at(i + 1, step.recvs)
        T = i + 1 + position
        for step in stage("chain", i):  # one piece, one message
            at(T, [*step.recvs, *step.posts, *step.sends])
        for s, step in enumerate(stage("node ag", i)):
            at(T + s, step.sends)
            at(T + s + 1, step.recvs)
    for t in sorted(ticks):
        yield from ticks[t]
        yield ("flush",)


def _zipped(names: Sequence[str], stage: Stage, K: int) -> Iterator[HierOp]:
    """One slice (K = 1) of a broadcast on one node or with one member a node: its stages one after
    the other, the chain chunk by chunk (each member forwards a chunk as soon as it has it)."""
    for t in range(K + len(names) - 1):
        for s, name in enumerate(names):
            if 0 <= t - s < K:
                for step in stage(name, t - s):
                    yield from step.whole()
