"""The plan validator: shape and bounds, then a symbolic run proving each output chunk's contributions.

Rules (each refusal is a PlanError naming the GPU, the step and, where one is involved, the chunk):
1. the collective is known; one program per GPU, in GPU order; buffer chunk counts fit the collective
   (allreduce, all2all, broadcast, reduce: input and output alike, all2all's a multiple of the GPU
   count; allgather and gather: output = GPUs x input; reduce_scatter and scatter: input = GPUs x
   output); inplace: alike; a rooted collective's root is one of the GPUs; chunk element counts
   (GpuProgram.elements) given by every GPU or none, one non-negative integer per chunk;
2. every operation's kind is known and runnable, names the buffers its kind needs, in range, and peers that are other GPUs of the plan;
   a dependency names an earlier operation of the same GPU (so the dependencies have no cycle); only a
   reducing kind has an operand order (incoming_first); on a plan whose channels run on lanes
   (Plan.lanes = C > 1), every channel is one of 0..C-1; an in-switch kind names a slot (a non-empty
   tuple of non-negative ints), no other kind does; a switch_contribute's send_to is None (its result to
   every GPU) or a GPU of the plan, its own included;
3. a symbolic run, every GPU in program order, sends never waiting, a receive waiting for the matching
   send (same sender, receiver and channel, in order): it must end with every program done (else the
   plan deadlocks: the waiting GPUs are named) and no message unreceived; a send and its receive move
   the same number of chunks (and, in a plan that gives its chunks' element counts, the same elements:
   a send and its receive, a copy's or reduction's source and destination); no operation reads a chunk
   nothing wrote; a reduction never adds a contribution a chunk already holds (it would be counted twice);
   in the switch: a switch_recv waits until every switch_contribute of its slot has run, and takes their
   reduction, the sum of their contributions (a contribution two of them hold would be counted twice);
   the contributions of a slot agree on its chunk count and destination (send_to), and every GPU the slot
   goes to takes it exactly once, no other GPU; a multicast_store is a slot of one put (no other store or
   contribution) that every GPU takes; a load_reduce (one a slot, of input chunks) is answered by every
   GPU's switch_contribute to its slot, each of the same input chunks and to the requester, which waits
   for the request (format.walk), and names its requester's rank first in its slot (the switch's rule); a
   credit_wait waits for the next credit of its GPU (recv_from), and every credit is taken by every other GPU;
   in a leaf plan (Plan.leaf: a partition of the GPUs in nodes) an in-switch op's slot names its GPU's node
   first (then a load-reduce its position in the node), "every GPU" of a slot is that node's, and a
   switch_contribute only answers a load_reduce;
4. at the end every output chunk holds exactly the contributions the collective requires: allreduce
   chunk c = input chunk c of every GPU; allgather chunk g k + m = GPU g's input chunk m; reduce_scatter
   chunk m of GPU g = input chunk g k + m of every GPU; all2all chunk h k + m of GPU g = GPU h's input
   chunk g k + m; broadcast chunk c = the root's input chunk c; reduce: the root's output as allreduce;
   gather: the root's chunk h k + m = GPU h's input chunk m; scatter: GPU g's chunk m = the root's input
   chunk g k + m (k: output chunks). Nothing is required of reduce's and gather's other GPUs' outputs, nor
   of a chunk of no element in a plan that gives its chunks' element counts (it holds no data).
A contribution is (GPU, input chunk); a chunk's value is the set of them, a bit set in which bit c n + h
is GPU h's input chunk c (n GPUs), held as (lo, bits): the set is bits << lo. A union or an overlap is
one machine-word loop over the bits a value spans (frozensets of pairs took 4.6 s of CPU to validate
`direct` allreduce on 256 GPUs), and a chunk that holds one input chunk of some GPUs spans n bits
whatever its index (a whole-width int per chunk took 23 GB to validate ring's 8 channels on 256 GPUs).
"""

from dataclasses import replace
from typing import Any, cast

from ..errors import PlanError
from .gc_pause import cyclic_gc_paused
from .format import BUFFERS, COLLECTIVES, CREDIT_CHANNEL, IN_SWITCH, KINDS, LOCAL, RECVS, REDUCING, ROOTED, SENDS, \
    GpuProgram, Op, Plan, Ref, switch_slots, walk

_NEEDS = {"send": ("src",), "recv": ("dst",), "recv_reduce": ("dst",), "recv_reduce_send": ("src",),
          "recv_copy_send": ("dst",), "recv_reduce_copy_send": ("dst",), "copy": ("src", "dst"),
          "reduce": ("src", "dst"), "flush": (), "nop": (), "switch_contribute": ("src",), "switch_recv": ("dst",),
          "multicast_store": ("src",), "load_reduce": ("src",), "credit": (), "credit_wait": ()}
_SWITCH_KINDS = frozenset(IN_SWITCH)
Value = tuple[int, int]  # a chunk's contributions, (lo, bits): the set bits << lo (module docstring)
# what a switch_contribute or multicast_store puts into its slot: (GPU, step, values, send_to, element counts, kind)
Put = tuple[int, int, list[Value], int | None, tuple[int, ...] | None, str]
# slot -> (its destination, its chunks' element counts, the sum, the GPUs that took it) (_take)
Taken = dict[tuple[int, ...], tuple[int | None, tuple[int, ...] | None, list[Value], set[int]]]


def _where(g: int, step: int, op: Op | None = None, chunk: int | None = None) -> str:
    text = f"GPU {g} step {step}"
    if op is not None:
        text += f" ({op.kind}, channel {op.channel})"
    if chunk is not None:
        text += f" chunk {chunk}"
    return text


def _shape(plan: Plan) -> None:
    if plan.collective not in COLLECTIVES:
        raise PlanError(f"plan {plan.name!r}: collective {plan.collective!r} unknown; known: {', '.join(COLLECTIVES)}")
    n = plan.gpus
    if n < 1 or len(plan.programs) != n:
        raise PlanError(f"plan {plan.name!r}: for {n} GPUs but has {len(plan.programs)} programs")
    if plan.collective in ROOTED and not 0 <= plan.root < n:
        raise PlanError(f"plan {plan.name!r}: root {plan.root} is not one of its {n} GPUs")
    if plan.groups < 1 or plan.lanes < 0:
        raise PlanError(f"plan {plan.name!r}: groups {plan.groups} (at least 1), lanes {plan.lanes} (at least 0)")
    if plan.leaf and (not isinstance(plan.leaf, tuple) or any(not isinstance(node, tuple) or not node
                                                               for node in plan.leaf)
                      or sorted(g for node in plan.leaf for g in node) != list(range(n))):
        raise PlanError(f"plan {plan.name!r}: leaf {plan.leaf!r} is not its {n} GPUs in nodes (tuples of GPUs)")
    for g, program in enumerate(plan.programs):
        if program.gpu != g:
            raise PlanError(f"plan {plan.name!r}: program {g} is for GPU {program.gpu} (programs go in GPU order)")
        i, o, s = program.i_chunks, program.o_chunks, program.s_chunks
        if min(i, o) < 1 or s < 0:
            raise PlanError(f"GPU {g}: buffers of {i} input, {o} output, {s} scratch chunks")
        c = plan.collective
        ok = {"allgather": o == n * i, "gather": o == n * i, "reduce_scatter": i == n * o, "scatter": i == n * o,
              "all2all": i == o and i % n == 0}.get(c, i == o)
        if not ok or (plan.inplace and i != o):
            raise PlanError(f"GPU {g}: {i} input and {o} output chunks do not fit {'an in-place ' if plan.inplace else ''}"
                            f"{c} on {n} GPUs")
        if (i, o) != (plan.programs[0].i_chunks, plan.programs[0].o_chunks):
            raise PlanError(f"GPU {g}: {i} input and {o} output chunks, GPU 0 has "
                            f"{plan.programs[0].i_chunks} and {plan.programs[0].o_chunks}")
        _elements(plan, g, program)


def _elements(plan: Plan, g: int, program: GpuProgram) -> None:
    """GPU g's chunk element counts (GpuProgram.elements), if the plan gives them: every GPU's or none."""
    sizes = program.elements
    if (sizes is None) != (plan.programs[0].elements is None):
        raise PlanError(f"GPU {g} {'does not give' if sizes is None else 'gives'} its chunks' element counts and "
                        f"GPU 0 {'does' if sizes is None else 'does not'}: a plan gives every GPU's or none")
    if sizes is None:
        return
    chunks = (program.i_chunks, program.o_chunks, program.s_chunks)
    if type(sizes) is tuple and len(sizes) == 3 and all(  # plain ints, in C (a generator per chunk cost ~1 us)
            type(row) is tuple and len(row) == count and (not row or set(map(type, row)) == {int} and min(row) >= 0)
            for row, count in zip(sizes, chunks)):
        pass  # a quick test of what the rule below passes (it, per chunk, names what is wrong)
    elif not isinstance(sizes, tuple) or len(sizes) != 3 or any(
            not isinstance(row, tuple) or len(row) != count or
            any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in row)
            for row, count in zip(sizes, chunks)):
        raise PlanError(f"GPU {g}: chunk element counts {sizes!r} are not one non-negative integer per chunk of its "
                        f"{chunks[0]} input, {chunks[1]} output and {chunks[2]} scratch chunks")
    if plan.inplace and sizes[0] != sizes[1]:
        raise PlanError(f"GPU {g}: in place, but its input chunks hold {list(sizes[0])} elements and its output "
                        f"chunks {list(sizes[1])}")


def _ops(plan: Plan) -> None:
    """Rule 2 on every operation: a quick test (_fine) passes the operations that keep every rule; any other
    is checked rule by rule (_check_op), which names what is wrong."""
    n, lanes = plan.gpus, plan.lanes if plan.lanes > 1 else None
    # a tuple of operations every GPU shares (sharp's), with the same chunk counts, passes the quick test
    # for any GPU it names as no peer, since GPU g's test differs from another's only in "a peer is not g"
    # (id of the tuple, chunk counts) -> the peers its operations name
    passed: dict[tuple[int, int, int, int], set[int | None]] = {}
    for g, program in enumerate(plan.programs):
        shared = (id(program.ops), program.i_chunks, program.o_chunks, program.s_chunks)
        peers = passed.get(shared)
        if peers is not None and g not in peers:
            continue
        sizes = {"i": program.i_chunks, "o": program.o_chunks, "s": program.s_chunks}
        for step, op in enumerate(program.ops):
            if not _fine(op, g, step, n, sizes, lanes):
                _check_op(plan, g, step, op)
        if peers is None:
            passed[shared] = {op.send_to for op in program.ops} | {op.recv_from for op in program.ops}


_SEND_KINDS, _RECV_KINDS = frozenset(SENDS), frozenset(RECVS)


# kind -> (needs a src, needs a dst, sends, receives, folds, in the switch): _fine's one lookup an operation
_SPEC = {kind: ("src" in needs, "dst" in needs, kind in _SEND_KINDS, kind in _RECV_KINDS or kind == "credit_wait",
                kind in REDUCING, kind in _SWITCH_KINDS)
         for kind, needs in _NEEDS.items()}  # a credit_wait names the GPU it waits for


def _fine(op: Op, g: int, step: int, n: int, sizes: dict[str, int], lanes: int | None) -> bool:
    """Whether `op` keeps rule 2 (False: maybe not; _check_op decides)."""
    kind = op.kind
    spec = _SPEC.get(kind) if type(kind) is str else None
    if spec is None:  # unknown: rule by rule
        return False
    needs_src, needs_dst, sends, receives, folds, in_switch = spec  # needs, peers and fold in one lookup
    if in_switch:
        return _fine_in_switch(op, kind, needs_src, step, n, sizes, lanes)
    if op.slot != ():
        return False
    src, dst = op.src, op.dst
    if needs_src:
        if src is None or src.cnt < 1 or src.off < 0 or src.off + src.cnt > sizes.get(src.buf, -1):
            return False
    elif src is not None:
        return False
    if needs_dst:
        if dst is None or dst.cnt < 1 or dst.off < 0 or dst.off + dst.cnt > sizes.get(dst.buf, -1):
            return False
    elif dst is not None:
        return False
    first = op.incoming_first
    if first is not False and (first is not True or not folds):
        return False
    to, frm = op.send_to, op.recv_from
    if sends:
        if to is None or not 0 <= to < n or to == g:
            return False
    elif to is not None:
        return False
    if receives:
        if frm is None or not 0 <= frm < n or frm == g:
            return False
    elif frm is not None:
        return False
    if lanes is not None and not 0 <= op.channel < lanes:
        return False
    deps = op.deps
    return type(deps) is tuple and (not deps or all(0 <= d < step for d in deps))


def _fine_in_switch(op: Op, kind: str, needs_src: bool, step: int, n: int, sizes: dict[str, int],
                    lanes: int | None) -> bool:
    """_fine for an in-switch kind, which needs a src (needs_src) or a dst (False: maybe not; _check_op decides)."""
    slot, to = op.slot, op.send_to
    if type(slot) is not tuple or not slot or op.recv_from is not None or op.incoming_first is not False:
        return False
    for x in slot:
        if type(x) is not int or x < 0:
            return False
    ref, other = (op.src, op.dst) if needs_src else (op.dst, op.src)
    if ref is None or other is not None or ref.cnt < 1 or ref.off < 0 or ref.off + ref.cnt > sizes.get(ref.buf, -1):
        return False
    if to is not None and (kind != "switch_contribute" or type(to) is not int or not 0 <= to < n):
        return False
    if lanes is not None and not 0 <= op.channel < lanes:
        return False
    deps = op.deps
    return type(deps) is tuple and (not deps or all(0 <= d < step for d in deps))


def _check_op(plan: Plan, g: int, step: int, op: Op) -> None:
    """Rule 2 on one operation, rule by rule: PlanError naming what it breaks."""
    n = plan.gpus
    if op.kind not in KINDS:
        raise PlanError(f"{_where(g, step)}: kind {op.kind!r} unknown; known: {', '.join(KINDS)}")
    slot = op.slot
    if op.kind in IN_SWITCH:
        if type(slot) is not tuple or not slot or any(type(x) is not int or x < 0 for x in slot):
            raise PlanError(f"{_where(g, step, op)}: slot {slot!r} is not a non-empty tuple of non-negative ints")
    elif slot != ():
        raise PlanError(f"{_where(g, step, op)}: a {op.kind} has no slot (only the in-switch kinds)")
    if op.kind == "switch_contribute":
        if op.send_to is not None and (type(op.send_to) is not int or not 0 <= op.send_to < n):
            raise PlanError(f"{_where(g, step, op)}: send_to {op.send_to!r} (where the slot's result goes) is not "
                            f"a GPU of the plan's {n}, nor None (every GPU)")
        op = replace(op, send_to=None)  # checked: the peer rules below are the point-to-point kinds'
    for name in ("src", "dst"):
        ref = getattr(op, name)
        if name not in _NEEDS[op.kind]:
            if ref is not None:
                raise PlanError(f"{_where(g, step, op)}: a {op.kind} takes no {name}")
            continue
        if ref is None:
            raise PlanError(f"{_where(g, step, op)}: a {op.kind} needs a {name}")
        if ref.buf not in BUFFERS:
            raise PlanError(f"{_where(g, step, op)}: buffer {ref.buf!r} unknown (i, o, s)")
        size = plan.programs[g].chunks_of(ref.buf)
        if ref.cnt < 1 or ref.off < 0 or ref.off + ref.cnt > size:
            raise PlanError(f"{_where(g, step, op, ref.off)}: {name} chunks [{ref.off}, {ref.off + ref.cnt}) of "
                            f"buffer {ref.buf!r} out of its {size}")
    for attr, needed in (("send_to", op.kind in SENDS), ("recv_from", op.kind in RECVS or op.kind == "credit_wait")):
        peer = getattr(op, attr)
        if needed and (peer is None or not 0 <= peer < n or peer == g):
            raise PlanError(f"{_where(g, step, op)}: {attr} {peer} is not another GPU of the plan's {n}")
        if not needed and peer is not None:
            raise PlanError(f"{_where(g, step, op)}: a {op.kind} has no {attr}")
    if op.incoming_first is not False and (op.incoming_first is not True or op.kind not in REDUCING):
        raise PlanError(f"{_where(g, step, op)}: incoming_first={op.incoming_first!r}: an operand order is "
                        f"True or False, and only for the kinds that fold ({', '.join(REDUCING)})")
    if plan.lanes > 1 and not 0 <= op.channel < plan.lanes:
        raise PlanError(f"{_where(g, step, op)}: channel {op.channel} has no lane; the plan runs its channels "
                        f"on lanes 0..{plan.lanes - 1}")
    if type(op.deps) is not tuple:
        raise PlanError(f"{_where(g, step, op)}: deps {op.deps!r} are not a tuple of earlier steps")
    for d in op.deps:
        if not 0 <= d < step:
            raise PlanError(f"{_where(g, step, op)}: depends on step {d}, not an earlier step of GPU {g} "
                            f"(a dependency on a later step is a cycle)")


class _State:
    """Each GPU's chunks' contributions (bit sets, the module docstring's; None: never written)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.bufs: list[dict[str, list[Value | None]]] = []
        n = plan.gpus
        for g, program in enumerate(plan.programs):
            bufs: dict[str, list[Value | None]] = {"i": [(c * n + g, 1) for c in range(program.i_chunks)],
                    "s": [None] * program.s_chunks}
            bufs["o"] = bufs["i"] if plan.inplace else [None] * program.o_chunks
            self.bufs.append(bufs)

    def read(self, g: int, step: int, op: Op, ref: Ref) -> list[Value]:
        values = self.bufs[g][ref.buf][ref.off:ref.off + ref.cnt]  # a new list: the caller's to keep
        if None in values:
            k = values.index(None)
            raise PlanError(f"{_where(g, step, op, ref.off + k)}: reads chunk {ref.off + k} of buffer "
                            f"{ref.buf!r}, which nothing wrote")
        return cast(list[Value], values)  # none is None: checked above

    def write(self, g: int, ref: Ref, values: list[Value]) -> None:
        self.bufs[g][ref.buf][ref.off:ref.off + ref.cnt] = values

    def fold(self, g: int, step: int, op: Op, ref: Ref, values: list[Value]) -> list[Value]:
        out = []
        for k, (have, add) in enumerate(zip(self.read(g, step, op, ref), values)):
            lo, a, b = _aligned(have, add)
            if a & b:
                raise PlanError(f"{_where(g, step, op, ref.off + k)}: the reduction would count "
                                f"{_names((lo, a & b), self.plan)} twice")
            out.append((lo, a | b))
        return out


def _aligned(x: Value, y: Value) -> tuple[int, int, int]:
    """Two values (lo, bits) on one offset: (lo, x's bits, y's bits)."""
    (xl, xb), (yl, yb) = x, y
    if xl == yl:
        return xl, xb, yb
    lo = min(xl, yl)
    return lo, xb << (xl - lo), yb << (yl - lo)


def _normal(value: Value) -> Value:
    """A value (lo, bits) with lo its lowest contribution's bit, so that equal sets compare equal."""
    lo, bits = value
    if not bits:
        return 0, 0
    low = (bits & -bits).bit_length() - 1
    return lo + low, bits >> low


def _names(value: Value, plan: Plan) -> str:
    lo, bits = value
    pairs = [divmod(lo + b, plan.gpus) for b in range(bits.bit_length()) if bits >> b & 1]
    return ", ".join(f"GPU {h}'s input chunk {c}" for c, h in pairs)


def _combine(values: list[Value], message: list[Value], g: int, step: int, op: Op, plan: Plan) -> list[Value]:
    out: list[Value] = []
    for (xl, xb), (yl, yb) in zip(values, message):
        # _aligned, inline (a call per chunk was most of a slot's sum: 256 contributions a slot in sharp's)
        lo, a, b = (xl, xb, yb) if xl == yl else (xl, xb, yb << (yl - xl)) if xl < yl else (yl, xb << (xl - yl), yb)
        if a & b:
            raise PlanError(f"{_where(g, step, op, len(out))}: the reduction would count "
                            f"{_names((lo, a & b), plan)} twice")
        out.append((lo, a | b))
    return out


def _run(plan: Plan) -> _State:
    state = _State(plan)
    sized = plan.programs[0].elements is not None
    bufs = state.bufs
    # GPU -> buffer -> its chunks' element counts, if the plan gives them (a tuple: a slice of it is a run's)
    rows: list[dict[str, tuple[int, ...]]] = [dict(zip("ios", program.elements)) if program.elements is not None
                                              else {} for program in plan.programs]

    # the element counts of a run of chunks, if the plan gives them
    def size_of(g: int, ref: Ref) -> tuple[int, ...] | None:
        if not sized:
            return None
        return rows[g][ref.buf][ref.off:ref.off + ref.cnt]

    taken: Taken = {}  # slot -> its result and the GPUs that took it (_take)
    # slot -> (GPU, step, chunks) of the load_reduce that asks for it
    asked: dict[tuple[int, ...], tuple[int, int, Ref]] = {}
    node_of = {h: a for a, node in enumerate(plan.leaf) for h in node}  # Plan.leaf: an in-switch slot's node first
    position_of = {h: i for node in plan.leaf for i, h in enumerate(node)}  # and a load-reduce's position in it

    # op: an Op that kept rule 2 (_ops), so the Refs its kind needs are set: Any, as mypy cannot tie src and dst
    # to the kind (a cast per use would cost a call per operation of the walk)
    def visit(g: int, step: int, op: Any, received: Any) -> tuple[Any, ...] | None:
        kind = op.kind  # the commonest kinds first, each checked as the general path below checks it:
        if kind == "send":  # its chunks' values, read as state.read does
            src = op.src
            out: list[Value | None] | list[Value] | None  # this chunk's values here; a sent message's below
            out = bufs[g][src.buf][src.off:src.off + src.cnt]
            if None in out:
                out = state.read(g, step, op, src)  # names the chunk nothing wrote
            return step, out, rows[g][src.buf][src.off:src.off + src.cnt] if sized else None
        if kind == "recv" or kind == "recv_reduce":  # a message that fits, stored, or folded into one chunk
            _, sent, sizes = received
            dst = op.dst
            if len(sent) == dst.cnt and (not sized or sizes == rows[g][dst.buf][dst.off:dst.off + dst.cnt]):
                row = bufs[g][dst.buf]
                if kind == "recv":
                    row[dst.off:dst.off + dst.cnt] = sent
                    return None
                if dst.cnt == 1:  # one chunk: state.fold's union, inline, if it adds no twice
                    have = row[dst.off]
                    if have is not None:
                        (xl, xb), (yl, yb) = have, sent[0]
                        lo, a, b = (xl, xb, yb) if xl == yl else (xl, xb, yb << (yl - xl)) if xl < yl else \
                            (yl, xb << (xl - yl), yb)  # _aligned
                        if not a & b:
                            row[dst.off] = (lo, a | b)
                            return None
            # else the general path below: it names a misfit, and folds (naming a contribution counted twice)
        if kind == "flush" or kind == "nop":
            return None
        if not node_of and (kind == "switch_recv" or kind == "switch_contribute"):  # sharp's and nvls's, when
            # every rule below holds (else the general path names what does not): a slot's sum taken once more
            slot, ref = op.slot, op.dst if kind == "switch_recv" else op.src
            run = rows[g][ref.buf][ref.off:ref.off + ref.cnt] if sized else None
            if kind == "switch_recv":
                known = taken.get(slot)
                if known is not None and slot not in asked:
                    to, sizes0, value, seen = known
                    if len(value) == ref.cnt and sizes0 == run and (to is None or to == g) and g not in seen:
                        seen.add(g)
                        bufs[g][ref.buf][ref.off:ref.off + ref.cnt] = value
                        return None
            else:  # a contribution of written chunks, answering the request of its slot, if any, as it asks
                want = asked.get(slot)
                if want is None or (op.send_to == want[0] and (ref is want[2] or ref.__class__ is want[2].__class__ and (
                        ref.buf, ref.off, ref.cnt) == (want[2].buf, want[2].off, want[2].cnt))):  # Ref's __eq__
                    values = bufs[g][ref.buf][ref.off:ref.off + ref.cnt]
                    if None not in values:
                        return g, step, values, op.send_to, run, kind
        message: Any = None
        if kind == "credit":  # out of band: what the other GPUs' credit_waits take (format.walk)
            return step, None, None
        if kind == "credit_wait":
            return None
        if node_of and kind in _SWITCH_KINDS and op.slot[0] != node_of[g]:
            raise PlanError(f"{_where(g, step, op)}: slot {list(op.slot)} names node {op.slot[0]}'s leaf, GPU {g} is "
                            f"at node {node_of[g]} (a leaf plan's in-switch slot names its GPU's node first)")
        if received is not None and kind not in _SWITCH_KINDS:
            sender_step, message, sizes = received
            ref = op.dst if op.dst is not None else op.src
            if len(message) != ref.cnt:
                raise PlanError(f"{_where(g, step, op, ref.off)}: receives {ref.cnt} chunks, GPU "
                                f"{op.recv_from} step {sender_step} sent {len(message)}")
            if sized and sizes != size_of(g, ref):  # (sized: size_of gives counts, not None)
                raise PlanError(f"{_where(g, step, op, ref.off)}: receives chunks of {list(size_of(g, ref))} "  # type: ignore[arg-type]
                                f"elements, GPU {op.recv_from} step {sender_step} sent {list(sizes)}")
        if op.kind in LOCAL and size_of(g, op.src) != size_of(g, op.dst):  # (they differ: sized, counts, not None)
            raise PlanError(f"{_where(g, step, op, op.dst.off)}: {op.kind} of chunks of {list(size_of(g, op.src))} "  # type: ignore[arg-type]
                            f"elements into chunks of {list(size_of(g, op.dst))}")  # type: ignore[arg-type]
        kind, out = op.kind, None
        if kind == "load_reduce":
            if op.src.buf != "i" or op.slot in asked:
                raise PlanError(f"{_where(g, step, op, op.src.off)}: " + (
                    f"a load-reduce reads the GPUs' input ('i'), not {op.src.buf!r}" if op.src.buf != "i" else
                    f"slot {list(op.slot)} is asked for twice (GPU {asked.get(op.slot, (0,))[0]} asked first)"))
            # the switch files a slot's LOADs under the slot alone, so a request names its requester's rank in the
            # group first (after a leaf plan's node: its position in the node), or another's answer is taken over
            at, rank = (1, position_of[g]) if node_of else (0, g)
            if len(op.slot) <= at or op.slot[at] != rank:
                raise PlanError(f"{_where(g, step, op)}: slot {list(op.slot)}: a load-reduce names its requester's "
                                f"rank {rank} in the group {'after its node ' if node_of else ''}first in its slot")
            asked[op.slot] = (g, step, op.src)
            return None
        if node_of and kind == "switch_contribute" and op.slot not in asked:
            raise PlanError(f"{_where(g, step, op)}: slot {list(op.slot)}: in a leaf plan a switch_contribute answers "
                            f"a load_reduce (the leaf's group reduces only what a member asked for), and none asks "
                            f"for this slot")
        if kind == "switch_contribute" and op.slot in asked:  # an answer to the switch's read
            h, hstep, ref = asked[op.slot]
            if op.src != ref or op.send_to != h:
                raise PlanError(f"{_where(g, step, op, op.src.off)}: answers GPU {h} step {hstep}'s load-reduce of "
                                f"slot {list(op.slot)} with chunks [{op.src.off}, {op.src.off + op.src.cnt}) of "
                                f"{op.src.buf!r} to {'every GPU' if op.send_to is None else f'GPU {op.send_to}'}; "
                                f"it asks for chunks [{ref.off}, {ref.off + ref.cnt}) of 'i' to GPU {h}")
        if kind == "switch_contribute" or kind == "multicast_store":
            return g, step, state.read(g, step, op, op.src), op.send_to, size_of(g, op.src), kind
        if kind == "switch_recv":
            group = plan.leaf[op.slot[0]] if node_of else range(plan.gpus)
            if op.slot in asked and {put[0] for put in received} != set(group):
                raise PlanError(f"{_where(g, step, op)}: slot {list(op.slot)} is a load-reduce, answered by GPUs "
                                f"{sorted({put[0] for put in received})}, not every GPU of the "
                                + (f"plan's {plan.gpus}" if not node_of else f"node's {list(group)}"))
            state.write(g, op.dst, _take(plan, g, step, op, received, taken, size_of(g, op.dst)))
            return None
        if kind == "recv":
            state.write(g, op.dst, message)
        elif kind == "recv_reduce":
            state.write(g, op.dst, state.fold(g, step, op, op.dst, message))
        elif kind == "recv_copy_send":
            state.write(g, op.dst, message)
            out = message
        elif kind == "recv_reduce_copy_send":
            out = state.fold(g, step, op, op.dst, message)
            state.write(g, op.dst, out)
        elif kind == "recv_reduce_send":
            out = _combine(state.read(g, step, op, op.src), message, g, step, op, plan)
        elif kind == "send":
            out = state.read(g, step, op, op.src)
        elif kind == "copy":
            if op.src.cnt != op.dst.cnt:
                raise PlanError(f"{_where(g, step, op, op.dst.off)}: copies {op.src.cnt} chunks into {op.dst.cnt}")
            state.write(g, op.dst, state.read(g, step, op, op.src))
        elif kind == "reduce":
            if op.src.cnt != op.dst.cnt:
                raise PlanError(f"{_where(g, step, op, op.dst.off)}: reduces {op.src.cnt} chunks into {op.dst.cnt}")
            state.write(g, op.dst, state.fold(g, step, op, op.dst, state.read(g, step, op, op.src)))
        if op.kind in SENDS:
            return step, out, size_of(g, op.src if op.kind in ("send", "recv_reduce_send") else op.dst)
        return None

    at, queues = walk(plan, visit)
    stuck = [f"GPU {g} step {at[g]} waits for a credit from GPU {p.ops[at[g]].recv_from}"
             if p.ops[at[g]].kind == "credit_wait" else
             f"GPU {g} step {at[g]} waits for GPU {p.ops[at[g]].recv_from} on channel {p.ops[at[g]].channel}"
             if p.ops[at[g]].kind not in _SWITCH_KINDS else
             f"GPU {g} step {at[g]} waits for in-switch slot {list(p.ops[at[g]].slot)}"
             for g, p in enumerate(plan.programs) if at[g] < len(p.ops)]
    if stuck:
        raise PlanError(f"plan {plan.name!r} deadlocks: {'; '.join(stuck)}")
    for (src, dst, channel), queue in queues.items():
        if queue:
            step = queue[0][0]
            what = "credit(s)" if channel == CREDIT_CHANNEL else f"message(s) to GPU {dst} on channel {channel}"
            raise PlanError(f"GPU {src} step {step}: {len(queue)} {what} never received"
                            + (f" by GPU {dst} (credit_wait)" if channel == CREDIT_CHANNEL else ""))
    for slot, puts in switch_slots(plan).items():
        g0, step0 = puts[0]
        to = plan.programs[g0].ops[step0].send_to
        want = set(plan.leaf[slot[0]] if plan.leaf else range(plan.gpus)) if to is None else {to}
        missing = sorted(want - (taken[slot][3] if slot in taken else set()))
        if missing:
            raise PlanError(f"GPU {missing[0]}: never takes in-switch slot {list(slot)} (switch_recv), which "
                            f"GPU {g0} step {step0} sends it")
    return state


def _take(plan: Plan, g: int, step: int, op: Any, puts: list[Put], taken: Taken, sizes: tuple[int, ...] | None
          ) -> list[Value]:
    """What GPU g's switch_recv of op.slot holds: the sum of the slot's contributions (puts: (GPU, step,
    values, send_to, element counts, kind) of each, in the order they ran), refused unless they agree on
    their chunks and destination, g is it, g takes it once, and no contribution is counted twice. The sum
    is made once a slot (taken: slot -> (its destination, its chunks' element counts, the sum, the GPUs
    that took it)), so a result every GPU takes costs O(GPUs), not O(GPUs^2)."""
    known = taken.get(op.slot)
    if known is None:
        g0, step0, value, to, sizes0, kind = puts[0]
        if kind == "multicast_store" and len(puts) > 1:
            raise PlanError(f"{_where(puts[1][0], puts[1][1])} ({puts[1][5]}) puts into slot {list(op.slot)}, GPU {g0} "
                            f"step {step0}'s multicast store (a store is a slot of its own)")
        for h, hstep, values, hto, hsizes, hkind in puts:
            if hto != to:
                raise PlanError(f"{_where(h, hstep)} (switch_contribute) sends slot {list(op.slot)}'s result to "
                                f"{'every GPU' if hto is None else f'GPU {hto}'}, GPU {g0} step {step0} to "
                                f"{'every GPU' if to is None else f'GPU {to}'}")
            if len(values) != len(value) or hsizes != sizes0:
                raise PlanError(f"{_where(h, hstep)} ({hkind}) puts {len(values)} chunks"
                                f"{'' if hsizes is None else f' of {list(hsizes)} elements'} into slot "
                                f"{list(op.slot)}, GPU {g0} step {step0} {len(value)}"
                                f"{'' if sizes0 is None else f' of {list(sizes0)} elements'}")
        value = list(value)
        for h, hstep, values, _, _, _ in puts[1:]:
            value = _combine(value, values, g, step, op, plan)
        known = taken[op.slot] = (to, sizes0, value, set[int]())
    to, sizes0, value, seen = known
    if len(value) != op.dst.cnt or sizes0 != sizes:
        raise PlanError(f"{_where(g, step, op, op.dst.off)}: takes {op.dst.cnt} chunks"
                        f"{'' if sizes is None else f' of {list(sizes)} elements'} of slot {list(op.slot)}, "
                        f"which holds {len(value)}{'' if sizes0 is None else f' of {list(sizes0)} elements'}")
    if to is not None and to != g:
        raise PlanError(f"{_where(g, step, op)}: takes slot {list(op.slot)}, whose result goes to GPU {to}")
    if g in seen:
        raise PlanError(f"{_where(g, step, op)}: takes slot {list(op.slot)} a second time")
    seen.add(g)
    return value


def expected(plan: Plan, g: int, c: int) -> Value | None:
    """The contributions output chunk c of GPU g must hold, a value (lo, bits) as _normal gives it (None:
    not checked, reduce's and gather's non-roots)."""
    return wanted(plan, g)[c]


def wanted(plan: Plan, g: int) -> list[Value | None]:
    """expected's value of every output chunk of GPU g, in chunk order (a list made at once: a call per
    chunk was ~0.3 s of validating a plan of a million output chunks)."""
    n, program, width = plan.gpus, plan.programs[g], plan.programs[0].i_chunks
    every = (1 << n) - 1  # one input chunk of every GPU
    coll, chunks, k = plan.collective, range(program.o_chunks), program.o_chunks
    if coll == "allreduce" or (coll == "reduce" and g == plan.root):
        return [(c * n, every) for c in chunks]
    if coll in ("reduce", "gather") and g != plan.root:
        return [None] * k
    if coll == "gather" or coll == "allgather":
        return [((c % width) * n + c // width, 1) for c in chunks]  # GPU c // width's input chunk c % width
    if coll == "scatter":
        return [((g * k + c) * n + plan.root, 1) for c in chunks]  # the root's input chunk g k + c
    if coll == "broadcast":
        return [(c * n + plan.root, 1) for c in chunks]
    if coll == "reduce_scatter":
        return [((g * k + c) * n, every) for c in chunks]
    m = width // n  # all2all: GPU c // m's input chunk g m + c % m
    return [((g * m + c % m) * n + c // m, 1) for c in chunks]


def validate(plan: Plan) -> Plan:
    """Prove `plan` (rules in the module docstring); return it, or raise PlanError."""
    # the proof makes a few objects an operation, none in a cycle, while the plan holds millions: the cyclic
    # collector's passes over them were ~15% of its CPU (nvls 8 x 8 at 128 MiB, 4.2 million operations: 24.4 s,
    # 21.1 s without); paused here for a plan from a file too (the registry pauses it around building as well)
    with cyclic_gc_paused():
        return _validate(plan)


def _validate(plan: Plan) -> Plan:
    _shape(plan)
    _ops(plan)
    state = _run(plan)
    for g, program in enumerate(plan.programs):
        wants, haves = wanted(plan, g), state.bufs[g]["o"]
        if haves == wants:  # every chunk as required (in C; a chunk's value is normal where the plan is right)
            continue
        empty = program.elements[1] if program.elements is not None else None  # a chunk of no element: no need
        for c in range(program.o_chunks):
            want, have = wants[c], haves[c]
            if want is None or have == want or (have is not None and _normal(have) == want) or \
                    (empty is not None and not empty[c]):  # (want is normal: a value equal to it is too)
                continue
            if have is None:
                raise PlanError(f"GPU {g} output chunk {c}: never written (needs {_names(want, plan)})")
            lo, w, h = _aligned(want, have)
            missing, extra = w & ~h, h & ~w
            parts = ([f"misses {_names((lo, missing), plan)}"] if missing else []) + \
                ([f"holds {_names((lo, extra), plan)} too"] if extra else [])
            raise PlanError(f"GPU {g} output chunk {c}: {'; '.join(parts)} (at the end of the plan)")
    return plan
