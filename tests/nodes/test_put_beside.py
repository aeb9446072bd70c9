"""Multi-rank, several nodes: a put posted while the GPU's own channelled collective still sends (a non-blocking
ring allreduce across nodes, 2 channels) takes a lane of its own on the GPU's uplink, at B / (C + 1), instead of
queueing behind the channels' last byte (fabric.timemodel.LinkEnd.post; docs/model/time.md, "A put beside a
collective"): the put returns once its own bytes left, long before the collective ends, and the collective's
modeled time is the replay's, untouched. Before this rule the put left after the collective's last byte."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.reduction import ring_channel_count

from nodes_helpers import config, run

pytestmark = pytest.mark.mpi(min_size=7)

BASE = "superpod-h100-ib-line"  # the links alone (no software latency): closed forms
COUNT = 1 << 18                 # float32: 1 MiB, 2 channels across nodes of 2 GPUs
PUT = 1 << 18                   # bytes GPU 0 puts into GPU 1 (its node) meanwhile: one chunk


def test_a_put_beside_a_channelled_collective_takes_a_lane_of_its_own():
    cfg = config(BASE)
    C = ring_channel_count(COUNT * 4, cfg.gpus_per_node)
    assert C == 2

    def main(gpu):
        window = gpu.alloc(PUT, "uint8")
        handles = gpu.world.allgather_object(gpu.export(window))
        gpu.world.barrier()  # every member starts at the latest clock, its links idle by then
        t0 = gpu.now_ns
        request = gpu.world.iallreduce(np.ones(COUNT, np.float32), algorithm="ring")
        put_ns = None
        if gpu.rank == 0:
            gpu.put(handles[1], np.full(PUT, 7, np.uint8))
            put_ns = gpu.now_ns - t0
            gpu.fence()
        request.wait()
        ends = gpu.world.allgather_object(request.end_ns - t0)
        seen = int(window[0]) if gpu.rank == 1 else None
        gpu.world.barrier()
        return put_ns, request.start_ns - t0, ends, seen

    result = run(main, BASE, timeout_s=120)
    if result.role != "gpu":
        return
    put_ns, start_ns, ends, seen = result.value
    assert start_ns == 0.0
    # the collective's time: the replay's, as if no put had been posted beside it
    assert max(ends) == pytest.approx(cost_nodes.modeled_ns("allreduce", "ring", cfg.topology, COUNT * 4, cfg),
                                      rel=1e-12)
    if result.rank == 0:
        # its own lane at B / (C + 1) from the GPU's clock: not behind the channels' last byte
        lane = cfg.topology.gpu_gbytes_per_s / (C + 1)
        assert put_ns == pytest.approx(raw_bytes(PUT, cfg.mtu_bytes, cfg.header_bytes) / lane, rel=1e-12)
        assert put_ns < ends[0] / 2
    if result.rank == 1:
        assert seen == 7
