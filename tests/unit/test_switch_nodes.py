"""Two nodes in one process: leaf SwitchLogic -> SpineLogic -> leaf SwitchLogic, with hand-computed
modeled times at every hop, counts on every link of every level, and requests translated at the
target's leaf (issue 10)."""

import numpy as np
import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.packets import ExportInfo, Kind, MsgInfo, Packet, raw_bytes
from nvlink_emu.fabric.switch import SpineLogic, SwitchLogic
from nvlink_emu.fabric.timemodel import LinkEnd

# superpod-h100-ib, 2 nodes x 2 GPUs, 1 spine: a = 150 ns (nvlink4), s = 250 ns a leaf, s' = 130 ns the IB spine (the
# ib-ndr profile's switch), GPU links 450 GB/s; each GPU's share of its node's uplink is its NIC, 50 GB/s, with
# u = 600 ns (the ib-ndr profile's)
A, S, SP, U, GPU_BW, UP_BW = 150.0, 250.0, 130.0, 600.0, 450.0, 50.0
NBYTES = 4096


@pytest.fixture
def fabric():
    config = preset("superpod-h100-ib", nodes=2, gpus=4, spines=1)
    return config, SwitchLogic(config, 0), SpineLogic(config, 2), SwitchLogic(config, 1)


def sent_at(config, src: int, dst: int, t: float, nbytes: int = NBYTES, seq: int = 0):
    """A MSG of GPU `src` to GPU `dst` that left src at modeled time t, stamped as the GPU does (its
    uplink, at the leaf's input), and its payload."""
    leaf = SwitchLogic(config, src // config.gpus_per_node)
    raw = raw_bytes(nbytes, config.mtu_bytes, config.header_bytes)
    packet = Packet(Kind.MSG, leaf.route_key(src), leaf.route_key(dst), 0, nbytes, info=MsgInfo(("k", seq)),
                    t_start=t + A, t_end=t + raw / GPU_BW + A)
    return packet, np.zeros(nbytes, np.uint8)


def test_a_link_end_books_cut_through_and_adds_its_latency():
    end = LinkEnd(100.0, 600.0)
    assert end.send(400.0, 410.0, 1000) == (1000.0, 1010.0)   # 10 ns on the link, then 600 ns
    assert end.send(400.0, 401.0, 1000) == (1010.0, 1020.0)   # behind the first: from 410 on
    assert end.book(0.0, 0.0, 500) == (0.0, 5.0)              # an idle gap before them takes it
    assert (end.free_ns, end.busy_ns) == (420.0, 25.0)


def test_a_transfer_to_another_node_takes_each_hop_s_time(fabric):
    config, leaf0, spine, leaf1 = fabric
    raw = raw_bytes(NBYTES, config.mtu_bytes, config.header_bytes)
    packet, payload = sent_at(config, 0, 2, 0.0)
    (up,) = leaf0.on_packet(0, packet, payload)
    assert up.port == 2 and leaf0.next_switch(2) == 2 and leaf0.egress_link(2) == "sw0->sw2"
    # through leaf 0 (+s), on GPU 0's outbound share from 400 ns at 50 GB/s (the GPU link fed it faster), +u
    assert (up.packet.t_start, up.packet.t_end) == pytest.approx((A + S + U, A + S + raw / UP_BW + U))
    down = spine.on_packet(0, up.packet, up.payload)
    assert down.port == 2 and spine.next_switch(2) == 1
    # through the spine (+s', its own switch latency) and down the cable (+u): the spine books nothing
    assert (down.packet.t_start, down.packet.t_end) == pytest.approx((A + S + SP + 2 * U, A + S + SP + raw / UP_BW + 2 * U))
    (last,) = leaf1.on_transit(2, down.packet, down.payload)
    assert last.port == 2 and leaf1.next_switch(2) is None
    assert (last.packet.t_start, last.packet.t_end) == pytest.approx((A + 2 * S + SP + 2 * U, A + 2 * S + SP + raw / UP_BW + 2 * U))
    # GPU 2 books its inbound share, then its downlink, at once (idle); its last byte arrives a after: the
    # route's unloaded time
    share = LinkEnd(UP_BW, 0.0).book(last.packet.t_start, last.packet.t_end, raw)
    arrival = LinkEnd(GPU_BW, A).send(*share, raw)[1]
    assert arrival == pytest.approx(config.topology.unloaded_ns(0, 2, raw)) == pytest.approx(2 * A + 2 * U + 2 * S + SP + raw / UP_BW)
    # counted on every link of the route, once, at both switches that see a link between switches
    assert {name: stats.payload_bytes for name, stats in leaf0.counters.links.items()} == {
        "gpu0->sw0": NBYTES, "sw0->sw2": NBYTES}
    assert {name: stats.payload_bytes for name, stats in spine.counters.links.items()} == {
        "sw0->sw2": NBYTES, "sw2->sw1": NBYTES}
    assert {name: stats.payload_bytes for name, stats in leaf1.counters.links.items()} == {
        "sw2->sw1": NBYTES, "sw1->gpu2": NBYTES}


def test_two_gpus_of_a_node_cross_on_their_own_shares_whatever_the_order(fabric):
    config = fabric[0]
    raw = raw_bytes(NBYTES, config.mtu_bytes, config.header_bytes)
    busy = raw / UP_BW
    for order in ((0, 1), (1, 0)):  # the leaf handles GPU 0's and GPU 1's transfers in either order
        leaf0 = SwitchLogic(config, 0)
        ups = {g: leaf0.on_packet(g, *sent_at(config, g, g + 2, 0.0))[0] for g in order}
        for g in (0, 1):  # the same times: neither waits for the other on the cable sw0->sw2
            assert (ups[g].packet.t_start, ups[g].packet.t_end) == pytest.approx((A + S + U, A + S + busy + U))
        assert leaf0.counters.get("sw0->sw2").payload_bytes == 2 * NBYTES  # both counted on the cable
    # one GPU's transfers queue on its own share, in the order it sent them
    leaf0 = SwitchLogic(config, 0)
    first = leaf0.on_packet(0, *sent_at(config, 0, 2, 0.0, seq=0))[0]
    second = leaf0.on_packet(0, *sent_at(config, 0, 3, 0.0, seq=1))[0]
    assert first.packet.t_end == pytest.approx(A + S + busy + U)
    assert (second.packet.t_start, second.packet.t_end) == pytest.approx((A + S + busy + U, A + S + 2 * busy + U))
    assert leaf0.shares[0].busy_ns == pytest.approx(2 * busy) and leaf0.shares[1].busy_ns == 0


def test_a_put_to_another_node_is_translated_at_its_target_s_leaf_and_answered_back(fabric):
    config, leaf0, spine, leaf1 = fabric
    # GPU 3 exports a window to GPU 0 at its own leaf
    (reply,) = leaf1.on_packet(3, Packet(Kind.EXPORT, leaf1.route_key(3), -1, req=1,
                                         info=ExportInfo(4096, 8192, (0,), True, True)))
    network_address, address = reply.packet.info["handle"][:2]
    raw = raw_bytes(256, config.mtu_bytes, config.header_bytes)
    put = Packet(Kind.PUT, leaf0.route_key(0), network_address, address + 256, 256, req=7, t_start=A,
                 t_end=A + raw / GPU_BW)
    (up,) = leaf0.on_packet(0, put, np.ones(256, np.uint8))
    assert up.packet.address == put.address and not leaf0.tlbs.get(3)  # leaf 0 holds no TLB of GPU 3
    down = spine.on_packet(0, up.packet, up.payload)
    (deliver,) = leaf1.on_transit(2, down.packet, down.payload)
    assert deliver.port == 3 and deliver.packet.address == 4096 + 256  # its physical offset, by GPU 3's TLB
    # GPU 3's acknowledgement goes back the same way, matched with the request at GPU 3's leaf
    ack = Packet(Kind.PUT_ACK, leaf1.route_key(3), leaf1.route_key(0), req=7, t_start=5000.0, t_end=5000.0)
    (back,) = leaf1.on_packet(3, ack)
    assert back.port == 0 and leaf1.egress_link(0) == "sw1->sw2" and leaf1.awaited_replies == 0
    (home,) = leaf0.on_transit(2, spine.on_packet(1, back.packet).packet)
    assert home.port == 0 and home.packet.kind is Kind.PUT_ACK
    # a second acknowledgement answers nothing: refused at GPU 3's leaf, never leaving the node
    (nack,) = leaf1.on_packet(3, ack)
    assert nack.port == 3 and nack.packet.kind is Kind.NACK and leaf1.violations[3] == 1


def test_a_one_sided_reply_takes_its_own_lane_of_its_senders_share(fabric):
    """GPU 3 serves GPU 0's GET (its GET_DATA, booked as the host delivered the request) and sends a message of
    its program to GPU 1, both ready at 0 ns: leaf 1 takes them in either order, and neither waits for the
    other on GPU 3's outbound share (issue 28; on one lane, the reply first pushed the message 87.04 ns later)."""
    config = fabric[0]
    raw = raw_bytes(NBYTES, config.mtu_bytes, config.header_bytes)
    alone = pytest.approx((A + S + U, A + S + raw / UP_BW + U))
    for reply_first in (True, False):
        leaf0, spine, leaf1 = SwitchLogic(config, 0), SpineLogic(config, 2), SwitchLogic(config, 1)
        (reply,) = leaf1.on_packet(3, Packet(Kind.EXPORT, leaf1.route_key(3), -1, req=1,
                                             info=ExportInfo(4096, 8192, (0,), True, True)))
        network_address, address = reply.packet.info["handle"][:2]
        get = Packet(Kind.GET, leaf0.route_key(0), network_address, address, NBYTES, req=9, t_start=A, t_end=A)
        (up,) = leaf0.on_packet(0, get)
        (deliver,) = leaf1.on_transit(2, spine.on_packet(0, up.packet).packet)
        assert deliver.port == 3 and deliver.packet.kind is Kind.GET
        data = Packet(Kind.GET_DATA, leaf1.route_key(3), leaf1.route_key(0), 0, NBYTES, req=9, t_start=A,
                      t_end=A + raw / GPU_BW)
        handed = [(3, data, np.zeros(NBYTES, np.uint8)), (3, *sent_at(config, 3, 1, 0.0))]
        out = [leaf1.on_packet(*args)[0] for args in (handed if reply_first else handed[::-1])]
        answer, message = out if reply_first else out[::-1]
        assert (answer.packet.kind, message.packet.kind) == (Kind.GET_DATA, Kind.MSG)
        assert (message.packet.t_start, message.packet.t_end) == alone
        assert (answer.packet.t_start, answer.packet.t_end) == alone
        assert leaf1.shares[3].busy_ns == pytest.approx(2 * raw / UP_BW)
