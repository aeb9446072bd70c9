"""Today's systems as presets (issue 28 part 5): GB200 NVL72 and DGX GH200, their published figures agreeing
with each other and with the presets built from them."""

import pytest

from nvlink_emu.fabric import cost, cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.profiles import (NVL72_CHIPS_PER_TRAY, NVL72_GPUS, NVL72_LINKS_PER_GPU, NVL72_SOURCES,
                                        NVL72_SWITCH_TRAYS, PROFILES, SYSTEMS)


def test_gb200_nvl72_is_one_nvlink5_domain_of_72_gpus():
    calibrated, config = preset("gb200-nvl72"), preset("gb200-nvl72-line")
    assert (calibrated.gpus, calibrated.nodes, calibrated.mode, calibrated.sharp, calibrated.link) == (
        72, 1, "network", True, "nvlink5-nccl")  # as dgx-b200: NVLink5 as NCCL measures it
    assert (config.gpus, config.nodes, config.mode, config.sharp, config.link) == (72, 1, "network", True, "nvlink5")
    assert NVL72_GPUS == 18 * 4  # 18 compute trays of 2 GB200 superchips (2 GPUs each)
    assert NVL72_SWITCH_TRAYS * NVL72_CHIPS_PER_TRAY == NVL72_LINKS_PER_GPU == 18  # a link to each switch chip
    assert NVL72_LINKS_PER_GPU * 50.0 == config.timing.bandwidth_gbytes_per_s == 900.0  # 1.8 TB/s both ways
    assert NVL72_GPUS * 2 * config.timing.bandwidth_gbytes_per_s / 1e3 == pytest.approx(130, rel=0.01)  # 129.6 TB/s
    assert all(source.startswith('"') and "https://" in source for _, source in NVL72_SOURCES)
    assert preset("gb200-nvl72", gpus=8).gpus == 8  # what the emulator runs on this machine


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb200-nvl72-line"])
def test_gb200_nvl72_models_at_full_size(name):
    """72 GPUs, 1 GiB: sharp moves S each way on every link (one send, one result) and S of results out of
    the reduction engine; busbw approaches 2(n-1)/n of the slower of the link's payload rate and the
    engine's, x 256/272 GB/s, as on every one-switch preset (line rate: the link's 900; calibrated: the
    engine's 513, nvlink5-nccl)."""
    config, S = preset(name), 1 << 30
    t = config.timing
    assert cost.payload_bytes("allreduce", "sharp", S, 72) == (S, S)
    ring = cost.modeled_ns("allreduce", "ring", S, 72, config)
    sharp = cost.modeled_ns("allreduce", "sharp", S, 72, config)
    assert sharp < ring
    rate = min(t.bandwidth_gbytes_per_s, t.reduction_gbytes_per_s)
    links = S / cost.links_ns("allreduce", "sharp", S, 72, config) * 2 * 71 / 72  # busbw of the links' time
    assert links == pytest.approx(2 * 71 / 72 * rate * 256 / 272, rel=0.01)


def test_dgx_gh200_numbers_agree_with_each_other():
    gh, nvlink4 = SYSTEMS["dgx-gh200"], PROFILES["nvlink4"]
    assert gh.nodes_max * gh.gpus_per_node == 256
    assert gh.uplinks_per_node == gh.gpus_per_node * 18  # every NVLink4 port of the node's GPUs goes up
    assert gh.uplinks_per_node * gh.uplink_gbytes_per_s_each == gh.uplink_gbytes_per_s_per_node == 3600.0
    assert gh.taper == 1.0  # non-blocking, against superpod-h100-nvlink's 2:1
    assert SYSTEMS["superpod-h100-nvlink"].taper == 2.0
    gpus = gh.nodes_max * gh.gpus_per_node
    assert gpus * nvlink4.bandwidth_gbytes_per_s == 115_200.0  # the whitepaper's 115.2 TB/s aggregate
    assert gpus // 2 * nvlink4.bandwidth_gbytes_per_s == 57_600.0  # the 57.6 TB/s all-to-all: the bisection
    assert gh.in_network_reduction and gh.mode == "network" and gh.gpu_link == "nvlink4"


def test_dgx_gh200_preset_full_size_and_against_the_projected_superpod():
    config = preset("dgx-gh200", nodes=32, gpus=256)
    assert (config.nodes, config.gpus_per_node, config.spines, config.spine_sharp) == (32, 8, 8, True)
    assert config.topology.share_gbytes_per_s == 393.0  # a GPU's whole link (nvlink4-nccl): no taper
    assert preset("dgx-gh200-line", nodes=32, gpus=256).topology.share_gbytes_per_s == 450.0  # at line rate
    # 72 of the node's 144 links: half a GPU's, calibrated (72 x 393/18 / 8) and at line rate (72 x 25 / 8)
    assert preset("superpod-h100-nvlink", nodes=32, gpus=256).topology.share_gbytes_per_s == 196.5
    assert preset("superpod-h100-nvlink-line", nodes=32, gpus=256).topology.share_gbytes_per_s == 225.0
    # an All2All across 4 nodes: the tapered superpod is bound by its shares of the nodes' uplinks (24 remote
    # blocks at 196.5 GB/s; 225 at line rate), the GH200 by a GPU's downlink (31 blocks at 393; 450): 48/31 = 1.55 times as fast
    # without the taper, each at its occupancy bound (before direct's Latin-square order, 2.0: the superpod's
    # inbound shares idled, 1.29x its bound)
    S = 64 << 20
    times = {}
    for name in ("dgx-gh200", "superpod-h100-nvlink"):
        config = preset(name, nodes=4, gpus=32)
        times[name] = cost_nodes.links_ns("all2all", "direct", config.topology, S, config)
        assert times[name] < 1.01 * cost_nodes.occupancy_bound_ns("all2all", "direct", config.topology, S, config)
    assert times["superpod-h100-nvlink"] / times["dgx-gh200"] == pytest.approx(48 / 31, rel=0.01)


@pytest.mark.parametrize("name", ["superpod-h100-nvlink", "superpod-h100-ib", "superpod-a100-ib", "dgx-gh200"])
def test_the_multi_node_presets_are_calibrated_and_their_line_twins_at_line_rate(name):
    """Issue 28 part 3: NVLink inside a node is the generation's calibrated profile (as on dgx-h100 / dgx-a100);
    an NVLink uplink carries its links at the calibrated per-link rate, an InfiniBand one stays at the NIC's line
    rate; NAME-line keeps the published line rates, and no software latency."""
    system, calibrated, line = SYSTEMS[name], preset(name), preset(name + "-line")
    assert (line.link, calibrated.link) == (system.gpu_link, system.gpu_link + "-nccl")
    per_gpu = system.uplink_gbytes_per_s_per_node / system.gpus_per_node
    assert line.uplink_gbytes_per_s_per_gpu == per_gpu
    if system.spine_link.startswith("nvlink"):
        scale = PROFILES[calibrated.link].bandwidth_gbytes_per_s / PROFILES[system.gpu_link].bandwidth_gbytes_per_s
        assert calibrated.uplink_gbytes_per_s_per_gpu == pytest.approx(per_gpu * scale)
    else:
        assert calibrated.uplink_gbytes_per_s_per_gpu == per_gpu
    assert calibrated.uplink_latency_ns == line.uplink_latency_ns == PROFILES[system.spine_link].link_latency_ns
    assert (calibrated.software, line.software) == ("nccl", "none")  # NCCL's latency on top of the calibrated links
    # a spine is its own link profile's switch (IB 130 ns, NVLink 250 ns), a leaf the node link's
    spine = PROFILES[system.spine_link].switch_latency_ns
    assert calibrated.topology.spine_latency_ns == line.topology.spine_latency_ns == spine
    assert calibrated.spine_switch_latency_ns == line.spine_switch_latency_ns == (None if spine == 250.0 else spine)
    assert [sw.latency_ns for sw in calibrated.topology.switches] == [250.0] * 2 + [spine] * calibrated.spines
    same = {k: v for k, v in vars(calibrated).items()
            if k not in ("name", "link", "uplink_gbytes_per_s_per_gpu", "software") and not k.startswith("_")}
    assert same == {k: v for k, v in vars(line).items() if k in same}  # nothing else differs

