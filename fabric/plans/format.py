"""The plan format: per GPU, ordered operations on chunks of its input, output and scratch buffers.

A buffer of a call is cut into `chunks` equal parts (fabric.reduction.blocks of its element count, the
first parts one element longer where it does not divide), or, in a plan built for one call's sizes
(all2allv's counts), into the element counts its programs give (GpuProgram.elements); an operation names a run of `cnt` chunks
from offset `off` of a buffer ("i" input, "o" output, "s" scratch). A GPU's operations are listed in
the order its program issues them; each carries a channel (an operation stream, MSCCL's threadblock)
and `deps`: indices of earlier operations of the same GPU (on any channel) that must be done first.
A send to GPU b on channel c is matched with the receive from this GPU on channel c of b, in order:
the n-th such send with the n-th such receive (MSCCL's rule). Messages are cut into pieces of at most
the fabric's chunk_bytes when timed or run (ranks/collectives/ring.py's chunking).

Kinds (MSCCL-IR's step types in brackets): send [s], recv [r] (dst = the message), recv_reduce [rrc]
(dst += the message), recv_reduce_send [rrs] (send src + the message on, store nothing),
recv_copy_send [rcs] (dst = the message, send it on), recv_reduce_copy_send [rrcs] (dst += the
message, send dst on), copy [cpy] (dst = src), reduce [re] (dst += src), flush (wait until this
GPU's sends so far have left its uplink: no data moves; on a plan whose channels run on lanes, Plan.lanes,
its channel's sends), nop. "+=" is dst (op) incoming; a reducing kind with incoming_first=True folds the
other way round, incoming (op) dst (the message, or reduce's src, on the left: ring.py's reduce chain folds
a member's own data into the partial it received). MSCCL-IR has no such field: a loaded plan folds dst (op)
incoming.

In-switch kinds (NVLink SHARP; each names a `slot`, a non-empty tuple of non-negative ints, the switch's
reduction or store it is part of; its last entry picks the spine across nodes, slot[-1] mod P):
switch_contribute (src: this GPU's contribution to in-switch reduction `slot`; every contribution to a
slot is reduced in the switch, and the result goes to send_to, or, with send_to None, to every GPU of the
plan; sharp's push: a contribution is issued at the call's start, its credits are not modeled),
switch_recv (dst = what the switch delivers for `slot`: its reduction's result once every contribution is
in; a GPU the slot goes to takes it exactly once), multicast_store (src: a copy to every GPU of the plan,
this one included, each taking it with a switch_recv of the slot; one store a slot; across nodes its spine
is (this GPU + slot[-1]) mod P, the switches' rule for stores, fabric.switch.multicast.store_spine; issued
at the GPU's clock) and load_reduce (NVLS: src names chunks of this GPU's input; it asks the switch to
read those chunks of every GPU's input ("i", bound for the call), reduce them and send the result to this
GPU as slot `slot`; each GPU's switch_contribute to that slot is its answer to the switch's read, which it
serves at its turn once the request is out, of the same chunks, send_to the requester; header-only
requests, all of a GPU's booked on its uplink at the call's start, sent as credits allow).

Credit kinds (out of band, as the communicator's control messages: no data on a link, no modeled time):
credit (tell every other GPU of the plan how many in-switch results this GPU has taken so far) and
credit_wait (recv_from: wait for that GPU's next credit). They bound what a push keeps in the switch where
only one GPU takes the results (sharp's reduce: the root's credits pace the others' contributions); every
credit must be taken by every other GPU, in order.
"""

import dataclasses
import operator
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

BUFFERS = ("i", "o", "s")
SENDS = ("send", "recv_reduce_send", "recv_copy_send", "recv_reduce_copy_send")
RECVS = ("recv", "recv_reduce", "recv_reduce_send", "recv_copy_send", "recv_reduce_copy_send")
LOCAL = ("copy", "reduce")
REDUCING = ("recv_reduce", "recv_reduce_send", "recv_reduce_copy_send", "reduce")  # the kinds that fold
IN_SWITCH = ("switch_contribute", "multicast_store", "load_reduce", "switch_recv")
SWITCH_PUTS = ("switch_contribute", "multicast_store")  # the in-switch kinds that put data into a slot (walk)
SWITCH_TAKES = ("switch_recv",)  # the in-switch kinds that wait for what the switch delivers for a slot
CREDITS = ("credit", "credit_wait")  # out of band: no data, no modeled time (module docstring)
CREDIT_CHANNEL = -1  # the key walk files a credit under, apart from every channel's messages
KINDS = tuple(dict.fromkeys(SENDS + RECVS + LOCAL + ("flush", "nop") + IN_SWITCH + CREDITS))
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "all2all", "broadcast", "reduce", "gather", "scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # the collectives a plan's root is for
FABRICS = ("classic", "network")  # fabric modes (fabric.config)


@dataclass(frozen=True, slots=True)
class Ref:
    """`cnt` chunks of buffer `buf` from chunk `off`."""

    buf: str
    off: int
    cnt: int = 1

    def chunk_ids(self) -> range:
        return range(self.off, self.off + self.cnt)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a GPU's program. send_to/recv_from: the GPU sent to / received from (a
    switch_contribute's send_to: the GPU its slot's result goes to, None: every GPU); incoming_first: a
    reducing kind's operand order (module docstring), incoming (op) dst; slot: an in-switch kind's."""

    kind: str
    channel: int = 0
    src: Ref | None = None
    dst: Ref | None = None
    send_to: int | None = None
    recv_from: int | None = None
    deps: tuple[int, ...] = ()
    incoming_first: bool = False
    slot: tuple[int, ...] = ()  # an in-switch kind's reduction or store (module docstring); () otherwise


def _quick_init(cls: type) -> None:
    """Give the frozen, slotted dataclass `cls` an __init__ that stores each field through its slot
    (the generated one goes through object.__setattr__, field by field: at 2.6 million operations a plan,
    ring's channels on 256 GPUs, that was most of building one). Written from the class's own fields, so a
    field added later is stored too; a field with a default_factory keeps the generated __init__."""
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not dataclasses.MISSING for f in fields):
        return
    scope = {f"_set_{f.name}": cls.__dict__[f.name].__set__ for f in fields}
    scope |= {f"_default_{f.name}": f.default for f in fields if f.default is not dataclasses.MISSING}
    params = ", ".join(f.name if f.default is dataclasses.MISSING else f"{f.name}=_default_{f.name}" for f in fields)
    body = "".join(f"    _set_{f.name}(self, {f.name})\n" for f in fields)
    exec(f"def __init__(self, {params}):\n{body}", scope)  # noqa: S102 (our own field names only)
    scope["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = scope["__init__"]  # type: ignore[misc]  # this class's own __init__, replaced on purpose


_quick_init(Ref)
_quick_init(Op)


@dataclass(frozen=True)
class GpuProgram:
    """One GPU's buffers (chunks each) and operations in program order. elements: None (chunks cut from
    the call's size), or the element count of every chunk, (input's, output's, scratch's), in a plan built
    for one call's sizes; the buffers hold at least their sums."""

    gpu: int
    ops: tuple[Op, ...]
    i_chunks: int
    o_chunks: int
    s_chunks: int = 0
    elements: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def chunks_of(self, buf: str) -> int:
        return {"i": self.i_chunks, "o": self.o_chunks, "s": self.s_chunks}[buf]


@dataclass(frozen=True)
class Plan:
    """A collective as data. name: the algorithm; collective: one of COLLECTIVES; gpus: the GPU count it
    is for; inplace: output buffer is the input buffer (ops on "o" and "i" name the same chunks);
    root: a rooted collective's (ROOTED: broadcast, reduce, gather, scatter); fabrics: the fabric modes that
    may run it. groups: a buffer of groups x k chunks is cut into `groups` blocks first
    (fabric.reduction.blocks), each then into k chunks (ring's channels: chunk m C + c is member m's range
    of channel c, fabric.reduction.rail_ranges); 1: one cut. piece: 0, or the plan is for one element
    count: each of the `groups` blocks is cut into pieces of `piece` elements (fabric.reduction.chunks, the
    last one shorter), chunk ids running through the blocks in order (tree's pipeline chunks). lanes: 0 or
    1, the channels are operation streams on the GPU's one clock and whole links; C > 1, channel c
    (0..C-1) runs on its own lane (c, C): its own clock and 1 / C of the GPU's uplink and downlink
    (docs/model/time.md, "Channels"; MSCCL's threadblocks on channels), a flush on it waits for its own
    sends only, and the GPU's clock is the latest channel's at the end (fabric.programs.Join). leaf: () the plan's
    in-switch operations are on one group of every GPU (sharp's, nvls's); else the nodes' GPUs (leaf[a]: node
    a's, in its positions' order) and they run in each node's leaf switch (hier_nvls's node stages, mixed
    with point-to-point messages): an in-switch op's slot[0] is its own node a, slot[1:] the leaf's slot
    (a load-reduce's: its requester's position first); "every GPU" of a slot (a store's copies, a
    load_reduce's answers, a result with send_to None) is node a's; the leaf sums (an average is finished
    by the GPUs at the end, as point to point); a load_reduce is issued at the GPU's clock at its turn and a
    switch_recv posted at its turn (fabric.plans.timing_leaf times it)."""

    name: str
    collective: str
    gpus: int
    programs: tuple[GpuProgram, ...]
    inplace: bool = False
    root: int = 0
    fabrics: tuple[str, ...] = FABRICS
    groups: int = 1
    lanes: int = 0
    piece: int = 0
    leaf: tuple[tuple[int, ...], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def ops(self) -> Iterator[tuple[int, int, Op]]:
        """(gpu, step, op) for every operation, GPU by GPU in program order."""
        for program in self.programs:
            for step, op in enumerate(program.ops):
                yield program.gpu, step, op


def walk(plan: Plan, visit: Callable[[int, int, Op, Any], Any]
         ) -> tuple[list[int], dict[tuple[int, int, int], deque[Any]]]:
    """The plan's symbolic run, shared by the validator and the timing tables: every GPU in program order
    until it waits for a message not yet sent (sends never wait; a receive takes the oldest message of
    its sender, receiver and channel). visit(g, step, op, message) is called once per operation that
    runs, with the message a receive takes (None otherwise), and returns what a sending operation sends.
    Returns (each GPU's count of operations run, the queues of messages (sender, receiver, channel)):
    a GPU that stopped short waits for ever (a deadlock), a message left in a queue was never received.
    In-switch kinds: what a SWITCH_PUTS operation's visit returns joins its slot's pool; a SWITCH_TAKES
    operation waits until every operation of the plan that puts into its slot has (switch_slots), and its
    message is the pool, a list in the order they ran; a switch_contribute to a slot a load_reduce asks for
    (load_requests) waits until that request has run (it answers the switch's read). A credit's visit
    result goes to every other GPU, filed under channel CREDIT_CHANNEL; a credit_wait takes the oldest."""
    queues: dict[tuple[int, int, int], deque[Any]] = {}
    pools: dict[tuple[int, ...], list[Any]] = {}
    needed = None  # slot -> how many operations put into it, counted at the first wait for a slot
    takes: dict[tuple[int, ...], int] = {}  # slot -> its takes still to run (then its pool is dropped: nvls's
    # pools held every put's visit result to the end, 2.2 GB of a validation at 8 x 8 GPUs and 256 MiB)
    loads, requested = None, set()  # the slots load_reduce asks for (load_requests); those asked so far
    at = [0] * plan.gpus
    recvs, sends = _RECVS, _SENDS
    op: Any  # an operation of the plan: its kind says which peers are set (a cast per use would cost a call)
    progressed = True
    while progressed:
        progressed = False
        for g, program in enumerate(plan.programs):
            ops, step = program.ops, at[g]
            end = len(ops)
            while step < end:
                op, message = ops[step], None
                kind = op.kind
                if kind in recvs:
                    queue = queues.get((op.recv_from, g, op.channel))  # a receive names its sender
                    if not queue:
                        break
                    message = queue.popleft()
                elif kind == "credit_wait":  # the next credit of recv_from
                    queue = queues.get((op.recv_from, g, CREDIT_CHANNEL))
                    if not queue:
                        break
                    message = queue.popleft()
                elif kind in _WAITS:
                    if kind == "switch_contribute":
                        if loads is None:
                            loads = load_requests(plan)
                        if op.slot in loads and op.slot not in requested:
                            break
                    else:
                        if needed is None:
                            needed = {slot: len(puts) for slot, puts in switch_slots(plan).items()}
                            takes = _takes(plan)
                        message = pools.get(op.slot)
                        if message is None or len(message) < needed.get(op.slot, 0) or not needed.get(op.slot):
                            break
                out = visit(g, step, op, message)
                if kind in _TAKES:
                    left = takes[op.slot] = takes[op.slot] - 1
                    if not left:
                        del pools[op.slot]  # its last take has run
                elif kind in _PUTS:
                    pools.setdefault(op.slot, []).append(out)
                elif kind == "load_reduce":
                    requested.add(op.slot)
                elif kind == "credit":  # to every other GPU, each taking it with a credit_wait
                    for h in range(plan.gpus):
                        if h != g:
                            queues.setdefault((g, h, CREDIT_CHANNEL), deque()).append(out)
                if kind in sends:
                    key = (g, op.send_to, op.channel)  # a send names its receiver
                    queue = queues.get(key)
                    if queue is None:
                        queue = queues[key] = deque()
                    queue.append(out)
                step += 1
                progressed = True
            at[g] = step
    return at, queues


_RECVS, _SENDS = frozenset(RECVS), frozenset(SENDS)  # walk's membership tests
_PUTS, _TAKES = frozenset(SWITCH_PUTS), frozenset(SWITCH_TAKES)
_WAITS = _TAKES | {"switch_contribute"}  # the in-switch kinds that may wait in walk
_KIND = operator.attrgetter("kind")  # an operation's kind, read in C by map


def switch_slots(plan: Plan) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    """slot -> the (GPU, step) of every operation that puts into it (SWITCH_PUTS), in GPU and program order;
    kept on the plan (a plan is immutable)."""
    kept = plan.__dict__.get("_switch_slots")
    if kept is None:
        kept, kinds = {}, _kinds(plan)
        for at, program in enumerate(plan.programs):
            if kinds is not None and _PUTS.isdisjoint(kinds[at]):  # most programs have none
                continue
            for step, op in enumerate(program.ops):
                if op.kind in _PUTS:
                    kept.setdefault(op.slot, []).append((program.gpu, step))
        plan.__dict__["_switch_slots"] = kept
    return kept


def _takes(plan: Plan) -> dict[tuple[int, ...], int]:
    """slot -> how many operations take from it (SWITCH_TAKES), for walk."""
    out: dict[tuple[int, ...], int] = {}
    kinds = _kinds(plan)
    for at, program in enumerate(plan.programs):
        if kinds is not None and _TAKES.isdisjoint(kinds[at]):  # most programs of most plans have none
            continue
        for op in program.ops:
            if op.kind in _TAKES:
                out[op.slot] = out.get(op.slot, 0) + 1
    return out


def load_requests(plan: Plan) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    """slot -> the (GPU, step) of every load_reduce that asks for it, in GPU and program order; kept on the plan."""
    kept = plan.__dict__.get("_load_requests")
    if kept is None:
        kept, kinds = {}, _kinds(plan)
        for at, program in enumerate(plan.programs):
            if kinds is not None and "load_reduce" not in kinds[at]:  # most programs have none
                continue
            for step, op in enumerate(program.ops):
                if op.kind == "load_reduce":
                    kept.setdefault(op.slot, []).append((program.gpu, step))
        plan.__dict__["_load_requests"] = kept
    return kept


def has_credits(plan: Plan) -> bool:
    """Whether any operation of `plan` is a credit kind (kept on the plan)."""
    return _has_kind(plan, "_has_credits", CREDITS)


def in_switch(plan: Plan) -> bool:
    """Whether any operation of `plan` is an in-switch kind (kept on the plan)."""
    return _has_kind(plan, "_in_switch", IN_SWITCH)


def _has_kind(plan: Plan, name: str, kinds: tuple[str, ...]) -> bool:
    """Whether any operation of `plan` is one of `kinds`, kept on the plan under `name` (a plan is immutable)."""
    kept = plan.__dict__.get(name)
    if kept is None:
        every = _kinds(plan)
        kept = plan.__dict__[name] = any(op.kind in kinds for _, _, op in plan.ops()) if every is None else \
            any(kind in have for have in every for kind in kinds)
    return bool(kept)


def _kinds(plan: Plan) -> list[set[Any]] | None:
    """The kinds of each program's operations, GPU by GPU, read in C (a generator over plan.ops() took ~0.7 s
    at 2.6 million operations); kept on the plan. None where a kind is not hashable (no valid plan's)."""
    kept = plan.__dict__.get("_kinds", False)
    if kept is False:
        try:
            kept = [set(map(_KIND, program.ops)) for program in plan.programs]
        except TypeError:
            kept = None
        plan.__dict__["_kinds"] = kept
    return cast(list[set[Any]] | None, kept)
