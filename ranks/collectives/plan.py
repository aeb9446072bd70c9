"""The one executor of plans (fabric.plans): a validated plan run with real messages and real data.

Each member runs its GPU's program in order: an operation's receives (piece by piece, as fabric.plans.timing
lists them: messages of at most chunk_bytes of whole elements, keys (PLAN, channel, message number on
that channel and pair, piece)), then its sends (one that receives and sends on forwards each piece as
soon as it is in), a flush where the plan says; so the emulated modeled
time is the replay's (fabric.plans.timing.plan_ns) by construction. Buffers: "i" the input, "o" the
output (the input itself in place), "s" a scratch array of the plan's scratch chunks, chunks as
fabric.plans.chunks.spans cuts them (a scratch chunk the size of what is first written into it).
Reductions fold the received data into what is there (fabric.reduction.combine(op, dst, incoming): ring.py's order;
an operation with incoming_first, the other way round: combine_incoming_first, ring.py's reduce chain); an allreduce's or reduce_scatter's
average is finished on every output element at the end (the same sum divided by n on every member).
A plan whose channels run on lanes (Plan.lanes = C > 1) runs channel c's operations in call.channel(c, C)
(its own clock and lane of the links) and ends with a flush on every channel and call.join_channels, as
fabric.plans.timing.messages times it. Link bytes: the plan's (fabric.plans.plan_link_bytes).
In-switch operations are the switch packets sharp.py sent (Call.reduce, so the switches check them as
any other): a switch_contribute of a chunk run is one REDUCE of slot op.slot, issued at the call's start
(its modeled issue time: the credits are not modeled), its result to send_to or every member under key
(PLAN_SWITCH, *slot); a multicast_store is one MCAST under that key (Call.multicast: the switch picks its
spine from the key's last entry); a load_reduce is one LOAD_REDUCE (Call.load_reduce) of its chunks of the
input, bound for the call as SOURCE by every member (gpu.bind_buffer, unbound at the end), its header-only
request booked on the uplink at the start (gpu.reserve_uplink, all of them, in program order: nvls.py's),
and a switch_contribute to a slot a load_reduce asks for is the member's answer to the switch's read
(Call.serve_load: the switch names the range); every switch_recv's chunks are posted at the start and
waited for at its turn;
the switch finishes the reduction (no average at the end). A chunk run of no element is skipped.
A leaf plan (Plan.leaf: hier_nvls's node stages in the leaf) sends its in-switch operations through the node's
group at its leaf (Communicator.node_group_id) under the leaf's slot (op.slot[1:]; its node first in the
plan), a load_reduce at its turn (its request on the uplink at the member's clock) with the leaf summing (an
average is finished on the output at the end, as point to point), and posts a switch_recv at its turn.
A credit is the communicator's out-of-band credit (Communicator.send_credit: the results this member
took so far), a credit_wait takes the next one from its GPU (next_credit).
"""

import numpy as np

from nvlink_emu.fabric.errors import PlanError
from nvlink_emu.fabric.plans.format import RECVS, SENDS, in_switch, load_requests
from nvlink_emu.fabric.plans.chunks import check_sizes, span, spans
from nvlink_emu.fabric.plans.timing import with_flushes
from nvlink_emu.fabric.reduction import chunks, combine, combine_incoming_first, finish

PLAN = 30  # message phase
PLAN_SWITCH = 31  # an in-switch slot's result
SOURCE = ("plan-bound",)  # the input, bound for the switch's LOADs (load_reduce)


def execute(call, plan, inp: np.ndarray, out: np.ndarray) -> None:
    """Run `plan` (validated, for call.n GPUs) as member call.r: inp/out the flat input and output
    arrays (the same array in place; a buffer the member's program does not touch, such as gather's
    output off the root or scatter's input, may be empty)."""
    if plan.gpus != call.n:
        raise PlanError(f"plan {plan.name!r} is for {plan.gpus} GPUs, the communicator has {call.n}")
    item = inp.dtype.itemsize
    # S as fabric.plans.timing takes it (gather's and scatter's: n parts; a non-root passes an empty buffer)
    S = {"allgather": out.size, "all2all": inp.size, "gather": inp.size * call.n,
         "scatter": out.size * call.n}.get(plan.collective, inp.size) * item
    check_sizes(plan, S, item)  # every member refuses a plan whose chunks misfit at this size, before a byte moves
    table = spans(plan, S, item, call.r)
    program = plan.programs[call.r]
    bufs = {"i": inp, "o": inp if plan.inplace else out}
    for name, ranges in table.items():  # a plan sized for a call (GpuProgram.elements) names its own ends
        if name in bufs and ranges and ranges[-1][1] > bufs[name].size and program.elements is not None:
            raise PlanError(f"plan {plan.name!r} GPU {call.r}: its {name!r} chunks hold {ranges[-1][1]} elements, "
                            f"the buffer {bufs[name].size}")
    if program.s_chunks:
        bufs["s"] = np.empty(table["s"][-1][1], inp.dtype)  # the validator proved no chunk is read unwritten
    # a received piece, before it is folded: at most a message, or a whole buffer (a run of several chunks)
    longest = max((ranges[-1][1] for ranges in table.values() if ranges), default=0)
    tmp_all = np.empty(min(call.chunk, max(longest, 1)), inp.dtype)
    sent: dict[tuple, int] = {}  # (peer, channel) -> messages sent so far, to number each pair's stream
    taken: dict[tuple, int] = {}
    switched = in_switch(plan)
    # in-switch: the contributions' modeled issue time (the call's start), the slots load_reduce asks for,
    # and each request's stamp on the uplink
    ctx = {"start": call.gpu.now_ns, "loads": load_requests(plan) if switched else {}, "stamps": {}, "taken": 0,
           # a leaf plan (Plan.leaf): the node's group at its leaf, which sums (an average is finished below)
           "group": call.comm.node_group_id() if plan.leaf else None,
           "op": "sum" if call.op == "avg" and plan.leaf else None}
    if ctx["loads"]:  # every member answers the switch's reads from its input
        call.gpu.bind_buffer(call.key(*SOURCE), bufs["i"])
    if ctx["loads"] and not plan.leaf:  # its requests are issued at once (a leaf plan's: at their turn)
        for op in program.ops:
            if op.kind == "load_reduce":
                lo, hi = span(table, op.src)
                if hi > lo:
                    ctx["stamps"][op.slot] = call.gpu.reserve_uplink(0, ctx["start"])
    if switched and not plan.leaf:  # every result's chunks posted before anything is contributed (sharp.py's order)
        for op in program.ops:
            if op.kind == "switch_recv":
                lo, hi = span(table, op.dst)
                call.post((PLAN_SWITCH, *op.slot), bufs[op.dst.buf][lo:hi])
    C = plan.lanes if plan.lanes > 1 else 1  # channel c on its own lane (c, C): Call.channel (Plan.lanes)
    for op in with_flushes(plan, call.r):  # a flush before overwriting what a pending send reads
        if C > 1:
            with call.channel(op.channel, C):
                _run_op(call, plan, op, bufs, table, tmp_all, sent, taken, ctx)
        else:
            _run_op(call, plan, op, bufs, table, tmp_all, sent, taken, ctx)
    if C > 1:  # every channel's sends have left (on its lane); the GPU's clock: the latest channel's
        for c in range(C):
            with call.channel(c, C):
                call.flush()
        call.join_channels()
    else:
        call.flush()
    if ctx["loads"]:
        call.gpu.unbind_buffer(call.key(*SOURCE))
    if switched and not plan.leaf:  # the switch finished the reduction (an average divided once there)
        return
    if plan.collective in ("allreduce", "reduce_scatter") or (plan.collective == "reduce" and call.r == plan.root):
        target = bufs["o"]
        finish(call.op, target, call.n, target)


def _run_op(call, plan, op, bufs, table, tmp_all, sent, taken, ctx) -> None:
    """One operation of the member's program (execute's loop); ctx: its in-switch state (execute)."""
    if op.kind == "switch_contribute":
        lo, hi = span(table, op.src)
        if hi > lo and op.slot in ctx["loads"]:  # the answer to the switch's read (it names the range)
            call.serve_load(SOURCE, op.slot[1:] if plan.leaf else op.slot, op.send_to, ctx["group"])
        elif hi > lo:
            dest = list(range(call.n)) if op.send_to is None else [op.send_to]
            call.reduce(op.slot, bufs[op.src.buf][lo:hi], dest, (PLAN_SWITCH, *op.slot), ctx["start"])
        return
    if op.kind == "load_reduce":
        lo, hi = span(table, op.src)
        if hi > lo:
            item = bufs["i"].dtype.itemsize
            if plan.leaf:  # issued at the member's clock, to its node's leaf under the leaf's slot
                call.load_reduce(op.slot[1:], SOURCE, lo * item, (hi - lo) * item, (PLAN_SWITCH, *op.slot),
                                 call.gpu.reserve_uplink(0, call.gpu.now_ns), ctx["group"], ctx["op"])
            else:
                call.load_reduce(op.slot, SOURCE, lo * item, (hi - lo) * item, (PLAN_SWITCH, *op.slot),
                                 ctx["stamps"][op.slot])
        return
    if op.kind == "multicast_store":
        lo, hi = span(table, op.src)
        if hi > lo:
            call.multicast((PLAN_SWITCH, *op.slot), bufs[op.src.buf][lo:hi], ctx["group"])
        return
    if op.kind == "switch_recv":
        lo, hi = span(table, op.dst)
        if plan.leaf:  # posted at its turn
            call.recv_switch((PLAN_SWITCH, *op.slot), bufs[op.dst.buf][lo:hi], "the leaf's delivery", ctx["group"])
        else:
            call.wait((PLAN_SWITCH, *op.slot), "the switch's delivery", bufs[op.dst.buf][lo:hi])
        ctx["taken"] += 1
        return
    if op.kind == "credit":  # out of band: how many results this member has taken
        call.comm.send_credit(ctx["taken"])
        return
    if op.kind == "credit_wait":
        call.comm.next_credit(op.recv_from)
        return
    if op.kind in RECVS:
        m = taken[(op.recv_from, op.channel)] = taken.get((op.recv_from, op.channel), -1) + 1
    if op.kind in SENDS:
        n = sent[(op.send_to, op.channel)] = sent.get((op.send_to, op.channel), -1) + 1
    fold = combine_incoming_first if op.incoming_first else combine
    if op.kind in RECVS:
        ref = op.dst if op.dst is not None else op.src
        lo0, hi0 = span(table, ref)
        # rrs: what was received and folded, sent on without being stored
        held = bufs[ref.buf][lo0:hi0].copy() if op.kind == "recv_reduce_send" else None
        for k, (lo, hi) in enumerate(chunks(lo0, hi0, call.chunk)):
            view = bufs[ref.buf][lo:hi] if held is None else held[lo - lo0:hi - lo0]
            if op.kind in ("recv", "recv_copy_send"):
                call.recv(op.recv_from, (PLAN, op.channel, m, k), view)
            else:
                tmp = tmp_all[:hi - lo]
                call.recv(op.recv_from, (PLAN, op.channel, m, k), tmp)
                fold(call.op, view, tmp)
            if op.kind in SENDS:  # piece k forwarded at once (fabric.plans.timing.messages)
                call.send(op.send_to, (PLAN, op.channel, n, k), view)
    elif op.kind in SENDS:
        lo0, hi0 = span(table, op.src)
        for k, (lo, hi) in enumerate(chunks(lo0, hi0, call.chunk)):
            call.send(op.send_to, (PLAN, op.channel, n, k), bufs[op.src.buf][lo:hi])
    if op.kind in ("copy", "reduce"):
        slo, shi = span(table, op.src)
        dlo, dhi = span(table, op.dst)
        if shi - slo != dhi - dlo:
            raise PlanError(f"plan {plan.name!r} GPU {call.r}: {op.kind} of {shi - slo} elements into {dhi - dlo}")
        if op.kind == "copy":
            bufs[op.dst.buf][dlo:dhi] = bufs[op.src.buf][slo:shi]
        else:
            fold(call.op, bufs[op.dst.buf][dlo:dhi], bufs[op.src.buf][slo:shi])
    elif op.kind == "flush":
        call.flush()
