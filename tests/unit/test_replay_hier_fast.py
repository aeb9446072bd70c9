"""fabric.replay.hier_ns (hier_nvls: hier's node stages in the leaf), made faster (hier_plan's operations consumed directly,
the link clocks called directly, raw bytes memoised, a call's slice plans built once for every member),
gives exactly (==) the times of the replay before (of `hier` on these presets, which ran its node stages in
the leaf before they were split off as hier_nvls): the loop as it was (copied below, over replay._hier's
translation of each member's own program), and the values the code before the change gave (main at
35a4ac4) on several presets, shapes, collectives, itemsizes and sizes. hier_plan.program with one memo
shared by every member yields, op for op, what it yields alone."""

import pytest

from nvlink_emu.fabric import hier_plan, replay
from nvlink_emu.fabric.config import resolve
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.switch import buffer_share_bytes
from nvlink_emu.fabric.timemodel import ReductionClock

# (preset, nodes, GPUs per node, collective, bytes, itemsize, root) -> ns, as the code before gave them
BEFORE = [
    (("superpod-h100-ib", 2, 4, "allreduce", 1048576, 4, 0), 16222.240000000002),
    (("superpod-h100-ib", 2, 8, "allreduce", 16777216, 4, 0), 90558.47111111095),
    (("superpod-h100-ib", 4, 8, "allreduce", 33554444, 4, 0), 207316.6488888908),
    (("superpod-h100-ib", 3, 2, "reduce_scatter", 6000012, 4, 0), 49664.33777777778),
    (("superpod-h100-nvlink", 2, 8, "allgather", 8388608, 2, 0), 23632.23999999999),
    (("superpod-h100-ib", 3, 4, "broadcast", 5242880, 4, 7), 42806.017777777786),
    (("superpod-h100-nvlink", 4, 4, "allreduce", 67108864, 2, 0), 319187.7244444442),
    (("superpod-h100-ib", 2, 2, "allreduce", 4096, 4, 0), 6308.097777777778),
]


def old_hier_ns(collective, topo, count, config, itemsize=4, root=0):
    """hier_ns as it was before it was made faster (35a4ac4), verbatim but for this docstring."""
    G, n = topo.gpus_per_node, topo.gpus
    chunk = max(1, config.chunk_bytes // itemsize)
    share = buffer_share_bytes(config)
    t = config.timing
    s = t.switch_latency_ns
    raw = lambda nbytes: raw_bytes(nbytes, config.mtu_bytes, config.header_bytes)
    header = raw(0)
    fabric = replay.Fabric(topo, config.mtu_bytes, config.header_bytes)
    engines = [ReductionClock(t.reduction_gbytes_per_s, t.reduction_latency_ns) for _ in range(topo.nodes)]
    asked, slots, delivered = {}, {}, {}
    programs = {r: replay._hier(collective, topo, r, count, chunk, itemsize, root, share) for r in range(n)}
    waiting = {}
    while programs:
        progressed = False
        for r in list(programs):
            gpu = fabric.gpus[r]
            op = waiting.pop(r, None)
            while True:
                if op is None:
                    op = next(programs[r], None)
                    if op is None:
                        del programs[r]
                        progressed = True
                        break
                kind = op[0]
                if kind == "send":
                    fabric.send(gpu, op[1], op[2], op[3])
                elif kind == "recv":
                    if not fabric.receive(gpu, op[1], op[2]):
                        waiting[r] = op
                        break
                elif kind == "lr":
                    _, end = gpu.uplink.send(gpu.now, gpu.now, header)
                    asked[(gpu.node, op[1])] = (r, end)
                elif kind == "serve":
                    got = asked.get((gpu.node, op[2]))
                    if got is None:
                        waiting[r] = op
                        break
                    requester, end = got
                    _, at = gpu.downlink.book(end + s, end + s, header)
                    at += gpu.downlink.latency_ns
                    a, b = gpu.uplink.send(at, at, raw(op[3]))
                    slot = slots.setdefault((gpu.node, op[2]), [0, 0.0, 0.0])
                    slot[0] += 1
                    slot[1], slot[2] = max(slot[1], a), max(slot[2], b)
                    if slot[0] == G:
                        del slots[(gpu.node, op[2])], asked[(gpu.node, op[2])]
                        start, finish = engines[gpu.node].reduce(slot[1] + s, slot[2] + s, raw(op[3]))
                        delivered[(requester, op[2])] = (start, finish, raw(op[3]))
                elif kind == "mcast":
                    a, b = gpu.uplink.send(gpu.now, gpu.now, raw(op[2]))
                    for g in range(gpu.node * G, (gpu.node + 1) * G):
                        delivered[(g, op[1])] = (a + s, b + s, raw(op[2]))
                elif kind == "take":
                    got = delivered.pop((r, op[1]), None)
                    if got is None:
                        waiting[r] = op
                        break
                    _, end = gpu.downlink.book(*got)
                    gpu.now = max(gpu.now, end + gpu.downlink.latency_ns)
                else:
                    gpu.now = max(gpu.now, gpu.uplink.free_ns)
                progressed = True
                op = None
        if not progressed:
            raise FabricError("old hier_ns waits for ever")
    return max(gpu.now for gpu in fabric.gpus)


@pytest.mark.parametrize("case, before", BEFORE, ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}-{c[4]}" for c, _ in BEFORE])
def test_the_faster_replay_gives_the_times_the_code_before_gave(case, before):
    name, N, G, collective, S, itemsize, root = case
    config = resolve(name, None, None, N, G)
    assert hier_plan.in_leaf(config)
    got = replay.replay_ns(collective, "hier_nvls", config.topology, S, config, itemsize, root)
    assert got == before
    assert got == old_hier_ns(collective, config.topology, S // itemsize, config, itemsize, root)


@pytest.mark.parametrize("name", ("superpod-h100-ib", "superpod-h100-nvlink"))
@pytest.mark.parametrize("N, G", [(2, 2), (3, 4), (2, 8), (5, 2)])
@pytest.mark.parametrize("collective", hier_plan.STAGES)
def test_the_faster_replay_equals_the_old_loop(name, N, G, collective):
    config = resolve(name, None, None, N, G)
    root = (N * G) - 1 if collective == "broadcast" else 0
    # a few slices (the leaf's share bounds a slice: 2 (G - 1) N G itemsize bytes of it), uneven ranges
    P = hier_plan.slice_elements(max(1, config.chunk_bytes // 4), 4, N, G, buffer_share_bytes(config))
    for count in (1, N * G * 3 + 1, 3 * P * N * G + 7):
        got = replay.hier_ns(collective, config.topology, count, config, 4, root)
        assert got == old_hier_ns(collective, config.topology, count, config, 4, root) > 0


@pytest.mark.parametrize("collective", hier_plan.STAGES)
def test_a_shared_memo_gives_every_member_its_own_program(collective):
    N, G = 3, 4
    config = resolve("superpod-h100-ib", None, None, N, G)
    share, chunk = buffer_share_bytes(config), 1000
    P = hier_plan.slice_elements(chunk, 4, N, G, share)
    count = 2 * P * N * G + 5
    memo = {}
    shared = [hier_plan.program(collective, N, G, r // G, r % G, count, chunk, 4, (1, 2), None, share, memo)
              for r in range(N * G)]
    alone = [list(hier_plan.program(collective, N, G, r // G, r % G, count, chunk, 4, (1, 2), None, share))
             for r in range(N * G)]
    got = [[] for _ in shared]
    for _ in range(max(len(ops) for ops in alone)):  # interleaved, as the replay runs them
        for r, ops in enumerate(shared):
            op = next(ops, None)
            if op is not None:
                got[r].append(op)
    assert got == alone
    assert memo  # it was shared: built once
