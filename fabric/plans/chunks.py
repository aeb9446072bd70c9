"""A plan's chunks at a call's size: every GPU's buffers cut into its chunks, element ranges (spans), and
whether they line up (check_sizes). Shared by the interpreters: the ranks' executor
(ranks/collectives/plan.py), the replay (fabric.plans.timing, timing_leaf) and the in-switch builders.

Sizes as fabric.replay takes them: S bytes (allreduce, broadcast, reduce: the buffer; all2all: each GPU's
send buffer; reduce_scatter: the input; allgather: the output; gather: the root's output, scatter: the
root's input, n x each GPU's part), elements of `itemsize` bytes. Buffer b of a GPU holds count_b elements,
cut into its chunks by fabric.reduction.blocks (or a plan's groups and pieces: `cut`).
"""

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from ..errors import PlanError
from ..reduction import blocks, chunks
from .format import IN_SWITCH, SENDS, SWITCH_PUTS, SWITCH_TAKES, Op, Plan, Ref, walk

T = TypeVar("T")
_SWITCH = frozenset(IN_SWITCH)
# a GPU's chunks at the call's size, element ranges by buffer (spans)
Table = dict[str, list[tuple[int, int]]]


def buffer_elements(plan: Plan, S: int, itemsize: int) -> dict[str, int]:
    """Elements of each GPU's input and output buffer for a call of S bytes (module docstring)."""
    count, n = int(S) // itemsize, plan.gpus
    if plan.collective in ("allgather", "gather"):
        return {"i": count // n, "o": count}
    if plan.collective in ("reduce_scatter", "scatter"):
        return {"i": count, "o": count // n}
    return {"i": count, "o": count}


def packed(sizes: Iterable[int]) -> list[tuple[int, int]]:
    """Element ranges of chunks of `sizes` elements laid one after another from 0."""
    out: list[tuple[int, int]] = []
    lo = 0
    for size in sizes:
        out.append((lo, lo + size))
        lo += size
    return out


def _packed_once(sizes: tuple[int, ...], packs: dict[int, list[tuple[int, int]]] | None) -> list[tuple[int, int]]:
    """packed(sizes), made once for every GPU whose program holds this very tuple (a builder shares one
    between GPUs: nvls's at 8 x 8 and 256 MiB, 0.5 GB of copies); keyed by the tuple's id, which the plan
    keeps alive while the tables are made."""
    if packs is None:
        return packed(sizes)
    table = packs.get(id(sizes))
    if table is None:
        table = packs[id(sizes)] = packed(sizes)
    return table


def _base(plan: Plan, S: int, itemsize: int, g: int,
          memo: dict[tuple[int, int], list[tuple[int, int]]] | None = None,
          packs: dict[int, list[tuple[int, int]]] | None = None) -> Table:
    """GPU g's input and output chunks, element ranges: reduce_scatter's and scatter's output and allgather's
    and gather's input are GPU g's block of the whole (fabric.reduction.blocks(count, n)[g], as the API sizes
    them; gather's and scatter's blocks are equal); a plan's own chunk sizes where it gives them (S unused).
    memo and packs: cuts and packings shared between GPUs (_chunk_tables; read-only)."""
    program = plan.programs[g]
    if program.elements is not None:
        return {"i": _packed_once(program.elements[0], packs), "o": _packed_once(program.elements[1], packs)}
    elements = buffer_elements(plan, S, itemsize)
    count = int(S) // itemsize
    if plan.collective in ("reduce_scatter", "allgather", "scatter", "gather"):
        lo, hi = blocks(count, plan.gpus)[g]
        elements = {"i": count, "o": hi - lo} if plan.collective in ("reduce_scatter", "scatter") else \
            {"i": hi - lo, "o": count}
    out: Table = {}
    for b in ("i", "o"):
        key = (elements[b], program.chunks_of(b))
        table = None if memo is None else memo.get(key)
        if table is None:
            table = cut(elements[b], key[1], plan.groups, plan.piece)
            if memo is not None:
                memo[key] = table
        out[b] = table
    return out


def cut(count: int, k: int, groups: int = 1, piece: int = 0) -> list[tuple[int, int]]:
    """`count` elements in k chunks: fabric.reduction.blocks, or, when k is a multiple of `groups` > 1
    (Plan.groups), blocks(count, groups) each cut into k / groups blocks (fabric.reduction.rail_ranges);
    piece > 0 (Plan.piece): blocks(count, groups) each cut into pieces of `piece` elements
    (fabric.reduction.chunks), which must number k (PlanError otherwise: a plan for another size)."""
    if piece > 0:
        out = [c for lo, hi in blocks(count, groups) for c in chunks(lo, hi, piece)]
        if len(out) != k:
            raise PlanError(f"a plan cut in pieces of {piece} elements has {k} chunks; {count} elements make "
                            f"{len(out)} (the plan is for another size)")
        return out
    if groups <= 1 or k % groups:
        return blocks(count, k)
    return [(lo + x, lo + y) for lo, hi in blocks(count, groups) for x, y in blocks(hi - lo, k // groups)]


def on_plan(plan: Plan, name: str, key: tuple[int, int], make: Callable[[Plan, int, int], T]) -> T:
    """make(plan, *key), kept on the plan itself under `name` (a plan is immutable), the newest 16 keys (a
    sweep's sizes): a cache keyed by the plan would compare two equal plans built apart operation by
    operation on every lookup, once per GPU (it made `model` 20-40x slower at 256 GPUs)."""
    memo: dict[tuple[int, int], T] = plan.__dict__.setdefault(name, {})
    if key not in memo:
        if len(memo) >= 16:
            memo.pop(next(iter(memo)))
        memo[key] = make(plan, *key)
    return memo[key]


def _tables(plan: Plan, S: int, itemsize: int) -> tuple[Table, ...]:
    return on_plan(plan, "_chunk_tables", (S, itemsize), _chunk_tables)


def _chunk_tables(plan: Plan, S: int, itemsize: int) -> tuple[Table, ...]:
    """Every GPU's chunk table (spans). A scratch chunk takes the size of the first chunk written into it
    (received, copied or reduced, in the validator's order of a symbolic run: fabric.plans.validate), so
    that a chunk of an uneven buffer fits where it lands; one nothing writes, the larger buffer's longest
    chunk."""
    # (elements, chunks) -> its cut: every GPU of most plans cuts its buffers alike: one cut (a list, shared, read-only)
    memo: dict[tuple[int, int], list[tuple[int, int]]] = {}
    packs: dict[int, list[tuple[int, int]]] = {}  # a plan's own chunk sizes (a tuple's id) -> their packing
    tables = [_base(plan, S, itemsize, g, memo, packs) for g in range(plan.gpus)]
    if plan.programs[0].elements is not None:  # sized by the plan (the validator: every GPU's or none)
        for g, program in enumerate(plan.programs):
            # every GPU's, as the first's
            tables[g]["s"] = _packed_once(cast(tuple[tuple[int, ...], ...], program.elements)[2], packs)
        return tuple(tables)
    if not any(program.s_chunks for program in plan.programs):
        return tuple(tables)
    sizes: list[list[int | None]] = [[None] * program.s_chunks for program in plan.programs]

    def size_of(g: int, ref: Ref) -> list[int | None]:
        if ref.buf == "s":
            return [sizes[g][c] for c in ref.chunk_ids()]
        table = tables[g][ref.buf]
        return [table[c][1] - table[c][0] for c in ref.chunk_ids()]

    def write(g: int, ref: Ref, values: Iterable[int | None]) -> None:
        if ref.buf == "s":
            for c, v in zip(ref.chunk_ids(), values):
                if sizes[g][c] is None:
                    sizes[g][c] = v

    def visit(g: int, step: int, op: Any, message: Any) -> list[int | None] | None:
        # message: a sent chunk run's sizes (size_of), or a slot's contributions, a list of those
        if op.kind in _SWITCH:  # a slot's contributions: (size) each; its result the size of the first
            if op.kind in SWITCH_PUTS:
                return size_of(g, op.src)
            write(g, op.dst, message[0])
            return None
        if message is not None and op.dst is not None:
            write(g, op.dst, message)
        if op.kind in ("copy", "reduce"):
            write(g, op.dst, size_of(g, op.src))
        if op.kind in SENDS:
            return size_of(g, op.src if op.kind in ("send", "recv_reduce_send") else op.dst)
        return None

    walk(plan, visit)
    for g, program in enumerate(plan.programs):
        if program.s_chunks:
            default = max(hi - lo for b in ("i", "o") for lo, hi in tables[g][b])
            bounds: list[tuple[int, int]] = []
            lo = 0
            for v in sizes[g]:
                bounds.append((lo, lo + (default if v is None else v)))
                lo = bounds[-1][1]
            tables[g]["s"] = bounds
    return tuple(tables)


def spans(plan: Plan, S: int, itemsize: int, g: int) -> Table:
    """GPU g's chunks of each buffer ("i", "o", "s"), element ranges, for a call of S bytes: input and
    output cut by fabric.reduction.blocks (reduce_scatter's output and allgather's input GPU g's block of
    the whole); a scratch chunk the size of the first chunk written into it (_tables). Read-only."""
    return _tables(plan, int(S), itemsize)[g]


def check_sizes(plan: Plan, S: int, itemsize: int) -> None:
    """PlanError, naming the GPU, step, chunk and size, if the chunks of `plan` (validated) do not line up
    at a call of S bytes of `itemsize`-byte elements (spans): a receive that would take more or fewer
    elements than its send sent, a copy or reduction into a run of chunks of another size. The validator
    checks chunk counts, which hold at every size; this, the elements at one size. The ranks' executor and
    `plan check` call it before anything moves (the replay times a misfit: fabric.cost_nodes times all2all
    at sizes the API refuses). Kept on the plan per size (_kept)."""
    problem = misfit(plan, S, itemsize)
    if problem is not None:
        raise PlanError(problem)


def misfit(plan: Plan, S: int, itemsize: int) -> str | None:
    """check_sizes' answer as a message (None: the chunks line up at S), kept on the plan per size."""
    return on_plan(plan, "_misfits", (int(S), itemsize), _misfit)


def _misfit(plan: Plan, S: int, itemsize: int) -> str | None:
    tables = [spans(plan, S, itemsize, g) for g in range(plan.gpus)]
    found: list[str] = []

    def elements(g: int, ref: Ref) -> int:
        lo, hi = span(tables[g], ref)
        return hi - lo

    def fits(g: int, step: int, op: Op, ref: Ref, want: int, what: str) -> None:
        have = elements(g, ref)
        if have != want and not found:
            found.append(f"GPU {g} step {step} ({op.kind}, channel {op.channel}) chunk {ref.off}: at {S} bytes "
                         f"({itemsize}-byte elements) {what} {want} elements into chunks of {have} (the chunks of "
                         f"the GPUs' buffers do not line up at this size)")

    def visit(g: int, step: int, op: Any, message: Any) -> tuple[int, int, int] | None:
        # message: (sender, its step, its elements), or a slot's contributions, a list of those
        if op.kind in SWITCH_PUTS:
            return g, step, elements(g, op.src)
        if op.kind in SWITCH_TAKES:  # every contribution of the slot: (GPU, its step, its elements)
            for h, hstep, sent in message:
                fits(g, step, op, op.dst, sent, f"takes in-switch slot {list(op.slot)}, GPU {h} step {hstep} "
                     f"contributing")
            return None
        if message is not None:  # (sender, its step, the elements it sent)
            fits(g, step, op, op.dst if op.dst is not None else op.src, message[2],
                 f"receives from GPU {message[0]} step {message[1]}")
        if op.kind in ("copy", "reduce"):
            fits(g, step, op, op.dst, elements(g, op.src), f"a {op.kind} of")
        if op.kind in SENDS:
            return g, step, elements(g, op.src if op.kind in ("send", "recv_reduce_send") else op.dst)
        return None

    walk(plan, visit)
    return found[0] if found else None


def span(table: Table, ref: Ref | None) -> tuple[int, int]:
    """The element range [lo, hi) of chunk run `ref` in a GPU's table (spans)."""
    # ref: an Op's src or dst, which its kind sets (never None here); mypy cannot tie the field to the kind,
    # and callers narrowing it would cost a call per operation
    return table[ref.buf][ref.off][0], table[ref.buf][ref.off + ref.cnt - 1][1]  # type: ignore[union-attr]
