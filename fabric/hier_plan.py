"""`hier`'s pipelined schedule as pure data: one member's operations in program order.

ranks/collectives/hier.py executes it and fabric.replay replays it, so emulated and replayed modeled
times are the same schedule by construction. Members are hier's grid: N nodes x G positions, a member
named by its coordinates (a, j); ranges[a][j] its element range (hier.py's docstring).

**Slices** (the pipeline's unit, NCCL's chunk): each range (a, j) (broadcast: each part j) is cut into
pieces of P elements from its start, P = slice_elements(chunk, itemsize) = min(chunk_bytes, 256 KiB)
of whole elements (SLICE_BYTES: NCCL's COLLNET_CHAIN chunk ceiling, NVIDIA/nccl src/enqueue.cc,
chunkSize = min(256 KiB, stepSize x chunkSteps); at most one message of chunk_bytes each); slice i is
piece i of every range, K = the most pieces of any range. K = 1 on one node, with one member a node,
or when every range fits in one piece: then the ticks below run the phases' steps one after the
other, the same messages as unpipelined (one node: exactly ring.py's schedule and times).
Each element keeps its range, so every element is folded in hier's documented order whatever K is,
and every link carries the same payload bytes (message boundaries move: raw bytes can differ by the
headers of a few more, shorter messages).

**Stages** of a slice, each a ring of ranks/collectives/ring.py's steps (step s, position p sends
segment p-1-s (reduce-scatter) or p-s (all-gather) to p+1) over that slice's pieces only:
allreduce: node RS, rail RS, rail AG, node AG; reduce_scatter: node RS, rail RS; allgather: rail AG,
node AG; broadcast: scatter (the root's node: the root sends piece i of part k to position k), rail
chain (piece i of part j down rail j from the root's node, a pipelined chain), node AG.

**Ticks** (software pipelining, as NCCL's chunked algorithms overlap a channel's intra- and inter-node
steps on different links: NVIDIA/nccl src/device/all_reduce.h, runTreeSplit and NVLS_TREE, whose
scatter, reduce, tree and broadcast warps work on successive chunks at once, COLLNET_CHAIN): every
ring step of every stage takes one tick of a slice's life, slice i starting at tick i. In tick t a
member runs, for each slice in the pipeline (the youngest first), the receives of the step it sent in
tick t - 1, then the sends of its next step (received data passes on at once; one ring's last
receive and the next ring's first send share a tick; the rail RS's last receive finishes the piece,
avg), then a flush. So slice i's rail (NIC) steps run while slice i+1's node (NVLink) steps do, and
every wait is for a message sent a tick earlier: the next transfers are queued while it waits, and a
ring's step latency is paid once a tick, not once a slice. A slice lives 2(G-1) + 2(N-1) + 1 ticks
(allreduce; reduce_scatter and allgather (G-1) + (N-1) + 1), the call K - 1 more. Broadcast: slice
i's scatter is sent at tick i and received at i + 1, its chain piece reaches the node `position` hops
down the chain at T = i + 1 + position and goes on in the same tick, its node AG step s is sent at
T + s and received at T + s + 1. Every receive matches a send of an earlier tick, so no wait is for a
message sent later: deadlock-free. Measured (fabric.replay, 16 MiB AllReduce, float32, one slice ->
this pipeline): superpod-h100-ib 2 x 4 GPUs 156.3 -> 113.7 us, 2 x 8 126.1 -> 108.7 (64 MiB 467.7 ->
313.7), superpod-h100-nvlink 2 x 8 89.6 -> 77.0, superpod-a100-ib 2 x 8 205.3 -> 145.0 (a different
pipeline order, rail steps grouped in one tick, was ahead on a few IB shapes and behind on the NVLink
one, where node and rail steps cost alike: this one was never slower than the phases one after the
other on the shapes measured, 2 x 2 to 8 x 8 GPUs on the three presets).

**Node stages in the leaf** (`hier_nvls`, share given: the leaf switch reduces and multicasts, fabric
config `sharp` true in NVLink Network mode (in_leaf), N > 1 and G > 1; `hier` keeps the node rings;
NCCL's NVLS_TREE on H100 clusters: NVIDIA/nccl
src/device/all_reduce.h, runTreeSplit's NVLS_TREE, the node's reduction by the NVSwitch, the rails
over the NICs). The node's G members form a switch group at their leaf; each binds its work buffer
(allreduce: its array; reduce_scatter: a copy of its input). Node RS of slice i is one step: member j
asks the leaf to load-reduce each chunk of its column-j segment (one LOAD_REDUCE a chunk, as
ranks/collectives/nvls.py), then serves the leaf's LOADs of every member's requests of the slice, in
one order every member keeps (column k = 0..G-1, its chunks in order: the leaf's engine then books
the slots in that order whatever the host does), and takes its reduced chunks back a tick later
(the slice's node RS takes one tick: requests and loads in tick t, results in tick t + 1). Node AG of
a slice is one step too: member j multicast-stores its column-j segment (broadcast: part j's piece)
to the node group, chunk by chunk, and a tick later takes in every member's stores (its own copy
too, in member order). The node ring's G - 1 steps become one each way; the rail stages and the
ticks are as above, but a tick's serves go last in it, after its rail sends (which then go first on
the uplink, where a slice's answers - every column's, the heaviest step - would hold them back; a
serve waits only for requests of the same tick: still deadlock-free). Measured (fabric.replay,
AllReduce float32, node rings (hier) -> in the leaf (hier_nvls)): superpod-h100-ib 2 x 4 GPUs 16 MiB 113.7 -> 108.8 us,
64 MiB 381.0 -> 376.6; 2 x 8 16 MiB 108.7 -> 90.6; 4 x 8 16 MiB 138.4 -> 131.0; superpod-h100-nvlink
2 x 8 1 MiB 15.4 -> 9.5, 16 MiB 77.0 -> 80.6 (a loss), 64 MiB 299.7 -> 233.2; losses too: superpod-h100-ib
4 x 2 16 MiB 279.5 -> 286.3, superpod-h100-nvlink 2 x 2 ReduceScatter 16 MiB 33.7 -> 58.1 (so `auto`
weighs both forms: they are two algorithms); with the serves first, or the slices halved, some of these
were slower. With nvls the slice is also at most share / (2 (G - 1) N G itemsize) elements
(share: the partition's in-switch buffer), so that the leaf's contributions held for two slices'
load-reduces (at most G - 1 of G answers of every slot; a member is at most one slice ahead of the
slowest) fit its share.

Operations: ("send", (b, k), key, lo, hi): elements [lo, hi) to member (b, k); ("recv", (b, k), key,
lo, hi, reduce): from (b, k) into [lo, hi), folded into it after what is there (reduce) or written;
("finish", lo, hi): [lo, hi) is fully reduced; ("flush",): wait until the sends so far have left.
Node stages in the leaf: ("load_reduce", key, lo, hi): ask the leaf for the node's reduction of [lo,
hi) of every member's bound buffer, for me under `key`; ("serve", k, key, lo, hi): answer the leaf's
LOAD of [lo, hi) for position k's request `key`; ("mcast", key, lo, hi): multicast-store [lo, hi) to
the node group; ("take", key, lo, hi, own): take the leaf's delivery `key` (a result, or a store)
into [lo, hi) (own: my own store's copy, into scratch).
Keys: (phase, slice, step, segment, chunk) for the rings, (phase, slice, position, chunk) for the
node stages in the leaf (a load-reduce's slot: leaf_slot(key)), (phase, slice, 0, chunk) for the scatter,
(phase, slice, chunk) for the chain.
"""

from .reduction import blocks, chunks, merged_columns, two_level_blocks

SLICE_BYTES = 256 * 1024  # NCCL's COLLNET_CHAIN chunk ceiling (src/enqueue.cc)
NODE_RS, RAIL_RS, RAIL_AG, NODE_AG, SCATTER, CHAIN = 20, 21, 22, 23, 24, 25  # message phases
STAGES = {"allreduce": ("node rs", "rail rs", "rail ag", "node ag"), "reduce_scatter": ("node rs", "rail rs"),
          "allgather": ("rail ag", "node ag"), "broadcast": ("scatter", "chain", "node ag")}


def in_leaf(config) -> bool:
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


def slice_pieces(spans, i: int, P: int, K: int) -> list[list[tuple[int, int]]]:
    """Slice i's piece of every range of `spans` (ranges' layout; K slices of P elements: program's)."""
    return [[_piece(span, i, P, K) for span in row] for row in spans]


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


def leaf_slot(key: tuple) -> tuple:
    """The leaf's slot of node RS key (NODE_RS, slice, position, chunk): (position, NODE_RS, slice, chunk),
    the requester's position first, so second after the call's seq: fabric.switch refuses a load-reduce
    whose slot does not name its requester's rank in the group there, and the node group's members are
    the node's in communicator rank order (Communicator.node_group_id), as the positions are."""
    phase, i, position, c = key
    return (position, phase, i, c)


def _flat_chunks(segment, chunk) -> list[tuple[int, int]]:
    return [span for a, b in segment for span in chunks(a, b, chunk)]


def _leaf_rs(j, G, segments, i, chunk, memo=None) -> list[_Step]:
    """Node RS in the leaf, one step: my requests of column j, then the loads of every position's (in
    position order), then (received) my reduced chunks. memo: program's (the serves are every member's)."""
    flat = _flat_segments(segments, chunk, memo, i)
    mine = flat[j]
    sends = [("load_reduce", (NODE_RS, i, j, c), lo, hi) for c, (lo, hi) in enumerate(mine)]
    serves = memo.get(("serves", i)) if memo is not None else None
    if serves is None:
        serves = [("serve", k, (NODE_RS, i, k, c), lo, hi) for k in range(G) for c, (lo, hi) in enumerate(flat[k])]
        if memo is not None:
            memo[("serves", i)] = serves
    takes = [("take", (NODE_RS, i, j, c), lo, hi, False) for c, (lo, hi) in enumerate(mine)]
    return [_Step(sends + serves, takes, (), True)]


def _leaf_ag(j, G, segments, i, chunk, memo=None) -> list[_Step]:
    """Node AG in the leaf, one step: multicast-store my segment, then (received) every position's stores,
    mine too, in position order."""
    flat = _flat_segments(segments, chunk, memo, i)
    sends = [("mcast", (NODE_AG, i, j, c), lo, hi) for c, (lo, hi) in enumerate(flat[j])]
    takes = [("take", (NODE_AG, i, k, c), lo, hi, k == j) for k in range(G) for c, (lo, hi) in enumerate(flat[k])]
    return [_Step(sends, takes, (), True)]


def _flat_segments(segments, chunk, memo, i) -> list[list[tuple[int, int]]]:
    """Each node segment's chunks (_flat_chunks), once per slice i for every member (memo: program's)."""
    flat = memo.get(("flat", i)) if memo is not None else None
    if flat is None:
        flat = [_flat_chunks(segment, chunk) for segment in segments]
        if memo is not None:
            memo[("flat", i)] = flat
    return flat


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
            root: tuple[int, int] | None = None, rank=None, share: int | None = None, memo: dict | None = None):
    """Member (a, j)'s operations (the module docstring) for one call of `count` elements, messages of at
    most `chunk` elements of `itemsize` bytes; root: the broadcast root's coordinates; rank: as ranges';
    share: None for node rings, else the node stages run in the leaf (in_leaf) and share is the
    partition's in-switch buffer (bytes, fabric.budget.buffer_share_bytes). memo: a dict shared by the
    programs of every member of one call (the same arguments but a, j), so that what every member's
    program builds alike (a slice's pieces, node segments, serves) is built once (fabric.replay.hier_ns)."""
    spans = ranges(collective, N, G, count, rank)
    leaf = share is not None and N > 1 and G > 1
    P = slice_elements(chunk, itemsize, N, G, share if leaf else None)
    K = slices(spans, N, G, P)
    node_ring, rail_ring = [(a, k) for k in range(G)], [(b, j) for b in range(N)]
    memo = {} if memo is None else memo  # (what, slice) -> the same for every member of the call

    def pieces(i):
        got = memo.get(("pieces", i))
        if got is None:
            got = memo[("pieces", i)] = slice_pieces(spans, i, P, K)
        return got

    def node_segments(i):
        got = memo.get(("segments", i))
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
    if collective != "broadcast":
        yield from _stepwise(names, stage, K, spans[a][j], P, N, 1 if leaf else G - 1)
    elif N > 1 and G > 1:
        yield from _stepwise_broadcast(stage, K, (a - root[0]) % N)
    else:  # one slice: the scatter, the chain chunk by chunk, the node ring, one after the other
        yield from _zipped(names, stage, K)
    yield ("flush",)


def _stepwise(names, stage, K: int, own: tuple[int, int], P: int, N: int, node_steps: int):
    """Every ring step of every stage a tick of its own: tick t runs, for each slice i in the pipeline,
    its receives of the step it sent in tick t - 1, then its sends of the next step (the last receive
    of one ring and the first send of the next are one tick; the rail RS's last receive finishes the
    piece), then a flush. node_steps: a node stage's steps (G - 1 for a ring, 1 in the leaf)."""
    plan: list[list[tuple]] = []  # a slice's ticks: [(stage, step received or None, step sent or None)]
    for name in names:
        m = node_steps if name.startswith("node") else N - 1
        units = [(name, s - 1 if s else None, s if s < m else None) for s in range(m + 1)] if m else [(name, None, None)]
        if plan and plan[-1][-1][2] is None and units[0][1] is None:
            plan[-1] = plan[-1] + [units[0]]  # one ring's last receive, the next one's first send
            units = units[1:]
        plan += [[u] for u in units]
    cache: dict[tuple, list[_Step]] = {}

    def steps(name, i):
        if (name, i) not in cache:
            cache[(name, i)] = stage(name, i)
        return cache[(name, i)]

    for t in range(K + len(plan) - 1):
        serves = []  # the leaf's loads this tick: answered last, so they queue behind the tick's rail sends
        for idx, units in enumerate(plan):
            i = t - idx
            if not 0 <= i < K:
                continue
            for name, received, sent in units:
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


def _stepwise_broadcast(stage, K: int, position: int):
    """Broadcast's ticks on the node `position` hops down the chain from the root's: slice i's scatter
    sends at tick i and is received at i + 1; its chain piece arrives at tick T = i + 1 + position (the
    root's node sends it at i + 1) and goes on in the same tick; node AG step s sends at T + s and is
    received at T + s + 1. Every receive waits for a message of an earlier tick; a flush ends each tick."""
    ticks: dict[int, list] = {}

    def at(t, ops):
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


def _zipped(names, stage, K: int):
    """One slice (K = 1) of a broadcast on one node or with one member a node: its stages one after
    the other, the chain chunk by chunk (each member forwards a chunk as soon as it has it)."""
    for t in range(K + len(names) - 1):
        for s, name in enumerate(names):
            if 0 <= t - s < K:
                for step in stage(name, t - s):
                    yield from step.whole()
