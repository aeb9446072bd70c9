"""The time model's clocks: serialization, cut-through, reduction engine, config overrides."""

import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.timemodel import LinkClock, LinkEnd, ReductionClock


def test_a_link_serializes_transfers_after_it_is_free():
    link = LinkClock(bandwidth=2.0)  # bytes per ns
    assert link.transmit(10.0, 10.0, 100) == (10.0, 60.0)
    assert link.transmit(0.0, 0.0, 40) == (60.0, 80.0)      # does not fit before 10: waits for the link
    assert link.transmit(100.0, 100.0, 2) == (100.0, 101.0)  # an idle gap is not busy time
    assert link.free_ns == 101.0 and link.busy_ns == 50.0 + 20.0 + 1.0


def test_cut_through_never_ends_before_the_upstream_last_byte():
    link = LinkClock(bandwidth=10.0)
    # the bytes stream in slowly (ready over 0..100 ns): the link ends with the last one, not at 10 ns
    assert link.transmit(0.0, 100.0, 100) == (0.0, 100.0)
    assert link.busy_ns == 10.0


def test_reduction_engine_adds_latency_and_streams_at_its_throughput():
    engine = ReductionClock(bandwidth=1.0, latency_ns=5.0)
    assert engine.reduce(0.0, 50.0, 10) == (5.0, 55.0)     # inputs slower than the engine
    assert engine.reduce(0.0, 0.0, 10) == (55.0, 65.0)     # queued behind the first result
    fast = ReductionClock(bandwidth=0.5, latency_ns=0.0)
    assert fast.reduce(0.0, 1.0, 10) == (0.0, 20.0)         # the engine is the bottleneck


def test_config_timing_takes_the_profile_and_overrides():
    t = preset("dgx-h100").timing  # calibrated (nvlink4-nccl); dgx-h100-line: the line rate
    assert (t.bandwidth_gbytes_per_s, t.link_latency_ns, t.switch_latency_ns) == (393.0, 150.0, 250.0)
    assert preset("dgx-h100-line").timing.bandwidth_gbytes_per_s == 450.0
    assert preset("h100-ib").timing.bandwidth_gbytes_per_s == 50.0
    assert preset("dgx-a100", link_latency_ns=7).timing.link_latency_ns == 7
    with pytest.raises(ConfigError, match="bandwidth_gbytes_per_s"):
        preset("dgx-h100", bandwidth_gbytes_per_s=0)
    with pytest.raises(ConfigError, match="link_latency_ns"):
        preset("dgx-h100", link_latency_ns=-1)


@pytest.mark.parametrize("name,link,mode,sharp", [("a100-ib", "ib-hdr", "network", False),
                                                  ("h100-ib", "ib-ndr", "network", False),
                                                  ("pcie-gen4", "pcie-gen4", "classic", False),
                                                  ("pcie-gen5", "pcie-gen5", "classic", False)])
def test_the_comparison_presets(name, link, mode, sharp):
    config = preset(name)
    assert (config.link, config.mode, config.sharp, config.gpus) == (link, mode, sharp, 8)


def test_a_transfer_fills_an_idle_gap_left_before_later_ones():
    link = LinkClock(bandwidth=1.0)
    assert link.transmit(100.0, 100.0, 10) == (100.0, 110.0)  # handed over first, ready later
    assert link.transmit(0.0, 0.0, 10) == (0.0, 10.0)         # ready earlier: takes the idle gap
    assert link.transmit(95.0, 95.0, 10) == (110.0, 120.0)    # does not fit before 100: goes after
    assert link.transmit(0.0, 0.0, 80) == (10.0, 90.0)        # fills most of the gap
    assert link.free_ns == 120.0 and link.busy_ns == 110.0


def test_gap_filling_makes_non_competing_transfers_order_independent():
    transfers = [(0.0, 0.0, 10), (50.0, 60.0, 5), (200.0, 200.0, 30), (20.0, 20.0, 10)]
    outcomes = set()
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        link = LinkClock(bandwidth=1.0)
        outcomes.add(tuple(sorted(link.transmit(*transfers[i]) for i in order)))
    assert len(outcomes) == 1


def test_a_served_reply_does_not_move_when_the_programs_sends_left():
    """A GPU's uplink as in tests/cli/test_determinism.py[one-node] (issue 28), in ns at 2 bytes per ns:
    its program sends 100 bytes at 0 and 40 at 30, then its call flushes; it also serves a one-sided reply
    (a PUT_ACK) ready at 200, which the host may hand over before, between or after those sends. The flush
    must see the program's last byte leave at 70 in every order; the link's last busy byte (free_ns, which
    flush took before) is 210 when the reply came first, 70 when it came last."""
    flushed, last_busy, bookings = set(), set(), set()
    for order in (("send", "send", "serve"), ("serve", "send", "send"), ("send", "serve", "send")):
        uplink, sends = LinkEnd(bandwidth=2.0, latency_ns=5.0), iter([(0.0, 100), (30.0, 40)])
        booked = []
        for i, op in enumerate(order):
            if op == "serve":
                booked.append(uplink.serve(200.0, 200.0, 20))
            else:
                at, raw = next(sends)
                booked.append(uplink.send(at, at, raw))
            if op == "send" and "send" not in order[i + 1:]:  # the program's last send: its call flushes
                flushed.add(uplink.sent_ns)
                last_busy.add(uplink.free_ns)
        bookings.add(tuple(sorted(booked)))
        assert uplink.sent_ns == 70.0 and uplink.free_ns == 210.0 and uplink.busy_ns == 80.0
    assert flushed == {70.0} and last_busy == {70.0, 210.0}
    assert bookings == {((5.0, 55.0), (55.0, 75.0), (205.0, 215.0))}  # the reply competes with no send


def test_one_sided_traffic_takes_its_own_lane_in_every_host_order():
    """A GPU's downlink at 2 bytes per ns (issue 28): its program consumes transfers of 100 bytes ready at
    0 and of 40 ready at 30 (a collective's, in program order); a put of 60 bytes ready at 10 is served
    whenever the host delivers it: before, between or after them. The program's transfers and the put
    keep the same times in every order (on one shared lane the put, first, pushed them to 40..90..110)."""
    outcomes = set()
    for put_at in range(3):
        downlink, program, booked = LinkEnd(bandwidth=2.0, latency_ns=5.0), iter([(0.0, 100), (30.0, 40)]), {}
        for i in range(3):
            if i == put_at:
                booked["put"] = downlink.book(10.0, 10.0, 60, served=True)
            else:
                at, raw = next(program)
                booked[raw] = downlink.book(at, at, raw)
        outcomes.add(frozenset(booked.items()))
        assert downlink.busy_ns == 100.0 and downlink.free_ns == 70.0
    assert outcomes == {frozenset({100: (0.0, 50.0), 40: (50.0, 70.0), "put": (10.0, 40.0)}.items())}


def test_channel_lanes_split_the_link_and_keep_its_program_order():
    # docs/model/time.md, "Channels": channel c of C books lane c at bandwidth / C, in its own order
    link = LinkEnd(bandwidth=4.0, latency_ns=1.0)
    assert link.send(0.0, 0.0, 40) == (1.0, 11.0)                # the program lane first: 0..10 ns
    # two channels at 2 bytes per ns each, both from 0: they run side by side, after the program's 10 ns
    assert link.send(0.0, 0.0, 20, lane=(0, 2)) == (11.0, 21.0)
    assert link.send(0.0, 0.0, 20, lane=(1, 2)) == (11.0, 21.0)
    assert link.send(0.0, 0.0, 10, lane=(0, 2)) == (21.0, 26.0)  # lane 0's next waits for lane 0 only
    assert (link.lane_sent_ns((0, 2)), link.lane_sent_ns((1, 2)), link.sent_ns) == (25.0, 20.0, 25.0)
    assert link.lane_bandwidth((1, 2)) == 2.0 and link.lane_bandwidth(None) == 4.0
    # busy at the link's bandwidth: 10 + (20 + 20 + 10) / 4 ns, never more than the time the lanes span
    assert link.busy_ns == 10.0 + 12.5 and link.free_ns == 25.0
    # the next program transfer (lanes closed) waits for the lanes' last byte, whatever its ready time
    assert link.send(0.0, 0.0, 4) == (26.0, 27.0)
    assert link.busy_ns == 23.5


def test_one_channel_is_the_program_lane():
    one, plain = LinkEnd(bandwidth=4.0, latency_ns=1.0), LinkEnd(bandwidth=4.0, latency_ns=1.0)
    for ready in (0.0, 3.0, 40.0):
        assert one.send(ready, ready, 8, lane=(0, 1)) == plain.send(ready, ready, 8)
        assert one.book(ready, ready + 5, 8, lane=(0, 1)) == plain.book(ready, ready + 5, 8)
    assert (one.busy_ns, one.sent_ns, one.free_ns) == (plain.busy_ns, plain.sent_ns, plain.free_ns)


def test_a_one_sided_transfer_beside_busy_channel_lanes_takes_a_lane_of_its_own():
    # docs/model/time.md, "A put beside a collective": at bandwidth / (C + 1), the channel lanes left open
    link = LinkEnd(bandwidth=6.0, latency_ns=1.0)
    assert link.post(0.0, 0.0, 6) is None                           # no channel lanes: booked as any send
    assert link.send(0.0, 0.0, 12) == (1.0, 3.0)                    # the program lane: 0..2 ns
    assert link.send(0.0, 0.0, 30, lane=(0, 2)) == (3.0, 13.0)      # two channels at 3 bytes per ns, 2..12
    assert link.send(0.0, 0.0, 30, lane=(1, 2)) == (3.0, 13.0)
    # a put ready at 1 ns: its own lane at 2 bytes per ns, from the lanes' floor (2 ns), not after 12 ns
    assert link.post(1.0, 1.0, 8) == (3.0, 7.0)
    assert link.send(0.0, 0.0, 3, lane=(0, 2)) == (13.0, 14.0)     # the channels go on, their lanes unmoved
    assert link.post(5.0, 5.0, 8) == (7.0, 11.0)                    # the next behind the first, on its lane
    assert (link.sent_ns, link.lane_sent_ns((1, 2)), link.free_ns) == (13.0, 12.0, 13.0)
    assert link.post(13.0, 13.0, 8) is None                         # the lanes are done by then: not beside
    # the program lane (lanes closed) waits for every lane's last byte, the beside lane's too
    assert link.send(0.0, 0.0, 6) == (14.0, 15.0)
    assert link.busy_ns == pytest.approx(2.0 + (30 + 30 + 8 + 3 + 8) / 6 + 1.0, rel=1e-15)
