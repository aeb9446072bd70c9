"""The in-switch algorithms as plans (NVLink SHARP; docs/model/algorithms-in-switch.md): sharp's push.

sharp allreduce: every GPU contributes chunk c of its buffer to in-switch reduction slot (c,) (the switch
reduces the contributions; across nodes each leaf its node's members into a partial for spine c mod P,
the spine the partials) and takes the result, multicast to every member, into chunk c of the same buffer
(in place). The chunks are the in-switch chunk of the call (fabric.budget.in_switch_window: chunk_bytes
shrunk so the switch's buffer share holds them), and the window is its credit order: `window` chunks
contributed before the first result is taken, then one more after each result (a result back means
every member contributed that chunk, so at most `window` chunks of each member are in the switch). The
contributions are issued at the call's start (the credits are not modeled: both interpreters book them
at once; docs/model/time.md). The switch finishes the reduction (an average divides once there).

sharp reduce_scatter: block j (fabric.reduction.blocks of the input over the members) in chunks; chunk c of
block j is slot (j, c, j + c) (its last entry picks the spine, so that blocks of one chunk each still share
the spines out), its result to member j only. In rounds c: every member first takes back its own chunks up
to c - window + 1 (a result back means every member sent the rounds before it, so at most `window` rounds are
in the switch; window >= 2: no deadlock), then contributes chunk c of every block; then the rest of its
own. The blocks' chunk counts may differ by one: every block is padded to the most with chunks of no
element (GpuProgram.elements: the plan is for one call's sizes), contributed and taken at their turn but
skipped by both interpreters, so the buffers keep reduce_scatter's shape (input n x output chunks).

sharp reduce (one node): every GPU contributes chunk c to slot (c,), its result to the root only (send_to),
`window` chunks in the switch per GPU (Call.in_switch_window with one stream). Only the root sees results, so
it paces the others out of band: after every max(1, window // 2) results, and after the last one a
contribution waits for, a credit (the results it took); a GPU contributes chunk c once a credit says that
results 0..c - window are back (credit_wait, format's credit kinds; no modeled time).

sharp allgather and broadcast: multicast stores (docs/model/algorithms-in-switch.md). allgather: every
member stores chunk c (messages of chunk_bytes) of its block as slot (p, c) (the switch sends it to every
member, this one included, and picks the spine (p + c) mod P), then takes every block's chunks in order,
its own node's blocks first and then the others', each in member order (a GPU takes its deliveries on its
downlink in the order it waits, and another node's come later); blocks padded as reduce_scatter's. broadcast:
the root stores chunk c of its buffer as slot (c,) and takes its own copies into scratch; every member takes
them into its buffer (in place).

nvls reduce_scatter and allreduce (NCCL's NVLS): member r asks the switch to load-reduce chunk c of its
own block r (load_reduce, slot (r, c, r + c): the switch reads that chunk of every member's input and
reduces it; its last entry picks the spine), `window` requests out before the first result is back, one
more after each; in rounds c every member answers the switch's reads of chunk c of every block in member
order (switch_contribute to slot (j, c, j + c), send_to j), then takes back its own chunk c - 1 and
(allreduce) multicast-stores it (slot (r, c - 1): the switches' spine (r + c - 1) mod P), then takes every
member's store of chunk c - 2 (a round behind, so that waiting for them never delays its next store);
then the last rounds' takes. reduce_scatter's results land in the output; allreduce's in scratch (chunks
0..R-1; its own store's copy in R..2R-1), copied into its own block at the end. Blocks padded as
reduce_scatter's. The chunk is nvls_chunk_bytes shrunk as Call.in_switch_window does with nvls's credit
streams (fabric.budget.nvls_streams), the window at least 2.

What the plan is built from depends on the fabric's config (its switch buffer and chunk), so `shape`
computes it and registry.build takes it (`shape=`): (elements, elements a chunk, window).
"""

from typing import TYPE_CHECKING, cast

from ..budget import in_switch_window, nvls_streams_wide, sharp_scatter_streams, sharp_streams
from ..errors import PlanError
from ..reduction import Grid, blocks, chunks
from .chunks import span, spans
from .format import GpuProgram, Op, Plan, Ref

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from ..config import FabricConfig


def shape(algorithm: str, gpus: int, collective: str, nodes: int, config: "FabricConfig", nbytes: int, itemsize: int,
          wide: int = 1, member_nodes: tuple[int, ...] | None = None) -> tuple[int, int, int | tuple[int, ...] | None]:
    """What the in-switch plan of `algorithm` for a call of `nbytes` (the buffer's bytes as fabric.replay
    takes them) in `itemsize`-byte elements by `gpus` members in `nodes` nodes of the fabric `config` is
    built from: (elements, elements a chunk, window). wide: how many times as wide as an element the
    switch's accumulator is (a leaf's partial: 2 for float16/bfloat16, fabric.reduction.switch_accumulator).
    The window and chunk are Call.in_switch_window's with sharp.py's credit streams
    (fabric.budget.sharp_streams; reduce_scatter: sharp_scatter_streams, at least 2 chunks). allgather and
    broadcast (multicast stores, no credits): (elements, elements a message of chunk_bytes, allgather: the
    node of each member, member_nodes, which orders its takes)."""
    if algorithm == "nvls" and collective in ("allreduce", "reduce_scatter"):
        streams = nvls_streams_wide(gpus, nodes, config.nodes, wide)
        window, chunk = in_switch_window(config, gpus, streams, 2, config.nvls_chunk_bytes, itemsize)
        return int(nbytes) // itemsize, chunk // itemsize, window
    if algorithm != "sharp" or collective not in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        raise PlanError(f"no in-switch plan for {collective} with {algorithm!r}")
    if collective in ("allgather", "broadcast"):
        if collective == "allgather" and (member_nodes is None or len(member_nodes) != gpus):
            raise PlanError(f"sharp allgather plan: it needs the node of each of its {gpus} members")
        return (int(nbytes) // itemsize, max(1, config.chunk_bytes // itemsize),
                tuple(cast(tuple[int, ...], member_nodes)) if collective == "allgather" else None)  # checked above
    if collective == "reduce_scatter":  # every block's chunk of a round in flight: sharp_scatter_streams
        streams, least = sharp_scatter_streams(gpus, nodes, config.nodes, wide), 2
    elif collective == "reduce":  # one node: one stream of results, the root's
        streams, least = 1, 1
    else:
        streams, least = sharp_streams(gpus, nodes, config.nodes, wide), 1
    window, chunk = in_switch_window(config, gpus, streams, least, None, itemsize)
    return int(nbytes) // itemsize, chunk // itemsize, window


def sharp(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
          shape: tuple[int, int, int | tuple[int, ...] | None] | None = None) -> Plan:
    """sharp's allreduce or reduce_scatter (module docstring) for shape = (elements, elements a chunk,
    window; reduce_scatter: the input's elements). allreduce: every GPU runs the same operations (one tuple,
    shared)."""
    if collective not in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        raise PlanError(f"sharp plan: no {collective}; sharp builds allreduce, reduce_scatter, allgather, "
                        f"broadcast and reduce")
    if shape is None:
        raise PlanError("sharp plan: it is built for a call's size and the fabric's switch buffer "
                        "(fabric.plans.in_switch.shape)")
    count, piece, third = shape  # the window; allgather: the node of each member; broadcast: None
    if collective == "reduce_scatter":
        return _scatter(gpus, count, piece, cast(int, third))
    if collective == "allgather":
        return _allgather(gpus, count, piece, cast(tuple[int, ...], third))
    if collective == "broadcast":
        return _broadcast(gpus, count, piece, root)
    if collective == "reduce":
        return _reduce(gpus, count, piece, cast(int, third), root)
    k = len(chunks(0, count, piece))
    if k == 0:  # no element: one empty chunk, contributed and taken (the interpreters skip empty ones)
        k, piece = 1, 0
    window = cast(int, third)
    contribute = [Op("switch_contribute", src=Ref("i", c), slot=(c,)) for c in range(k)]
    order = contribute[:window]
    for c in range(k):
        order.append(Op("switch_recv", dst=Ref("o", c), slot=(c,)))
        if c + window < k:
            order.append(contribute[c + window])
    ops = tuple(order)
    programs = tuple(GpuProgram(g, ops, k, k) for g in range(gpus))
    return Plan("sharp", "allreduce", gpus, programs, inplace=True, fabrics=("network",), piece=piece)


def _reduce(n: int, count: int, piece: int, window: int, root: int) -> Plan:
    """sharp's reduce to `root` (module docstring): `count` elements in chunks of `piece`, `window` in the
    switch per GPU; the root's credits after every max(1, window // 2) results and the last one a contribution
    waits for."""
    k = len(chunks(0, count, piece))
    if k == 0:  # no element: one empty chunk, contributed and taken (the interpreters skip empty ones)
        k, piece = 1, 0
    contribute = [Op("switch_contribute", src=Ref("i", c), send_to=root, slot=(c,)) for c in range(k)]
    last, step = k - window, max(1, window // 2)  # results the last contribution waits for; the credits' step
    credits = [done for done in range(1, last + 1) if done % step == 0 or done == last]  # each one's value
    programs = []
    for g in range(n):
        if g == root:
            ops = contribute[:window]
            for c in range(k):
                ops.append(Op("switch_recv", dst=Ref("o", c), slot=(c,)))
                if c + 1 in credits:
                    ops.append(Op("credit"))
                if c + window < k:
                    ops.append(contribute[c + window])
        else:
            ops, seen, taken = [], 0, 0
            for c in range(k):
                while seen < c - window + 1:  # chunk c goes once results 0..c-window are back at the root
                    ops.append(Op("credit_wait", recv_from=root))
                    seen, taken = credits[taken], taken + 1
                ops.append(contribute[c])
        programs.append(GpuProgram(g, tuple(ops), k, k))
    return Plan("sharp", "reduce", n, tuple(programs), root=root, fabrics=("network",), piece=piece)


def _scatter(n: int, count: int, piece: int, window: int) -> Plan:
    """sharp's reduce_scatter (module docstring): `count` input elements, chunks of `piece`."""
    spans = [chunks(a, b, piece) for a, b in blocks(count, n)]
    rounds = max(1, max(len(span) for span in spans))  # no element: one empty chunk a block
    sizes = [[hi - lo for lo, hi in span] + [0] * (rounds - len(span)) for span in spans]
    inputs = tuple(x for row in sizes for x in row)  # block j's chunk c is input chunk j rounds + c
    contribute = [[Op("switch_contribute", src=Ref("i", j * rounds + c), send_to=j, slot=(j, c, j + c))
                   for c in range(rounds)] for j in range(n)]
    programs = []
    for r in range(n):
        own = len(spans[r])
        take = [Op("switch_recv", dst=Ref("o", c), slot=(r, c, r + c)) for c in range(rounds)]
        ops, waited = [], 0
        for c in range(rounds):
            while waited <= min(c - window + 1, own - 1):
                ops.append(take[waited])
                waited += 1
            ops += [contribute[j][c] for j in range(n)]
        ops += take[waited:]
        programs.append(GpuProgram(r, tuple(ops), n * rounds, rounds, elements=(inputs, tuple(sizes[r]), ())))
    return Plan("sharp", "reduce_scatter", n, tuple(programs), fabrics=("network",))


def _allgather(n: int, count: int, piece: int, member_nodes: tuple[int, ...]) -> Plan:
    """sharp's allgather (module docstring): `count` output elements, messages of `piece`."""
    spans = [chunks(a, b, piece) for a, b in blocks(count, n)]
    rounds = max(1, max(len(span) for span in spans))
    sizes = [[hi - lo for lo, hi in span] + [0] * (rounds - len(span)) for span in spans]
    outputs = tuple(x for row in sizes for x in row)  # block p's chunk c is output chunk p rounds + c
    programs = []
    for r in range(n):
        ops = [Op("multicast_store", src=Ref("i", c), slot=(r, c)) for c in range(rounds)]
        here = member_nodes[r]
        for p in sorted(range(n), key=lambda p: member_nodes[p] != here):
            ops += [Op("switch_recv", dst=Ref("o", p * rounds + c), slot=(p, c)) for c in range(rounds)]
        programs.append(GpuProgram(r, tuple(ops), rounds, n * rounds, elements=(tuple(sizes[r]), outputs, ())))
    return Plan("sharp", "allgather", n, tuple(programs), fabrics=("network",))


def _broadcast(n: int, count: int, piece: int, root: int) -> Plan:
    """sharp's broadcast (module docstring) from `root`: `count` elements, messages of `piece`."""
    k = len(chunks(0, count, piece))
    if k == 0:  # no element: one empty chunk
        k, piece = 1, 0
    takes = tuple(Op("switch_recv", dst=Ref("o", c), slot=(c,)) for c in range(k))
    programs = []
    for r in range(n):
        if r == root:
            ops = tuple(Op("multicast_store", src=Ref("i", c), slot=(c,)) for c in range(k)) + tuple(
                Op("switch_recv", dst=Ref("s", c), slot=(c,)) for c in range(k))
            programs.append(GpuProgram(r, ops, k, k, k))
        else:
            programs.append(GpuProgram(r, takes, k, k))
    return Plan("sharp", "broadcast", n, tuple(programs), inplace=True, root=root, fabrics=("network",), piece=piece)


def stores(plan: Plan, S: int, itemsize: int) -> dict[int, list[tuple[int, int]]]:
    """{sender: [(payload bytes, its spine's index before mod P: sender + slot[-1], the switches' rule), ...]
    in its program order} of the multicast stores of `plan` at a call of S bytes (a store of no element is
    not sent)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for program in plan.programs:
        table = None
        for op in program.ops:
            if op.kind == "multicast_store":
                table = table or spans(plan, S, itemsize, program.gpu)
                lo, hi = span(table, op.src)
                if hi > lo:
                    out.setdefault(program.gpu, []).append(((hi - lo) * itemsize, program.gpu + op.slot[-1]))
    return out


def nvls(gpus: int, collective: str, root: int = 0, layout: Grid | None = None,
         shape: tuple[int, int, int] | None = None) -> Plan:
    """nvls's reduce_scatter or allreduce (module docstring) for shape = (elements, elements a chunk, window)."""
    if collective not in ("allreduce", "reduce_scatter"):
        raise PlanError(f"nvls plan: no {collective}; nvls builds allreduce and reduce_scatter (its allgather "
                        f"and broadcast are sharp's multicast stores)")
    if shape is None:
        raise PlanError("nvls plan: it is built for a call's size and the fabric's switch buffer "
                        "(fabric.plans.in_switch.shape)")
    n, (count, piece, window) = gpus, shape
    spans = [chunks(a, b, piece) for a, b in blocks(count, n)]
    R = max(1, max(len(span) for span in spans))  # rounds; no element: one empty chunk a block
    sizes = [[hi - lo for lo, hi in span] + [0] * (R - len(span)) for span in spans]
    whole = tuple(x for row in sizes for x in row)  # block j's chunk c is chunk j R + c
    everyone = collective == "allreduce"
    answer = [[Op("switch_contribute", src=Ref("i", j * R + c), send_to=j, slot=(j, c, j + c)) for c in range(R)]
              for j in range(n)]
    # member p's store of chunk c, taken into output chunk p R + c: one operation for every member but p (n^2 R
    # takes, ~200 bytes each: 0.9 GB at 8 x 8 GPUs and 256 MiB, were one object each)
    stored = [[Op("switch_recv", dst=Ref("o", p * R + c), slot=(p, c)) for c in range(R)] for p in range(n)] \
        if everyone else []
    programs = []
    for r in range(n):
        request = [Op("load_reduce", src=Ref("i", r * R + c), slot=(r, c, r + c)) for c in range(R)]
        result = Ref("s", 0) if everyone else Ref("o", 0)  # my reduced chunks (chunk c at offset c)
        ops = request[:window]

        def take_back(c: int) -> None:  # my reduced chunk c is back: store it, let one more request go
            ops.append(Op("switch_recv", dst=Ref(result.buf, c), slot=(r, c, r + c)))
            if everyone:
                ops.append(Op("multicast_store", src=Ref("s", c), slot=(r, c)))
            if c + window < R:
                ops.append(request[c + window])

        def gather(c: int) -> None:  # every member's store of chunk c (my own: its copy into scratch)
            if everyone and 0 <= c < R:
                ops.extend(Op("switch_recv", dst=Ref("s", R + c), slot=(p, c)) if p == r else stored[p][c]
                           for p in range(n))

        for c in range(R):
            ops.extend(answer[j][c] for j in range(n))
            if c:
                take_back(c - 1)
                gather(c - 2)
        take_back(R - 1)
        gather(R - 2)
        gather(R - 1)
        if everyone:  # my block's sum, into my output
            ops.append(Op("copy", src=Ref("s", 0, R), dst=Ref("o", r * R, R)))
            elements = (whole, whole, tuple(sizes[r]) * 2)
            programs.append(GpuProgram(r, tuple(ops), n * R, n * R, 2 * R, elements=elements))
        else:
            programs.append(GpuProgram(r, tuple(ops), n * R, R, elements=(whole, tuple(sizes[r]), ())))
    return Plan("nvls", collective, n, tuple(programs), inplace=everyone, fabrics=("network",))
