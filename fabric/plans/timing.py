"""The replay interpreter of plans: a validated plan timed on fabric.replay's link clocks, and its
per-link bytes summed from its messages.

Sizes as fabric.replay takes them: S bytes (allreduce, broadcast, reduce: the buffer; all2all: each
GPU's send buffer; reduce_scatter: the input; allgather: the output; gather: the root's output, scatter:
the root's input, n x each GPU's part), elements of `itemsize` bytes.
Buffer b of a GPU holds count_b elements, cut into its chunks by fabric.reduction.blocks; an operation's
run of chunks is one element range, sent as messages of at most config.chunk_bytes of whole elements
(ranks/collectives/ring.py's chunking). Program order: an operation's receives, then its sends; a flush
waits until the GPU's uplink is free, and every program ends with one; a flush is put before an
operation that writes a chunk an unflushed send reads (with_flushes). Local copies and reductions take no modeled time (as in the
ranks: fabric.replay models the links only).
"""


from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FabricError, PlanError
from ..packets import raw_bytes
from ..reduction import chunks
from ..programs import JOIN, Event, Fabric, Flush, Lane, Program, Recv, Send, run_programs
from ..topology import Topology
from ..switch_clocks import OneSwitch, TwoLevelSwitches
from .chunks import misfit, on_plan, span, spans
from .timing_leaf import leaf_plan_ns
from .format import (CREDITS, IN_SWITCH, RECVS, SENDS, SWITCH_TAKES, Op, Plan, Ref, in_switch, load_requests,
                     switch_slots, walk)

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from ..config import FabricConfig

# walk's visitors below take `op` as Any: the kind says which of src, dst, send_to and recv_from are set (the
# validator checked it), which mypy cannot tie; a cast or an assert per field would cost a call per operation


def with_flushes(plan: Plan, g: int) -> tuple[Op, ...]:
    """GPU g's operations with a flush put before any that writes a chunk a send not yet flushed reads
    (a send's data is not copied: ranks/collectives/plan.py sends views of the buffers, as ring.py does),
    so that both interpreters run the same program. In place, "o" and "i" are one buffer. Kept on the
    plan, one tuple per GPU (every replay of the plan, at any size, runs the same); read-only."""
    kept: dict[int, tuple[Op, ...]] = plan.__dict__.setdefault("_with_flushes", {})
    if g not in kept:
        ops, flushed = plan.programs[g].ops, _with_flushes(plan, g)
        # the program's own tuple when no flush was added (most plans' GPUs): no second copy to keep
        kept[g] = ops if len(flushed) == len(ops) else tuple(flushed)
    return kept[g]


_WRITES = frozenset(("recv", "recv_reduce", "recv_copy_send", "recv_reduce_copy_send", "copy", "reduce"))
_READ_BY_SEND = {"send": "src", "recv_copy_send": "dst", "recv_reduce_copy_send": "dst"}  # what a send's data is


def _with_flushes(plan: Plan, g: int) -> list[Op]:
    """with_flushes' list: a flush on each channel (in channel order) with an unflushed send that reads a
    chunk the operation writes; without lanes one flush (channel 0) for all. A chunk is an int key (chunk
    << 2 | buffer) and the channels reading it a bit set: no tuple or set a send (2.6 million operations at
    256 GPUs)."""
    inplace, lanes = plan.inplace, plan.lanes > 1  # on lanes a flush waits for its channel's sends only
    held: dict[int, list[int]] = {}       # channel (0 without lanes) -> the chunk keys its sends read
    readers: dict[int, int] = {}          # chunk key -> the bit set of channels whose unflushed sends read it
    out: list[Op] = []
    append = out.append
    buffer_of = {"i": 0, "o": 1, "s": 2}
    if inplace:
        buffer_of["o"] = 0  # "o" and "i" are one buffer

    def flushed(c: int) -> None:
        keep = ~(1 << c)
        for key in held.pop(c, ()):
            bits = readers.get(key)
            if bits is not None:
                bits &= keep
                if bits:
                    readers[key] = bits
                else:
                    del readers[key]

    op: Any  # an Op: Any, as the visitors' (its kind says which refs are set; a cast per use costs a call)
    for op in plan.programs[g].ops:
        kind = op.kind
        if readers and kind in _WRITES:
            dst = op.dst  # a writing kind names its destination
            b = buffer_of[dst.buf]
            if dst.cnt == 1:  # one chunk (the commonest), without the loop
                hit = readers.get(dst.off << 2 | b, 0)
            else:
                hit = 0
                for k in range(dst.off, dst.off + dst.cnt):
                    hit |= readers.get(k << 2 | b, 0)
            c = 0
            while hit:
                if hit & 1:
                    append(Op("flush", channel=c))
                    flushed(c)
                hit >>= 1
                c += 1
        append(op)
        if kind == "flush":
            flushed(op.channel if lanes else 0)
        elif kind in _READ_BY_SEND:
            ref = op.src if kind == "send" else op.dst  # a kind sends read names it
            c = op.channel if lanes else 0
            b, bit = buffer_of[ref.buf], 1 << c
            keys = held.get(c)
            if keys is None:
                keys = held[c] = []
            if ref.cnt == 1:  # one chunk (the commonest), without the loop
                key = ref.off << 2 | b
                keys.append(key)
                readers[key] = readers.get(key, 0) | bit
                continue
            for k in range(ref.off, ref.off + ref.cnt):
                key = k << 2 | b
                keys.append(key)
                readers[key] = readers.get(key, 0) | bit
    return out


def lane_of(plan: Plan) -> Callable[[int], Lane | None]:
    """channel -> its lane (c, C) on the link clocks (fabric.programs), None without lanes (Plan.lanes)."""
    C = plan.lanes
    return (lambda c: (c, C)) if C > 1 else (lambda c: None)


# kind -> 1 receives, 2 sends, 3 (1 | 2) receives and sends on, 4 a flush; the others time nothing
_ROLE = {kind: (1 if kind in RECVS else 0) | (2 if kind in SENDS else 0) for kind in RECVS + SENDS} | {"flush": 4}


def messages(plan: Plan, S: int, itemsize: int, chunk: int) -> dict[int, Program]:
    """Per GPU, its program for fabric.programs.run_programs: Recv(peer, key), Send(peer, key, nbytes),
    Flush() in plan order; key (channel, message number on that channel and pair, piece).
    An operation that receives and sends on (rrs, rcs, rrcs) is pipelined piece by piece: piece k is
    sent on as soon as it is in (as a chain forwards it, and MSCCL's runtime does, slice by slice).
    A plan whose channels run on lanes (Plan.lanes) gives every operation its channel's lane and ends
    with a flush on every lane and a Join (ranks/collectives/plan.py: the same)."""
    lane_at = lane_of(plan)
    lanes = [lane_at(c) for c in range(plan.lanes)] if plan.lanes > 1 else None
    flushes = [Flush(lane) for lane in lanes] if lanes else None
    new = tuple.__new__  # a record's own __new__ is a Python call, 8x slower (a message each, millions)
    pieces: dict[tuple[int, int], list[int]] = {}  # element range -> its messages' bytes (every GPU's: read-only)

    def program(g: int) -> Program:
        table = spans(plan, S, itemsize, g)
        # channel n + peer -> the last message number on that channel and pair
        sent: dict[int, int] = {}
        taken: dict[int, int] = {}
        op: Any  # an Op: Any, as the visitors' (above)
        # a chunk run -> its messages' bytes, by the Ref's id (the plan holds its Refs, and builders share
        # them between operations: one dict look-up an operation); by element range in `pieces`
        by_ref: dict[int, list[int]] = {}
        role_of, n_gpus = _ROLE.get, plan.gpus
        for op in with_flushes(plan, g):
            role = role_of(op.kind)
            if role is None:
                continue  # local: no modeled time
            if role == 4:
                yield flushes[op.channel] if flushes else _FLUSH
                continue
            channel = op.channel
            lane = lanes[channel] if lanes else None
            if role & 1:  # receives
                key = channel * n_gpus + op.recv_from
                m = taken[key] = taken.get(key, -1) + 1
                ref = op.dst if op.dst is not None else op.src
            else:
                ref = op.src
            if role & 2:  # sends
                key = channel * n_gpus + op.send_to
                n = sent[key] = sent.get(key, -1) + 1
            sizes = by_ref.get(id(ref))
            if sizes is None:
                rows = table[ref.buf]
                where = (rows[ref.off][0], rows[ref.off + ref.cnt - 1][1])
                sizes = pieces.get(where)
                if sizes is None:
                    sizes = pieces[where] = [(hi - lo) * itemsize for lo, hi in chunks(*where, chunk)]
                by_ref[id(ref)] = sizes
            if role == 1:
                frm = op.recv_from
                if len(sizes) == 1:  # one piece (most): no range or enumerate an operation, 0.3 s at 2.6 million
                    yield new(Recv, (frm, (channel, m, 0), lane))
                else:
                    for k in range(len(sizes)):
                        yield new(Recv, (frm, (channel, m, k), lane))
            elif role == 2:
                to = op.send_to
                if len(sizes) == 1:
                    yield new(Send, (to, (channel, n, 0), sizes[0], lane))
                else:
                    for k, nbytes in enumerate(sizes):
                        yield new(Send, (to, (channel, n, k), nbytes, lane))
            else:  # forwarded at once (a recv_*_send sends what it received into)
                frm, to = op.recv_from, op.send_to
                for k, nbytes in enumerate(sizes):
                    yield new(Recv, (frm, (channel, m, k), lane))
                    yield new(Send, (to, (channel, n, k), nbytes, lane))
        if flushes:  # every channel's sends have left; the GPU's clock is the latest channel's
            yield from flushes
            yield JOIN
        else:
            yield _FLUSH  # a call returns once its sends have left (ranks/collectives/plan.py)

    return {g: program(g) for g in range(plan.gpus)}


_FLUSH = Flush()


def _check(plan: Plan, topo: Topology, config: "FabricConfig") -> None:
    if topo.gpus != plan.gpus:
        raise PlanError(f"plan {plan.name!r} is for {plan.gpus} GPUs, the fabric has {topo.gpus}")
    if config.mode not in plan.fabrics:
        raise PlanError(f"plan {plan.name!r} runs on {', '.join(plan.fabrics)} fabrics, not {config.mode!r}")


def plan_ns(plan: Plan, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
            events: list[Event] | None = None, partial_itemsize: int | None = None) -> float:
    """Modeled ns of one call of `plan` (validated) on every GPU of `topo`, all starting at 0: the latest
    GPU's clock at the end, as fabric.replay.replay_ns. events: if given, gets the timeline
    fabric.programs.run_programs records (GPU, "send"/"recv"/"wait", peer, start_ns, end_ns). A plan of
    in-switch operations: switch_plan_ns (partial_itemsize: the bytes of an element of a leaf's partial); a
    leaf plan (Plan.leaf): fabric.plans.timing_leaf.leaf_plan_ns."""
    if plan.leaf:  # timed with this module's chunk tables and flushes
        return leaf_plan_ns(plan, topo, config, itemsize, [spans(plan, S, itemsize, g) for g in range(plan.gpus)],
                            [with_flushes(plan, g) for g in range(plan.gpus)])
    if in_switch(plan):
        return switch_plan_ns(plan, topo, S, config, itemsize, partial_itemsize)
    _check(plan, topo, config)
    chunk = max(1, config.chunk_bytes // itemsize)
    fabric = Fabric(topo, config.mtu_bytes, config.header_bytes)

    # a validated plan waits for ever only where its chunks misfit at S: say where
    def stuck(waiting: dict[int, Recv]) -> Exception:
        problem = misfit(plan, S, itemsize)
        if problem is not None:
            return PlanError(problem)
        return FabricError(f"plan {plan.name!r}: {plan.collective} on {plan.gpus} GPUs waits for ever: GPUs "
                           f"{sorted(waiting)} wait for what nobody sends (a plan fabric.plans.validate refuses)")

    return run_programs(fabric, messages(plan, S, itemsize, chunk), stuck, events)


def switch_plan_ns(plan: Plan, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                   partial_itemsize: int | None = None) -> float:
    """Modeled ns of one call of a plan of in-switch operations (validated) on every GPU of `topo` (one node,
    or several nodes and spines), all starting at 0, the plan's schedule booked on the switches' clocks
    (fabric.switch_clocks: OneSwitch, the leaf's, on one node; TwoLevelSwitches across nodes: what the
    switches do with it). Every GPU's load_reduce requests
    are booked on its uplink first, in its program order (issued at the call's start); then the plan's
    symbolic run (format.walk) books, each GPU in its program order: a switch_contribute on its uplink (a
    push's from the call's start; an answer to a load_reduce once that request's LOAD came down its
    downlink) and its part of its node's partial toward the spine slot[-1] mod P (partial_itemsize: the
    bytes of an element of a leaf's partial, default itemsize); a slot's last contribution has the
    switches reduce it and send the result down to the nodes of the GPUs it goes to; a multicast_store from
    the GPU's clock, up to spine (GPU + slot[-1]) mod P and down to every other node; a switch_recv on its
    downlink, its clock then at the last byte; a flush, its clock at its uplink's last byte; a copy or a
    reduction, no modeled time. The call ends once every uplink is free. A chunk of no element is neither
    sent nor taken."""
    # one node: the leaf's engine and ports (OneSwitch); several: leaves and spines (TwoLevelSwitches)
    clocks: OneSwitch | TwoLevelSwitches = (OneSwitch if topo.nodes == 1 else TwoLevelSwitches)(topo, config,
                                                                                                 plan.name)
    _check(plan, topo, config)
    if not _switch_timed(plan):
        raise PlanError(f"plan {plan.name!r}: in-switch operations are timed in plans of in-switch and local "
                        f"operations only (no lanes, no point-to-point messages)")
    n, wide = plan.gpus, partial_itemsize or itemsize
    tables = [spans(plan, S, itemsize, g) for g in range(n)]
    mtu, headers = config.mtu_bytes, config.header_bytes
    # elements -> (raw bytes of them, of their partial: packets.raw_bytes): a call has a few sizes of chunk
    sizes: dict[int, tuple[int, int]] = {}

    def raw(elements: int) -> tuple[int, int]:
        out = sizes[elements] = (raw_bytes(elements * itemsize, mtu, headers), raw_bytes(elements * wide, mtu, headers))
        return out

    header = raw_bytes(0, mtu, headers)
    puts = switch_slots(plan)
    node_of = [topo.locate(g)[0] for g in range(n)]
    every_node = sorted(set(node_of))  # where a result every GPU takes goes
    requests: dict[tuple[int, ...], tuple[float, float]] = {}  # a load_reduce's slot -> its request's stamps
    asks = sorted(ask for asking in load_requests(plan).values() for ask in asking)  # (GPU, step): GPU, program order
    for g, step in asks:
        asking = plan.programs[g].ops[step]
        lo, hi = span(tables[g], asking.src)
        if hi > lo:  # a chunk of no element is not asked for
            requests[asking.slot] = clocks.request(g, header)
    # a slot's contributions so far (the clocks' pool), until the last one has the switches reduce it
    pools: dict[tuple[int, ...], list[float]] = {}
    results: dict[tuple[int, ...], dict[int, tuple[float, float]]] = {}
    contribute, take, load, new_pool = clocks.contribute, clocks.take, clocks.load, clocks.pool
    takes = frozenset(SWITCH_TAKES)

    def visit(g: int, step: int, op: Any, message: Any) -> None:
        kind = op.kind
        # span(tables[g], ref) and raw, written out: the hot path (an operation per GPU per chunk)
        if kind == "switch_contribute":
            ref = op.src
            chunk = tables[g][ref.buf]
            elements = chunk[ref.off + ref.cnt - 1][1] - chunk[ref.off][0]
            if not elements:
                return None
            slot = op.slot
            asked = requests.get(slot)
            at = 0.0 if asked is None else load(g, asked, op.send_to, header)
            pool = pools.get(slot)
            if pool is None:
                pool = pools[slot] = new_pool()
            whole, partial = sizes.get(elements) or raw(elements)
            contribute(pool, g, whole, partial, slot[-1], at)
            if pool[0] == len(puts[slot]):  # the slot's last contribution: the switches reduce it
                del pools[slot]
                if pool[0] != n:
                    raise PlanError(f"plan {plan.name!r}: slot {list(slot)} has {int(pool[0])} contributions; an "
                                    f"in-switch reduction across nodes is timed with every GPU's ({n})")
                to = every_node if op.send_to is None else [node_of[op.send_to]]
                results[slot] = clocks.reduce(slot[-1], pool, whole, partial, to)
        elif kind in takes:
            ref = op.dst
            chunk = tables[g][ref.buf]
            elements = chunk[ref.off + ref.cnt - 1][1] - chunk[ref.off][0]
            if elements:
                take(g, results[op.slot][node_of[g]], (sizes.get(elements) or raw(elements))[0])
        elif kind == "multicast_store":
            lo, hi = span(tables[g], op.src)
            if hi > lo:
                results[op.slot] = clocks.store(g, raw(hi - lo)[0], g + op.slot[-1])
        elif kind == "flush":  # its sends so far have left (local copies and reductions take no modeled time)
            clocks.gpus[g].now = max(clocks.gpus[g].now, clocks.gpus[g].uplink.free_ns)
        return None

    walk(plan, visit)
    return clocks.end_ns()


def _switch_timed(plan: Plan) -> bool:
    """Whether switch_plan_ns times `plan`: no lanes, in-switch and local operations only; kept on the plan
    (a plan is immutable), each distinct program looked at once (sharp's allreduce: one for every GPU)."""
    kept = plan.__dict__.get("_switch_timed")
    if kept is None:
        programs = {id(program.ops): program.ops for program in plan.programs}.values()
        kept = plan.__dict__["_switch_timed"] = plan.lanes <= 1 and all(
            op.kind in _SWITCH or op.kind in _BESIDE_SWITCH for ops in programs for op in ops)
    return bool(kept)


_SWITCH = frozenset(IN_SWITCH)
_BESIDE_SWITCH = frozenset(("flush", "nop", "copy", "reduce") + CREDITS)  # what else an in-switch plan may hold


def plan_link_bytes(plan: Plan, topo: Topology, S: int, config: "FabricConfig",
                    itemsize: int = 4) -> dict[str, tuple[int, int]]:
    """link name -> (payload bytes, raw bytes) the plan's messages put on it (every link of each
    message's route, fabric.topology.Topology.route), summed from the plan. Not for in-switch operations
    (PlanError): what crosses the switches' cables is theirs (fabric.cost_nodes.link_bytes counts it)."""
    if in_switch(plan):
        raise PlanError(f"plan {plan.name!r}: the link bytes of in-switch operations are the switches' "
                        f"(fabric.cost_nodes.link_bytes), not a sum of the plan's messages")
    _check(plan, topo, config)
    chunk = max(1, config.chunk_bytes // itemsize)
    out: dict[str, tuple[int, int]] = {}
    for g, program in messages(plan, S, itemsize, chunk).items():
        for op in program:
            if type(op) is not Send:
                continue
            raw = raw_bytes(op.nbytes, config.mtu_bytes, config.header_bytes)
            for link in topo.route(g, op.peer):
                payload, total = out.get(link.name, (0, 0))
                out[link.name] = (payload + op.nbytes, total + raw)
    return out


def plan_rounds(plan: Plan, S: int, itemsize: int = 4) -> list[np.ndarray]:
    """_plan_rounds, kept on the plan (_kept): the bounds and the byte sums of every fabric ask for the
    same rounds. Read-only: the matrices are shared by every caller."""
    return on_plan(plan, "_rounds", (int(S), itemsize), _read_only_rounds)


def _read_only_rounds(plan: Plan, S: int, itemsize: int) -> list[np.ndarray]:
    rounds = _plan_rounds(plan, S, itemsize)
    for matrix in rounds:
        matrix.setflags(write=False)
    return rounds


def _plan_rounds(plan: Plan, S: int, itemsize: int) -> list[np.ndarray]:
    """The plan's dependent rounds for fabric.cost_nodes' bounds: round k is a gpus x gpus int64 matrix of
    the payload bytes (row: sender, column: receiver) sent in round k (each send's round: send_rounds), its
    bytes those of the chunks it sends at this size. No round for a plan that sends nothing (one GPU)."""
    n = plan.gpus
    rounds, senders, receivers, sizes = [], [], [], []
    for g, sends in enumerate(send_rounds(plan)):
        table = spans(plan, S, itemsize, g)
        for k, to, ref in sends:
            lo, hi = span(table, ref)
            rounds.append(k)
            senders.append(g)
            receivers.append(to)
            sizes.append((hi - lo) * itemsize)
    if not rounds:
        return []
    out = np.zeros((max(rounds) + 1, n, n), np.int64)
    np.add.at(out, (np.array(rounds), np.array(senders), np.array(receivers)), np.array(sizes, np.int64))
    return list(out)


def plan_traffic(plan: Plan, S: int, itemsize: int = 4, channels: Container[int] | None = None) -> np.ndarray:
    """The payload bytes (gpus x gpus int64, row: sender, column: receiver) of the plan's sends on
    `channels` (default every channel), summed from its operations (no run: what a send carries is its
    chunks at this size)."""
    n = plan.gpus
    out = np.zeros((n, n), np.int64)
    for g, program in enumerate(plan.programs):
        table = spans(plan, S, itemsize, g)
        to: dict[int, int] = {}  # receiver -> elements, summed in Python ints (a numpy item per send is slow)
        op: Any  # an Op: Any, as the visitors' (a send's kind sets send_to and the ref it reads)
        for op in program.ops:
            kind = op.kind
            if kind in _SENDING and (channels is None or op.channel in channels):
                ref = op.src if kind == "send" or kind == "recv_reduce_send" else op.dst
                rows = table[ref.buf]
                to[op.send_to] = to.get(op.send_to, 0) + rows[ref.off + ref.cnt - 1][1] - rows[ref.off][0]
        for peer, elements in to.items():
            out[g, peer] = elements * itemsize
    return out


def send_rounds(plan: Plan) -> list[list[tuple[int, int, Ref]]]:
    """Per GPU, (round, receiver, chunks sent) of each of its sends in program order, the same at every size
    (kept on the plan). A send is in the round after the latest message whose data it sends on (a chunk's
    round: that of the message last received or folded into it, carried by local copies and reductions;
    a proxy's forward, rrs, rcs and rrcs included), and, after a GPU's k-th explicit flush (the flushes a
    plan writes split its phases; those with_flushes adds do not; on lanes, the flushes of its own
    channel), in round k at least: so a ring's all-gather steps, with no flush between them, are one round
    each."""
    kept: list[list[tuple[int, int, Ref]]] | None = plan.__dict__.get("_send_rounds")
    if kept is None:
        kept = plan.__dict__["_send_rounds"] = _send_rounds(plan)
    return kept


def _send_rounds(plan: Plan) -> list[list[tuple[int, int, Ref]]]:
    visit, out = _round_visitor(plan)
    walk(plan, visit)
    return out


def _round_visitor(plan: Plan) -> tuple[Callable[[int, int, Any, int | None], int | None],
                                          list[list[tuple[int, int, Ref]]]]:
    """(visit, out): a walk visitor that puts (round, receiver, chunks sent) of each send in out[GPU]. A chunk
    is an int key (chunk << 2 | buffer), a GPU's phases a dict by its line: no tuple an operation."""
    n = plan.gpus
    lanes = plan.lanes > 1
    buffer_of = {"i": 0, "o": 0 if plan.inplace else 1, "s": 2}  # in place, "o" and "i" are one buffer
    phase: list[dict[int, int]] = [{} for _ in range(n)]  # GPU -> line (its channel on lanes, else 0) -> flushes
    after: list[dict[int, int]] = [{} for _ in range(n)]  # GPU -> chunk key -> round + 1
    out: list[list[tuple[int, int, Ref]]] = [[] for _ in range(n)]

    def ready(g: int, ref: Ref) -> int:  # the first round the data of chunks `ref` may be sent in
        held, b = after[g], buffer_of[ref.buf]
        if ref.cnt == 1:
            return held.get(ref.off << 2 | b, 0)
        return max(held.get(c << 2 | b, 0) for c in range(ref.off, ref.off + ref.cnt))

    def mark(g: int, ref: Ref, k: int) -> None:
        held, b = after[g], buffer_of[ref.buf]
        for c in range(ref.off, ref.off + ref.cnt):
            key = c << 2 | b
            if held.get(key, 0) < k:
                held[key] = k

    def visit(g: int, step: int, op: Any, came: int | None) -> int | None:  # a message is the round it was sent in
        kind = op.kind
        if kind in _SWITCH:  # no point-to-point round: the switch's (fabric.cost_nodes times them)
            return None
        if kind == "flush":
            line, lines = op.channel if lanes else 0, phase[g]
            lines[line] = lines.get(line, 0) + 1
            return None
        if came is not None and op.dst is not None and kind != "recv_reduce_send":
            dst = op.dst
            if dst.cnt == 1:  # mark's one chunk, inline (the commonest)
                held, key = after[g], dst.off << 2 | buffer_of[dst.buf]
                if held.get(key, 0) <= came:
                    held[key] = came + 1
            else:
                mark(g, dst, came + 1)
        if kind == "copy" or kind == "reduce":
            mark(g, op.dst, ready(g, op.src))
        if kind not in _SENDING:
            return None
        source = op.src if kind == "send" or kind == "recv_reduce_send" else op.dst
        if source.cnt == 1:  # ready's one chunk, inline
            first = after[g].get(source.off << 2 | buffer_of[source.buf], 0)
        else:
            first = ready(g, source)
        k = max(phase[g].get(op.channel if lanes else 0, 0), first, 0 if came is None else came + 1)
        out[g].append((k, op.send_to, source))
        return k

    return visit, out


_SENDING = frozenset(SENDS)
