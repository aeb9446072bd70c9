"""fabric.cost_nodes for `hier` (ranks/collectives/hier.py, node rings) and `hier_nvls` (its node stages in
the leaf): hier's rounds on 2 nodes x 4 GPUs by hand, the closed forms of bytes per level on several shapes,
rail alignment, one node is the ring (one node and one GPU a node, hier_nvls is hier); the pipelined plan
(fabric.hier_plan) moves the rounds' bytes and overlaps the phases; hier_nvls's bytes per link, counted slice
by slice, are op for op its programs'."""

import numpy as np
import pytest

from nvlink_emu.fabric import tuner
from nvlink_emu.fabric import cost_nodes as cn, hier_plan, plans, replay
from nvlink_emu.fabric.plans import registry, timing
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.topology import Topology

B = 1024
S = 8 * B  # 2 x 4 GPUs: blocks of 1 KiB, parts (columns) of 2 KiB


def topo(nodes=2, per_node=4, spines=1):
    return Topology.multi_node(nodes=nodes, gpus_per_node=per_node, spines=spines, gpu_link=(450.0, 150.0),
                               uplink_gbytes_per_s_per_node=1800.0, uplink_latency_ns=200.0, switch_latency_ns=250.0)


def test_allreduce_rounds_on_two_by_four_by_hand():
    t = topo()
    got = cn.rounds("allreduce", "hier", t, S)
    assert len(got) == 3 + 1 + 1 + 3  # node RS, rail RS, rail AG, node AG
    for k in (0, 1, 2, 6, 7):  # node rings: (a, j) -> (a, j+1), one part (2 KiB) each
        expect = np.zeros((8, 8), np.int64)
        for g in range(8):
            expect[g, g // 4 * 4 + (g + 1) % 4] = 2 * B
        assert np.array_equal(got[k], expect), k
    for k in (3, 4):  # rail rings of 2 nodes: (a, j) -> (1 - a, j), one block (1 KiB)
        expect = np.zeros((8, 8), np.int64)
        for g in range(8):
            expect[g, (g + 4) % 8] = B
        assert np.array_equal(got[k], expect), k


@pytest.mark.parametrize("spines", [1, 2])
def test_bytes_on_two_by_four_by_hand(spines):
    t = topo(spines=spines)
    per_spine = {1: [4], 2: [2, 2]}[spines]  # rails 0..3 over the spines by local index mod spines
    for collective, gpu, spine_each in (("allreduce", 6 * 2 * B + 2 * B, 2 * B), ("reduce_scatter", 3 * 2 * B + B, B),
                                        ("allgather", 3 * 2 * B + B, B)):
        got = cn.link_bytes(collective, "hier", t, S)
        for g in range(8):
            leaf = f"sw{g // 4}"
            assert got[f"gpu{g}->{leaf}"] == got[f"{leaf}->gpu{g}"] == gpu, (collective, g)
        for i, rails in enumerate(per_spine):
            spine = f"sw{2 + i}"
            for leaf in ("sw0", "sw1"):
                assert got[f"{leaf}->{spine}"] == got[f"{spine}->{leaf}"] == rails * spine_each, (collective, spine)


def test_broadcast_from_the_second_node_by_hand():
    t = topo(spines=2)
    root = 5  # node 1, local 1
    got = cn.link_bytes("broadcast", "hier", t, S, root=root)
    for g in range(8):
        leaf = f"sw{g // 4}"
        tx = 3 * 2 * B + (2 * B if g >= 4 else 0) + (3 * 2 * B if g == root else 0)  # node AG, chain, scatter
        rx = 3 * 2 * B + (2 * B if g < 4 else 0) + (2 * B if g >= 4 and g != root else 0)
        assert (got[f"gpu{g}->{leaf}"], got[f"{leaf}->gpu{g}"]) == (tx, rx), g
    # the chain goes node 1 -> node 0 only: rails 0, 2 over sw2, rails 1, 3 over sw3
    assert got["sw1->sw2"] == got["sw2->sw0"] == got["sw1->sw3"] == got["sw3->sw0"] == 4 * B
    assert got["sw0->sw2"] == got["sw2->sw1"] == got["sw0->sw3"] == got["sw3->sw1"] == 0
    rounds = cn.rounds("broadcast", "hier", t, S, root=root)
    assert len(rounds) == 1 + 1 + 3 and rounds[0][root].tolist() == [0, 0, 0, 0, 2 * B, 0, 2 * B, 2 * B]


@pytest.mark.parametrize("nodes, per_node, spines", [(2, 2, 1), (3, 2, 2), (4, 8, 2), (3, 4, 3), (5, 1, 1)])
def test_bytes_per_level_are_the_closed_forms(nodes, per_node, spines):
    t = topo(nodes, per_node, spines)
    n, G, N = nodes * per_node, per_node, nodes
    size = 24 * n * 4  # a multiple of N G itemsize
    rails = [sum(1 for j in range(G) if j % spines == i) for i in range(spines)]
    for collective, factor in (("allreduce", 2), ("reduce_scatter", 1), ("allgather", 1)):
        got = cn.link_bytes(collective, "hier", t, size)
        for link in t.links:
            if link.level == "gpu-leaf":
                assert got[link.name] == factor * (n - 1) * size // n, (collective, link.name)
            else:
                i = int((link.dst if link.direction == "up" else link.src)[2:]) - nodes
                assert got[link.name] == rails[i] * factor * (N - 1) * size // n, (collective, link.name)
    for root in (0, n - 1):
        a_root, j_root = divmod(root, G)
        got = cn.link_bytes("broadcast", "hier", t, size, root=root)
        for g in range(n):
            a, j = divmod(g, G)
            leaf = f"sw{a}"
            tx = (G - 1) * size // G + (size // G if N > 1 and a != (a_root - 1) % N else 0) + \
                ((G - 1) * size // G if g == root else 0)
            rx = (G - 1) * size // G + (size // G if a != a_root else 0) + \
                (size // G if a == a_root and j != j_root else 0)
            assert (got[f"gpu{g}->{leaf}"], got[f"{leaf}->gpu{g}"]) == (tx, rx), (root, g)
        for i in range(spines):
            spine = f"sw{nodes + i}"
            for a in range(nodes):
                assert got[f"sw{a}->{spine}"] == (0 if a == (a_root - 1) % N else rails[i] * size // G)
                assert got[f"{spine}->sw{a}"] == (0 if a == a_root else rails[i] * size // G)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_traffic_leaves_a_node_only_on_its_own_rail(collective):
    t = topo(3, 4, 2)
    for size in (3 * 4096 + 8, 4 * 12 * 7):  # uneven and even blocks
        total = cn.traffic(collective, "hier", t, size)
        for g in range(12):
            for d in range(12):
                if g // 4 != d // 4 and g % 4 != d % 4:
                    assert total[g, d] == 0, (g, d)
        levels = t.totals_by_level(cn.link_bytes(collective, "hier", t, size))
        assert levels["gpu-leaf"]["up"] == levels["gpu-leaf"]["down"]
        assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"] > 0


@pytest.mark.parametrize("gpus", [2, 3, 8])
def test_one_node_is_the_ring_round_for_round(gpus):
    config = preset("dgx-h100-line", gpus=gpus)
    t = Topology.single(config)
    for size in (gpus * 3 * 4096, 4 * 1001):
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            ours, ring = cn.rounds(collective, "hier", t, size), cn.rounds(collective, "ring", t, size)
            assert len(ours) == len(ring) and all(np.array_equal(a, b) for a, b in zip(ours, ring)), collective
            assert cn.links_ns(collective, "hier", t, size, config) == cn.links_ns(collective, "ring", t, size,
                                                                                        config)
            nvls = cn.rounds(collective, "hier_nvls", t, size)  # one node: hier's node ring
            assert len(nvls) == len(ring) and all(np.array_equal(a, b) for a, b in zip(nvls, ring)), collective
            assert cn.links_ns(collective, "hier_nvls", t, size, config) == cn.links_ns(collective, "ring", t,
                                                                                             size, config)


def test_one_gpu_a_node_hier_nvls_is_hier():
    config = preset("superpod-h100-ib", nodes=4, gpus=4, spines=1)  # 4 nodes x 1 GPU: the rail ring alone
    t = config.topology
    for collective in cn.FLAT["hier"]:
        for size in (4 * 4, 4 * 4 * 3001):
            assert cn.link_bytes(collective, "hier_nvls", t, size, config=config) == cn.link_bytes(collective, "hier",
                                                                                                  t, size)
            assert cn.links_ns(collective, "hier_nvls", t, size, config) == cn.links_ns(collective, "hier", t,
                                                                                             size, config)
            assert cn.occupancy_bound_ns(collective, "hier_nvls", t, size, config) == cn.occupancy_bound_ns(
                collective, "hier", t, size, config)


def test_uneven_sizes_move_every_byte_once_per_phase():
    t = topo(3, 2, 1)
    for count in (0, 1, 5, 6, 7, 1001):
        size = 2 * count  # float16
        for collective, phases in (("allreduce", 2), ("reduce_scatter", 1), ("allgather", 1)):
            total = cn.traffic(collective, "hier", t, size, itemsize=2)
            # a node ring moves every column G-1 times, in each of the N nodes; rail j's ring moves
            # column j N-1 times: N (G-1) S + (N-1) S = 3 S + 2 S per phase, whatever the blocks
            assert int(total.sum()) == phases * (3 * size + 2 * size), (collective, count)


def test_errors_name_what_is_wrong():
    t = topo()
    with pytest.raises(FabricError, match="broadcast root must be one of GPUs 0..7"):
        cn.rounds("broadcast", "hier", t, S, root=8)
    with pytest.raises(FabricError, match="multiple of itemsize 4"):
        cn.rounds("allreduce", "hier", t, S + 2)
    with pytest.raises(FabricError, match="no multi-node model for all2all with 'hier'"):
        cn.rounds("all2all", "hier", t, S)
    with pytest.raises(FabricError, match="hier_nvls's link bytes need the config"):
        cn.link_bytes("allreduce", "hier_nvls", t, S)
    a100 = preset("superpod-a100-ib", nodes=2, gpus=8, spines=1)  # its leaves only forward
    with pytest.raises(FabricError, match="hier_nvls runs its node stages in the leaf on 2 nodes of 4 GPUs, config "
                                          "'superpod-a100-ib'.*leaves that reduce"):
        cn.link_bytes("allreduce", "hier_nvls", a100.topology, S, config=a100)
    with pytest.raises(FabricError, match="allreduce hier_nvls on 2 nodes of 4 GPUs .* do not reduce"):
        replay.replay_ns("allreduce", "hier_nvls", a100.topology, S, a100)


def test_the_time_bounds_hold_and_auto_may_pick_hier():
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=1)
    t = config.topology
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
        for size in (8 * 4096, 8 << 20):
            for algorithm in ("hier", "hier_nvls"):
                ns = cn.links_ns(collective, algorithm, t, size, config)
                assert cn.lower_bound_ns(collective, algorithm, t, size, config) <= ns, (collective, algorithm, size)
                assert cn.occupancy_bound_ns(collective, algorithm, t, size, config) <= ns, (collective, algorithm)
    candidates = ("ring", "direct", "hier", "hier_nvls")
    times = {a: cn.modeled_ns("allreduce", a, t, 1 << 20, config) for a in candidates}
    assert tuner.fastest_across_nodes("allreduce", candidates, 1 << 20, config) == min(times, key=times.get)


def plan_traffic(collective, N, G, count, chunk, itemsize=4, root=0):
    """Payload bytes per (sender, receiver) of fabric.hier_plan's programs, and each member's finished
    elements."""
    n = N * G
    t, finished = np.zeros((n, n), np.int64), [0] * n
    for r in range(n):
        a, j = divmod(r, G)
        for op in hier_plan.program(collective, N, G, a, j, count, chunk, itemsize, divmod(root, G)):
            if op[0] == "send":
                t[r, op[1][0] * G + op[1][1]] += (op[4] - op[3]) * itemsize
            elif op[0] == "finish":
                finished[r] += op[2] - op[1]
    return t, finished


@pytest.mark.parametrize("nodes, per_node", [(2, 4), (3, 2), (4, 1), (5, 3)])
def test_the_pipelined_plan_moves_the_rounds_bytes_and_finishes_every_range_once(nodes, per_node):
    t = topo(nodes, per_node)
    N, G = nodes, per_node
    for count, chunk in ((0, 7), (1, 7), (1001, 7), (1001, 64), (20003, 64), (20003, 1 << 20)):
        # slices of 7, 64 and 65536 elements: 1 to 90 of them in the pipeline
            for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
                for root in ((0, N * G - 1) if collective == "broadcast" else (0,)):
                    got, finished = plan_traffic(collective, N, G, count, chunk, root=root)
                    assert np.array_equal(got, cn.traffic(collective, "hier", t, 4 * count, 4, root)), \
                        (collective, count, chunk, root)
                    plan = plans.build("hier", N * G, collective, root, layout=registry.grid(N, G), nbytes=4 * count,
                                       itemsize=4, chunk_bytes=4 * chunk)  # hier's plan: the same messages
                    assert np.array_equal(timing.plan_traffic(plan, 4 * count, 4), got), (collective, count, chunk)
                    if collective in ("allreduce", "reduce_scatter"):
                        own = hier_plan.ranges(collective, N, G, count)
                        assert finished == [hi - lo for row in own for lo, hi in row], (collective, count, chunk)


def test_pipelining_overlaps_the_node_and_rail_phases(monkeypatch):
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=1)
    t, S = config.topology, 16 << 20  # ranges of 2 MiB: 8 slices of 256 KiB
    forms = ("hier", "hier_nvls")
    piped = {(c, a): replay.replay_ns(c, a, t, S, config, root=1) for a in forms for c in cn.FLAT[a]}
    monkeypatch.setattr(hier_plan, "SLICE_BYTES", 1 << 40)  # one slice (hier_nvls: as the leaf's share allows)
    serial = {(c, a): replay.replay_ns(c, a, t, S, config, root=1) for a in forms for c in cn.FLAT[a]}
    for algorithm in forms:
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            assert piped[(collective, algorithm)] < 0.9 * serial[(collective, algorithm)], (collective, piped, serial)
        assert piped[("broadcast", algorithm)] < serial[("broadcast", algorithm)]
        # no faster than the busiest stage allows (its bytes at its bandwidth)
        assert piped[("allreduce", algorithm)] > cn.bottleneck("allreduce", algorithm, t, S, config)[1]


@pytest.mark.parametrize("nodes, per_node, spines", [(2, 2, 1), (2, 4, 2), (3, 4, 3), (4, 8, 2)])
def test_node_stages_in_the_leaf_move_the_closed_forms_and_the_rails_as_the_rings(nodes, per_node, spines):
    config = preset("superpod-h100-ib", nodes=nodes, gpus=nodes * per_node, spines=spines, chunk_bytes=4096)
    t, N, G, n = config.topology, nodes, per_node, nodes * per_node
    assert hier_plan.in_leaf(config) and not hier_plan.in_leaf(preset("superpod-a100-ib", nodes=2, gpus=4))
    size = 24 * n * 4 * 64  # a multiple of N G itemsize, several chunks and slices
    header = config.header_bytes
    for collective, tx, rx in (("allreduce", size + size // G + 2 * (N - 1) * size // n,
                                size + size // G + 2 * (N - 1) * size // n),
                               ("reduce_scatter", size + (N - 1) * size // n, size // G + (N - 1) * size // n),
                               ("allgather", size // G + (N - 1) * size // n, size + (N - 1) * size // n)):
        payload, raw = cn.hier_leaf_link_bytes(collective, t, size, config)
        assert cn.link_bytes(collective, "hier_nvls", t, size, config=config) == payload
        rings = cn.link_bytes(collective, "hier", t, size, config=config)  # hier: node rings, leaves that reduce or not
        assert rings == cn.link_bytes(collective, "hier", t, size)
        for link in t.links:
            if link.level == "gpu-leaf":
                assert payload[link.name] == (tx if link.direction == "up" else rx), (collective, link.name)
                assert raw[link.name] > payload[link.name]
            else:  # only the rail messages cross: as with node rings, payload and raw alike
                assert payload[link.name] == rings[link.name] and raw[link.name] >= payload[link.name]
        if collective == "reduce_scatter":  # raw: one header a packet; each load-reduce request and LOAD header-only
            chunks = sum(-(-(hi - lo) // 1024) for lo, hi in hier_plan.ranges(collective, N, G, size // 4)[0][:1])
            assert raw["sw0->gpu0"] - payload["sw0->gpu0"] >= header * chunks


def test_the_leaf_plan_serves_in_one_order_and_finishes_every_range_once():
    N, G, count, chunk = 3, 4, 20003, 64
    share = 1 << 26
    for collective in ("allreduce", "reduce_scatter"):
        own = hier_plan.ranges(collective, N, G, count)
        for a in range(N):
            orders = []
            for j in range(G):
                ops = list(hier_plan.program(collective, N, G, a, j, count, chunk, 4, None, None, share))
                orders.append([op[2] for op in ops if op[0] == "serve"])
                asked = sum(op[3] - op[2] for op in ops if op[0] == "load_reduce")
                columns = hier_plan.merged_columns(own)
                assert asked == sum(hi - lo for lo, hi in columns[j]), (collective, a, j)
                assert sum(op[2] - op[1] for op in ops if op[0] == "finish") == own[a][j][1] - own[a][j][0]
                assert not [op for op in ops if op[0] == "send" and op[1][0] == a]  # nothing GPU to GPU in the node
            assert all(order == orders[0] for order in orders)  # the leaf's engine books the slots in this order
    # the slice bound keeps two slices' held answers within the share
    P = hier_plan.slice_elements(1 << 20, 4, 32, 8, 1 << 26)
    assert 2 * 7 * 32 * 8 * P * 4 <= 1 << 26 < 2 * 7 * 32 * 8 * (P + 1) * 4
    assert hier_plan.slice_elements(1 << 20, 4) == hier_plan.SLICE_BYTES // 4


def _leaf_program(collective, topo, r, count, chunk, item, root, share):
    """Member r's hier_plan program with the node stages in the leaf, its operations in bytes (as the
    replay's translation of it gave them before hier became a plan and hier_ns consumed them directly)."""
    G = topo.gpus_per_node
    a, j = divmod(r, G)
    for op in hier_plan.program(collective, topo.nodes, G, a, j, count, chunk, item, divmod(root, G), None, share):
        kind = op[0]
        if kind == "send":
            (b, k), key, lo, hi = op[1:]
            yield ("send", b * G + k, key, (hi - lo) * item)
        elif kind == "load_reduce":
            yield ("lr", op[1], (op[3] - op[2]) * item)
        elif kind == "serve":
            yield ("serve", a * G + op[1], op[2], (op[4] - op[3]) * item)
        elif kind == "mcast":
            yield ("mcast", op[1], (op[3] - op[2]) * item)
        elif kind == "take":
            yield ("take", op[1], (op[3] - op[2]) * item)


def op_by_op_leaf_traffic(collective, topo, S, config, itemsize=4, root=0):
    """cost_in_switch.hier_leaf_traffic as hier_leaf_link_bytes counted it before it went slice by slice: every
    member's program (_leaf_program) op by op."""
    from nvlink_emu.fabric.packets import raw_bytes
    from nvlink_emu.fabric.budget import buffer_share_bytes
    n = topo.gpus
    count = S // itemsize
    chunk = max(1, config.chunk_bytes // itemsize)
    raw = lambda nbytes: raw_bytes(nbytes, config.mtu_bytes, config.header_bytes)
    sent, sent_raw = np.zeros((n, n), object), np.zeros((n, n), object)
    up, up_raw, down, down_raw = [0] * n, [0] * n, [0] * n, [0] * n
    share = buffer_share_bytes(config)
    for r in range(n):
        for op in _leaf_program(collective, topo, r, count, chunk, itemsize, root, share):
            kind = op[0]
            if kind == "send":
                sent[r, op[1]] += op[3]
                sent_raw[r, op[1]] += raw(op[3])
            elif kind == "lr":
                up_raw[r] += raw(0)
            elif kind == "serve":
                down_raw[r] += raw(0)
                up[r] += op[3]
                up_raw[r] += raw(op[3])
            elif kind == "mcast":
                up[r] += op[2]
                up_raw[r] += raw(op[2])
            elif kind == "take":
                down[r] += op[2]
                down_raw[r] += raw(op[2])
    return sent.tolist(), sent_raw.tolist(), up, up_raw, down, down_raw


@pytest.mark.parametrize("name", ("superpod-h100-ib", "superpod-h100-nvlink"))
@pytest.mark.parametrize("N, G", [(2, 2), (3, 4), (2, 8), (5, 2)])
def test_leaf_bytes_counted_slice_by_slice_are_the_programs_op_by_op(name, N, G):
    config = preset(name, nodes=N, gpus=N * G, chunk_bytes=1024)
    t = config.topology
    P = hier_plan.slice_elements(256, 4, N, G, cn.buffer_share_bytes(config))
    for itemsize in (4, 2):
        # one element; uneven ranges in one slice; several slices (some ranges one piece shorter), many chunks
        for count in (1, N * G * 3 + 1, 3 * P * N * G + 7, 257 * N * G + 3):
            for collective in cn.FLAT["hier_nvls"]:
                for root in ((0, N * G - 1, G + 1) if collective == "broadcast" else (0,)):
                    sent, sent_raw, *rest = cn.hier_leaf_traffic(collective, t, count * itemsize, config, itemsize,
                                                                  root)
                    got = [sent.tolist(), sent_raw.tolist(), *rest]
                    assert got == list(op_by_op_leaf_traffic(collective, t, count * itemsize, config, itemsize,
                                                             root)), (collective, itemsize, count, root)
