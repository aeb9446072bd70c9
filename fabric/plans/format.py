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
incoming. The in-switch kinds (contribute to an
in-switch reduction, multicast store, load-reduce request) are part of the format; the interpreters
do not run them yet, and the validator refuses them with UnsupportedOperation-style PlanError.
"""

import dataclasses
from collections import deque
from dataclasses import dataclass, field

BUFFERS = ("i", "o", "s")
SENDS = ("send", "recv_reduce_send", "recv_copy_send", "recv_reduce_copy_send")
RECVS = ("recv", "recv_reduce", "recv_reduce_send", "recv_copy_send", "recv_reduce_copy_send")
LOCAL = ("copy", "reduce")
REDUCING = ("recv_reduce", "recv_reduce_send", "recv_reduce_copy_send", "reduce")  # the kinds that fold
IN_SWITCH = ("switch_contribute", "multicast_store", "load_reduce")
KINDS = tuple(dict.fromkeys(SENDS + RECVS + LOCAL + ("flush", "nop") + IN_SWITCH))
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
    """One operation of a GPU's program. send_to/recv_from: the GPU sent to / received from;
    incoming_first: a reducing kind's operand order (module docstring), incoming (op) dst."""

    kind: str
    channel: int = 0
    src: Ref | None = None
    dst: Ref | None = None
    send_to: int | None = None
    recv_from: int | None = None
    deps: tuple[int, ...] = ()
    incoming_first: bool = False


def _quick_init(cls) -> None:
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
    cls.__init__ = scope["__init__"]


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
    sends only, and the GPU's clock is the latest channel's at the end (a "join")."""

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
    meta: dict = field(default_factory=dict, compare=False)

    def ops(self):
        """(gpu, step, op) for every operation, GPU by GPU in program order."""
        for program in self.programs:
            for step, op in enumerate(program.ops):
                yield program.gpu, step, op


def walk(plan: Plan, visit) -> tuple[list[int], dict[tuple[int, int, int], deque]]:
    """The plan's symbolic run, shared by the validator and the timing tables: every GPU in program order
    until it waits for a message not yet sent (sends never wait; a receive takes the oldest message of
    its sender, receiver and channel). visit(g, step, op, message) is called once per operation that
    runs, with the message a receive takes (None otherwise), and returns what a sending operation sends.
    Returns (each GPU's count of operations run, the queues of messages (sender, receiver, channel)):
    a GPU that stopped short waits for ever (a deadlock), a message left in a queue was never received."""
    queues: dict[tuple[int, int, int], deque] = {}
    at = [0] * plan.gpus
    recvs, sends = _RECVS, _SENDS
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
                    queue = queues.get((op.recv_from, g, op.channel))
                    if not queue:
                        break
                    message = queue.popleft()
                out = visit(g, step, op, message)
                if kind in sends:
                    key = (g, op.send_to, op.channel)
                    queue = queues.get(key)
                    if queue is None:
                        queue = queues[key] = deque()
                    queue.append(out)
                step += 1
                progressed = True
            at[g] = step
    return at, queues


_RECVS, _SENDS = frozenset(RECVS), frozenset(SENDS)  # walk's membership tests
