"""The double binary tree of `tree` (fabric.reduction.btree, dtree, tree_parts) against NCCL's own drawings
(NVIDIA/nccl src/graph/trees.cc), and its exact bytes per link (fabric.cost_nodes) by hand on 2 nodes x 4."""

import math

import pytest

from nvlink_emu.fabric import tuner
from nvlink_emu.fabric import cost_nodes as cn, replay
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.reduction import dtree, tree_parts
from nvlink_emu.fabric.topology import Topology


def edges(nranks, tree):
    """{child: parent} of tree `tree` (0, 1) of dtree, checked against each parent's children."""
    up = {}
    for r in range(nranks):
        parent, d0, d1 = dtree(nranks, r)[tree]
        if parent != -1:
            up[r] = parent
            assert r in dtree(nranks, parent)[tree][1:], (r, parent)
        for d in (d0, d1):
            if d != -1:
                assert dtree(nranks, d)[tree][0] == r
    return up


def test_the_two_trees_are_nccl_s_drawings():
    # trees.cc, 14 ranks: 0-8, 8-4, 8-12, 4-2, 4-6, 12-10, 12-13, 2-1, 2-3, 6-5, 6-7, 10-9, 10-11
    assert edges(14, 0) == {8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 13: 12, 1: 2, 3: 2, 5: 6, 7: 6, 9: 10, 11: 10}
    # 12 ranks, the mirror: 3-11, 3-1, 3-7, 1-0, 1-2, 7-5, 7-9, 5-4, 5-6, 9-8, 9-10
    assert edges(12, 1) == {3: 11, 1: 3, 7: 3, 0: 1, 2: 1, 5: 7, 9: 7, 4: 5, 6: 5, 8: 9, 10: 9}
    # 13 ranks, shifted by one: 1-9, 9-5, 9-0, 5-3, 5-7, 0-11, 3-2, 3-4, 7-6, 7-8, 11-10, 11-12
    assert edges(13, 1) == {9: 1, 5: 9, 0: 9, 3: 5, 7: 5, 11: 0, 2: 3, 4: 3, 6: 7, 8: 7, 10: 11, 12: 11}
    assert edges(2, 0) == {1: 0} and edges(2, 1) == {0: 1} and edges(1, 0) == {} == edges(1, 1)


@pytest.mark.parametrize("nodes,per_node", [(1, 3), (2, 4), (3, 2), (5, 1), (12, 2)])
def test_every_position_is_in_both_trees_once_with_the_head_talking_to_the_nodes(nodes, per_node):
    for t, part in enumerate(tree_parts(nodes, per_node)):
        assert set(part) == {(a, j) for a in range(nodes) for j in range(per_node)}
        roots = [at for at, (parent, _) in part.items() if parent is None]
        head = t * (per_node - 1)
        root_node = [a for a in range(nodes) if dtree(nodes, a)[t][0] == -1]
        assert roots == [(root_node[0], head)]
        for (a, j), (parent, children) in part.items():
            for child in children:
                assert part[child][0] == (a, j)
            if parent is not None and parent[0] != a:  # between nodes only head to head, on the head's rail
                assert j == parent[1] == head
        # the chain: tree 0 runs 0 -> G-1, tree 1 G-1 -> 0
        for a in range(nodes):
            for j in range(per_node):
                nxt = j + 1 if t == 0 else j - 1
                children = part[(a, j)][1]
                assert (children[:1] == [(a, nxt)]) == (0 <= nxt < per_node)


@pytest.mark.parametrize("spines", [1, 2])
def test_tree_bytes_on_two_nodes_by_hand(spines):
    topo = Topology.multi_node(nodes=2, gpus_per_node=4, spines=spines, gpu_link=(450.0, 150.0),
                               uplink_gbytes_per_s_per_node=1800.0, uplink_latency_ns=200.0, switch_latency_ns=250.0)
    S, P = 8192, 4096  # a half per tree
    got = cn.link_bytes("allreduce", "tree", topo, S)
    # tree 0: chain 0, 1, 2, 3 (head 0: the nodes' link and GPU 1; 1, 2: parent and child; 3: parent only);
    # tree 1 the mirror, 3, 2, 1, 0: each way GPU 0 3P, 1 4P, 2 4P, 3 3P in both nodes
    for g in range(8):
        leaf = f"sw{g // 4}"
        assert got[f"gpu{g}->{leaf}"] == got[f"{leaf}->gpu{g}"] == (3, 4, 4, 3)[g % 4] * P, g
    # P each way between the nodes per tree: tree 0 on local 0's spine (sw2), tree 1 on local 3's (3 mod spines)
    spine_of = {0: "sw2", 1: "sw2" if spines == 1 else "sw3"}
    want = {}
    for t in (0, 1):
        for x, y in (("sw0", spine_of[t]), (spine_of[t], "sw1"), ("sw1", spine_of[t]), (spine_of[t], "sw0")):
            want[f"{x}->{y}"] = want.get(f"{x}->{y}", 0) + P
    assert {k: v for k, v in got.items() if "gpu" not in k and v} == want
    assert len(cn.rounds("allreduce", "tree", topo, S)) == 2


def test_tree_time_on_two_nodes_of_one_gpu_by_hand():
    # 2 nodes x 1 GPU, 4 KiB: halves of 2 KiB, tree 0 rooted at GPU 0, tree 1 at GPU 1. Each GPU sends the
    # half it is a leaf of up at step 0 (tree_steps: a leaf at once), folds the other's into its own half when
    # it lands and sends the result back: two crossings one after the other
    config = preset("superpod-h100-ib", nodes=2, gpus=2, spines=1)
    one = config.topology.unloaded_ns(0, 1, raw_bytes(2048, config.mtu_bytes, config.header_bytes))
    got = replay.replay_ns("allreduce", "tree", config.topology, 4096, config)
    assert math.isclose(got, 2 * one, rel_tol=1e-12), (got, one)


def test_auto_weighs_tree_and_the_rails_rings_by_their_replayed_times():
    from nvlink_emu.ranks import collectives
    cfg = preset("superpod-h100-ib", nodes=8, gpus=8, spines=1)  # 8 nodes x 1 GPU
    assert {"ring", "tree"} <= set(collectives.allowed(cfg, cfg.nodes))
    for S in (4096, 1 << 20):
        times = {a: cn.modeled_ns("allreduce", a, cfg.topology, S, cfg) for a in ("ring", "direct", "hier", "tree")}
        assert collectives.choose("allreduce", "auto", cfg, S) == min(times, key=times.get)
    # latency-bound, without the one-hop direct: the tree's depth of 3 nodes beats 14 ring steps
    assert tuner.fastest_across_nodes("allreduce", ["ring", "hier", "tree"], 4096, cfg) == "tree"
    assert tuner.fastest_across_nodes("allreduce", ["ring", "tree"], 16 << 20, cfg) == "ring"
