"""Multi-rank: put/get through the switch, Link-TLB isolation, classic NVLink, exact link counters."""

import numpy as np
import pytest

from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.errors import AccessViolation, FabricTimeout, OutOfMemory, UnsupportedOperation
from nvlink_emu.fabric.packets import raw_bytes, segments

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)  # 3 GPUs + the switch at least


def transfer_totals(sizes, config):
    """Closed forms of what a list of puts of `sizes` bytes puts on the requester's uplink:
    (payload, raw, packets, chunks), with every put split into chunk_bytes transfers."""
    payload = raw = packets = chunks = 0
    for size in sizes:
        pieces = [min(config.chunk_bytes, size - s) for s in range(0, size, config.chunk_bytes)] or [0]
        for piece in pieces:
            payload += piece
            raw += raw_bytes(piece, config.mtu_bytes, config.header_bytes)
            packets += segments(piece, config.mtu_bytes)
            chunks += 1
    return payload, raw, packets, chunks


SIZES = [1, 255, 256, 257, 4096, (1 << 20) * 2 + 5]


def test_put_adds_exact_bytes_to_both_links():
    writer, owner = 0, gpus() - 1

    def main(gpu):
        window = gpu.alloc(sum(SIZES), "uint8")
        handle = gpu.world.allgather_object(gpu.export(window) if gpu.rank == owner else None)[owner]
        before = gpu.link_counters()
        gpu.world.barrier()  # every GPU has its "before" before the first byte moves
        offset = 0
        if gpu.rank == writer:
            rng = np.random.default_rng(7)
            for size in SIZES:
                data = gpu.alloc(size, "uint8")
                data[:] = rng.integers(0, 256, size, dtype=np.uint8)
                gpu.put(handle, data, offset=offset)
                offset += size
            gpu.fence()
        gpu.world.barrier()
        after = gpu.link_counters()
        digest = window.tobytes() if gpu.rank == owner else None
        return {k: after[k] - before[k] for k in after}, gpu.world.allgather_object(digest)[owner], gpu.config

    result = run(main)
    report = result.report
    config = result.value[2] if result.role == "gpu" else None
    if result.role == "gpu":
        payload, raw, packets, chunks = transfer_totals(SIZES, config)
        links = {name: {k: v for k, v in stats.items() if k != "busy_ns"} for name, stats in report["links"].items()}
        up = links[uplink(writer)]
        down = links[downlink(owner)]
        assert up == {"payload_bytes": payload, "raw_bytes": raw, "packets": packets}
        assert down == up  # the switch forwards every byte it took in, nothing else goes to the owner
        # the owner's acknowledgements: one header-only packet per transfer, back to the writer
        assert links[uplink(owner)] == {"payload_bytes": 0, "raw_bytes": chunks * config.header_bytes,
                                        "packets": chunks}
        assert links[downlink(writer)] == links[uplink(owner)]
        delta = result.value[0]
        if result.rank == writer:
            assert delta["tx_bytes"] == payload and delta["tx_raw_bytes"] == raw and delta["tx_packets"] == packets
        if result.rank == owner:
            assert delta["rx_bytes"] == payload and delta["rx_raw_bytes"] == raw
            expected = np.random.default_rng(7)
            data = np.concatenate([expected.integers(0, 256, s, dtype=np.uint8) for s in SIZES])
            assert result.value[1] == data.tobytes()


def test_gpu_outside_allowed_set_is_refused_and_bytes_stay():
    owner, allowed, stray = 1, 0, 2

    def main(gpu):
        window = gpu.alloc(1024, "float64")
        window[:] = np.arange(1024)
        handle = gpu.world.allgather_object(gpu.export(window, to=[allowed]) if gpu.rank == owner else None)[owner]
        before = window.tobytes()
        if gpu.rank == stray:
            gpu.put(handle, np.full(1024, -1.0))
            with pytest.raises(AccessViolation, match=r"GPU 2 is not in the allowed set \[0\]"):
                gpu.fence()
            with pytest.raises(AccessViolation, match="not in the allowed set"):
                gpu.get(handle, np.empty(8))
        gpu.world.barrier()
        if gpu.rank == allowed:
            got = np.empty(1024)
            gpu.get(handle, got)
            assert np.array_equal(got, np.arange(1024))
        gpu.world.barrier()
        assert window.tobytes() == before  # on every rank this is its own window; the owner's is what counts

    report = run(main).report
    assert report["ports"][stray]["violations"] == 2
    assert report["ports"][owner]["tlb_faults"] == 2
    assert sum(p["violations"] for p in report["ports"].values()) == 2
    # the refused put crossed the stray GPU's uplink but never left the switch towards the owner
    assert report["links"][uplink(stray)]["payload_bytes"] == 8 * 1024
    assert report["links"][downlink(owner)]["payload_bytes"] == 0  # the owner only sent GET_DATA
    assert report["links"][uplink(owner)]["payload_bytes"] == 8 * 1024


def test_classic_nvlink_stray_write_lands_without_isolation():
    owner, stray = 1, 2

    def main(gpu):
        buffer = gpu.alloc(256, "int32")
        buffer[:] = 0
        address = gpu.world.allgather_object(gpu.physical_address(buffer) if gpu.rank == owner else None)[owner]
        with pytest.raises(UnsupportedOperation, match="fixed at boot"):
            gpu.export(buffer)
        if gpu.rank == stray:
            gpu.put(address, np.full(256, 7, np.int32))
            gpu.fence()
        gpu.world.barrier()
        if gpu.rank == owner:
            assert (buffer == 7).all()

    report = run(main, base="dgx-a100").report
    assert all(p["violations"] == 0 for p in report["ports"].values())
    assert report["links"][downlink(owner)]["payload_bytes"] == 1024
    assert report["network_addresses"] == []


def test_revoke_at_run_time_refuses_later_accesses():
    def main(gpu):
        window = gpu.alloc(64, "float32")
        window[:] = gpu.rank
        handles = gpu.world.allgather_object(gpu.export(window))
        peer = (gpu.rank + 1) % gpu.size
        got = np.empty(64, np.float32)
        gpu.get(handles[peer], got)
        assert (got == peer).all()
        gpu.world.barrier()
        gpu.revoke(handles[gpu.rank])
        gpu.world.barrier()
        with pytest.raises(AccessViolation, match="was revoked"):
            gpu.get(handles[peer], got)
        with pytest.raises(AccessViolation, match="out of bounds|was revoked"):
            gpu.put(handles[peer], got, offset=4)
            gpu.fence()

    report = run(main).report
    assert all(p["violations"] == 2 for p in report["ports"].values())


def test_out_of_window_bounds_is_refused():
    def main(gpu):
        window = gpu.alloc(100, "uint8")
        handle = gpu.world.allgather_object(gpu.export(window))[(gpu.rank + 1) % gpu.size]
        gpu.put(handle, np.ones(100, np.uint8))        # exactly the window: fine
        gpu.fence()
        with pytest.raises(AccessViolation, match="out of bounds"):
            gpu.put(handle, np.ones(10, np.uint8), offset=91)
            gpu.fence()
        gpu.world.barrier()
        assert (window == 1).all()

    run(main)


def test_partitions_are_isolated():
    partitions = [[0, 1], list(range(2, gpus()))]

    def main(gpu):
        window = gpu.alloc(32, "uint8")
        window[:] = 5
        if gpu.rank == 2:
            with pytest.raises(AccessViolation, match="partitions are isolated"):
                gpu.export(window, to=[0])
        handle = gpu.world.allgather_object(gpu.export(window) if gpu.rank == 0 else None)[0]
        if gpu.rank == 2:
            gpu.put(handle, np.zeros(32, np.uint8))
            with pytest.raises(AccessViolation, match="partition"):
                gpu.fence()
        if gpu.rank == 1:
            got = np.empty(32, np.uint8)
            gpu.get(handle, got)
            assert (got == 5).all()
        gpu.world.barrier()
        assert (window == 5).all()

    report = run(main, partitions=partitions).report
    assert report["ports"][2]["violations"] == 1


def test_a_gpu_blocked_in_a_receive_still_serves_gets():
    def main(gpu):
        window = gpu.alloc(1 << 16, "uint8")
        window[:] = gpu.rank + 1
        handles = gpu.world.allgather_object(gpu.export(window))
        if gpu.rank == 0:
            got = np.empty(1, np.uint8)
            gpu.receive_message(("hello",), got, peer=1)  # blocks; meanwhile GPU 1 reads our memory
            assert got[0] == 42
        elif gpu.rank == 1:
            data = np.empty(1 << 16, np.uint8)
            gpu.get(handles[0], data)
            assert (data == 1).all()
            gpu.send_message(0, ("hello",), np.array([42], np.uint8))

    run(main)


def test_a_gpu_that_never_joins_ends_the_wait_with_a_timeout_naming_it():
    def main(gpu):
        if gpu.rank == 0:
            missing = list(range(1, gpu.size))
            with pytest.raises(FabricTimeout, match=rf"GPU 0: barrier .* waiting for GPUs \[{', '.join(map(str, missing))}\]"):
                gpu.world.barrier()

    run(main, timeout_s=1.0)


def test_vram_is_not_merged_across_gpus():
    def main(gpu):
        capacity = gpu.config.memory_capacity_bytes
        assert sum(gpu.world.allgather_object(gpu.free_bytes)) > capacity * 3 // 2
        with pytest.raises(OutOfMemory, match="does not fit"):
            gpu.alloc(capacity * 3 // 2, "uint8")
        big = gpu.alloc(capacity // 2, "uint8")
        gpu.free(big)

    run(main)


def test_network_addresses_are_unique_and_not_ranks():
    def main(gpu):
        return gpu.world.allgather_object(gpu.network_address)

    result = run(main)
    addresses = result.report["network_addresses"]
    assert len(set(addresses)) == gpus() and addresses != list(range(gpus()))
    if result.role == "gpu":
        assert result.value == addresses


def test_a_gpu_whose_main_returned_still_answers_gets_and_puts():
    """The owner exports and returns at once; readers get and put afterwards: its memory outlives its
    program, and the run ends normally (it used to time out, blaming the owner for not finishing)."""
    owner = 0

    def main(gpu):
        window = gpu.alloc(4096, "uint8")
        window[:] = 5
        handle = gpu.world.allgather_object(gpu.export(window) if gpu.rank == owner else None)[owner]
        if gpu.rank == owner:
            return None
        got = gpu.alloc(4096, "uint8")
        gpu.get(handle, got)
        gpu.put(handle, got[:16], offset=16 * gpu.rank)
        gpu.fence()
        return int(got.sum())

    result = run(main, timeout_s=10.0)
    if result.role == "gpu" and result.rank != owner:
        assert result.value == 5 * 4096
