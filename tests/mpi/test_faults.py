"""Multi-rank: a fault plan on GPU links (fabric.faults) - bit errors replayed (payload intact, replays
counted, each replay one packet time on the link), a link trained down to 9 of 36 lanes (4x the link
time), a down uplink (LinkDown on that GPU, catchable; the others unaffected), same seed same run."""

import numpy as np
import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import LinkDown
from nvlink_emu.fabric.faults import corrupted, packet_error_probability
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.ranks.session import run_fabric

from mpi_helpers import gpus

pytestmark = pytest.mark.mpi(min_size=4)

S = 1 << 20            # bytes gpu1 sends gpu0
MTU, HEADER = 256, 16  # dgx-h100's packets
PACKET = MTU + HEADER


def run(main, faults):
    result = run_fabric(preset("dgx-h100", gpus=gpus(), faults=faults), main, timeout_s=30.0, abort_on_error=False)
    assert result.report["conservation"] == {}, result.report["conservation"]
    return result


def send_one_buffer(gpu):
    """gpu1 sends S bytes to gpu0 (a known pattern); returns (gpu0's check, gpu1's uplink busy ns)."""
    comm = gpu.world
    ok = True
    if comm.rank == 1:
        comm.send(np.arange(S // 4, dtype=np.float32), 0)
    elif comm.rank == 0:
        got = np.zeros(S // 4, np.float32)
        comm.recv(got, 1)
        ok = bool(np.array_equal(got, np.arange(S // 4, dtype=np.float32)))
    comm.barrier()
    return ok, gpu.link_counters()["tx_busy_ns"], gpu.link_status()


def expected_replays(seed, link, ber, packets):
    """The closed form's k: every attempt of every packet that the splitmix64 hash calls corrupted."""
    p = packet_error_probability(ber, PACKET)
    k = 0
    for index in range(packets):
        attempt = 0
        while corrupted(seed, link, index, attempt, p):
            attempt += 1
        k += attempt
    return k


def test_ber_replays_keep_the_payload_and_add_k_packet_times():
    ber, seed = 1e-5, 7
    result = run(send_one_buffer, [{"link": "gpu1->sw0", "kind": "ber", "ber": ber, "seed": seed}])
    if result.role != "gpu":
        return
    ok, busy, status = result.value
    assert ok  # gpu0 got exactly what gpu1 sent
    links = result.report["links"]
    packets = S // MTU
    k = expected_replays(seed, "gpu1->sw0", ber, packets)
    assert k > 10  # p = 0.0215 per packet: about 88 of 4096, so the check is not vacuous
    assert links["gpu1->sw0"]["payload_bytes"] == S  # replays are not payload: bytes and packets unchanged
    assert links["gpu1->sw0"]["packets"] == packets
    assert links["gpu1->sw0"]["replays"] == links["gpu1->sw0"]["crc_errors"] == k
    assert links["gpu1->sw0"]["state"] == "ber"
    bandwidth = preset("dgx-h100").timing.bandwidth_gbytes_per_s  # bytes per ns
    if gpu_index(result) == 1:
        assert busy == pytest.approx((raw_bytes(S, MTU, HEADER) + k * PACKET) / bandwidth, rel=1e-12)
        assert status["gpu1->sw0"] == {"crc_errors": k, "replays": k, "state": "ber"}
    if gpu_index(result) == 2:  # a GPU whose links have no fault: nothing changes
        assert status["gpu2->sw0"] == {"crc_errors": 0, "replays": 0, "state": "up"}


def gpu_index(result):
    """The GPU a rank played (its MPI rank: GPUs come first), or None on a switch rank."""
    return result.rank if result.role == "gpu" else None


def test_a_link_trained_to_9_of_36_lanes_takes_4x_its_time():
    result = run(send_one_buffer, [{"link": "gpu1<->sw0", "kind": "degraded", "lanes": 9}])
    if result.role != "gpu":
        return
    ok, busy, status = result.value
    assert ok
    bandwidth = preset("dgx-h100").timing.bandwidth_gbytes_per_s
    if gpu_index(result) == 1:
        assert busy == pytest.approx(4 * raw_bytes(S, MTU, HEADER) / bandwidth, rel=1e-12)
        assert status["gpu1->sw0"]["state"] == "degraded"
    assert result.report["links"]["gpu1->sw0"]["payload_bytes"] == S


def test_a_down_uplink_raises_linkdown_on_its_gpu_only_and_the_others_run_on():
    def main(gpu):
        comm = gpu.world
        caught = None
        if comm.rank == 2:
            try:
                comm.send(np.ones(1024, np.float32), 0)  # refused at GPU 2's own link: GPU 0 gets nothing
            except LinkDown as exc:
                caught = (exc.link, exc.at_ns, exc.up_at_ns, str(exc))
        elif comm.rank in (0, 1):  # another pair's traffic, unaffected
            mine = np.full(4096, comm.rank, np.float32)
            got = np.empty_like(mine)
            comm.sendrecv(mine, 1 - comm.rank, got, 1 - comm.rank)
            assert np.array_equal(got, np.full(4096, 1 - comm.rank, np.float32))
        return caught

    result = run(main, [{"link": "gpu2->sw0", "kind": "down", "until_ns": 1e9}])
    if gpu_index(result) == 2:
        link, at_ns, up_at_ns, message = result.value
        assert (link, at_ns, up_at_ns) == ("gpu2->sw0", 0.0, 1e9)
        assert "link gpu2->sw0 is down at 0 ns (down since 0 ns, up at 1000000000 ns)" in message
    assert result.report["links"].get("gpu2->sw0", {}).get("payload_bytes", 0) == 0  # nothing left it
    assert result.report["links"]["gpu2->sw0"]["state"] == "down"


def test_same_seed_same_run():
    plan = [{"link": "gpu0<->sw0", "kind": "ber", "ber": 3e-5, "seed": 11}]

    def main(gpu):
        x = np.arange(1 << 16, dtype=np.float32) * (gpu.world.rank + 1)
        gpu.world.allreduce(x, "sum", "ring")
        return gpu.now_ns, x.sum()

    first, second = run(main, plan), run(main, plan)
    assert first.report["links"] == second.report["links"]
    assert first.value == second.value
    assert first.report["links"]["gpu0->sw0"]["replays"] > 0


def test_a_gpu_cannot_forge_faults_in_the_report():
    """A hostile GPU that books its own links with a made-up BER plan (its own clock is its word) still
    gets no crc_errors or replays in the report: the switch takes them only for the plan's links."""
    from nvlink_emu.fabric.faults import LinkFaultState, parse_plan

    def main(gpu):
        if gpu.rank == 2:
            forged = parse_plan([{"link": "gpu2<->sw0", "kind": "ber", "ber": 1e-4}], "forged")
            for link in ("gpu2->sw0", "sw0->gpu2"):
                gpu.raw_port().fault_states[link] = LinkFaultState(forged, link, MTU, HEADER)
            gpu.world.send(np.ones(4096, np.float32), 0)
        elif gpu.rank == 0:
            got = np.empty(4096, np.float32)
            gpu.world.recv(got, 2)
            assert np.array_equal(got, np.ones(4096, np.float32))
        return gpu.link_status()

    result = run(main, [{"link": "gpu0->sw0", "kind": "degraded", "lanes": 18}])
    links = result.report["links"]
    assert "replays" not in links["gpu2->sw0"] and "crc_errors" not in links["gpu2->sw0"]
    assert "state" not in links["gpu2->sw0"]
    assert links["gpu0->sw0"]["state"] == "degraded"
    if gpu_index(result) == 2:  # the forger's own view is its own business
        assert result.value["gpu2->sw0"]["replays"] > 0
