"""fabric.tuner.fastest_across_nodes' pruning: occupancy_bound_ns (and fabric.replay.nvls_lower_bound_ns) never
exceeds the replay, and the pick is the one replaying every candidate gives (`exhaustive` below: the
definition the pruning must keep), on several shapes, presets and sizes, hier (node rings, all its rounds) and hier_nvls
(its node stages in the leaf: its GPU links' raw bytes) among them; the pruning does skip replays."""

import math

import pytest

from nvlink_emu.fabric import tuner
from nvlink_emu.fabric import cost_nodes as cn, hier_plan, replay
from nvlink_emu.fabric.config import resolve
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.software import call_latency_ns
from nvlink_emu.ranks.collectives import ALGORITHMS, allowed, choose

PRESETS = ("superpod-h100-nvlink", "superpod-h100-ib", "superpod-a100-ib")
SHAPES = [(2, 2), (3, 2), (2, 4)]  # (nodes, GPUs per node)


def sizes(n):
    """Bytes of float32 calls on n GPUs: under one packet a block, a few chunks, uneven blocks, 1 MiB a GPU."""
    return (4 * n, 1024 * n, 4 * n * 3001 + 8, n << 20)


def pairs(config):
    """Every (collective, algorithm) the bound covers on `config`: FLAT's (hier_nvls where the leaves reduce),
    and nvls's load-reduce if its spines reduce."""
    out = [(c, a) for a, cs in cn.FLAT.items() for c in cs
           if a != "all2allv" and (a != "hier_nvls" or hier_plan.in_leaf(config))]
    return out + ([("allreduce", "nvls"), ("reduce_scatter", "nvls")] if config.spine_sharp else [])


def exhaustive(collective, candidates, S, config, itemsize=4):
    """fastest as it was: every covered candidate replayed (unmemoised) plus its software latency, the least
    time, ties to the earlier."""
    covered = [a for a in candidates if collective in cn.FLAT.get(a, ()) or collective in tuner.ACROSS_NODES.get(a, ())]
    if len(covered) == 1:
        return covered[0]
    best, best_ns = None, math.inf
    for algorithm in covered:
        ns = (replay.replay_ns(collective, algorithm, config.topology, S, config, itemsize)
              + call_latency_ns(collective, algorithm, config.gpus, config.nodes, S, config))
        if ns < best_ns:
            best, best_ns = algorithm, ns
    return best


def candidates(config, collective):
    return [a for a in allowed(config, config.nodes, collective) if hasattr(ALGORITHMS[a], collective)]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("nodes,per_node", SHAPES)
def test_the_occupancy_bound_never_exceeds_the_replay(name, nodes, per_node):
    config = resolve(name, None, None, nodes, per_node)
    topo, n = config.topology, config.gpus
    for collective, algorithm in pairs(config):
        for S in sizes(n):
            if collective == "all2all" and S % (4 * n):
                continue
            bound = cn.occupancy_bound_ns(collective, algorithm, topo, S, config)
            ns = replay.replay_ns(collective, algorithm, topo, S, config)
            assert 0 < bound <= ns, (collective, algorithm, S, bound, ns)
            floor = cn.point_to_point_floor_ns(collective, algorithm, topo, S)
            assert floor <= ns, (collective, algorithm, S, floor, ns)
            assert (floor > 0) == (algorithm in cn.POINT_TO_POINT and collective != "all2all"), (collective, algorithm)


@pytest.mark.parametrize("nodes,per_node", SHAPES)
def test_the_plan_free_floor_is_ring_s_busiest_uplink(nodes, per_node):
    """The floor is tight: ring's channels send exactly k (n - 1)/n S from every GPU (S whole blocks), which
    the floor says no point-to-point algorithm can beat; for an S that is not, it stays below ring's."""
    config = resolve("superpod-h100-nvlink", None, None, nodes, per_node)
    topo, n = config.topology, config.gpus
    B = topo.gpu_gbytes_per_s
    for collective in cn.FLAT["ring"]:
        for S in (n * 4 * 1024, n * 4 * 3001 + 8):
            sent = cn.traffic(collective, "ring", topo, S).sum(axis=1).max()
            floor = cn.point_to_point_floor_ns(collective, "ring", topo, S)
            if S % (4 * n) == 0:
                assert floor == pytest.approx(sent / B, rel=1e-12), (collective, S)
            assert floor <= sent / B * (1 + 1e-12), (collective, S)


def test_a_point_to_point_plan_is_not_built_when_its_floor_exceeds_the_best_time(monkeypatch):
    """superpod-h100-nvlink-line 2 x 4, allreduce of 16 MiB a GPU: sharp's replay (51.1 us) beats every
    point-to-point algorithm's floor (65.2 us: 2 x 7/8 x 16 MiB at 450 GB/s), so ring, direct, hier and tree
    are skipped without their occupancy bounds (their plans built and walked); the pick is the exhaustive one."""
    config = resolve("superpod-h100-nvlink-line", None, None, 2, 4)
    S = 16 << 20
    names = candidates(config, "allreduce")
    assert exhaustive("allreduce", names, S, config) == "sharp"
    bounded = []
    real = cn.occupancy_bound_ns
    monkeypatch.setattr(cn, "occupancy_bound_ns", lambda c, algorithm, *args: bounded.append(algorithm) or real(c, algorithm, *args))
    assert tuner.fastest_across_nodes("allreduce", names, S, config) == "sharp"
    assert set(cn.POINT_TO_POINT) & set(names) and not set(cn.POINT_TO_POINT) & set(bounded), bounded


@pytest.mark.parametrize("name", ("superpod-h100-ib", "superpod-h100-nvlink"))
@pytest.mark.parametrize("nodes,per_node", [(2, 8), (4, 2)])
def test_the_hier_bounds_never_exceed_their_replays_in_many_slices(name, nodes, per_node):
    """Sizes whose ranges run in several slices (hier_nvls: as the leaf's share bounds them), float32 and
    float16; each bound at least its GPU links' payload over B (hier_leaf_link_bytes' closed forms)."""
    config = resolve(name, None, None, nodes, per_node)
    topo, n, G = config.topology, config.gpus, per_node
    B = topo.gpu_gbytes_per_s
    for itemsize in (4, 2):
        for S in (n * itemsize * 70001, 16 << 20):
            for collective in cn.FLAT["hier"]:
                for algorithm in ("hier", "hier_nvls"):
                    bound = cn.occupancy_bound_ns(collective, algorithm, topo, S, config, itemsize)
                    ns = replay.replay_ns(collective, algorithm, topo, S, config, itemsize)
                    assert 0 < bound <= ns, (collective, algorithm, S, itemsize, bound, ns)
                    links = cn.link_bytes(collective, algorithm, topo, S, itemsize, config=config)
                    most = max(b for k, b in links.items() if k.startswith("gpu"))
                    assert bound >= most / B, (collective, algorithm, S)
            if S == 16 << 20 and itemsize == 4:  # allreduce in the leaf: S + S/G + 2(N-1)/(NG) S up, over B at least
                assert cn.occupancy_bound_ns("allreduce", "hier_nvls", topo, S, config) >= \
                    (S + S // G + 2 * (nodes - 1) * S // n) / B


def test_the_nvls_bound_by_hand():
    """2 x 2 on superpod-h100-nvlink, 4 elements of float32 a call: one 4-byte chunk (raw 20) for GPU 0's block."""
    config = resolve("superpod-h100-nvlink", None, None, 2, 2)
    t, topo = config.timing, config.topology
    B, a, s, u, p = topo.gpu_gbytes_per_s, topo.gpu_latency_ns, t.switch_latency_ns, config.uplink_latency_ns, \
        t.reduction_latency_ns
    h, r = 16, 4 + 16  # a header-only packet; one float32 in one packet
    t_r = 2 * h / B + 3 * a + 4 * s + 2 * p + 2 * u
    t_s = t_r + r / B + 2 * a + s
    want = max(t_s + 4 * r / B + a,                   # every member's one store
               h / B + a + s + (4 * h + r + 4 * r) / B + a)  # or all of the downlink from the first request
    assert replay.nvls_lower_bound_ns("allreduce", topo, 4, config) == want
    assert replay.nvls_lower_bound_ns("allreduce", topo, 0, config) == 0.0 == replay.replay_ns("allreduce", "nvls", topo, 0, config)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("nodes,per_node", SHAPES)
def test_fastest_picks_what_replaying_every_candidate_picks(name, nodes, per_node):
    config = resolve(name, None, None, nodes, per_node)
    n = config.gpus
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
        for S in sizes(n):
            want = exhaustive(collective, candidates(config, collective), S, config)
            assert tuner.fastest_across_nodes(collective, candidates(config, collective), S, config) == want, (collective, S)
            assert choose(collective, "auto", config, S) == want, (collective, S)


def test_a_tie_goes_to_the_earlier_candidate_whatever_the_order_of_the_bounds(monkeypatch):
    """Two candidates of equal time: the earlier one wins even when the later one's bound is less (links
    alone: the line-rate twin has no software latency to add to the bounds)."""
    config = resolve("superpod-h100-ib-line", None, None, 2, 2)
    S = 4 * 1024
    monkeypatch.setattr(cn, "modeled_ns", lambda *args, **kw: 1000.0)
    monkeypatch.setattr(cn, "occupancy_bound_ns", lambda c, algorithm, *args, **kw: {"ring": 900.0}.get(algorithm, 10.0))
    assert tuner.fastest_across_nodes("allreduce", ["ring", "direct", "hier"], S, config) == "ring"


def test_the_pruning_skips_replays(monkeypatch):
    """superpod-h100-nvlink 2 x 2 allreduce of 4 KiB a GPU: sharp (no bound) is replayed first, nvls (its
    bound 2.7 us, sharp's time 1.6) is not; the pick is sharp as without the pruning (links alone: the
    line-rate twin; with NCCL's software latency direct wins there, by 25 us of NVLS's)."""
    config = resolve("superpod-h100-nvlink-line", None, None, 2, 2)
    S = 4 * 4096
    names = candidates(config, "allreduce")
    assert exhaustive("allreduce", names, S, config) == "sharp"
    replayed = []
    real = replay.replay_ns
    monkeypatch.setattr(replay, "replay_ns", lambda c, algorithm, *args: replayed.append(algorithm) or real(c, algorithm, *args))
    cn._MODELED.clear()
    assert tuner.fastest_across_nodes("allreduce", names, S, config) == "sharp"
    sharp_ns = real("allreduce", "sharp", config.topology, S, config)
    skipped = [a for a in names if a not in replayed]
    assert "nvls" in skipped and replayed[0] == "sharp", replayed
    for algorithm in skipped:
        assert cn.occupancy_bound_ns("allreduce", algorithm, config.topology, S, config) > sharp_ns


def test_auto_weighs_hier_against_hier_nvls_as_replaying_both_does():
    """superpod-h100-ib-line 2 x 4 GPUs (line-rate NVLink): the leaf's stages win at 256 KiB and 16 MiB, the node rings at 3 MiB
    (hier_nvls 29.945 us, hier 29.295; at 2 MiB hier won, 26.369 against 26.744, until the IB spine took its
    own 130 ns switch latency: then the ring, 26.004, edged out hier, 26.129; at 4 MiB hier won, 39.387 against
    41.237, until a transfer from another node crossed the downlink as one burst); the pruned pick is the
    exhaustive one at each."""
    config = resolve("superpod-h100-ib-line", None, None, 2, 4)
    names = candidates(config, "allreduce")
    assert names.index("hier") + 1 == names.index("hier_nvls")  # the tie order: right after hier
    picks = []
    for S in (256 << 10, 3 << 20, 16 << 20):
        want = exhaustive("allreduce", names, S, config)
        assert tuner.fastest_across_nodes("allreduce", names, S, config) == want == choose("allreduce", "auto", config, S), S
        picks.append(want)
    assert picks == ["hier_nvls", "hier", "hier_nvls"]


def test_a_size_of_part_elements_is_refused_before_any_bound():
    """S not whole elements: a FabricError naming S, whichever candidates' bounds would be computed (the
    floor spares hier's, which used to be the one to refuse it)."""
    config = resolve("superpod-h100-nvlink", None, None, 2, 2)
    with pytest.raises(FabricError, match="multiple of itemsize 4 bytes, got 16001"):
        tuner.fastest_across_nodes("broadcast", candidates(config, "broadcast"), 16001, config)
