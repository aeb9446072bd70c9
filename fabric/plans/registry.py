"""The registry of algorithms built as plans: name -> function(gpus, collective, root) -> Plan.

ring: ranks/collectives/ring.py's one-node schedule (one ring 0, 1, ..., n-1; the buffer in n chunks;
reduce-scatter step s: position p sends chunk p-1-s to p+1 and folds chunk p-2-s from p-1 into its
own, a flush after each step; all-gather step s: sends chunk p-s, takes chunk p-1-s, one flush at the
end; broadcast: a chain from the root, root+1, ..., root+n-1, each GPU passing every piece on as soon
as it is in; reduce: a chain root+1, root+2, ..., root, each GPU folding its own input into every piece
of the partial it receives, partial (op) own (incoming_first), and passing it on, the root folding it
into its output). Each GPU's link bytes: 2 (n-1)/n S (allreduce), (n-1)/n S (reduce_scatter,
allgather); broadcast S out (all but the chain's last) and S in (all but the root); reduce S out (all
but the root) and S in (all but root+1).
recursive_doubling: allreduce on a power-of-two GPU count; step k, GPU g exchanges its whole buffer
with g xor 2^k and adds the partner's (received into scratch) to its own: log2(n) S bytes each way;
every GPU folds the same sets, in a different order (floating-point sums may differ from ring's).
direct: ranks/collectives/direct.py's schedules, the A100 NVSwitch way (the buffer in n blocks, GPU r
owns block r): reduce_scatter, step k = 1..n-1 sends block r+k to GPU r+k, then takes block r from
r-1, r-2, ... into scratch (slot p for GPU p) and folds them in member order 0, 1, ..., n-1 (its own
input at its turn) into its output; allgather sends its block to r+1, ..., r+n-1, then takes block p
from p = r-1, r-2, ...; allreduce is the two in place, a flush between them (the sum of block r is
built in the output, its own part saved to scratch slot r first); broadcast: the root sends the whole
buffer to root+1, ..., root+n-1, the others take it from the root; all2all (ranks/collectives/all2all.py
with equal blocks): on one node block r+k to GPU r+k for k = 1..n-1, its own block copied, then block p
from p = r-1, r-2, ...; across nodes (a layout) the other nodes' blocks in a Latin square of steps, each
followed by one of its own node's (_all2all_order). Link bytes per GPU: (n-1)/n S each way
(reduce_scatter, allgather, all2all), 2 (n-1)/n S (allreduce); broadcast: the root (n-1) S out, the
others S in; reduce: reduce_scatter's phase, a flush, then every GPU but the root sends its block to the
root, which takes them from root+1, root+2, ... (its output; another GPU's output is a scratch array of
the input's size); gather: every GPU but the root sends its input to the root, which copies its own and
takes the others from root+1, root+2, ...; scatter: the root sends block p to GPU p, p = root+1, root+2,
..., then copies its own (gather: the root (n-1) s in, the others s out; scatter the reverse; s: a GPU's
part).
pxn: ranks/collectives/pxn.py's All2All on N nodes x G positions (a layout): a block for GPU (b, k), b
another node and k another position, goes first to the sender's node's GPU on position k, which passes
it on piece by piece (recv_copy_send through a scratch slot); the others go straight; each hop and
forward on its pair's own channel.
"""

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Callable, cast

from ..errors import PlanError
from ..reduction import Grid, blocks, channel_rings, chunks, ring_channel_count, tree_chunk, tree_parts, tree_steps
from .format import GpuProgram, Op, Plan, Ref
from .gc_pause import cyclic_gc_paused
from .hier import hier, hier_nvls, hier_pieces
from .in_switch import nvls, sharp
from .validate import validate


def _ring_steps(n: int, p: int, buf: str, reduce: bool) -> list[Op]:
    nxt, prv = (p + 1) % n, (p - 1) % n
    ops = []
    for s in range(n - 1):
        sent, taken = ((p - 1 - s) % n, (p - 2 - s) % n) if reduce else ((p - s) % n, (p - 1 - s) % n)
        ops.append(Op("send", src=Ref(buf, sent), send_to=nxt))
        ops.append(Op("recv_reduce" if reduce else "recv", dst=Ref(buf, taken), recv_from=prv))
        if reduce:
            ops.append(Op("flush"))
    if not reduce and n > 1:
        ops.append(Op("flush"))
    return ops


def ring_channels(gpus: int, layout: Grid | None, nbytes: int | None) -> int | None:
    """What ring's plan for a call of `nbytes` is built from: its channel count across nodes
    (fabric.reduction.ring_channel_count of the call's bytes and the positions per node) when `layout`
    is a grid of several nodes of equal rows; None (the one ring) otherwise or without a size."""
    if layout is None or nbytes is None or len(layout) < 2 or len({len(row) for row in layout}) != 1:
        return None
    return ring_channel_count(int(nbytes), len(layout[0]))


def _chain_pieces(gpus: int, layout: Grid | None, nbytes: int | None, itemsize: int,
                  chunk_bytes: int | None) -> tuple[int, int, int] | None:
    """What ring's broadcast across nodes is built from: (channels, elements, elements a message); None on
    one node, without a size or of no element (the one chain: it sends nothing)."""
    C = ring_channels(gpus, layout, nbytes)  # (None without a size: nbytes is an int below)
    if C is None or chunk_bytes is None or int(nbytes) < itemsize:  # type: ignore[arg-type]
        return None
    return C, int(nbytes) // itemsize, max(1, int(chunk_bytes) // itemsize)  # type: ignore[arg-type]


def _chain_plan(gpus: int, root: int, layout: Grid, C: int, count: int, piece: int) -> Plan:
    """ring.py's broadcast across nodes: part c = blocks(count, C)[c] (Plan.groups = C) down a chain along ring
    c (channel_rings of the grid) from the root, in messages of `piece` elements (Plan.piece), every
    channel's message i before any channel's message i + 1 (a member takes it from the one before it on
    ring c and passes it on at once), channel c on lane (c, C)."""
    n = gpus
    rings = channel_rings([list(row) for row in layout])[:C]
    spans = [chunks(lo, hi, piece) for lo, hi in blocks(count, C)]
    first = [sum(len(x) for x in spans[:c]) for c in range(C)]
    programs = []
    for g in range(n):
        ops = []
        for i in range(max(map(len, spans), default=0)):
            for c, ring in enumerate(rings):
                if i >= len(spans[c]):
                    continue
                q = ring.index(g)
                position, whole = (q - ring.index(root)) % n, Ref("o", first[c] + i)
                prv, nxt = ring[(q - 1) % n], ring[(q + 1) % n]
                ops.append(Op("send", channel=c, src=whole, send_to=nxt) if position == 0 else
                           Op("recv", channel=c, dst=whole, recv_from=prv) if position == n - 1 else
                           Op("recv_copy_send", channel=c, dst=whole, send_to=nxt, recv_from=prv))
        total = first[-1] + len(spans[-1])
        programs.append(GpuProgram(g, tuple(ops), total, total))
    return Plan("ring", "broadcast", n, tuple(programs), inplace=True, root=root, groups=C, lanes=C, piece=piece)


def _chain_reduce_plan(gpus: int, root: int, layout: Grid, C: int, count: int, piece: int) -> Plan:
    """ring.py's reduce across nodes: part c = blocks(count, C)[c] (Plan.groups = C) up a chain along ring c
    (channel_rings of the grid) from the root's successor to the root, in messages of `piece` elements
    (Plan.piece), every channel's message i before any channel's message i + 1: the chain's first member
    sends its own input, each next one folds its own into the partial it receives, partial (op) own
    (incoming_first), and passes it on, the root folds it into its output (its own input copied there
    first); channel c on lane (c, C)."""
    n = gpus
    rings = channel_rings([list(row) for row in layout])[:C]
    spans = [chunks(lo, hi, piece) for lo, hi in blocks(count, C)]
    first = [sum(len(x) for x in spans[:c]) for c in range(C)]
    total = first[-1] + len(spans[-1])
    programs = []
    for g in range(n):
        ops = [Op("copy", src=Ref("i", 0, total), dst=Ref("o", 0, total))] if g == root and total else []
        for i in range(max(map(len, spans), default=0)):
            for c, ring in enumerate(rings):
                if i >= len(spans[c]):
                    continue
                q = ring.index(g)
                position, mine = (q - ring.index(root) - 1) % n, Ref("i", first[c] + i)
                prv, nxt = ring[(q - 1) % n], ring[(q + 1) % n]
                ops.append(Op("send", channel=c, src=mine, send_to=nxt) if position == 0 else
                           Op("recv_reduce", channel=c, dst=Ref("o", first[c] + i), recv_from=prv,
                              incoming_first=True) if position == n - 1 else
                           Op("recv_reduce_send", channel=c, src=mine, send_to=nxt, recv_from=prv,
                              incoming_first=True))
        programs.append(GpuProgram(g, tuple(ops), total, total))
    return Plan("ring", "reduce", n, tuple(programs), root=root, groups=C, lanes=C, piece=piece)


def _channel_plan(gpus: int, collective: str, layout: Grid, C: int) -> Plan:
    """ring.py's channels across nodes (module docstring) for allreduce, reduce_scatter or allgather: C
    rings (fabric.reduction.channel_rings of the grid `layout`), every buffer in n C chunks, chunk m C + c
    member m's range of channel c (Plan.groups = n: fabric.reduction.rail_ranges), each channel on its own
    lane (Plan.lanes = C). Step s of every channel at once: their sends, then their receives
    (reduce-scatter: position q of ring c sends the chunk of member ring_c[q-1-s] to ring_c[q+1] and folds
    that of ring_c[q-2-s] from ring_c[q-1] into its own; all-gather: ring_c[q-s], ring_c[q-1-s]), a flush on
    every channel after each reduce-scatter step and after the all-gather."""
    n = gpus
    rings = channel_rings([list(row) for row in layout])[:C]
    where = [{m: q for q, m in enumerate(ring)} for ring in rings]
    flushes = [Op("flush", channel=c) for c in range(C)]
    refs = {buf: [Ref(buf, k) for k in range(n * C)] for buf in ("i", "o")}  # one Ref a chunk, shared

    def steps(g: int, buf: str, reduce: bool) -> list[Op]:
        ops: list[Op] = []
        append, chunk, kind = ops.append, refs[buf], "recv_reduce" if reduce else "recv"
        # per channel: (c, its ring, g's position q, the GPU at q + 1, at q - 1): the same every step
        places = [(c, ring, where[c][g], ring[(where[c][g] + 1) % n], ring[(where[c][g] - 1) % n])
                  for c, ring in enumerate(rings)]
        for s in range(n - 1):
            sent, taken = (1 + s, 2 + s) if reduce else (s, 1 + s)
            for c, ring, q, nxt, _ in places:
                append(Op("send", channel=c, src=chunk[ring[(q - sent) % n] * C + c], send_to=nxt))
            for c, ring, q, _, prv in places:
                append(Op(kind, channel=c, dst=chunk[ring[(q - taken) % n] * C + c], recv_from=prv))
            if reduce:
                ops += flushes
        return ops + ([] if reduce else flushes)

    programs = []
    for g in range(n):
        if collective == "allreduce":
            ops, chunks = steps(g, "o", True) + steps(g, "o", False), (n * C, n * C)
        elif collective == "reduce_scatter":
            ops, chunks = steps(g, "i", True) + [Op("copy", src=Ref("i", g * C, C), dst=Ref("o", 0, C))], (n * C, C)
        else:
            ops, chunks = [Op("copy", src=Ref("i", 0, C), dst=Ref("o", g * C, C))] + steps(g, "o", False), (C, n * C)
        programs.append(GpuProgram(g, tuple(ops), *chunks))
    return Plan("ring", collective, n, tuple(programs), inplace=collective == "allreduce", groups=n, lanes=C)


def ring(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
         channels: int | tuple[int, int, int] | None = None) -> Plan:
    """ring.py's one-node ring (module docstring) for allreduce, reduce_scatter, allgather, broadcast (from
    `root`) or reduce (to `root`); with `channels` (ring_channels: a grid `layout` of several nodes), its channels across nodes for
    allreduce, reduce_scatter or allgather (_channel_plan); broadcast's and reduce's chains across nodes with
    (channels, elements, elements a message) (_chain_pieces: _chain_plan, _chain_reduce_plan)."""
    n, programs = gpus, []
    if channels is not None and collective in ("allreduce", "reduce_scatter", "allgather"):
        return _channel_plan(n, collective, cast(Grid, layout), cast(int, channels))  # these three: a channel count
    if channels is not None and collective == "broadcast":  # (channels, elements, elements a message)
        return _chain_plan(n, root, cast(Grid, layout), *cast(tuple[int, int, int], channels))
    if channels is not None and collective == "reduce":  # (channels, elements, elements a message)
        return _chain_reduce_plan(n, root, cast(Grid, layout), *cast(tuple[int, int, int], channels))
    for p in range(n):
        if collective == "allreduce":
            ops, chunks = _ring_steps(n, p, "o", True) + _ring_steps(n, p, "o", False), (n, n)
        elif collective == "reduce_scatter":
            ops, chunks = _ring_steps(n, p, "i", True) + [Op("copy", src=Ref("i", p), dst=Ref("o", 0))], (n, 1)
        elif collective == "allgather":
            ops, chunks = [Op("copy", src=Ref("i", 0), dst=Ref("o", p))] + _ring_steps(n, p, "o", False), (1, n)
        elif collective == "broadcast":  # a chain root, root+1, ..., each piece passed on as soon as it is in
            position, nxt, prv = (p - root) % n, (p + 1) % n, (p - 1) % n
            whole = Ref("o", 0)
            ops = ([] if n == 1 else [Op("send", src=whole, send_to=nxt)] if position == 0 else
                   [Op("recv", dst=whole, recv_from=prv)] if position == n - 1 else
                   [Op("recv_copy_send", dst=whole, send_to=nxt, recv_from=prv)])
            chunks = (1, 1)
        elif collective == "reduce":  # a chain root+1, ..., root: each folds its own data into the partial
            position, nxt, prv = (p - root - 1) % n, (p + 1) % n, (p - 1) % n
            mine = Ref("i", 0)
            ops = ([Op("send", src=mine, send_to=nxt)] if position == 0 and n > 1 else
                   [Op("recv_reduce_send", src=mine, send_to=nxt, recv_from=prv, incoming_first=True)]
                   if position < n - 1 else
                   [Op("copy", src=mine, dst=Ref("o", 0))]
                   + ([Op("recv_reduce", dst=Ref("o", 0), recv_from=prv, incoming_first=True)] if n > 1 else []))
            chunks = (1, 1)
        else:
            raise PlanError(f"ring plan: no {collective}; ring builds allreduce, reduce_scatter, allgather, broadcast, "
                            f"reduce")
        programs.append(GpuProgram(p, tuple(ops), *chunks))
    return Plan("ring", collective, n, tuple(programs), inplace=collective in ("allreduce", "broadcast"), root=root)


def recursive_doubling(gpus: int, collective: str, root: int = 0, layout: Grid | None = None) -> Plan:
    """Recursive-doubling allreduce (module docstring) on a power-of-two GPU count."""
    n = gpus
    if collective != "allreduce":
        raise PlanError(f"recursive_doubling plan: no {collective}; it builds allreduce")
    if n < 1 or n & (n - 1):
        raise PlanError(f"recursive_doubling plan: {n} GPUs is not a power of two")
    programs = []
    for g in range(n):
        ops: list[Op] = []
        for k in range(n.bit_length() - 1):
            peer = g ^ (1 << k)
            ops += [Op("send", src=Ref("o", 0), send_to=peer), Op("recv", dst=Ref("s", 0), recv_from=peer),
                    Op("reduce", src=Ref("s", 0), dst=Ref("o", 0), deps=(len(ops) + 1,))]
        programs.append(GpuProgram(g, tuple(ops), 1, 1, 1))
    return Plan("recursive_doubling", "allreduce", n, tuple(programs), inplace=True)


def _direct_reduce(n: int, r: int, buf: str, out: Ref) -> list[Op]:
    """direct's reduce phase on GPU r: block r of every GPU's `buf` folded, in member order, into `out`."""
    ops = [Op("send", src=Ref(buf, (r + k) % n), send_to=(r + k) % n) for k in range(1, n)]
    ops += [Op("recv", dst=Ref("s", (r - k) % n), recv_from=(r - k) % n) for k in range(1, n)]
    mine = Ref(buf, r)
    if out == mine and r:  # in place: my own part is overwritten by GPU 0's first; keep it for its turn
        ops.append(Op("copy", src=mine, dst=Ref("s", r)))
        mine = Ref("s", r)
    if out != mine:
        ops.append(Op("copy", src=Ref("s", 0) if r else mine, dst=out))
    ops += [Op("reduce", src=mine if p == r else Ref("s", p), dst=out) for p in range(1, n)]
    return ops


def _direct_gather(n: int, r: int, own: Ref) -> list[Op]:
    """direct's broadcast phase on GPU r: its block `own` of "o" to every other GPU, then theirs."""
    ops = [Op("send", src=own, send_to=(r + k) % n) for k in range(1, n)]
    return ops + [Op("recv", dst=Ref("o", (r - k) % n), recv_from=(r - k) % n) for k in range(1, n)]


def _layout(n: int, layout: Grid | None, name: str) -> tuple[Grid, dict[int, tuple[int, int]]]:
    """(layout, at): the grid of `n` GPUs (layout[a]: node a's GPUs; default one node) and each GPU's (a, j)."""
    layout = layout or (tuple(range(n)),)
    at = {m: (a, j) for a, row in enumerate(layout) for j, m in enumerate(row)}
    if sorted(at) != list(range(n)) or len(at) != sum(map(len, layout)):
        raise PlanError(f"{name} plan: layout {layout} does not hold each of the {n} GPUs once")
    return layout, at


def _all2all_order(r: int, at: dict[int, tuple[int, int]], layout: Grid, sign: int) -> list[int]:
    """direct all2all's peers of GPU r = (a, j) (module docstring): sign +1 its send order, -1 its receive
    order. Step (d, e) is the GPU at position j + sign e of node a + sign d: the other nodes' steps (d =
    1, ..., N-1; e = 0, 1, ...) alternate with its own node's (d = 0; e = 1, 2, ...), one of each in turn,
    the other nodes' first. On a grid of N nodes x G GPUs, at each step every GPU sends one block and takes
    one (a Latin square), so every GPU's outbound and inbound share of its node's uplink carries one
    transfer after another from its first remote step to its last, and its own node's blocks cross its
    NVLink links between them: what posting every pair's transfer at once (NCCL) gives each share, under
    one transfer at a time per link (docs/model/time.md, "All2All across nodes"). One node: r + 1, r + 2,
    ...; from r - 1, r - 2, ...."""
    a, j = at[r]
    N, row = len(layout), layout[a]
    remote = [other[(j + sign * e) % len(other)] for d in range(1, N) for other in [layout[(a + sign * d) % N]]
              for e in range(len(other))]
    local = [row[(j + sign * e) % len(row)] for e in range(1, len(row))]
    out = []
    for i in range(max(len(remote), len(local))):
        out += remote[i:i + 1] + local[i:i + 1]
    return out


def direct(gpus: int, collective: str, root: int = 0, layout: Grid | None = None) -> Plan:
    """direct.py's schedules (module docstring) for allreduce, reduce_scatter, allgather, broadcast, reduce,
    gather, scatter; all2all
    on the grid `layout` (layout[a]: node a's GPUs; default one node: its order, _all2all_order)."""
    n, programs = gpus, []
    if collective == "all2all":
        layout, at = _layout(n, layout, "direct")
    for r in range(n):
        if collective == "reduce_scatter":
            ops, chunks = _direct_reduce(n, r, "i", Ref("o", 0)), (n, 1, n)
        elif collective == "allreduce":
            ops = _direct_reduce(n, r, "o", Ref("o", r)) + [Op("flush")] + _direct_gather(n, r, Ref("o", r))
            chunks = (n, n, n)
        elif collective == "allgather":
            ops, chunks = [Op("copy", src=Ref("i", 0), dst=Ref("o", r))] + _direct_gather(n, r, Ref("o", r)), (1, n, 0)
        elif collective == "broadcast":
            if r == root:
                ops = [Op("send", src=Ref("o", 0), send_to=(root + k) % n) for k in range(1, n)]
            else:
                ops = [Op("recv", dst=Ref("o", 0), recv_from=root)]
            chunks = (1, 1, 0)
        elif collective == "reduce":  # reduce_scatter's phase, then every block to the root, from root+1, ...
            ops = _direct_reduce(n, r, "i", Ref("o", r)) + [Op("flush")]
            ops += ([Op("send", src=Ref("o", r), send_to=root)] if r != root else
                    [Op("recv", dst=Ref("o", (root + k) % n), recv_from=(root + k) % n) for k in range(1, n)])
            chunks = (n, n, n)
        elif collective == "gather":  # every block straight to the root, which takes them from root+1, ...
            ops = ([Op("send", src=Ref("i", 0), send_to=root)] if r != root else
                   [Op("copy", src=Ref("i", 0), dst=Ref("o", root))]
                   + [Op("recv", dst=Ref("o", (root + k) % n), recv_from=(root + k) % n) for k in range(1, n)])
            chunks = (1, n, 0)
        elif collective == "scatter":  # the root sends block root+1, root+2, ... to its GPU, then keeps its own
            ops = ([Op("recv", dst=Ref("o", 0), recv_from=root)] if r != root else
                   [Op("send", src=Ref("i", (root + k) % n), send_to=(root + k) % n) for k in range(1, n)]
                   + [Op("copy", src=Ref("i", root), dst=Ref("o", 0))])
            chunks = (n, 1, 0)
        elif collective == "all2all":  # all2all.py's pairwise exchange, in _all2all_order's steps (layout: _layout's)
            ops = ([Op("send", src=Ref("i", p), send_to=p) for p in _all2all_order(r, at, layout, +1)]  # type: ignore[arg-type]
                   + [Op("copy", src=Ref("i", r), dst=Ref("o", r))]
                   + [Op("recv", dst=Ref("o", p), recv_from=p) for p in _all2all_order(r, at, layout, -1)])  # type: ignore[arg-type]
            chunks = (n, n, 0)
        else:
            raise PlanError(f"direct plan: no {collective}; direct builds allreduce, reduce_scatter, allgather, "
                            f"broadcast, reduce, gather, scatter, all2all")
        programs.append(GpuProgram(r, tuple(ops), *chunks))
    return Plan("direct", collective, n, tuple(programs), inplace=collective in ("allreduce", "broadcast"), root=root)


def pxn(gpus: int, collective: str, root: int = 0, layout: Grid | None = None) -> Plan:
    """pxn.py's All2All (module docstring) on the grid `layout` (layout[a][j]: the GPU at node a,
    position j; default one node)."""
    n = gpus
    if collective != "all2all":
        raise PlanError(f"pxn plan: no {collective}; pxn builds all2all")
    layout = layout or (tuple(range(n)),)
    N, G = len(layout), len(layout[0])
    at = {m: (a, j) for a, row in enumerate(layout) for j, m in enumerate(row)}
    if sorted(at) != list(range(n)) or any(len(row) != G for row in layout):
        raise PlanError(f"pxn plan: layout {layout} is not a grid of the {n} GPUs")
    programs = []
    for r in range(n):
        a, j = at[r]
        ops = []
        for shift in range(1, n):  # a shifted order spreads the load, as all2all.py's
            p = (r + shift) % n
            b, k = at[p]
            if b == a or k == j:
                ops.append(Op("send", src=Ref("i", p), send_to=p))
            else:  # to my node's GPU on p's rail, which passes it on (channel: the pair's own)
                ops.append(Op("send", channel=1 + r * n + p, src=Ref("i", p), send_to=layout[a][k]))
        slot = 0
        for k in range(G):  # as the proxy of my node's other positions, for the other nodes' GPUs on my rail
            for b in range(N):
                if k != j and b != a:
                    source, dest = layout[a][k], layout[b][j]
                    ops.append(Op("recv_copy_send", channel=1 + source * n + dest, dst=Ref("s", slot),
                                  recv_from=source, send_to=dest))
                    slot += 1
        ops.append(Op("copy", src=Ref("i", r), dst=Ref("o", r)))
        for shift in range(1, n):
            p = (r - shift) % n
            b, k = at[p]
            if b == a or k == j:
                ops.append(Op("recv", dst=Ref("o", p), recv_from=p))
            else:
                ops.append(Op("recv", channel=1 + p * n + r, dst=Ref("o", p), recv_from=layout[b][j]))
        programs.append(GpuProgram(r, tuple(ops), n, n, slot))
    return Plan("pxn", "all2all", n, tuple(programs))


def tree_pieces(gpus: int, layout: Grid | None, nbytes: int | None, itemsize: int,
                chunk_bytes: int | None) -> tuple[int, int] | None:
    """What tree's plan for a call of `nbytes` in elements of `itemsize` bytes is built from: (elements,
    elements a piece: fabric.reduction.tree_chunk of the fabric's chunk_bytes); None without them."""
    if nbytes is None or chunk_bytes is None:
        return None
    return int(nbytes) // itemsize, tree_chunk(int(chunk_bytes), itemsize)


def tree(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
         pieces: tuple[int, int] | None = None) -> Plan:
    """ranks/collectives/tree.py's allreduce (NCCL's double binary tree, fabric.reduction.tree_parts) on the
    grid `layout` for `pieces` = (elements, elements a piece) (tree_pieces): the buffer in two parts, each
    in the pipeline's pieces (Plan.groups = 2, Plan.piece), the input reduced in a copy ("i") and the result
    landing in the output ("o"; the root copies its part's sum there). At step s a member reduces piece
    s - up of each part (up: its height; fabric.reduction.tree_steps): takes each child's partial in fold
    order and folds it into its own, sends the result to its parent, or, the root, down to its children;
    then passes piece s - down on (down: the tree's height + its depth): takes it from its parent, sends
    it to each child. Channel 2 d + k: direction d (0 up, 1 down) of part k, so that a pair's up and down
    messages of either part never match each other."""
    if collective != "allreduce":
        raise PlanError(f"tree plan: no {collective}; tree builds allreduce")
    if pieces is None:
        raise PlanError("tree plan: it is built for a call's size (nbytes, itemsize and chunk_bytes)")
    layout, at = _layout(gpus, layout, "tree")
    N, G = len(layout), len(layout[0])
    if any(len(row) != G for row in layout):
        raise PlanError(f"tree plan: layout {layout} is not a grid of the {gpus} GPUs")
    count, piece = pieces
    parts = tree_parts(N, G)
    spans = [chunks(lo, hi, piece) for lo, hi in blocks(count, len(parts))]
    first = [0, len(spans[0])]  # part k's chunk i is chunk first[k] + i
    total = len(spans[0]) + len(spans[1])
    inputs, outputs = ([Ref(buf, k) for k in range(total)] for buf in ("i", "o"))  # one Ref a chunk, shared
    programs = []
    for g in range(gpus):
        # each part: (k, up, down, chunks, first chunk, parent's GPU or None, children's GPUs in fold order)
        trees = [(k, up, down, len(spans[k]), first[k], None if parent is None else layout[parent[0]][parent[1]],
                  [layout[b][c] for b, c in children])
                 for k, ((parent, children), (up, down)) in enumerate(zip((part[at[g]] for part in parts),
                                                                        tree_steps(parts, at[g])))]
        # Op(kind, channel, src, dst, send_to, recv_from) by position: names cost 25% more an operation (2 million)
        ops: list[Op] = []
        steps = max((cnt + down for _, _, down, cnt, *_ in trees), default=0)
        for step in range(steps):
            for k, up, _, cnt, base, parent, children in trees:  # up
                i = step - up
                if not 0 <= i < cnt:
                    continue
                mine = inputs[base + i]
                ops += [Op("recv_reduce", k, None, mine, None, x) for x in children]
                if parent is not None:
                    ops.append(Op("send", k, mine, None, parent))
                else:
                    ops += [Op("send", 2 + k, mine, None, x) for x in children]
            for k, _, down, cnt, base, parent, children in trees:  # down
                i = step - down
                if parent is None or not 0 <= i < cnt:
                    continue
                result = outputs[base + i]
                ops.append(Op("recv", 2 + k, None, result, None, parent))
                ops += [Op("send", 2 + k, result, None, x) for x in children]
        for k, _, _, cnt, base, parent, _ in trees:  # the root's part: its sum is the result
            if parent is None and cnt:
                ops.append(Op("copy", src=Ref("i", base, cnt), dst=Ref("o", base, cnt)))
        programs.append(GpuProgram(g, tuple(ops), total, total))
    return Plan("tree", "allreduce", gpus, tuple(programs), groups=2, piece=piece)


# what a plan of a sized algorithm is built from (SIZED, in_switch.shape): ring's channel count or its chain's
# (channels, elements, elements a message), tree's and hier's pieces, the in-switch algorithms' shape; None: no size
Shape = int | tuple[Any, ...] | None
# every builder takes (gpus, collective, root, layout[, shape]); their own extra argument differs (_build)
ALGORITHMS: dict[str, Callable[..., Plan]] = {
              "ring": ring, "recursive_doubling": recursive_doubling, "direct": direct, "pxn": pxn, "tree": tree,
              "hier": hier, "hier_nvls": hier_nvls, "sharp": sharp, "nvls": nvls}
# sharp, nvls, hier_nvls: built from the fabric's config too (in_switch.shape, hier.hier_nvls_pieces: build's shape=)
# the algorithms whose plan depends on the call's size: function (gpus, collective, layout, nbytes) -> what
# the plan is built from (passed on as its fifth argument; None: the plan of no size)
# a SIZED function's arguments: (gpus, collective, layout, nbytes, itemsize, chunk_bytes)
Sized = Callable[[int, str, Grid | None, int | None, int, int | None], Shape]
SIZED: dict[str, Sized] = {"ring": lambda gpus, collective, layout, nbytes, itemsize, chunk_bytes: (
    ring_channels(gpus, layout, nbytes) if collective in ("allreduce", "reduce_scatter", "allgather") else
    _chain_pieces(gpus, layout, nbytes, itemsize, chunk_bytes) if collective in ("broadcast", "reduce") else None),
    "tree": lambda gpus, collective, layout, nbytes, itemsize, chunk_bytes: tree_pieces(gpus, layout, nbytes, itemsize,
                                                                                        chunk_bytes),
    "hier": lambda gpus, collective, layout, nbytes, itemsize, chunk_bytes: hier_pieces(gpus, layout, nbytes, itemsize,
                                                                                        chunk_bytes)}


def build(algorithm: str, gpus: int, collective: str, root: int = 0, layout: Grid | None = None, nbytes: int | None = None,
          itemsize: int = 4, chunk_bytes: int | None = None, shape: Shape = None) -> Plan:
    """The validated plan of `algorithm` for `collective` on `gpus` GPUs (rooted collectives: from
    `root`; pxn, direct's all2all and ring across nodes: on the grid `layout`, a tuple of nodes' tuples of
    GPUs; ring across nodes: for a call of `nbytes`, the buffer's bytes as fabric.replay takes them; tree:
    on the grid, for a call of `nbytes` in elements of `itemsize` bytes on a fabric of `chunk_bytes`;
    PlanError if it has none); built and validated once per arguments and what the size decides (SIZED:
    ring's channel count; tree's elements and piece), not once per size: plans are immutable. shape: what
    an algorithm sized by the fabric's config is built from, given (the in-switch ones: in_switch.shape)."""
    sized = SIZED.get(algorithm)
    if shape is None and sized is not None:
        shape = sized(int(gpus), collective, layout, nbytes, int(itemsize), chunk_bytes)
    return _build(algorithm, int(gpus), collective, int(root), layout, shape)  # one cache key however called


# built plans, newest last, kept by what they cost: at most KEPT_PLANS of them and KEPT_OPERATIONS operations
# over all (an operation with its chunk references, tables and walks ~250 bytes: hier's plan at 32 x 8 and 1
# GiB, 4.2 million operations, holds ~1 GB, and a sweep of sizes builds one a size); the newest is always kept.
# The budget holds what `model --algorithm auto` builds for one size at 256 GPUs (ring's, tree's and hier's
# plans: 8.8 million operations), which it asks for again after the bounds.
KEPT_PLANS, KEPT_OPERATIONS = 256, 12_000_000
_kept: dict[tuple[str, int, str, int, Grid | None, Shape], tuple[Plan, int]] = {}  # key -> (plan, its operations), least recently used first


def _build(algorithm: str, gpus: int, collective: str, root: int, layout: Grid | None, shape: Shape) -> Plan:
    key = (algorithm, gpus, collective, root, layout, shape)
    hit = _kept.pop(key, None)
    if hit is None:
        if algorithm not in ALGORITHMS:
            raise PlanError(f"no plan algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
        args = (gpus, collective, root, layout) + (() if shape is None else (shape,))
        with cyclic_gc_paused():  # millions of operations at scale, no cycle among them (gc_pause)
            plan = validate(ALGORITHMS[algorithm](*args))
        hit = (plan, sum(len(program.ops) for program in plan.programs))
    _kept[key] = hit  # the most recently used, last
    total = sum(cost for _, cost in _kept.values())
    while len(_kept) > 1 and (len(_kept) > KEPT_PLANS or total > KEPT_OPERATIONS):
        total -= _kept.pop(next(iter(_kept)))[1]
    return hit[0]


def uniform_count(counts: Sequence[Sequence[int]]) -> int | None:
    """The one count of an all2allv count matrix whose every entry is the same (all2all's equal blocks:
    they run direct's all2all plan, its grid order across nodes), else None."""
    first = counts[0][0] if len(counts) and len(counts[0]) else None
    return first if first is not None and all(x == first for row in counts for x in row) else None


def all2allv_plan(counts: Sequence[Sequence[int]], layout: Grid | None = None) -> tuple[Plan, int | None]:
    """The plan one all2allv call runs, and the elements of each GPU's send buffer it runs on: equal blocks
    (uniform_count) run direct's all2all on `layout` (the communicator's grid across nodes, None on one
    node) over n x the block; other counts the call's own plan (all2allv), which sizes its chunks (None).
    The ranks (ranks/collectives/all2all.py), the replay and cost_nodes all take it from here."""
    each = uniform_count(counts)
    if each is None:
        return all2allv(counts), None
    return build("direct", len(counts), "all2all", layout=layout), len(counts) * each


def all2allv(counts: Sequence[Sequence[int]]) -> Plan:
    """The validated plan of one all2allv call: counts[i][j] elements GPU i sends GPU j (the diagonal: copied
    locally), blocks packed in GPU order in both buffers. direct's one-node All2All (block r+k to GPU r+k,
    k = 1..n-1, its own copied, then block p from p = r-1, r-2, ...: all2all.py's order for uneven blocks,
    on one node or several) with each GPU's chunks sized by its row (input) and column (output); built and
    validated once per count matrix (a call's counts are data, not a plan's chunking)."""
    matrix = tuple(tuple(int(x) for x in row) for row in counts)
    if not matrix or any(len(row) != len(matrix) for row in matrix):
        raise PlanError(f"all2allv plan: counts must be a square matrix, got {len(matrix)} rows of "
                        f"{sorted({len(row) for row in matrix})} counts")
    return _all2allv(matrix)


# a plan per count matrix costs O(n^2) to build and check and holds ~20 MB at 256 GPUs (the review of issue
# 26: 1.3 MB at 64): a few are kept, for the workloads that repeat their counts
@functools.lru_cache(maxsize=8)
def _all2allv(matrix: tuple[tuple[int, ...], ...]) -> Plan:
    n = len(matrix)
    plan = build("direct", n, "all2all")  # the exchange, validated once per GPU count; sized here
    programs = tuple(dataclasses.replace(program, elements=(matrix[r], tuple(row[r] for row in matrix), ()))
                     for r, program in enumerate(plan.programs))
    return validate(dataclasses.replace(plan, programs=programs))


def grid(nodes: int, gpus_per_node: int) -> tuple[tuple[int, ...], ...]:
    """The layout of a fabric's GPUs (GPU a G + j at node a, position j)."""
    return tuple(tuple(a * gpus_per_node + j for j in range(gpus_per_node)) for a in range(nodes))
