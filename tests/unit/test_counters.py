"""fabric.counters: per-link closed forms, the GPU view, byte conservation, the link table."""

import pytest

from nvlink_emu.fabric.counters import LinkCounters, LinkStats, check_conservation, downlink, format_table, gpu_view, uplink
from nvlink_emu.fabric.errors import FabricError


def test_link_names():
    assert uplink(3) == "gpu3->sw0"
    assert downlink(3) == "sw0->gpu3"
    assert uplink(1, switch=2) == "gpu1->sw2"


def test_record_closed_forms():
    c = LinkCounters(mtu_bytes=256, header_bytes=16)
    c.record("gpu0->sw0", 0)       # 1 packet, header only
    assert c.get("gpu0->sw0") == LinkStats(payload_bytes=0, raw_bytes=16, packets=1)
    c.record("gpu0->sw0", 256)     # exactly one MTU
    assert c.get("gpu0->sw0") == LinkStats(256, 16 + 256 + 16, 2)
    c.record("gpu0->sw0", 257)     # one byte more: two packets
    assert c.get("gpu0->sw0") == LinkStats(513, 16 + 272 + 257 + 32, 4)


@pytest.mark.parametrize("transfers", [[1], [1000, 24, 0], [4096] * 10, [255, 256, 257]])
def test_record_sum_of_transfers(transfers):
    mtu, header = 128, 24
    c = LinkCounters(mtu, header)
    for n in transfers:
        c.record("sw0->gpu1", n)
    packets = sum(max(1, -(-n // mtu)) for n in transfers)
    assert c.get("sw0->gpu1").as_dict() == {
        "payload_bytes": sum(transfers),
        "raw_bytes": sum(transfers) + packets * header,
        "packets": packets,
        "busy_ns": 0.0,
    }


def test_get_unknown_link_is_zero_and_not_created():
    c = LinkCounters(256, 16)
    assert c.get("gpu9->sw0") == LinkStats()
    assert c.snapshot() == {}


def test_snapshot_sorted_and_detached():
    c = LinkCounters(256, 16)
    c.record("sw0->gpu0", 10)
    c.record("gpu0->sw0", 20)
    snap = c.snapshot()
    assert list(snap) == ["gpu0->sw0", "sw0->gpu0"]
    assert snap["gpu0->sw0"] == {"payload_bytes": 20, "raw_bytes": 36, "packets": 1, "busy_ns": 0.0}
    c.record("gpu0->sw0", 20)
    assert snap["gpu0->sw0"]["payload_bytes"] == 20  # a snapshot is a copy


def test_gpu_view_keys_and_values():
    c = LinkCounters(256, 16)
    c.record(uplink(1), 1000)
    c.record(downlink(1), 300)
    c.record(downlink(1), 0)
    c.record(uplink(2), 5)  # another GPU's link is not in GPU 1's view
    view = gpu_view(c.snapshot(), 1)
    assert view == {
        "tx_bytes": 1000, "rx_bytes": 300,
        "tx_raw_bytes": 1000 + 4 * 16, "rx_raw_bytes": 300 + 3 * 16,
        "tx_packets": 4, "rx_packets": 3, "tx_busy_ns": 0.0, "rx_busy_ns": 0.0,
    }


def test_gpu_view_of_idle_gpu_is_zero():
    view = gpu_view({}, 0)
    assert set(view) == {"tx_bytes", "rx_bytes", "tx_raw_bytes", "rx_raw_bytes", "tx_packets", "rx_packets",
                         "tx_busy_ns", "rx_busy_ns"}
    assert all(v == 0 for v in view.values())


def _sides(gpus, transfers):
    """The switch's and each GPU's counters after the same transfers were counted at both ends."""
    switch = LinkCounters(256, 16)
    ends = [LinkCounters(256, 16) for _ in range(gpus)]
    for link, n in transfers:
        gpu = int(link.split("gpu")[1].split("-")[0])
        switch.record(link, n)
        ends[gpu].record(link, n)
    return switch, ends


def test_conservation_passes_when_equal():
    switch, ends = _sides(3, [(uplink(0), 100), (downlink(1), 100), (uplink(2), 0), (downlink(0), 7)])
    check_conservation(switch.snapshot(), [e.snapshot() for e in ends])


def test_conservation_passes_for_idle_fabric():
    check_conservation({}, [{}, {}])


@pytest.mark.parametrize("bad_link, gpu", [(uplink(1), 1), (downlink(0), 0)])
def test_conservation_mismatch_names_link(bad_link, gpu):
    switch, ends = _sides(2, [(uplink(0), 100), (downlink(1), 100), (uplink(1), 64), (downlink(0), 64)])
    ends[gpu].record(bad_link, 1)  # one end saw one more transfer
    with pytest.raises(FabricError) as info:
        check_conservation(switch.snapshot(), [e.snapshot() for e in ends])
    assert bad_link in str(info.value)
    assert f"GPU {gpu}" in str(info.value)


def test_conservation_mismatch_when_one_side_missing():
    switch = LinkCounters(256, 16)
    switch.record(downlink(1), 10)
    with pytest.raises(FabricError, match="sw0->gpu1"):
        check_conservation(switch.snapshot(), [{}, {}])


def test_format_table_contains_rows_and_totals():
    c = LinkCounters(256, 16)
    c.record(uplink(0), 1000)
    c.record(downlink(1), 1000)
    c.record(uplink(1), 24)
    text = format_table(c.snapshot(), gpus=2)
    lines = text.splitlines()
    assert lines[0].startswith("#")
    assert "tx payload B" in lines[1] and "rx pkts" in lines[1]
    assert lines[2].split()[0] == "gpu0<->sw0" and lines[3].split()[0] == "gpu1<->sw0"
    total = lines[-1].split()
    assert total[0] == "total"
    # tx payload, tx raw, tx pkts, rx payload, rx raw, rx pkts
    assert [int(v) for v in total[1:]] == [1024, 1024 + 5 * 16, 5, 1000, 1000 + 4 * 16, 4]
    assert [int(v) for v in lines[2].split()[1:7]] == [1000, 1064, 4, 0, 0, 0]


def test_format_table_extra_columns():
    text = format_table({}, gpus=2, extra={1: {"violations": 3}})
    lines = text.splitlines()
    assert "violations" in lines[1]
    assert lines[2].split()[-1] == "0" and lines[3].split()[-1] == "3"
    assert lines[-1].split()[0] == "total"
