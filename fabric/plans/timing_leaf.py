"""The replay interpreter of leaf plans (Plan.leaf: hier_nvls's node stages in the leaf switch, mixed with
point-to-point messages between nodes): a validated plan timed on fabric.programs' link clocks and one
reduction engine a leaf. Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns).

Every GPU runs its program (fabric.plans.timing.with_flushes, as the ranks' executor) round-robin, each
until it waits (a receive for its message, an answer for its load-reduce's request, a switch_recv for its
delivery), as fabric.programs.run_programs, booking as the ranks and fabric.switch do on one switch:
- a point-to-point message (send, recv, recv_reduce; pieces of at most chunk_bytes) as Fabric books it:
  the sender's uplink at its clock (+ a), its leaf (+ s), across nodes its outbound share (+ u), the
  spine and the cable down, the destination's leaf (+ s); the receiver's inbound share and downlink in its
  program order, its clock at the last byte (+ a);
- load_reduce: the request, header-only, on the requester's uplink at its clock (+ a); its leaf's LOADs
  are ready a switch traversal later (+ s);
- switch_contribute (a member's answer to a LOAD): the LOAD on its downlink as it serves it (+ a), the
  answer on its uplink from then (+ a); the node's engine (one ReductionClock a leaf) reduces a slot once
  every member's answer is in (+ s + its latency, at its bandwidth), in the order the slots complete;
- multicast_store: up the sender's uplink at its clock (+ a), through the leaf (+ s), to every member of
  the node, the sender too;
- switch_recv: the delivery (a result or a store's copy) on the GPU's downlink as it takes it, its clock
  at the last byte (+ a);
- flush: the GPU's clock at its uplink's last byte; copy, reduce, nop: no modeled time.
A run of chunks of no element is neither sent nor taken. The call ends at the latest GPU's clock.
"""

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..counters import downlink, uplink
from ..errors import FabricError, PlanError
from ..packets import raw_bytes
from ..programs import Fabric
from ..reduction import chunks
from ..timemodel import LinkEnd, ReductionClock
from ..topology import Topology
from .chunks import Table
from .format import Op, Plan, Ref

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from ..config import FabricConfig

# an operation as leaf_plan_ns walks it: (kind, peer, key, lo, hi, pieces taken); peer and key Any: the kind
# says which is set (a flush's are None), and narrowing them op by op would cost in the hot loop
Step = tuple[str, Any, Any, int, int, int]


def leaf_plan_ns(plan: Plan, topo: Topology, config: "FabricConfig", itemsize: int, tables: Sequence[Table],
                 programs: Sequence[Sequence[Op]]) -> float:
    """Modeled ns of one call of the leaf plan `plan` (validated; Plan.leaf the fabric's nodes) on every GPU of
    `topo`, all starting at 0 (module docstring): the latest GPU's clock at the end. tables[g]: GPU g's
    chunks at the call's size (fabric.plans.chunks.spans), programs[g]: its operations with the flushes the
    executor adds (timing.with_flushes): fabric.plans.timing.plan_ns gives them."""
    if topo.gpus != plan.gpus:
        raise PlanError(f"plan {plan.name!r} is for {plan.gpus} GPUs, the fabric has {topo.gpus}")
    if config.mode not in plan.fabrics:
        raise PlanError(f"plan {plan.name!r} runs on {', '.join(plan.fabrics)} fabrics, not {config.mode!r}")
    node_of = [topo.locate(g)[0] for g in range(topo.gpus)]
    if any(node_of[g] != a for a, node in enumerate(plan.leaf) for g in node):
        raise PlanError(f"plan {plan.name!r}: its leaf groups {plan.leaf} are not the fabric's nodes")
    n = plan.gpus
    chunk = max(1, config.chunk_bytes // itemsize)
    t = config.timing
    s = t.switch_latency_ns
    mtu, head = config.mtu_bytes, config.header_bytes
    raws: dict[int, int] = {}  # payload bytes -> raw bytes (a call has a few message sizes)

    def raw(nbytes: int) -> int:
        got = raws.get(nbytes)
        if got is None:
            got = raws[nbytes] = raw_bytes(nbytes, mtu, head)
        return got

    header = raw(0)
    fabric = Fabric(topo, mtu, head)
    gpus, sent = fabric.gpus, fabric.sent
    # read only for a transfer between nodes, where the fabric has them (spines)
    shares, spine_ns = cast(list[LinkEnd], fabric.shares), cast(float, fabric.spine_ns)
    engines = [ReductionClock(t.reduction_gbytes_per_s, t.reduction_latency_ns) for _ in range(topo.nodes)]
    members = [len(node) for node in plan.leaf]
    asked: dict[tuple[int, ...], tuple[int, float]] = {}  # slot -> (requester, its request's last byte at the leaf)
    slots: dict[tuple[int, ...], list[float]] = {}        # slot -> [answers, latest first byte, latest last byte]
    # (GPU, slot) -> stamps at its leaf, raw bytes
    delivered: dict[tuple[int, tuple[int, ...]], tuple[float, float, int]] = {}
    cuts: dict[tuple[int, int], list[int]] = {}  # an element range -> its messages' payload bytes

    def pieces(lo: int, hi: int) -> list[int]:
        got = cuts.get((lo, hi))
        if got is None:
            got = cuts[(lo, hi)] = [(y - x) * itemsize for x, y in chunks(lo, hi, chunk)]
        return got

    def program(g: int) -> Iterator[Step]:
        """GPU g's operations with their element ranges, point-to-point keys (channel, message number on
        that channel and pair, piece) as fabric.plans.timing.messages numbers them; last, a receive's pieces
        taken so far (0)."""
        table, numbers = tables[g], dict[tuple[int, int | None, bool], int]()
        for op in programs[g]:
            kind = op.kind
            if kind in ("copy", "reduce", "nop"):
                continue
            if kind == "flush":
                yield kind, None, None, 0, 0, 0
                continue
            ref = cast(Ref, op.src if kind in ("send", "load_reduce", "switch_contribute", "multicast_store")
                       else op.dst)  # the kind names it (the validator)
            lo, hi = table[ref.buf][ref.off][0], table[ref.buf][ref.off + ref.cnt - 1][1]  # chunks.span
            if kind == "send" or kind == "recv" or kind == "recv_reduce":
                peer = op.send_to if kind == "send" else op.recv_from
                key = (op.channel, peer, kind == "send")
                m = numbers[key] = numbers.get(key, -1) + 1
                yield kind, peer, (op.channel, m), lo, hi, 0
            elif kind in ("load_reduce", "switch_contribute", "multicast_store", "switch_recv"):
                if hi > lo:
                    yield kind, op.send_to, op.slot, lo, hi, 0
            else:
                raise PlanError(f"plan {plan.name!r}: a leaf plan's {kind} is not timed (send, recv, recv_reduce, "
                                f"the in-switch kinds, copy, reduce, flush, nop)")

    running = {g: program(g) for g in range(n)}
    waiting: dict[int, Step] = {}
    while running:
        progressed = False
        for r in list(running):
            gpu = gpus[r]
            # LinkEnd.book is its clock's transmit, LinkEnd.send that + its latency: called directly
            node, uplink = gpu.node, gpu.uplink
            up, up_ns = uplink.clock.transmit, uplink.latency_ns
            down, down_ns = gpu.downlink.clock.transmit, gpu.downlink.latency_ns
            ops = running[r]
            op = waiting.pop(r, None)
            while True:
                if op is None:
                    op = next(ops, None)
                    if op is None:
                        del running[r]
                        progressed = True
                        break
                kind, peer, key, lo, hi, done = op  # the commonest first: a slice's takes and answers are G per chunk
                if kind == "switch_recv":
                    got = delivered.pop((r, key), None)
                    if got is None:
                        waiting[r] = op
                        break
                    _, end = down(*got)
                    gpu.now = max(gpu.now, end + down_ns)
                elif kind == "switch_contribute":  # the answer to the LOAD of the request of `key`
                    request = asked.get(key)
                    if request is None:
                        waiting[r] = op
                        break
                    requester, end = request
                    nraw = raw((hi - lo) * itemsize)
                    _, at = down(end + s, end + s, header)
                    at += down_ns
                    a0, a1 = up(at, at, nraw)
                    a0, a1 = a0 + up_ns, a1 + up_ns
                    slot = slots.get(key)
                    if slot is None:
                        slot = slots[key] = [0, 0.0, 0.0]
                    slot[0] += 1
                    slot[1], slot[2] = max(slot[1], a0), max(slot[2], a1)
                    if slot[0] == members[node]:
                        del slots[key], asked[key]
                        start, finish = engines[node].reduce(slot[1] + s, slot[2] + s, nraw)
                        delivered[(requester, key)] = (start, finish, nraw)
                elif kind == "send":  # Fabric.send's bookings, inlined
                    b = gpus[peer].node
                    for k, nbytes in enumerate(pieces(lo, hi)):
                        nraw = raw(nbytes)
                        a0, a1 = up(gpu.now, gpu.now, nraw)
                        a0, a1 = a0 + up_ns + s, a1 + up_ns + s                 # the link, the sender's leaf
                        if b != node:
                            a0, a1 = shares[r].send(a0, a1, nraw)              # its outbound share, + u
                            a0, a1 = a0 + spine_ns, a1 + spine_ns              # the spine, the cable down
                            a0, a1 = a0 + s, a1 + s                             # the destination's leaf
                        sent[(r, peer, (*key, k))] = (a0, a1, nraw)
                elif kind == "recv" or kind == "recv_reduce":
                    count = len(pieces(lo, hi))
                    # from the pieces already taken when it waited (done)
                    while done < count and fabric.receive(gpu, peer, (*key, done)):
                        done += 1
                    if done < count:
                        waiting[r] = (kind, peer, key, lo, hi, done)
                        break
                elif kind == "load_reduce":
                    _, end = up(gpu.now, gpu.now, header)
                    asked[key] = (r, end + up_ns)
                elif kind == "multicast_store":
                    nraw = raw((hi - lo) * itemsize)
                    a0, a1 = up(gpu.now, gpu.now, nraw)
                    a0, a1 = a0 + up_ns + s, a1 + up_ns + s
                    for g in plan.leaf[node]:
                        delivered[(g, key)] = (a0, a1, nraw)
                else:  # flush
                    gpu.now = max(gpu.now, uplink.free_ns)
                progressed = True
                op = None
        if not progressed:
            raise FabricError(f"plan {plan.name!r}: {plan.collective} on {n} GPUs waits for ever: GPUs "
                              f"{sorted(waiting)} wait for what nobody sends (a plan fabric.plans.validate refuses)")
    return max(gpu.now for gpu in fabric.gpus)


def leaf_plan_link_bytes(plan: Plan, topo: Topology, config: "FabricConfig", itemsize: int,
                         tables: Sequence[Table]) -> tuple[dict[str, int], dict[str, int]]:
    """(payload, raw) bytes on every link (Topology.link_payload_bytes' names and order) of one call of the
    leaf plan `plan` (validated) on `topo`, summed from its operations; tables[g]: GPU g's chunks at the call's
    size (fabric.plans.chunks.spans). A point-to-point message (pieces of at most chunk_bytes) on its route;
    in the leaf, as leaf_plan_ns books them: a load_reduce's request (header only) on the requester's uplink;
    a switch_contribute's LOAD (header only) on the answering GPU's downlink and its answer on its uplink; a
    multicast_store on the sender's uplink and, taken, on every node member's downlink (its own too); a
    switch_recv (a result or a store's copy) on the taker's downlink. Raw: fabric.packets.raw_bytes a packet.
    Exact (Python ints)."""
    n = plan.gpus
    chunk = max(1, config.chunk_bytes // itemsize)
    mtu, head = config.mtu_bytes, config.header_bytes
    header = raw_bytes(0, mtu, head)
    sent, sent_raw = np.zeros((n, n), object), np.zeros((n, n), object)  # exact, as cost_in_switch's
    up, up_raw, down, down_raw = [0] * n, [0] * n, [0] * n, [0] * n
    for g, program in enumerate(plan.programs):
        table = tables[g]
        for op in program.ops:
            kind = op.kind
            if kind not in ("send", "load_reduce", "switch_contribute", "multicast_store", "switch_recv"):
                continue  # a receive is its send's; copy, reduce, flush, nop move nothing
            ref = cast(Ref, op.dst if kind == "switch_recv" else op.src)  # the kind names it (the validator)
            lo, hi = table[ref.buf][ref.off][0], table[ref.buf][ref.off + ref.cnt - 1][1]
            if hi <= lo:
                continue
            if kind == "send":
                for x, y in chunks(lo, hi, chunk):
                    sent[g, op.send_to] += (y - x) * itemsize
                    sent_raw[g, op.send_to] += raw_bytes((y - x) * itemsize, mtu, head)
            elif kind == "load_reduce":
                up_raw[g] += header
            elif kind == "switch_recv":
                down[g] += (hi - lo) * itemsize
                down_raw[g] += raw_bytes((hi - lo) * itemsize, mtu, head)
            else:  # an answer (its LOAD came down first) or a store, up
                up[g] += (hi - lo) * itemsize
                up_raw[g] += raw_bytes((hi - lo) * itemsize, mtu, head)
                if kind == "switch_contribute":
                    down_raw[g] += header
    payload, raws = topo.link_payload_bytes(sent), topo.link_payload_bytes(sent_raw)
    for g in range(n):
        leaf = topo.locate(g)[0]
        for out, u, d in ((payload, up, down), (raws, up_raw, down_raw)):
            out[uplink(g, leaf)] += u[g]
            out[downlink(g, leaf)] += d[g]
    return payload, raws
