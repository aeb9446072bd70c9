"""nvls's load-reduce through both levels of switches, in one process (fabric.switch, Spanning groups;
the Fabric of test_switch_spanning): the request's path (the requester's leaf, spine slot[-1] mod P, the other
leaves), the partials' combine order, the result to the requester's leaf alone and the notice
"reduced" to the others, and what the switches refuse or drop."""

import numpy as np
import pytest

from nvlink_emu.fabric.errors import AccessViolation
from nvlink_emu.fabric.packets import Kind, LoadInfo, McastInfo, Packet

from switch_helpers import Fabric, nvlink


def load_reduce(fabric, g, gid, slot, dest, nbytes, dtype="float16", address=0):
    """GPU g's LOAD_REDUCE of `nbytes` bytes at `address` of every member's buffer bound as ("c", "src")."""
    info = LoadInfo(gid, tuple(slot), "sum", dtype, tuple(dest), ("c", "r", *slot), ("c", "src"))
    return fabric.gpu(g, Packet(Kind.LOAD_REDUCE, 0, -1, address, nbytes, req=3, info=info))


def answer(fabric, load, buffers):
    """The member's REDUCE answering `load` (a Send to it) from its buffer, as ranks/gpu.serve_load sends it."""
    g, packet = load.port, load.packet
    data = buffers[g].view(np.uint8)[packet.address:packet.address + packet.nbytes]
    return fabric.gpu(g, Packet(Kind.REDUCE, 0, -1, 0, packet.nbytes, req=packet.req, info=packet.info.contribution()),
                      data)


def test_a_load_reduce_across_nodes_folds_each_node_then_the_nodes_and_returns_to_the_requester_alone():
    fabric = Fabric(nvlink(nodes=2, spines=2))
    gid = fabric.group((0, 1, 2, 3))
    rng = np.random.default_rng(5)
    buffers = {g: (rng.standard_normal(32) * 100).astype(np.float16) for g in range(4)}
    fabric.hops.clear()
    loads = load_reduce(fabric, 3, gid, (0, 3, 1), (3,), 16, address=16)  # chunk 1 -> spine 3
    assert sorted(s.port for s in loads) == [0, 1, 2, 3]
    assert all(s.packet.kind is Kind.LOAD and s.packet.payload_bytes == 0 for s in loads)
    assert [(frm, to, p.kind, p.payload_bytes) for frm, to, p in fabric.hops] == [
        (1, 3, Kind.LOAD_REDUCE, 0), (3, 0, Kind.LOAD_REDUCE, 0)]
    fabric.hops.clear()
    results = []
    for load in loads:
        results += answer(fabric, load, buffers)
    (result,) = results
    assert result.port == 3 and result.packet.info == McastInfo(gid, ("c", "r", 0, 3, 1))
    wide = {g: buffers[g][8:16].astype(np.float32) for g in range(4)}
    want = ((wide[0] + wide[1]) + (wide[2] + wide[3])).astype(np.float16)  # node 0 in rank order, then node 1
    assert result.payload.view(np.float16).tobytes() == want.tobytes()
    # each leaf's partial (float32) up to spine 3; the result down to the requester's leaf, the notice
    # "reduced" (a control packet, not on the cable's counters) to the other, which frees its partial
    assert sorted((frm, to, p.kind, p.payload_bytes) for frm, to, p in fabric.hops) == [
        (0, 3, Kind.REDUCE, 32), (1, 3, Kind.REDUCE, 32), (3, 0, Kind.GROUP, 0), (3, 1, Kind.MCAST, 16)]
    assert all(not leaf.spanning._partials and not any(leaf.spanning._partial_bytes.values()) for leaf in fabric.switches[:2])
    spine = fabric.switches[3].counters.snapshot()
    header = fabric.config.header_bytes
    assert spine["sw3->sw0"] == {"payload_bytes": 0, "raw_bytes": header, "packets": 1, "busy_ns": 0.0}  # the request
    assert spine["sw1->sw3"]["raw_bytes"] == header + 32 + header  # the request, then the partial
    assert fabric.switches[2].counters.snapshot() == {}  # spine 2 saw nothing of chunk 1


def test_what_the_switches_refuse_or_drop_of_a_load_reduce_across_nodes():
    fabric = Fabric(nvlink(nodes=2, spines=1))
    gid = fabric.group((0, 2))
    fabric.hops.clear()
    # the result goes to its requester only
    (nack,) = load_reduce(fabric, 0, gid, (0, 0, 0), (0, 2), 16)
    assert nack.packet.info.error == "AccessViolation" and "to its requester only" in nack.packet.info.message
    (nack,) = load_reduce(fabric, 0, gid, (), (0,), 16)
    assert nack.packet.info.error == "ProtocolError" and "names no chunk" in nack.packet.info.message
    assert not fabric.hops and fabric.switches[0].refused[0] == 2
    # a spine passes on a request only of a leaf for a requester of its own node
    spine, info = fabric.switches[2], LoadInfo(gid, (0, 0, 0), "sum", "float32", (0,), ("c", 1), ("c", 2))
    request = Packet(Kind.LOAD_REDUCE, 0, -1, 0, 16, info=info)
    with pytest.raises(AccessViolation, match=rf"spine 2: LOAD_REDUCE of group {gid} .* from leaf 1 for GPUs \[0\]"):
        spine.on_switch(1, request)
    # a request that crosses its group's release is dropped at the spine and at a leaf
    assert fabric.call(0, "release", gid) == {"group": gid}
    assert spine.on_switch(0, request) == []
    assert fabric.switches[1].on_switch(2, request) == []
    (nack,) = load_reduce(fabric, 0, gid, (0, 0, 0), (0,), 16)
    assert nack.packet.info.error == "AccessViolation" and f"no live group {gid}" in nack.packet.info.message


def test_nvls_link_bytes_across_nodes_are_the_closed_forms_for_equal_sets_of_chunks():
    """2 nodes x 2 GPUs, 2 spines, every block two equal chunks (one to each spine): reduce_scatter puts
    S / P on each leaf -> spine cable (float16's partials: float32, twice its bytes) and S / (N P) on each
    spine -> leaf cable; allreduce adds its stores, G S / (n P) up and (n - G) S / (n P) down per cable;
    a GPU's uplink S (+ its block), its downlink its block (+ S)."""
    from nvlink_emu.fabric import cost, cost_nodes, replay
    from nvlink_emu.fabric.errors import FabricError

    cfg = nvlink(nodes=2, spines=2, chunk_bytes=4096)
    topo, n, N, G, P = cfg.topology, 4, 2, 2, 2
    chunk = len(replay.nvls_chunks(topo, 4 * 2048, cfg, 4)[0])
    assert chunk == 2  # 2048 elements a block, in two chunks
    S = 4 * 2048 * 4
    rs = cost_nodes.link_bytes("reduce_scatter", "nvls", topo, S, 4, config=cfg)
    half = cost_nodes.link_bytes("reduce_scatter", "nvls", topo, S // 2, 2, config=cfg, partial_itemsize=4)
    ar = cost_nodes.link_bytes("allreduce", "nvls", topo, S, 4, config=cfg)
    for k in range(N):
        for i in (2, 3):
            assert rs[f"sw{k}->sw{i}"] == S // P
            assert rs[f"sw{i}->sw{k}"] == S // (N * P)
            assert ar[f"sw{k}->sw{i}"] == S // P + G * S // (n * P)
            assert ar[f"sw{i}->sw{k}"] == S // (N * P) + (n - G) * S // (n * P)
        assert half[f"sw{k}->sw2"] + half[f"sw{k}->sw3"] == S  # float16's S / 2 bytes, up as float32
    for g in range(n):
        assert (rs[f"gpu{g}->sw{g // G}"], rs[f"sw{g // G}->gpu{g}"]) == (S, S // n)
        assert (ar[f"gpu{g}->sw{g // G}"], ar[f"sw{g // G}->gpu{g}"]) == (S + S // n, S + S // n)
    with pytest.raises(FabricError, match="nvls's link bytes are for allreduce, reduce_scatter"):
        cost_nodes.link_bytes("reduce", "nvls", topo, S, 4, config=cfg)
    # one node: the leaf's engine and ports (fabric.switch_clocks.OneSwitch); here the closed form's time to 1e-15
    one = preset_one_node()
    assert replay.replay_ns("allreduce", "nvls", one.topology, 1024, one, 4) == pytest.approx(
        cost.links_ns("allreduce", "nvls", 1024, 4, one, 4), rel=1e-15)


def preset_one_node():
    from nvlink_emu.fabric.config import preset
    return preset("dgx-h100", gpus=4)


def test_a_leaf_keeps_a_partition_s_load_reduces_awaiting_their_result_within_its_share(monkeypatch):
    """Each load-reduce costs a LOAD to every member: a leaf takes at most partial_share_parts of a
    partition's awaiting their result (ResourceExhausted past it), one per result key
    (CollectiveMismatch for a second); a result, or the group's release, gives the slot back. The
    members answer no LOAD here, so the bound of LOADs unanswered per GPU (MAX_LOADS, 1,024, below
    this budget of 2,048: test_switch_unserved_notices) is raised for the budget to be what is reached."""
    from nvlink_emu.fabric.switch import multicast
    monkeypatch.setattr(multicast, "MAX_LOADS", 1 << 16)
    fabric = Fabric(nvlink(nodes=2, spines=1, chunk_bytes=1 << 12, switch_buffer_bytes=1 << 12))
    leaf = fabric.switches[0]
    limit = leaf.partial_share_parts
    gid = fabric.group((0, 2))
    for c in range(limit):
        assert sorted(s.port for s in load_reduce(fabric, 0, gid, (0, 0, c), (0,), 8)) == [0, 2]
    (nack,) = load_reduce(fabric, 0, gid, (0, 0, limit), (0,), 8)
    assert nack.packet.info.error == "ResourceExhausted" and f"its share {limit}" in nack.packet.info.message
    (nack,) = load_reduce(fabric, 0, gid, (0, 0, 0), (0,), 8)
    assert nack.packet.info.error == "CollectiveMismatch" and "awaited already" in nack.packet.info.message
    assert fabric.call(0, "release", gid) == {"group": gid}
    assert leaf.nvls._asked == {} and leaf.nvls._asked_count == {0: 0}
    gid = fabric.group((0, 2))
    buffers = {g: np.arange(4, dtype=np.float16) for g in (0, 2)}
    loads = load_reduce(fabric, 0, gid, (1, 0, 0), (0,), 8)
    assert leaf.nvls._asked_count == {0: 1}
    (result,) = [send for load in loads for send in answer(fabric, load, buffers)]
    assert result.port == 0 and leaf.nvls._asked_count == {0: 0}
