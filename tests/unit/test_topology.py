"""fabric.topology: today's one-switch fabrics as one-node topologies, multi-node layouts, D-mod-k routes,
per-link bytes of traffic matrices (hand-computed, and against numpy block sums), errors."""

import math

import numpy as np
import pytest

from nvlink_emu.fabric.addressing import MAX_GPUS
from nvlink_emu.fabric.config import PRESETS, preset
from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.packets import raw_bytes, segments
from nvlink_emu.fabric.timemodel import LinkClock
from nvlink_emu.fabric.topology import LEVELS, SWITCH_LEVELS, Topology, gpu_name, link_name, switch_name
from switch_helpers import msg, network


def two_by_four(spines, uplink_gbytes=1800.0):
    """2 nodes x 4 GPUs: GPUs 0-3 on leaf sw0, 4-7 on leaf sw1, spines sw2 (, sw3, sw4, sw5)."""
    return Topology.multi_node(nodes=2, gpus_per_node=4, spines=spines, gpu_link=(450.0, 150.0),
                               uplink_gbytes_per_s_per_node=uplink_gbytes, uplink_latency_ns=200.0,
                               switch_latency_ns=250.0, name=f"2x4x{spines}")


def names(links):
    return [link.name for link in links]


def ring_traffic(gpus, nbytes):
    """GPU i sends `nbytes` to GPU i+1 (mod gpus): one step of a ring in node-major (GPU index) order."""
    t = np.zeros((gpus, gpus), np.int64)
    for i in range(gpus):
        t[i, (i + 1) % gpus] = nbytes
    return t


def all2all_traffic(gpus, block):
    """Every GPU sends `block` bytes to every other GPU (its own block is a local copy: 0)."""
    t = np.full((gpus, gpus), block, np.int64)
    np.fill_diagonal(t, 0)
    return t


def nonzero(per_link):
    return {name: b for name, b in per_link.items() if b}


# -- one node: exactly today's fabric -----------------------------------------------------------------

ONE_NODE = sorted(name for name in PRESETS if preset(name).nodes == 1)


def test_the_multi_node_presets_are_the_superpods_and_dgx_gh200():
    systems = ["dgx-gh200", "superpod-a100-ib", "superpod-h100-ib", "superpod-h100-nvlink"]
    assert sorted(set(PRESETS) - set(ONE_NODE)) == sorted(systems + [name + "-line" for name in systems])


@pytest.mark.parametrize("name", ONE_NODE)
def test_every_one_node_preset_is_a_one_node_topology_with_todays_links_ports_and_ranks(name):
    config = preset(name)
    g, timing = config.gpus, config.timing
    topo = Topology.single(config)
    assert (topo.nodes, topo.gpus_per_node, topo.spines, topo.gpus, topo.name) == (1, g, 0, g, name)
    assert topo.world_size == config.world_size == g + 1
    # links: today's names (fabric.counters), one pair per GPU, the profile's figures
    assert names(topo.links) == [n for gpu in range(g) for n in (uplink(gpu), downlink(gpu))]
    for link in topo.links:
        assert (link.bandwidth_gbytes_per_s, link.latency_ns, link.level) == (
            timing.bandwidth_gbytes_per_s, timing.link_latency_ns, "gpu-leaf")
    assert list(topo.by_level()) == ["gpu-leaf"]
    # one switch at rank G; its port p is GPU p's
    (switch,) = topo.switches
    assert (switch.index, switch.name, switch.level, switch.node, switch.rank) == (0, "sw0", "leaf", 0, g)
    assert switch.latency_ns == timing.switch_latency_ns
    assert [(p.number, p.peer, p.peer_port, p.egress, p.ingress) for p in switch.ports] == [
        (gpu, f"gpu{gpu}", 0, downlink(gpu), uplink(gpu)) for gpu in range(g)]
    # ranks: GPUs 0..G-1, then the switch (ranks/session.py's role_of)
    assert [topo.role_of(r) for r in range(g + 1)] == [("gpu", r) for r in range(g)] + [("switch", 0)]
    assert topo.gpu_ranks == tuple(range(g)) and topo.switch_ranks == (g,)
    # every route is the sender's uplink and the receiver's downlink, one hop = 2a + s
    hop = 2 * timing.link_latency_ns + timing.switch_latency_ns
    for src in range(g):
        for dst in range(g):
            assert names(topo.route(src, dst)) == [uplink(src), downlink(dst)]
            assert topo.path_latency_ns(src, dst) == hop
            assert topo.next_port(0, dst) == dst


def test_single_takes_the_configs_overrides_and_gpu_count():
    topo = Topology.single(preset("dgx-a100", gpus=3, link_latency_ns=7, switch_latency_ns=11,
                                  bandwidth_gbytes_per_s=100))
    assert topo.gpus == 3 and topo.world_size == 4
    assert {(l.bandwidth_gbytes_per_s, l.latency_ns) for l in topo.links} == {(100, 7)}
    assert topo.switches[0].latency_ns == 11 and topo.path_latency_ns(0, 2) == 25


@pytest.mark.parametrize("nbytes", [0, 1, 256, 1000, 300_000])
def test_single_counters_match_the_switch_logic_byte_for_byte(nbytes):
    sw = network(gpus=4)  # today's switch decisions and counters (MTU 256, header 16)
    topo = Topology.single(sw.config)
    transfers = [(0, 1, nbytes), (1, 3, nbytes + 5), (3, 0, 2 * nbytes), (2, 1, nbytes)]
    for src, dst, n in transfers:
        packet, payload = msg(0, sw.route_key(dst), n)
        (send,) = sw.on_packet(src, packet, payload)
        assert send.port == topo.next_port(0, dst)
    expected = topo.expected_counters(transfers, sw.config.mtu_bytes, sw.config.header_bytes)
    assert expected.snapshot() == sw.counters.snapshot()


# -- multi-node: ranks, switches, ports, links -----------------------------------------------------

def test_rank_layout_puts_each_node_next_to_its_leaf_and_the_spines_last():
    topo = two_by_four(spines=2)
    assert topo.world_size == 2 * (4 + 1) + 2 == 12 and topo.ranks_per_node == 5
    assert [topo.role_of(r) for r in range(12)] == [
        ("gpu", 0), ("gpu", 1), ("gpu", 2), ("gpu", 3), ("switch", 0),
        ("gpu", 4), ("gpu", 5), ("gpu", 6), ("gpu", 7), ("switch", 1),
        ("switch", 2), ("switch", 3)]
    for rank in range(12):
        assert topo.rank_of(*topo.role_of(rank)) == rank
    assert topo.gpu_ranks == (0, 1, 2, 3, 5, 6, 7, 8) and topo.switch_ranks == (4, 9, 10, 11)
    # block placement of ranks_per_node ranks per host: host h holds exactly node h's GPUs and leaf
    for node in range(2):
        hosts = {topo.rank_of("gpu", topo.gpu_at(node, local)) // topo.ranks_per_node for local in range(4)}
        assert hosts == {topo.switch(node).rank // topo.ranks_per_node} == {node}
    big = Topology.multi_node(32, 8, 4, (450.0, 150.0), 1800.0, 150.0, 250.0)
    assert big.world_size == 32 * 9 + 4 == 292 and big.gpus == 256
    assert big.rank_of("gpu", 255) == 31 * 9 + 7 and big.rank_of("switch", 31) == 31 * 9 + 8
    assert big.rank_of("switch", 32 + 3) == 291 and big.role_of(288) == ("switch", 32)


def test_switches_ports_and_links_of_two_nodes_and_two_spines():
    topo = two_by_four(spines=2, uplink_gbytes=1800.0)
    assert {s.level for s in topo.switches} == set(SWITCH_LEVELS)
    assert [(s.name, s.level, s.node) for s in topo.switches] == [
        ("sw0", "leaf", 0), ("sw1", "leaf", 1), ("sw2", "spine", None), ("sw3", "spine", None)]
    leaf1 = topo.switch(1)
    assert [(p.number, p.peer, p.peer_port, p.egress, p.ingress) for p in leaf1.ports] == [
        (0, "gpu4", 0, "sw1->gpu4", "gpu4->sw1"), (1, "gpu5", 0, "sw1->gpu5", "gpu5->sw1"),
        (2, "gpu6", 0, "sw1->gpu6", "gpu6->sw1"), (3, "gpu7", 0, "sw1->gpu7", "gpu7->sw1"),
        (4, "sw2", 1, "sw1->sw2", "sw2->sw1"), (5, "sw3", 1, "sw1->sw3", "sw3->sw1")]
    spine1 = topo.switch(3)
    assert [(p.number, p.peer, p.peer_port, p.egress) for p in spine1.ports] == [
        (0, "sw0", 5, "sw3->sw0"), (1, "sw1", 5, "sw3->sw1")]
    levels = topo.by_level()
    assert list(levels) == list(LEVELS)
    assert len(levels["gpu-leaf"]) == 16 and len(levels["leaf-spine"]) == 8
    # a node's 1800 GB/s uplink is split over the 2 spines: 900 GB/s per leaf <-> spine link, each way
    for link in levels["leaf-spine"]:
        assert (link.bandwidth_gbytes_per_s, link.latency_ns) == (900.0, 200.0)
    assert topo.link("sw0->sw3").direction == "up" and topo.link("sw3->sw0").direction == "down"
    assert (topo.link("gpu6->sw1").src_port, topo.link("gpu6->sw1").dst_port) == (0, 2)
    # names agree with fabric.counters for a GPU's own links, whatever the node
    assert uplink(6, switch=1) == link_name(gpu_name(6), switch_name(1)) == "gpu6->sw1"
    assert downlink(6, switch=1) == "sw1->gpu6"


def test_routes_same_node_other_node_and_loopback():
    topo = two_by_four(spines=2)
    assert names(topo.route(1, 2)) == ["gpu1->sw0", "sw0->gpu2"]
    assert names(topo.route(3, 3)) == ["gpu3->sw0", "sw0->gpu3"]  # the switch sends it back out of its port
    # GPU 6 is local index 2 of node 1: spine 2 mod 2 = 0 (sw2); GPU 7 is local 3: spine 1 (sw3)
    assert names(topo.route(1, 6)) == ["gpu1->sw0", "sw0->sw2", "sw2->sw1", "sw1->gpu6"]
    assert names(topo.route(1, 7)) == ["gpu1->sw0", "sw0->sw3", "sw3->sw1", "sw1->gpu7"]
    assert names(topo.route(5, 0)) == ["gpu5->sw1", "sw1->sw2", "sw2->sw0", "sw0->gpu0"]
    assert [topo.spine_for(d) for d in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    # the forwarding decision of each switch: leaf down to a local GPU or up to the spine; spine down
    assert [topo.next_port(0, d) for d in range(8)] == [0, 1, 2, 3, 4, 5, 4, 5]
    assert [topo.next_port(3, d) for d in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # the route is the chain of next_port decisions: each link starts where the previous one ended
    for src in range(8):
        for dst in range(8):
            route = topo.route(src, dst)
            assert route[0].src == f"gpu{src}" and route[-1].dst == f"gpu{dst}"
            assert all(a.dst == b.src for a, b in zip(route, route[1:]))
            for link in route[1:]:  # each hop is the port the switch it leaves picks for dst
                switch = next(sw for sw in topo.switches if sw.name == link.src)
                assert switch.ports[topo.next_port(switch.index, dst)].egress == link.name
            same_node = src // 4 == dst // 4
            assert len(route) == (2 if same_node else 4)
    # latency: 2 GPU hops + 2 uplink hops + 3 switch traversals across nodes, today's hop within one
    assert topo.path_latency_ns(1, 6) == 2 * 150 + 2 * 200 + 3 * 250
    assert topo.path_latency_ns(1, 2) == 2 * 150 + 250


def test_a_spine_takes_its_own_switch_latency():
    """An InfiniBand spine under NVLink nodes (issue 28): the leaves 250 ns, the spines 130; the route across
    nodes crosses two leaves and one spine, its timed stages as the cost model adds them (traversal_ns)."""
    topo = Topology.multi_node(2, 4, 2, (450.0, 150.0), 400.0, 600.0, 250.0, spine_latency_ns=130.0)
    assert [sw.latency_ns for sw in topo.switches] == [250.0, 250.0, 130.0, 130.0]
    assert topo.path_latency_ns(1, 6) == 2 * 150 + 2 * 600 + 2 * 250 + 130
    assert topo.path_latency_ns(1, 2) == 2 * 150 + 250
    assert [topo.traversal_ns(link) for link in topo.route(1, 6)[:-1]] == [250.0, 130.0, 250.0]
    with pytest.raises(FabricError, match="ends at a GPU"):
        topo.traversal_ns(topo.route(1, 6)[-1])
    # unset: every switch the leaves' figure, as before spines had their own (and equal to it given)
    assert two_by_four(spines=2).spine_latency_ns == 250.0
    assert two_by_four(spines=2) == Topology.multi_node(2, 4, 2, (450.0, 150.0), 1800.0, 200.0, 250.0, "2x4x2", 250.0)


def test_one_node_has_no_spine_to_choose():
    assert Topology.single(preset("dgx-h100")).spine_for(5) is None
    one = Topology.multi_node(1, 4, 0, (450.0, 150.0), 1800.0, 200.0, 250.0)
    assert one.world_size == 5 and names(one.route(0, 3)) == ["gpu0->sw0", "sw0->gpu3"]


@pytest.mark.parametrize("uplink_gbytes,bottleneck", [(1800.0, 450.0), (400.0, 100.0)])
@pytest.mark.parametrize("raw", [16, 4112, 1 << 22])
def test_unloaded_time_is_what_cut_through_link_clocks_give(uplink_gbytes, bottleneck, raw):
    # an InfiniBand-like uplink (400 GB/s per node: 100 per GPU's share) is the bottleneck of its route
    topo = two_by_four(spines=2, uplink_gbytes=uplink_gbytes)
    assert topo.bottleneck_gbytes_per_s(2, 7) == bottleneck
    start = end = 1000.0
    for k, hop in enumerate(topo.timed_route(2, 7)):  # idle stages, one LinkClock each, cut-through switches
        s, e = LinkClock(hop.bandwidth_gbytes_per_s).transmit(start, end, raw)
        start, end = s + hop.latency_ns, e + hop.latency_ns
        if k < 3:
            start, end = start + 250.0, end + 250.0
    assert math.isclose(end - 1000.0, topo.unloaded_ns(2, 7, raw), rel_tol=1e-12)
    assert math.isclose(end - 1000.0, raw / bottleneck + 2 * 150 + 2 * 200 + 3 * 250, rel_tol=1e-12)


def test_a_transfer_between_nodes_is_timed_on_the_two_gpus_shares():
    topo = two_by_four(spines=2, uplink_gbytes=400.0)
    assert topo.share_gbytes_per_s == 100.0 and Topology.single(preset("dgx-h100")).share_gbytes_per_s is None
    timed = topo.timed_route(1, 6)
    assert [h.name for h in timed] == ["gpu1->sw0", "gpu1:out", "gpu6:in", "sw1->gpu6"]
    assert [h.bandwidth_gbytes_per_s for h in timed] == [450.0, 100.0, 100.0, 450.0]
    assert [h.latency_ns for h in timed] == [link.latency_ns for link in topo.route(1, 6)]  # the cables' latencies
    assert [h.name for h in topo.timed_route(1, 2)] == names(topo.route(1, 2))  # within a node: the links
    # the share does not depend on the spines: 1 or 4 cables of U / S, each GPU U / G
    assert two_by_four(spines=1, uplink_gbytes=400.0).share_gbytes_per_s == 100.0


# -- bytes per link under the routing -----------------------------------------------------------------

B = 1 << 20  # a ring hop's or an all2all block's bytes


def test_ring_in_node_major_order_one_spine():
    topo = two_by_four(spines=1)
    per_link = topo.link_payload_bytes(ring_traffic(8, B))
    gpu_links = {n: B for g in range(8) for n in (f"gpu{g}->sw{g // 4}", f"sw{g // 4}->gpu{g}")}
    # only hops 3 -> 4 and 7 -> 0 leave their node, through the one spine (sw2)
    assert nonzero(per_link) == {**gpu_links, "sw0->sw2": B, "sw2->sw1": B, "sw1->sw2": B, "sw2->sw0": B}


def test_ring_in_node_major_order_two_spines_uses_one_of_them():
    topo = two_by_four(spines=2)
    # an allreduce of S bytes by ring: 2(N-1) steps of S/N on every ring edge, N = 8
    S = 8 * B
    per_link = topo.link_payload_bytes(ring_traffic(8, 2 * 7 * S // 8))
    # both inter-node hops go to local index 0 (GPUs 4 and 0), so both take spine 0 (sw2); sw3 is idle
    assert {n: b for n, b in per_link.items() if "sw2" in n or "sw3" in n} == {
        "sw0->sw2": 14 * B, "sw2->sw0": 14 * B, "sw0->sw3": 0, "sw3->sw0": 0,
        "sw1->sw2": 14 * B, "sw2->sw1": 14 * B, "sw1->sw3": 0, "sw3->sw1": 0}
    assert all(per_link[f"gpu{g}->sw{g // 4}"] == per_link[f"sw{g // 4}->gpu{g}"] == 14 * B for g in range(8))
    assert topo.totals_by_level(per_link) == {"gpu-leaf": {"up": 8 * 14 * B, "down": 8 * 14 * B},
                                              "leaf-spine": {"up": 2 * 14 * B, "down": 2 * 14 * B}}


def test_all2all_two_nodes_one_spine():
    topo = two_by_four(spines=1)
    per_link = topo.link_payload_bytes(all2all_traffic(8, B))
    for g in range(8):  # every GPU sends 7 blocks and receives 7
        assert per_link[f"gpu{g}->sw{g // 4}"] == per_link[f"sw{g // 4}->gpu{g}"] == 7 * B
    # 4 senders x 4 receivers cross each way
    assert {n: per_link[n] for n in ("sw0->sw2", "sw2->sw1", "sw1->sw2", "sw2->sw0")} == dict.fromkeys(
        ("sw0->sw2", "sw2->sw1", "sw1->sw2", "sw2->sw0"), 16 * B)


def test_all2all_two_nodes_two_spines_splits_evenly():
    topo = two_by_four(spines=2)
    per_link = topo.link_payload_bytes(all2all_traffic(8, B))
    # leaf 0 -> spine 0 carries node 0's 4 senders' blocks for GPUs 4 and 6 (local 0, 2): 8 blocks
    assert {n: b for n, b in per_link.items() if n.startswith(("sw0->sw", "sw1->sw", "sw2", "sw3"))} == {
        "sw0->sw2": 8 * B, "sw2->sw0": 8 * B, "sw0->sw3": 8 * B, "sw3->sw0": 8 * B,
        "sw1->sw2": 8 * B, "sw2->sw1": 8 * B, "sw1->sw3": 8 * B, "sw3->sw1": 8 * B}
    assert topo.totals_by_level(per_link) == {"gpu-leaf": {"up": 56 * B, "down": 56 * B},
                                              "leaf-spine": {"up": 32 * B, "down": 32 * B}}


def test_all2all_with_spines_not_dividing_the_node_is_uneven():
    topo = two_by_four(spines=3)
    per_link = topo.link_payload_bytes(all2all_traffic(8, B))
    # local indices 0 and 3 both map to spine 0; 1 to spine 1; 2 to spine 2
    assert [per_link[f"sw0->sw{2 + k}"] for k in range(3)] == [8 * B, 4 * B, 4 * B]
    assert [per_link[f"sw{2 + k}->sw1"] for k in range(3)] == [8 * B, 4 * B, 4 * B]


def test_all2all_on_256_gpus():
    topo = Topology.multi_node(32, 8, 4, (450.0, 150.0), 1800.0, 150.0, 250.0)
    per_link = topo.link_payload_bytes(all2all_traffic(256, 1))
    up = {link.name: per_link[link.name] for link in topo.by_level()["leaf-spine"]}
    # leaf -> spine k: 8 senders x (31 other nodes x 2 receivers with local index = k mod 4) = 496 blocks
    assert set(up.values()) == {496}
    assert all(per_link[f"gpu{g}->sw{g // 8}"] == per_link[f"sw{g // 8}->gpu{g}"] == 255 for g in range(256))


@pytest.mark.parametrize("nodes,gpn,spines", [(3, 4, 1), (3, 4, 2), (3, 4, 3), (3, 4, 4), (2, 3, 2), (4, 2, 1)])
def test_random_traffic_matches_numpy_block_sums(nodes, gpn, spines):
    topo = Topology.multi_node(nodes, gpn, spines, (300.0, 150.0), 600.0, 300.0, 250.0)
    gpus = nodes * gpn
    rng = np.random.default_rng(nodes * 100 + gpn * 10 + spines)
    traffic = rng.integers(0, 1 << 40, size=(gpus, gpus), dtype=np.int64)
    traffic[rng.random((gpus, gpus)) < 0.3] = 0
    per_link = topo.link_payload_bytes(traffic)
    node = np.arange(gpus) // gpn
    spine = (np.arange(gpus) % gpn) % spines
    expected = {}
    for g in range(gpus):  # every byte leaves on its sender's uplink and arrives on its receiver's downlink
        expected[f"gpu{g}->sw{node[g]}"] = int(traffic[g, :].sum())
        expected[f"sw{node[g]}->gpu{g}"] = int(traffic[:, g].sum())
    for n in range(nodes):
        for k in range(spines):
            into_k = spine == k
            expected[f"sw{n}->sw{nodes + k}"] = int(traffic[np.ix_(node == n, (node != n) & into_k)].sum())
            expected[f"sw{nodes + k}->sw{n}"] = int(traffic[np.ix_(node != n, (node == n) & into_k)].sum())
    assert per_link == expected
    assert list(per_link) == names(topo.links)
    walked = dict.fromkeys(names(topo.links), 0)  # and the oracle of the routes themselves
    for i in range(gpus):
        for j in range(gpus):
            for link in topo.route(i, j):
                walked[link.name] += int(traffic[i, j])
    assert per_link == walked
    inter = int(traffic[node[:, None] != node[None, :]].sum())
    assert topo.totals_by_level(per_link)["leaf-spine"] == {"up": inter, "down": inter}


def test_the_diagonal_is_fabric_loopback():
    topo = two_by_four(spines=2)
    t = np.zeros((8, 8), np.int64)
    t[5, 5] = 100
    assert nonzero(topo.link_payload_bytes(t)) == {"gpu5->sw1": 100, "sw1->gpu5": 100}
    assert nonzero(topo.link_payload_bytes(np.zeros((8, 8), int))) == {}
    huge = np.zeros((8, 8), object)  # Python ints past int64 stay exact
    huge[0, 7] = huge[1, 7] = 2 ** 70
    assert topo.link_payload_bytes(huge)["sw1->gpu7"] == 2 ** 71
    wide = np.zeros((8, 8), np.int64)  # int64 entries whose sum does not fit int64
    wide[0, 7] = wide[1, 7] = 2 ** 62
    assert topo.link_payload_bytes(wide)["sw1->gpu7"] == 2 ** 63
    assert topo.link_payload_bytes([[0] * 8] * 7 + [[3] + [0] * 7])["sw0->gpu0"] == 3  # nested lists work


def test_expected_counters_count_every_link_of_the_route():
    topo = two_by_four(spines=2)
    counters = topo.expected_counters([(1, 6, 1000), (1, 6, 0), (6, 1, 256)], mtu_bytes=256, header_bytes=16)
    one_way = {"payload_bytes": 1000, "raw_bytes": raw_bytes(1000, 256, 16) + 16,
               "packets": segments(1000, 256) + 1, "busy_ns": 0.0}
    back = {"payload_bytes": 256, "raw_bytes": 256 + 16, "packets": 1, "busy_ns": 0.0}
    assert counters.snapshot() == {
        **{n: one_way for n in ("gpu1->sw0", "sw0->sw2", "sw2->sw1", "sw1->gpu6")},
        # back to GPU 1, local index 1: through spine 1 (sw3)
        **{n: back for n in ("gpu6->sw1", "sw1->sw3", "sw3->sw0", "sw0->gpu1")}}


# -- errors -------------------------------------------------------------------------------------------

def build(**overrides):
    args = dict(nodes=2, gpus_per_node=4, spines=2, gpu_link=(450.0, 150.0), uplink_gbytes_per_s_per_node=1800.0,
                uplink_latency_ns=200.0, switch_latency_ns=250.0)
    return Topology.multi_node(**{**args, **overrides})


@pytest.mark.parametrize("overrides,message", [
    (dict(nodes=0), "nodes: must be a positive integer, got 0"),
    (dict(nodes=2.0), "nodes: must be a positive integer, got 2.0"),
    (dict(nodes=True), "nodes: must be a positive integer, got True"),
    (dict(gpus_per_node=0), "gpus_per_node: must be a positive integer, got 0"),
    (dict(gpus_per_node="4"), "gpus_per_node: must be a positive integer, got '4'"),
    (dict(spines=-1), "spines: must be a non-negative integer, got -1"),
    (dict(spines=1.5), "spines: must be a non-negative integer, got 1.5"),
    (dict(spines=0), r"spines: 2 nodes need 1..4 spines .* got 0"),
    (dict(spines=5), r"spines: 2 nodes need 1..4 spines .*would carry nothing\), got 5"),
    (dict(nodes=1, spines=1), "spines: one node sends nothing between nodes; spines must be 0, got 1"),
    (dict(nodes=MAX_GPUS // 8 + 1, gpus_per_node=8), rf"481 nodes x 8 GPUs = 3848 GPUs; at most {MAX_GPUS}"),
    (dict(gpu_link=450.0), r"gpu_link: must be a \(GB/s, ns\) pair, got 450.0"),
    (dict(gpu_link=(450.0, 150.0, 1.0)), "gpu_link: must be a"),
    (dict(gpu_link=(0, 150.0)), "gpu_gbytes_per_s: must be a finite positive number, got 0"),
    (dict(gpu_link=(450.0, -1)), "gpu_latency_ns: must be a finite non-negative number, got -1"),
    (dict(uplink_gbytes_per_s_per_node=math.inf), "uplink_gbytes_per_s_per_node: must be a finite positive"),
    (dict(uplink_gbytes_per_s_per_node=None), "uplink_gbytes_per_s_per_node: must be a finite positive"),
    (dict(uplink_latency_ns=math.nan), "uplink_latency_ns: must be a finite non-negative number, got nan"),
    (dict(switch_latency_ns=True), "switch_latency_ns: must be a finite non-negative number, got True"),
    (dict(name=3), "name: must be a string, got 3"),
])
def test_bad_sizes_and_figures_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(**overrides)


def test_the_largest_fabric_addressing_allows_is_accepted():
    assert build(nodes=MAX_GPUS // 8, gpus_per_node=8).gpus == MAX_GPUS
    with pytest.raises(ConfigError, match="Topology.single takes a FabricConfig, got dict"):
        Topology.single({"gpus": 8})


def test_bad_queries_are_fabric_errors_naming_the_value():
    topo = two_by_four(spines=2)
    with pytest.raises(FabricError, match=r"GPU 8 is not one of GPUs 0..7"):
        topo.route(8, 0)
    with pytest.raises(FabricError, match=r"GPU True is not one of GPUs 0..7"):
        topo.route(True, 0)
    with pytest.raises(FabricError, match=r"rank 12 is not one of 0..11"):
        topo.role_of(12)
    with pytest.raises(FabricError, match=r"role must be one of \('gpu', 'switch'\), got 'spine'"):
        topo.rank_of("spine", 0)
    with pytest.raises(FabricError, match=r"no switch 4; switches are 0..3"):
        topo.next_port(4, 0)
    with pytest.raises(FabricError, match=r"no GPU at node 2, local index 0"):
        topo.gpu_at(2, 0)
    with pytest.raises(FabricError, match=r"no link 'gpu0->sw1'"):
        topo.link("gpu0->sw1")
    with pytest.raises(FabricError, match=r"no link\(s\) bogus"):
        topo.totals_by_level({"bogus": 1})
    with pytest.raises(FabricError, match=r"must be 8 x 8 .* got shape \(4, 4\)"):
        topo.link_payload_bytes(np.zeros((4, 4), int))
    with pytest.raises(FabricError, match="integer byte counts, got dtype float64"):
        topo.link_payload_bytes(np.ones((8, 8)))
    with pytest.raises(FabricError, match="integer byte counts, got dtype bool"):
        topo.link_payload_bytes(np.ones((8, 8), bool))
    negative = np.zeros((8, 8), int)
    negative[2, 5] = -4
    with pytest.raises(FabricError, match="traffic from GPU 2 to GPU 5 must be a non-negative integer number "
                                          "of bytes, got -4"):
        topo.link_payload_bytes(negative)
    fractional = np.zeros((8, 8), object)
    fractional[3, 1] = 1.5
    with pytest.raises(FabricError, match="traffic from GPU 3 to GPU 1 must be a non-negative integer number "
                                          "of bytes, got 1.5"):
        topo.link_payload_bytes(fractional)
    with pytest.raises(FabricError, match=r"transfer GPU 1 -> GPU 2: bytes must be a non-negative integer, got 1.5"):
        topo.expected_counters([(1, 2, 1.5)], 256, 16)
    with pytest.raises(FabricError, match=r"a transfer is \(src GPU, dst GPU, bytes\), got \(1, 2\)"):
        topo.expected_counters([(1, 2)], 256, 16)


def test_the_module_is_pure():
    # fabric/ never imports MPI: the topology must be usable by the launcher and the cost model anywhere
    import subprocess
    import sys
    code = "import sys, nvlink_emu.fabric.topology; print(sorted(m for m in sys.modules if m.startswith('mpi4py')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
