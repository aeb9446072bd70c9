"""Multi-node: a down leaf-spine link (fabric.faults) is routed around over the other spine - the
detour's bytes on the links it actually used, its modeled cost (the node's uplink at half its capacity:
one more share time), data intact, the other pair's traffic unaffected; with no spine left the sender
gets LinkDown and nothing hangs. World size 8: 2 nodes x 2 GPUs, 2 spines (leaves sw0, sw1; spines
sw2, sw3; GPU 2 is reached over sw2 by the routing rule, GPU 3 over sw3)."""

import numpy as np
import pytest

from nvlink_emu.fabric.errors import LinkDown
from nvlink_emu.fabric.packets import raw_bytes

from nodes_helpers import config, run

pytestmark = pytest.mark.mpi(min_size=8)

S = 1 << 18  # bytes


def exchange(gpu):
    """GPU 0 sends S bytes to GPU 2, GPU 1 to GPU 3; returns (data right, this GPU's clock)."""
    comm = gpu.world
    ok = True
    data = np.arange(S // 4, dtype=np.float32) + comm.rank
    if comm.rank in (0, 1):
        comm.send(data, comm.rank + 2)
    else:
        got = np.empty(S // 4, np.float32)
        comm.recv(got, comm.rank - 2)
        ok = bool(np.array_equal(got, np.arange(S // 4, dtype=np.float32) + comm.rank - 2))
    return ok, gpu.now_ns


def test_a_down_spine_link_is_routed_around_and_costs_one_share_time_more():
    honest = run(exchange)
    faulted = run(exchange, faults=[{"link": "sw0<->sw2", "kind": "down"}])
    links, before = faulted.report["links"], honest.report["links"]
    assert before["sw0->sw2"]["payload_bytes"] == S and before["sw0->sw3"]["payload_bytes"] == S
    # GPU 0's S bytes went up to sw3 with GPU 1's, and down from sw3 to node 1
    assert links.get("sw0->sw2", {}).get("payload_bytes", 0) == 0
    assert links["sw0->sw3"]["payload_bytes"] == 2 * S
    assert links["sw3->sw1"]["payload_bytes"] == 2 * S
    assert links.get("sw2->sw1", {}).get("payload_bytes", 0) == 0
    assert links["sw0->sw2"]["state"] == "down"
    if faulted.role != "gpu":
        return
    ok, now = faulted.value
    assert ok
    share = config().topology.share_gbytes_per_s  # bytes per ns
    if faulted.rank in (2, 3):  # half of node 0's uplink is gone: each GPU's share takes twice as long
        extra = raw_bytes(S, config().mtu_bytes, config().header_bytes) / share
        assert now - honest.value[1] == pytest.approx(extra, rel=1e-9)


def test_no_spine_left_gives_the_sender_linkdown_and_the_others_run_on():
    def main(gpu):
        comm = gpu.world
        mine = np.full(1024, comm.rank, np.float32)
        got = np.empty_like(mine)
        peer = {0: 1, 1: 0, 2: 3, 3: 2}[comm.rank]  # node-local pairs: no spine needed
        caught = None
        if comm.rank == 0:
            comm.send(mine, 2)     # refused at its leaf: the refusal comes back, raised in the next wait
            comm.send(mine, peer)  # behind it on the same link, so GPU 1's answer comes after the refusal
            try:
                comm.recv(got, peer)
            except LinkDown as exc:  # raised from the wait, which GPU 1's answer may have ended already
                caught = str(exc)
        elif comm.rank == 1:
            comm.recv(got, peer)
            comm.send(mine, peer)
        else:
            comm.sendrecv(mine, peer, got, peer)
        if comm.rank in (1, 2, 3):
            assert np.array_equal(got, np.full(1024, peer, np.float32))
        return caught

    result = run(main, faults=[{"link": "sw0->sw2", "kind": "down"}, {"link": "sw0->sw3", "kind": "down"}],
                 timeout_s=20.0)
    if result.role == "gpu" and result.rank == 0:
        assert result.value is not None
        assert "GPU 0: MSG: no path from switch 0 to switch 1 at" in result.value
        assert "every spine's link is down (sw0->sw2 down since 0 ns, not coming back up)" in result.value
    assert result.report["links"].get("sw0->sw2", {}).get("payload_bytes", 0) == 0
    assert result.report["links"].get("sw0->sw3", {}).get("payload_bytes", 0) == 0


def test_in_switch_reduction_across_a_faulted_spine_link_is_refused_on_every_member_and_auto_avoids_it():
    def main(gpu):
        x = np.ones(4096, np.float32)
        try:
            gpu.world.allreduce(x, "sum", "sharp")
        except Exception as exc:  # noqa: BLE001 - the test names the class below
            refused = type(exc).__name__, str(exc)
        gpu.world.allreduce(x, "sum", "auto")  # auto picks an algorithm without in-switch reduction
        assert np.array_equal(x, np.full(4096, gpu.size, np.float32))
        return refused, None

    result = run(main, spine_sharp=True, faults=[{"link": "sw0<->sw2", "kind": "flap", "period_ns": 1e6}])
    if result.role == "gpu":
        (name, message), _ = result.value
        assert name == "UnsupportedOperation" and "in-switch reduction across them is not modeled" in message
        assert "faults on links between switches" in message


def test_a_flapping_spine_link_gives_the_same_run_twice():
    """Rerouting is decided at each transfer's modeled time, so the same plan gives the same bytes on
    every link and the same clocks, whatever the host does."""
    plan = [{"link": "sw0<->sw2", "kind": "flap", "at_ns": 0, "period_ns": 1000}]

    def main(gpu):
        x = np.arange(1 << 14, dtype=np.float32) * (gpu.world.rank + 1)
        for _ in range(3):
            gpu.world.allreduce(x, "sum", "ring")
        return gpu.now_ns, float(x[1])

    honest = run(main)
    first, second = run(main, faults=plan), run(main, faults=plan)
    assert first.report["links"] == second.report["links"]
    assert first.value == second.value
    moved = honest.report["links"]["sw0->sw2"]["payload_bytes"] - first.report["links"]["sw0->sw2"]["payload_bytes"]
    assert moved > 0  # some went around, over sw3
    assert first.report["links"]["sw0->sw3"]["payload_bytes"] == honest.report["links"]["sw0->sw3"]["payload_bytes"] + moved
    if first.role == "gpu":
        assert first.value[1] == honest.value[1]  # the same sums
        assert first.value[0] >= honest.value[0]  # the detour costs time, never saves it
