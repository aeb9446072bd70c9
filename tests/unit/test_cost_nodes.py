"""fabric.cost_nodes: exact per-link bytes of the flat algorithms on 2 nodes x 4 GPUs (1 and 2 spines),
hand-computed; one node reduces to fabric.cost; time bounds by hand; the SuperPOD system data
(fabric.profiles.SYSTEMS) with sources and consistent numbers."""

import math

import numpy as np
import pytest

from nvlink_emu.fabric import cost, cost_nodes as cn
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.profiles import PROFILES, SYSTEMS, link_profile, system_profile
from nvlink_emu.fabric.topology import Topology

B = 1024            # bytes a block: 256 float32
S = 8 * B           # 8 GPUs, 8 blocks
LINE = preset("dgx-h100-line")  # mtu 256, header 16, chunk 4 MiB: R(1024) = 1024 + 4 x 16 = 1088


def two_by_four(spines, uplink=1800.0):
    """GPUs 0-3 on leaf sw0, 4-7 on leaf sw1; spines sw2 (, sw3); GPU links 450 GB/s, 150 ns."""
    return Topology.multi_node(nodes=2, gpus_per_node=4, spines=spines, gpu_link=(450.0, 150.0),
                               uplink_gbytes_per_s_per_node=uplink, uplink_latency_ns=200.0, switch_latency_ns=250.0)


def gpu_links(per_link, each_up, each_down):
    """The 16 GPU <-> leaf links of 2 x 4 each carrying each_up (GPU -> leaf) and each_down."""
    for g in range(8):
        leaf = f"sw{g // 4}"
        assert per_link[f"gpu{g}->{leaf}"] == each_up, g
        assert per_link[f"{leaf}->gpu{g}"] == each_down, g


def spine_links(per_link, expected):
    """Every leaf <-> spine link: its bytes in `expected`, 0 if missing."""
    for name, got in per_link.items():
        if "gpu" not in name:
            assert got == expected.get(name, 0), name


# -- bytes, by hand ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spines", [1, 2])
def test_node_major_ring_crosses_nodes_only_into_local_index_0_over_spine_0(spines):
    # 8 KiB: one ring channel (fabric.reduction.ring_channel_count, one per 32 KiB), the node-major ring
    topo = two_by_four(spines)
    # 7 rounds, each GPU sends one block to the next; crossings 3 -> 4 and 7 -> 0, both to local 0: spine 0
    for collective, rounds in (("allgather", 7), ("reduce_scatter", 7), ("allreduce", 14)):
        got = cn.link_bytes(collective, "ring", topo, S)
        gpu_links(got, rounds * B, rounds * B)
        spine_links(got, {"sw0->sw2": rounds * B, "sw2->sw1": rounds * B, "sw1->sw2": rounds * B,
                          "sw2->sw0": rounds * B})
        assert len(cn.rounds(collective, "ring", topo, S)) == rounds


B4 = 16 * 1024  # 128 KiB on 8 GPUs: 4 ring channels (one per 32 KiB), each range 4 KiB, R(4 KiB) = 4352


@pytest.mark.parametrize("spines", [1, 2])
def test_the_rings_of_the_rails_cross_nodes_on_every_gpu_s_share(spines):
    topo = two_by_four(spines)
    # 7 rounds, each GPU sends one range of each channel to its successor: ring c leaves node a from local
    # c-1 into node a+1's local c, so spine (c mod spines) carries channel c
    for collective, rounds in (("allgather", 7), ("reduce_scatter", 7), ("allreduce", 14)):
        got = cn.link_bytes(collective, "ring", topo, 8 * B4)
        gpu_links(got, rounds * B4, rounds * B4)
        per_spine = rounds * B4 // spines
        spine_links(got, {f"{x}->{y}": per_spine for k in range(spines) for x, y in
                          (("sw0", f"sw{2 + k}"), (f"sw{2 + k}", "sw1"), ("sw1", f"sw{2 + k}"), (f"sw{2 + k}", "sw0"))})
        steps = cn.rounds(collective, "ring", topo, 8 * B4)
        assert len(steps) == rounds
        for t in steps:  # every GPU sends one range across, to the next node's next local index
            for g in range(8):
                across = [d for d in range(8) if d // 4 != g // 4 and t[g, d]]
                assert across == [(g // 4 + 1) % 2 * 4 + (g % 4 + 1) % 4] and t[g, across[0]] == B4 // 4, (g, t)
    # 64 KiB: two channels, rings 0 and 1, crossing into local 0 and 1
    two = cn.rounds("allgather", "ring", topo, 4 * B4)[0]
    assert sorted((g, d) for g in range(8) for d in range(8) if d // 4 != g // 4 and two[g, d]) == \
        [(0, 5), (3, 4), (4, 1), (7, 0)]


@pytest.mark.parametrize("spines", [1, 2])
def test_ring_allgather_time_is_set_by_the_crossings_on_every_gpu_s_shares(spines):
    # a node's 90 GB/s uplink, 22.5 GB/s per GPU's share whatever the spines; in every round each GPU sends
    # its exit channel's range (4 KiB, R = 4352) across, on its outbound share, and the other three (12 KiB,
    # R = 13056) in one flow to the next GPU of its node
    topo = two_by_four(spines, uplink=90.0)
    S4 = 8 * B4
    path = 150 + 250 + 200 + 250 + 200 + 250 + 150  # GPU 3 -> sw0 -> sw2 -> sw1 -> GPU 4: 1450 ns
    share = 90.0 / 4
    one_round = path + 4352 / share
    assert math.isclose(cn.round_ns(topo, cn.rounds("allgather", "ring", topo, S4)[0], LINE), one_round)
    assert math.isclose(cn.rounds_ns("allgather", "ring", topo, S4, LINE), 7 * one_round)
    # however rounds overlap: each share carries 7 ranges one after another, and each round waits for the
    # previous one's receipt, at best the hop in the node (550 ns) and R(12 KiB) at 450 GB/s
    link = path + 7 * 4352 / share
    chain = 7 * (550 + 13056 / 450)
    assert math.isclose(cn.lower_bound_ns("allgather", "ring", topo, S4, LINE), max(link, chain))
    slow = two_by_four(spines, uplink=2.0)  # 2 GB/s: the share's bound is the larger one
    assert math.isclose(cn.lower_bound_ns("allgather", "ring", slow, S4, LINE), path + 7 * 4352 / (2.0 / 4))
    name, ns = cn.bottleneck("allgather", "ring", topo, S4, LINE)
    assert name.endswith((":out", ":in")) and math.isclose(ns, 7 * 4352 / share)


def test_direct_and_all2all_spread_over_the_spines_by_destination():
    # every GPU sends one block to each of the 7 others; 4 x 4 blocks cross each way between the nodes
    for collective, algorithm, times in (("allgather", "direct", 1), ("reduce_scatter", "direct", 1),
                                         ("allreduce", "direct", 2), ("all2all", "direct", 1)):
        one = cn.link_bytes(collective, algorithm, two_by_four(1), S)
        gpu_links(one, 7 * B * times, 7 * B * times)
        spine_links(one, {name: 16 * B * times for name in ("sw0->sw2", "sw2->sw1", "sw1->sw2", "sw2->sw0")})
        # 2 spines: destinations of local index 0, 2 take spine sw2, of 1, 3 spine sw3: half each
        two = cn.link_bytes(collective, algorithm, two_by_four(2), S)
        gpu_links(two, 7 * B * times, 7 * B * times)
        spine_links(two, {name: 8 * B * times for name in ("sw0->sw2", "sw2->sw1", "sw1->sw2", "sw2->sw0",
                                                            "sw0->sw3", "sw3->sw1", "sw1->sw3", "sw3->sw0")})


@pytest.mark.parametrize("spines", [1, 2])
def test_direct_broadcast_from_a_root_in_the_second_node(spines):
    root = 5  # node 1, local 1
    got = cn.link_bytes("broadcast", "direct", two_by_four(spines), S, root=root)
    for g in range(8):
        leaf = f"sw{g // 4}"
        assert got[f"gpu{g}->{leaf}"] == (7 * S if g == root else 0)
        assert got[f"{leaf}->gpu{g}"] == (0 if g == root else S)
    if spines == 1:  # the 4 copies for GPUs 0-3 cross leaf 1 -> spine -> leaf 0
        spine_links(got, {"sw1->sw2": 4 * S, "sw2->sw0": 4 * S})
    else:  # GPUs 0, 2 over sw2, GPUs 1, 3 over sw3
        spine_links(got, {"sw1->sw2": 2 * S, "sw2->sw0": 2 * S, "sw1->sw3": 2 * S, "sw3->sw0": 2 * S})


def test_all2allv_moves_the_counts_given_and_never_the_own_block():
    counts = np.array([[100 * (i + 1) + j for j in range(8)] for i in range(8)], np.int64)  # diagonal: local
    one = cn.link_bytes("all2allv", "all2allv", two_by_four(1), counts=counts)
    assert one["gpu2->sw0"] == 7 * 300 + (0 + 1 + 3 + 4 + 5 + 6 + 7) == 2126
    assert one["sw1->gpu5"] == 100 * (1 + 2 + 3 + 4 + 5 + 7 + 8) + 7 * 5 == 3035
    # node 0 -> node 1: sum over i = 0..3, j = 4..7 of 100 (i + 1) + j = 4000 + 88
    spine_links(one, {"sw0->sw2": 4088, "sw2->sw1": 4088, "sw1->sw2": 10424, "sw2->sw0": 10424})
    two = cn.link_bytes("all2allv", "all2allv", two_by_four(2), counts=counts)
    # spine sw2 carries destinations 4, 6 (and 0, 2), spine sw3 destinations 5, 7 (and 1, 3)
    spine_links(two, {"sw0->sw2": 2000 + 4 * (4 + 6), "sw2->sw1": 2040, "sw0->sw3": 2000 + 4 * (5 + 7),
                      "sw3->sw1": 2048, "sw1->sw2": 5200 + 4 * (0 + 2), "sw2->sw0": 5208,
                      "sw1->sw3": 5200 + 4 * (1 + 3), "sw3->sw0": 5216})
    assert counts[3, 3] == 403  # the caller's matrix is not changed by dropping the diagonal


def test_bytes_are_conserved_at_every_level():
    topo = two_by_four(2)
    for collective, algorithm in (("allreduce", "ring"), ("allreduce", "direct"), ("all2all", "direct")):
        levels = topo.totals_by_level(cn.link_bytes(collective, algorithm, topo, S))
        assert levels["gpu-leaf"]["up"] == levels["gpu-leaf"]["down"]
        assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"]


# -- one node is today's one-switch model ------------------------------------------------------------

@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_one_node_bytes_and_times_are_fabric_cost(gpus):
    config = preset("dgx-h100-line", gpus=gpus)
    topo = Topology.single(config)
    size = gpus * 3 * 4096  # equal blocks of whole float32s
    pairs = [("ring", c) for c in cn.FLAT["ring"]] + [("direct", c) for c in cn.FLAT["direct"]]
    for algorithm, collective in pairs:
        for root in ((0, gpus - 1) if collective == "broadcast" else (0,)):
            per_link = cn.link_bytes(collective, algorithm, topo, size, root=root)
            for g in range(gpus):
                tx, rx = cost.payload_bytes(collective, algorithm, size, gpus, rank=g, root=root)
                assert (per_link[f"gpu{g}->sw0"], per_link[f"sw0->gpu{g}"]) == (tx, rx), (algorithm, collective, g)
            ns = cn.modeled_ns(collective, algorithm, topo, size, config, root=root)
            assert math.isclose(ns, cost.modeled_ns(collective, algorithm, size, gpus, config), rel_tol=1e-12)
            assert cn.lower_bound_ns(collective, algorithm, topo, size, config, root=root) <= ns * (1 + 1e-12)


def test_one_node_ring_allreduce_by_hand():
    config = preset("dgx-h100-line", gpus=4)
    Rb = (2**20 + 4096 * 16) / 450  # fabric.cost's test: 1 MiB blocks
    got = cn.modeled_ns("allreduce", "ring", Topology.single(config), 4 * 2**20, config)
    assert math.isclose(got, 6 * (Rb + 2 * 150 + 250))


# -- time on two nodes, by hand ---------------------------------------------------------------------

@pytest.mark.parametrize("spines", [1, 2])
def test_ring_allgather_time_is_set_by_the_crossing_on_one_gpu_s_shares(spines):
    # a node's 90 GB/s uplink, 22.5 GB/s per GPU's share whatever the spines; each crossing of the ring
    # (GPU 3 -> 4, GPU 7 -> 0) is timed on the sender's outbound and the receiver's inbound share
    topo = two_by_four(spines, uplink=90.0)
    path = 150 + 250 + 200 + 250 + 200 + 250 + 150  # GPU 3 -> sw0 -> sw2 -> sw1 -> GPU 4: 1450 ns
    share = 90.0 / 4
    one_round = path + 1088 / share  # the share serialises R(1 KiB) = 1088 raw bytes
    assert math.isclose(cn.round_ns(topo, cn.rounds("allgather", "ring", topo, S)[0], LINE), one_round)
    assert math.isclose(cn.rounds_ns("allgather", "ring", topo, S, LINE), 7 * one_round)
    # however rounds overlap: GPU 3's outbound share carries all 7 blocks one after another, and each round
    # waits for the previous one's receipt, at best a hop in a node (550 ns) and R(1 KiB) at 450 GB/s
    link = path + 7 * 1088 / share
    chain = 7 * (550 + 1088 / 450)
    assert math.isclose(cn.lower_bound_ns("allgather", "ring", topo, S, LINE), max(link, chain))
    slow = two_by_four(spines, uplink=2.0)  # 2 GB/s: the share's bound is the larger one
    assert math.isclose(cn.lower_bound_ns("allgather", "ring", slow, S, LINE), path + 7 * 1088 / (2.0 / 4))
    name, ns = cn.bottleneck("allgather", "ring", topo, S, LINE)
    assert name in ("gpu3:out", "gpu7:out", "gpu4:in", "gpu0:in") and math.isclose(ns, 7 * 1088 / share)


def test_all2all_time_on_two_nodes_by_hand():
    topo = two_by_four(1, uplink=90.0)
    # one round: each GPU's outbound share (90 / 4 GB/s) carries its 4 blocks for the other node; the first
    # byte enters it 400 ns after leaving the GPU (a + s), the last leaves it after 200 ns of link and has
    # s + u + s + a = 850 ns to go (as 16 blocks on one 90 GB/s cable would take)
    want = 400 + 4 * 1088 / 22.5 + 200 + 850
    assert math.isclose(cn.rounds_ns("all2all", "direct", topo, S, LINE), want)
    assert math.isclose(cn.lower_bound_ns("all2all", "direct", topo, S, LINE), want)  # one round: the same


@pytest.mark.parametrize("spines,uplink", [(1, 90.0), (2, 90.0), (2, 1800.0), (4, 7200.0)])
def test_the_lower_bound_never_exceeds_the_estimate(spines, uplink):
    topo = two_by_four(spines, uplink)
    counts = np.arange(64, dtype=np.int64).reshape(8, 8) * 1000
    for size in (S, 8 * 2**20):
        for algorithm, collectives in cn.FLAT.items():
            for collective in collectives:
                args = dict(counts=counts) if algorithm == "all2allv" else dict(root=6)
                low = cn.lower_bound_ns(collective, algorithm, topo, size, LINE, **args)
                est = cn.rounds_ns(collective, algorithm, topo, size, LINE, **args)
                exact = cn.modeled_ns(collective, algorithm, topo, size, LINE, **args)
                assert 0 < low <= est * (1 + 1e-12), (collective, algorithm, size, low, est)
                assert low <= exact * (1 + 1e-12), (collective, algorithm, size, low, exact)


def test_a_faster_uplink_moves_the_bottleneck_to_the_gpu_links():
    topo = two_by_four(2, uplink=1800.0)  # 450 GB/s per GPU's share, as its GPU link; 7 blocks on it against 4
    name, _ = cn.bottleneck("all2all", "direct", topo, S, LINE)
    assert "->" in name and name.startswith("gpu")  # a GPU's uplink, not a share
    assert cn.bottleneck("all2all", "direct", two_by_four(2, uplink=90.0), S, LINE)[0].endswith((":out", ":in"))


# -- errors -----------------------------------------------------------------------------------------

def test_pairs_and_arguments_without_a_model_are_refused():
    topo = two_by_four(1)
    with pytest.raises(FabricError, match="broadcast with 'ring'"):
        cn.rounds("broadcast", "ring", topo, S)
    with pytest.raises(FabricError, match="sharp"):
        cn.rounds("allreduce", "sharp", topo, S)
    with pytest.raises(FabricError, match="multiple of itemsize 4"):
        cn.rounds("allreduce", "ring", topo, 1001)
    with pytest.raises(FabricError, match="root"):
        cn.rounds("broadcast", "direct", topo, S, root=8)
    with pytest.raises(FabricError, match="needs counts"):
        cn.rounds("all2allv", "all2allv", topo)
    with pytest.raises(FabricError, match="8 x 8"):
        cn.rounds("all2allv", "all2allv", topo, counts=np.ones((4, 4), np.int64))
    with pytest.raises(FabricError, match="Topology"):
        cn.rounds("allreduce", "ring", LINE, S)


def test_uneven_blocks_follow_fabric_reduction_blocks():
    topo = two_by_four(1)
    # 10 float32 on 8 GPUs: blocks 0 and 1 hold 2 elements (8 bytes), the others 1 (4 bytes)
    got = cn.link_bytes("allgather", "ring", topo, 40)
    assert got["gpu0->sw0"] == 40 - 8  # GPU r passes on every block but block r+1 (its successor's own)
    assert sum(v for k, v in got.items() if k.startswith("gpu")) == 7 * 40


# -- SuperPOD system data ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_every_system_figure_has_a_source_and_adds_up(name):
    system = system_profile(name)
    assert system.sources and system.notes
    for figure, source in system.sources:
        assert figure and source.startswith('"') and "https://" in source, (figure, source)
    assert math.isclose(system.uplinks_per_node * system.uplink_gbytes_per_s_each, system.uplink_gbytes_per_s_per_node)
    spine = link_profile(system.spine_link)
    link_profile(system.gpu_link)
    assert system.uplink_latency_ns is None  # none published was found: the preset must state its assumption
    assert system.nodes_max * system.gpus_per_node <= 256
    # a Topology of the system's largest size builds, one spine per local index (the rail pattern)
    topo = Topology.multi_node(system.nodes_max, system.gpus_per_node, system.gpus_per_node,
                               (link_profile(system.gpu_link).bandwidth_gbytes_per_s, 150.0),
                               system.uplink_gbytes_per_s_per_node, 600.0, 250.0)
    assert topo.gpus == system.nodes_max * system.gpus_per_node
    if system.spine_link.startswith("ib"):  # one NIC per GPU: each rail's link is one NIC at the IB line rate
        assert system.uplinks_per_node == system.gpus_per_node
        assert system.uplink_gbytes_per_s_each == spine.bandwidth_gbytes_per_s
        assert not system.in_network_reduction


def test_the_nvlink_switch_system_numbers_agree_with_each_other():
    nv = SYSTEMS["superpod-h100-nvlink"]
    nvlink4 = PROFILES["nvlink4"]
    assert 72 * 25.0 == nv.uplink_gbytes_per_s_per_node == 1800.0
    assert 18 * 25.0 == nvlink4.bandwidth_gbytes_per_s  # 18 NVLink4 ports a GPU
    assert nv.taper == 2.0  # 8 x 450 GB/s inside against 1.8 TB/s out
    assert nv.nodes_max * nv.uplink_gbytes_per_s_per_node == 57_600.0  # NVIDIA's 57.6 TB/s all-to-all
    assert 460.8e12 / 8 == 57.6e12  # Hot Chips 34's 460.8 Tb/s bisection is the same figure in bits
    assert nv.in_network_reduction and nv.mode == "network"
    # 9x the bisection of HDR InfiniBand on Ampere: 256 A100s with one 25 GB/s HDR link each
    a100 = SYSTEMS["superpod-a100-ib"]
    hdr = a100.nodes_max * a100.uplink_gbytes_per_s_per_node
    assert hdr == 256 * 25.0 and 57_600.0 / hdr == 9.0
    assert a100.mode == "classic" and a100.gpu_link == "nvlink3"
    assert SYSTEMS["superpod-h100-ib"].uplink_gbytes_per_s_per_node == 8 * 400 / 8  # 8 NICs x 400 Gb/s


def test_unknown_system_names_the_known_ones():
    with pytest.raises(ConfigError, match="superpod-h100-nvlink"):
        system_profile("superpod-x")


def test_sharp_link_bytes_of_one_node_is_a_clear_error_not_a_division_by_zero():
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.errors import FabricError
    config = preset("dgx-h100", gpus=4)
    with pytest.raises(FabricError, match="sharp across nodes needs spines"):
        cn.link_bytes("allreduce", "sharp", config.topology, 1 << 20, config=config)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("shape", [(2, 2), (3, 2), (2, 4)])
def test_ring_traffic_across_nodes_is_the_sum_of_its_rounds(collective, shape):
    # traffic of ring across nodes sums its plan's sends (plan_traffic) without walking its rounds: the same sends
    config = preset("superpod-h100-ib", nodes=shape[0], gpus=shape[0] * shape[1])
    for S in (0, 4 * 1021, 3 << 20):
        rounds = cn.rounds(collective, "ring", config.topology, S)
        total = sum(rounds, np.zeros((config.gpus, config.gpus), np.int64))
        traffic = cn.traffic(collective, "ring", config.topology, S)
        assert traffic.dtype == np.int64 and (traffic == total).all()
    with pytest.raises(FabricError):  # S is checked as rounds checks it
        cn.traffic(collective, "ring", config.topology, 6, itemsize=4)
