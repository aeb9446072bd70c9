"""fabric.cost_nodes for `pxn` (ranks/collectives/pxn.py), NCCL's rail-aligned All2All: its two rounds
on 2 nodes x 4 GPUs by hand, bytes per level in closed form, every block leaving a node on its
destination's rail, one node is `direct`."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes as cn
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.topology import Topology

B = 1024


def topo(nodes=2, per_node=4, spines=1):
    return Topology.multi_node(nodes=nodes, gpus_per_node=per_node, spines=spines, gpu_link=(450.0, 150.0),
                               uplink_gbytes_per_s_per_node=1800.0, uplink_latency_ns=200.0, switch_latency_ns=250.0)


def test_two_rounds_on_two_by_four_by_hand():
    first, second = cn.rounds("all2all", "pxn", topo(), 8 * B)
    # GPU 1 (node 0, local 1): its node peers 0, 2, 3 and GPU 5 (its rail) straight; its blocks for 4, 6, 7
    # to its proxies 0, 2, 3 (their rails), with each proxy's own block
    assert first[1].tolist() == [2 * B, 0, 2 * B, 2 * B, 0, B, 0, 0]
    # round 2: GPU 1 forwards the blocks of GPUs 0, 2, 3 for GPU 5
    assert second[1].tolist() == [0, 0, 0, 0, 0, 3 * B, 0, 0]
    assert (first + second)[1].sum() == 7 * B + 3 * B
    # what GPU 1 takes in: its node peers' own blocks and, as their proxy, their blocks for 5: 2 B each
    assert first[:, 1].tolist() == [2 * B, 0, 2 * B, 2 * B, 0, B, 0, 0]


@pytest.mark.parametrize("nodes, per_node, spines", [(2, 2, 1), (3, 2, 2), (2, 4, 2), (4, 8, 2), (3, 4, 3)])
def test_bytes_per_level_are_the_closed_forms(nodes, per_node, spines):
    t = topo(nodes, per_node, spines)
    n, N, G = nodes * per_node, nodes, per_node
    S = n * 3 * 4096  # each GPU's send buffer: n blocks of s bytes
    s = S // n
    got = cn.link_bytes("all2all", "pxn", t, S)
    direct = cn.link_bytes("all2all", "direct", t, S)
    rails = [sum(1 for j in range(G) if j % spines == i) for i in range(spines)]
    for link in t.links:
        if link.level == "gpu-leaf":
            assert got[link.name] == (n - 1) * s + (N - 1) * (G - 1) * s, link.name
        else:
            i = int((link.dst if link.direction == "up" else link.src)[2:]) - nodes
            assert got[link.name] == direct[link.name] == rails[i] * (N - 1) * S // N, link.name


def test_every_block_leaves_its_node_on_the_destination_s_rail():
    t = topo(3, 4, 2)
    for k, matrix in enumerate(cn.rounds("all2all", "pxn", t, 12 * 4 * 5)):
        for i in range(12):
            for d in range(12):
                if i // 4 != d // 4 and matrix[i, d]:
                    assert i % 4 == d % 4, (k, i, d)


@pytest.mark.parametrize("gpus", [2, 8])
def test_one_node_is_direct(gpus):
    config = preset("dgx-h100-line", gpus=gpus)
    t = Topology.single(config)
    S = gpus * 4096
    ours, direct = cn.rounds("all2all", "pxn", t, S), cn.rounds("all2all", "direct", t, S)
    assert len(ours) == len(direct) == 1 and np.array_equal(ours[0], direct[0])
    assert cn.links_ns("all2all", "pxn", t, S, config) == cn.links_ns("all2all", "direct", t, S, config)


def test_the_extra_hop_costs_latency_and_its_bytes():
    # exact times (fabric.replay): small, pxn's extra NVLink hop is slower; large, direct's Latin-square
    # order keeps every inbound share busy (fabric.plans.registry._all2all_order), so pxn's proxies spread
    # nothing more and its extra NVLink bytes cost (before that order pxn took 0.7 of direct's time at 8 MiB)
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=2)
    t = config.topology
    times = {S: {a: cn.links_ns("all2all", a, t, S, config) for a in ("pxn", "direct")} for S in (8 * 1024, 8 << 20)}
    assert times[8 * 1024]["direct"] < times[8 * 1024]["pxn"]
    assert times[8 << 20]["direct"] < times[8 << 20]["pxn"]
    assert times[8 << 20]["direct"] < 1.1 * cn.occupancy_bound_ns("all2all", "direct", t, 8 << 20, config)
    for S, row in times.items():
        assert cn.lower_bound_ns("all2all", "pxn", t, S, config) <= row["pxn"]
