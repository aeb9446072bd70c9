"""fabric.replay: the schedules of ring, direct and all2all replayed on one process's link clocks, against
the one-node closed forms (fabric.cost) and hand-computed multi-node times; errors. The MPI tier checks
them against emulated runs (tests/nodes/test_replay.py)."""

import math

import pytest

from nvlink_emu.fabric import cost, replay
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.topology import Topology

CASES = [(c, a) for a in ("ring", "direct") for c in cost.IMPLEMENTS[a]]  # fabric.cost's one-node forms


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100", "dgx-h100-line"])
@pytest.mark.parametrize("gpus", [3, 8])
def test_one_node_equals_the_closed_forms(name, gpus):
    config = preset(name, gpus=gpus)
    topo = Topology.single(config)
    for collective, algorithm in CASES:
        for size in (gpus * 1024, gpus << 20, gpus * 3 << 20):  # one chunk, several, uneven last ones
            got = replay.replay_ns(collective, algorithm, topo, size, config)
            want = cost.links_ns(collective, algorithm, size, gpus, config)
            assert math.isclose(got, want, rel_tol=1e-12), (collective, algorithm, size, got, want)


@pytest.mark.parametrize("gpus", [3, 8])
def test_on_one_node_hier_is_the_ring_and_pxn_is_direct(gpus):
    config = preset("dgx-h100", gpus=gpus)
    topo = Topology.single(config)
    for size in (gpus * 1024, gpus * 3 << 20):
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            for algorithm in ("hier", "hier_nvls"):  # hier_nvls runs hier's node ring on one node
                assert replay.replay_ns(collective, algorithm, topo, size, config) == pytest.approx(
                    replay.replay_ns(collective, "ring", topo, size, config), rel=1e-12)
        assert replay.replay_ns("all2all", "pxn", topo, size, config) == pytest.approx(
            replay.replay_ns("all2all", "direct", topo, size, config), rel=1e-12)


def test_a_node_major_ring_of_small_blocks_crosses_nodes_as_often_as_its_window_allows():
    # 4 KiB: one ring channel (fabric.reduction.ring_channel_count), the node-major ring.
    # superpod-h100-ib, 2 nodes x 4: a block of 512 B within a node takes d_in = 2a + s + R/450, across nodes
    # d_out = 2a + 2s + s' + 2u + R/50 (a NIC each way; s' = 130 ns, the IB spine's own); each of the 14 steps waits for the previous one's block,
    # so the slowest chain of 14 hops around the 8-GPU ring, 4 of them crossings, sets the time
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=1)
    raw = raw_bytes(512, config.mtu_bytes, config.header_bytes)
    d_in = 2 * 150 + 250 + raw / 450
    d_out = 2 * 150 + 2 * 250 + 130 + 2 * 600 + raw / 50
    got = replay.replay_ns("allreduce", "ring", config.topology, 4096, config)
    assert got == pytest.approx(4 * d_out + 10 * d_in + raw / 450, rel=1e-3)  # + the last downlink's turn


def test_the_rings_of_the_rails_run_as_independent_channels():
    # 128 KiB: 4 channels, ranges of 4 KiB, each with its own clock and its own lane of every GPU's uplink and
    # downlink at B / 4 (docs/model/time.md, "Channels"): a channel's step waits for its own receive only, so,
    # as for the one ring above, the slowest chain of 14 hops along one ring, 4 of them crossings, sets the
    # time: d_out = 2a + 2s + s' + 2u + R/50 (a NIC each way, slower than the lane; s' the IB spine's 130 ns), d_in = 2a + s + R/(B/4). Before
    # the lanes, one program per GPU ran its channels in step, every GPU entered one channel's ring, and each
    # of the 14 steps waited for a crossing: at least 14 d_out (31.0 us, against 14.8 now)
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=1)
    raw = raw_bytes(4096, config.mtu_bytes, config.header_bytes)
    lane = config.topology.gpu_gbytes_per_s / 4
    d_in = 2 * 150 + 250 + raw / lane
    d_out = 2 * 150 + 2 * 250 + 130 + 2 * 600 + raw / 50
    got = replay.replay_ns("allreduce", "ring", config.topology, 128 << 10, config)
    assert got == pytest.approx(4 * d_out + 10 * d_in, rel=1e-12)
    assert got < 14 * d_out / 2


def test_every_gpu_s_inbound_share_takes_one_remote_block_a_step():
    # All2All of 1 MiB on 2 x 4: at each of direct's remote steps every GPU of node 1 sends to a different
    # GPU of node 0 (a Latin square, fabric.plans.registry._all2all_order), so each inbound share takes its
    # four remote blocks one after another from the first step on: 4 blocks' time plus latencies. In the old
    # order (r + 1, r + 2, ...) all four senders started with GPU 0, and GPU 3 got its four blocks 3 blocks'
    # time late: 7 blocks (19.5 us against 13.4)
    config = preset("superpod-h100-ib", nodes=2, gpus=8, spines=1)
    block = raw_bytes(1 << 17, config.mtu_bytes, config.header_bytes) / 50  # 128 KiB at a NIC's 50 GB/s
    got = replay.replay_ns("all2all", "direct", config.topology, 1 << 20, config)
    assert 4 * block < got < 4 * block + 3000  # the shares busy from the first step, plus latencies
    assert replay.replay_ns("all2all", "direct", config.topology, 1 << 20, config) == got  # deterministic


def test_all2allv_takes_its_counts():
    config = preset("superpod-h100-nvlink", nodes=2, gpus=4, spines=1)
    zero = [[0] * 4 for _ in range(4)]
    assert replay.replay_ns("all2allv", "all2allv", config.topology, 0, config, counts=zero) == 0.0
    one = [row[:] for row in zero]
    one[0][3] = 4096  # GPU 0 -> GPU 3, another node: the route's unloaded time
    raw = raw_bytes(4096, config.mtu_bytes, config.header_bytes)
    assert replay.replay_ns("all2allv", "all2allv", config.topology, 0, config, counts=one) == pytest.approx(
        config.topology.unloaded_ns(0, 3, raw), rel=1e-12)


def test_unknown_schedules_are_refused():
    config = preset("superpod-h100-nvlink", nodes=2, gpus=4, spines=1)
    with pytest.raises(FabricError, match="no schedule for allgather with 'tree'"):
        replay.replay_ns("allgather", "tree", config.topology, 4096, config)
    with pytest.raises(FabricError, match="takes a Topology"):
        replay.replay_ns("allreduce", "ring", config, 4096, config)
