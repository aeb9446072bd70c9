"""fabric.switch.SwitchLogic (pure, no MPI): export, translate, authorise, route, count, NACK."""

import numpy as np
import pytest

from nvlink_emu.fabric.addressing import physical_address
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.packets import ExportInfo, Kind, MsgInfo, NackInfo, Packet, RevokeInfo
from nvlink_emu.fabric.switch import Send, SwitchLogic
from switch_helpers import HEADER, MEMORY, MTU, export, handle_of, link, msg, network, only_nack, payload_for, put


def classic(gpus=4):
    return SwitchLogic(FabricConfig(gpus=gpus, mode="classic", sharp=False, link="nvlink3", mtu_bytes=MTU,
                                    header_bytes=HEADER, memory_capacity_bytes=MEMORY))


# -- network mode: export and PUT ---------------------------------------------------------------------

def test_export_replies_with_handle():
    sw = network()
    info = export(sw, 1, phys_offset=8192, size=4096, req=17)
    h = handle_of(info)
    assert h.network_address == sw.network_addresses[1]
    assert h.size_bytes == 4096 and h.owner == 1
    assert info["allowed"] == [0, 1, 2, 3]
    assert "error" not in info
    assert sw.counters.snapshot() == {}  # the control plane is never counted


def test_export_reply_addressed_to_exporter():
    sw = network()
    sends = sw.on_packet(2, Packet(Kind.EXPORT, src=0, dst=-1, req=3, info=ExportInfo(0, 64, None, True, True)))
    assert sends[0].packet.dst == sw.network_addresses[2]


def test_network_addresses_are_not_ranks():
    sw = network()
    assert len(set(sw.network_addresses)) == 4
    assert list(sw.network_addresses) != [0, 1, 2, 3]
    assert [sw.port_of(sw.route_key(g)) for g in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize("nbytes", [1, 255, 256, 257, 1000, 4096 - 16])
@pytest.mark.parametrize("claimed_src", [0, -1, "gpu2"])
def test_put_translated_rewritten_counted(nbytes, claimed_src):
    sw = network()
    h = handle_of(export(sw, 1, phys_offset=8192, size=4096))
    src = sw.network_addresses[2] if claimed_src == "gpu2" else claimed_src  # whatever the sender claims
    packet, payload = put(src, h.network_address, h.address + 16, nbytes, req=9)
    sends = sw.on_packet(0, packet, payload)
    assert len(sends) == 1
    send = sends[0]
    assert send.port == 1 and send.payload is payload  # the bytes travel on untouched
    out = send.packet
    assert out.kind is Kind.PUT
    assert out.address == 8192 + 16                      # physical offset in GPU 1's memory
    assert out.src == sw.network_addresses[0]            # the ingress port, not the claim
    assert out.dst == sw.network_addresses[1]
    assert (out.nbytes, out.req) == (nbytes, 9)
    assert sw.counters.snapshot() == {uplink(0): link(nbytes), downlink(1): link(nbytes)}
    raw = nbytes + -(-nbytes // MTU) * HEADER
    assert sw.counters.get(uplink(0)).raw_bytes == raw and sw.counters.get(downlink(1)).raw_bytes == raw
    assert sw.violations == [0, 0, 0, 0]
    assert sw.tlbs[1].faults == 0


def test_put_whole_window_and_one_byte_more():
    sw = network()
    h = handle_of(export(sw, 1, phys_offset=0, size=5000))
    ok = sw.on_packet(0, *put(0, h.network_address, h.address, 5000, req=1))
    assert ok[0].port == 1 and ok[0].packet.address == 0
    bad = sw.on_packet(0, *put(0, h.network_address, h.address, 5001, req=2))
    nack = only_nack(bad, 0, 2)
    assert nack.info.error == "AccessViolation"
    assert "out of bounds" in nack.info.message


def test_refused_put_nacks_requester_only():
    sw = network()
    h = handle_of(export(sw, 1, to=[1, 2]))
    sends = sw.on_packet(0, *put(0, h.network_address, h.address, 512, req=42))
    nack = only_nack(sends, 0, 42)
    assert nack.dst == sw.network_addresses[0]
    assert nack.info.error == "AccessViolation"
    assert nack.info.kind == "PUT"
    assert "GPU 0" in nack.info.message
    assert sw.violations == [1, 0, 0, 0]
    assert sw.tlbs[1].faults == 1
    # the PUT was counted on the way in; only the NACK (no payload, one packet) went out, to GPU 0
    assert sw.counters.snapshot() == {uplink(0): link(512), downlink(0): link(0)}
    # an allowed GPU still gets through
    assert sw.on_packet(2, *put(0, h.network_address, h.address, 8, req=1))[0].port == 1


def test_violations_accumulate_per_requester():
    sw = network()
    h = handle_of(export(sw, 3, to=[3]))
    for requester, times in ((0, 2), (2, 1)):
        for _ in range(times):
            sw.on_packet(requester, *put(0, h.network_address, h.address, 4, req=0))
    assert sw.violations == [2, 0, 1, 0]
    assert sw.refused == [2, 0, 1, 0] and sw.malformed == [0, 0, 0, 0]
    assert sw.tlbs[3].faults == 3
    stats = sw.port_stats()
    assert stats[0]["violations"] == 2 and stats[3]["tlb_faults"] == 3
    assert stats[0]["refused"] == 2 and stats[0]["malformed"] == 0
    # the report now also carries every refusal and the malformed ones, per port
    assert set(stats[1]) == {"tlb_hits", "tlb_misses", "tlb_faults", "violations", "refused", "malformed"}


def test_get_translated_for_read():
    sw = network()
    ro = handle_of(export(sw, 1, phys_offset=4096, size=1024, writable=False))
    stray = np.zeros(100, np.uint8)  # a GET's request carries no data, whatever the sender attaches
    sends = sw.on_packet(0, Packet(Kind.GET, src=0, dst=ro.network_address, address=ro.address + 8, nbytes=100,
                                   req=5), stray)
    assert len(sends) == 1
    send = sends[0]
    assert send.port == 1 and send.payload is None
    assert send.packet.kind is Kind.GET
    assert (send.packet.address, send.packet.nbytes, send.packet.req) == (4096 + 8, 100, 5)
    assert send.packet.src == sw.network_addresses[0]
    # a GET carries no payload: a header each way
    assert sw.counters.snapshot() == {uplink(0): link(0), downlink(1): link(0)}
    # the same read-only window refuses a write
    nack = only_nack(sw.on_packet(0, *put(0, ro.network_address, ro.address, 4, req=6)), 0, 6)
    assert "not writable" in nack.info.message


def test_get_refused_on_write_only_window():
    sw = network()
    wo = handle_of(export(sw, 1, readable=False))
    nack = only_nack(sw.on_packet(0, Packet(Kind.GET, 0, wo.network_address, wo.address, 4, req=7)), 0, 7)
    assert "not readable" in nack.info.message
    assert sw.on_packet(0, *put(0, wo.network_address, wo.address, 4, req=8))[0].port == 1


def test_get_data_and_put_ack_routed_back():
    sw = network()
    h = handle_of(export(sw, 1))
    # a reply is forwarded only if it answers a request the switch forwarded (since the trust
    # hardening), so GPU 0's GET (req 5, 300 bytes) and PUT (req 6, 4 bytes) to GPU 1 go first
    sw.on_packet(0, Packet(Kind.GET, 0, h.network_address, h.address, 300, req=5))
    sw.on_packet(0, *put(0, h.network_address, h.address, 4, req=6))
    requests = {"payload_bytes": 4, "raw_bytes": 4 + 2 * HEADER, "packets": 2, "busy_ns": 0.0}
    assert sw.counters.snapshot() == {uplink(0): requests, downlink(1): requests}
    reply = Packet(Kind.GET_DATA, src=0, dst=sw.network_addresses[0], nbytes=300, req=5)
    payload = payload_for(reply)
    data = sw.on_packet(1, reply, payload)
    assert len(data) == 1
    assert data[0].port == 0 and data[0].payload is payload
    assert data[0].packet.src == sw.network_addresses[1]
    ack = sw.on_packet(1, Packet(Kind.PUT_ACK, src=0, dst=sw.network_addresses[0], req=6))
    assert ack[0].port == 0 and ack[0].payload is None
    assert sw.counters.snapshot() == {
        uplink(0): requests, downlink(1): requests,
        uplink(1): {"payload_bytes": 300, "raw_bytes": 300 + 3 * HEADER, "packets": 3, "busy_ns": 0.0},
        downlink(0): {"payload_bytes": 300, "raw_bytes": 300 + 3 * HEADER, "packets": 3, "busy_ns": 0.0},
    }
    assert sw.awaited_replies == 0


@pytest.mark.parametrize("kind", [Kind.GET_DATA, Kind.PUT_ACK])
def test_reply_to_no_forwarded_request_refused(kind):
    sw = network()
    packet = Packet(kind, src=0, dst=sw.network_addresses[0], nbytes=300 if kind is Kind.GET_DATA else 0, req=5)
    nack = only_nack(sw.on_packet(1, packet, payload_for(packet)), 1, 5)
    assert nack.info.error == "AccessViolation" and nack.info.kind == kind.name
    assert "answers no request the switch forwarded from GPU 0 to GPU 1" in nack.info.message
    assert sw.violations == [0, 1, 0, 0] and sw.refused == [0, 1, 0, 0]
    assert downlink(0) not in sw.counters.snapshot()


def test_revoke_then_put_refused():
    sw = network()
    h = handle_of(export(sw, 1))
    sends = sw.on_packet(1, Packet(Kind.REVOKE, src=0, dst=-1, req=4, info=RevokeInfo(h.network_address, h.address)))
    assert len(sends) == 1 and sends[0].packet.kind is Kind.REPLY
    assert sends[0].packet.info == {"revoked": h.address}
    nack = only_nack(sw.on_packet(0, *put(0, h.network_address, h.address, 4, req=5)), 0, 5)
    assert "revoked" in nack.info.message
    # revoking it again is an error reply, not a crash
    again = sw.on_packet(1, Packet(Kind.REVOKE, src=0, dst=-1, req=6, info=RevokeInfo(h.network_address, h.address)))
    assert again[0].packet.info["error"] == "AccessViolation"


def test_revoke_only_own_windows():
    sw = network()
    h = handle_of(export(sw, 1))
    reply = sw.on_packet(0, Packet(Kind.REVOKE, 0, -1, req=1, info=RevokeInfo(h.network_address, h.address)))
    assert reply[0].packet.info["error"] == "AccessViolation"
    assert sw.on_packet(0, *put(0, h.network_address, h.address, 4, req=2))[0].port == 1


def test_windows_are_per_gpu():
    sw = network()
    h = handle_of(export(sw, 1, phys_offset=0, size=4096))
    # the same network-virtual address on GPU 2 (which exported nothing) is not mapped
    nack = only_nack(sw.on_packet(0, *put(0, sw.network_addresses[2], h.address, 4, req=1)), 0, 1)
    assert nack.info.error == "AccessViolation"


def test_unknown_network_address_refused():
    sw = network()
    unknown = next(a for a in range(0x100, 0x2000) if a not in sw.network_addresses)
    for kind in (Kind.PUT, Kind.GET, Kind.MSG, Kind.GET_DATA):
        packet = Packet(kind, 0, unknown, 0x7F0000000000, 16, req=3, info=MsgInfo((1,)) if kind is Kind.MSG else None)
        nack = only_nack(sw.on_packet(0, packet, payload_for(packet)), 0, 3)
        assert nack.info.error == "AccessViolation"
        assert hex(unknown) in nack.info.message
    assert sw.violations[0] == 4
    # a GPU index is not a network address
    assert only_nack(sw.on_packet(0, *msg(0, 1, 4, req=8)), 0, 8)


# -- partitions -----------------------------------------------------------------------------------------

def test_msg_within_partition_forwarded():
    sw = network(partitions=((0, 1), (2, 3)))
    packet, payload = msg(0, sw.network_addresses[1], 64, req=1, key=(1, 2))
    sends = sw.on_packet(0, packet, payload)
    assert len(sends) == 1
    assert sends[0].port == 1 and sends[0].payload is payload
    assert sends[0].packet.src == sw.network_addresses[0] and sends[0].packet.info == MsgInfo((1, 2))


def test_msg_across_partitions_refused():
    sw = network(partitions=((0, 1), (2, 3)))
    sends = sw.on_packet(0, *msg(0, sw.network_addresses[2], 64, req=2))
    nack = only_nack(sends, 0, 2)
    assert nack.info.error == "AccessViolation"
    assert "partition" in nack.info.message
    assert sw.violations == [1, 0, 0, 0]
    assert downlink(2) not in sw.counters.snapshot()


def test_export_default_allowed_is_partition():
    sw = network(partitions=((0, 1), (2, 3)))
    info = export(sw, 3)
    assert info["allowed"] == [2, 3]
    h = handle_of(info)
    assert sw.on_packet(2, *put(0, h.network_address, h.address, 4, req=1))[0].port == 3
    nack = only_nack(sw.on_packet(1, *put(0, h.network_address, h.address, 4, req=2)), 1, 2)
    assert "partition" in nack.info.message


def test_export_to_other_partition_refused():
    sw = network(partitions=((0, 1), (2, 3)))
    info = export(sw, 0, to=[1, 2])
    assert info["error"] == "AccessViolation" and "handle" not in info
    assert sw.tlbs[0].windows == {}


def test_export_to_nonexistent_gpu_refused():
    sw = network()
    info = export(sw, 0, to=[9])
    assert info["error"] == "FabricError"
    assert "9" in info["message"]


@pytest.mark.parametrize("kind", [Kind.GET_DATA, Kind.PUT_ACK])
def test_responses_across_partitions_refused(kind):
    # no request crosses partitions, so no reply to one can: it answers nothing the switch forwarded
    sw = network(partitions=((0, 1), (2, 3)))
    packet = Packet(kind, src=0, dst=sw.network_addresses[2], nbytes=64, req=2)
    sends = sw.on_packet(0, packet, payload_for(packet))
    nack = only_nack(sends, 0, 2)
    assert nack.info.error == "AccessViolation"
    assert sw.violations == [1, 0, 0, 0]
    assert downlink(2) not in sw.counters.snapshot()


# -- classic mode -------------------------------------------------------------------------------------

def test_classic_put_routed_by_physical_address():
    sw = classic()
    assert sw.network_addresses == () and sw.tlbs == {}
    packet, payload = put(3, -1, physical_address(2, 4096 + 5), 700, req=11)
    sends = sw.on_packet(0, packet, payload)
    assert len(sends) == 1
    send = sends[0]
    assert send.port == 2 and send.payload is payload
    assert (send.packet.address, send.packet.dst, send.packet.src) == (4096 + 5, 2, 0)
    assert sw.counters.snapshot() == {uplink(0): link(700), downlink(2): link(700)}


def test_classic_get_routed_by_physical_address():
    sw = classic()
    sends = sw.on_packet(1, Packet(Kind.GET, src=1, dst=-1, address=physical_address(3, 64), nbytes=32, req=2))
    assert sends[0].port == 3 and sends[0].packet.address == 64 and sends[0].payload is None


def test_classic_no_isolation_between_gpus():
    sw = classic()
    for requester in range(4):
        for target in range(4):
            sends = sw.on_packet(requester, *put(0, -1, physical_address(target, 0), 4))
            assert sends[0].port == target and sends[0].packet.kind is Kind.PUT


def test_classic_bad_physical_addresses_refused():
    sw = classic()
    beyond_gpus = sw.on_packet(0, *put(0, -1, physical_address(4, 0), 4, req=1))
    assert only_nack(beyond_gpus, 0, 1).info.error == "AccessViolation"
    past_memory = sw.on_packet(0, *put(0, -1, physical_address(1, MEMORY - 4), 5, req=2))
    assert only_nack(past_memory, 0, 2).info.error == "AccessViolation"
    to_end = sw.on_packet(0, *put(0, -1, physical_address(1, MEMORY - 4), 4, req=3))
    assert to_end[0].port == 1
    assert sw.violations == [2, 0, 0, 0]


@pytest.mark.parametrize("kind, info", [(Kind.EXPORT, ExportInfo(0, 64, None, True, True)),
                                        (Kind.REVOKE, RevokeInfo(0, 0))])
def test_classic_export_revoke_unsupported(kind, info):
    sw = classic()
    sends = sw.on_packet(1, Packet(kind, src=1, dst=-1, req=4, info=info))
    assert len(sends) == 1
    reply = sends[0].packet
    assert sends[0].port == 1 and reply.kind is Kind.REPLY and reply.req == 4 and reply.dst == 1
    assert reply.info["error"] == "UnsupportedOperation"
    assert "handle" not in reply.info


def test_classic_msg_routed_by_gpu_index():
    sw = classic()
    sends = sw.on_packet(2, *msg(2, 0, 16))
    assert sends[0].port == 0 and sends[0].packet.src == 2
    nack = only_nack(sw.on_packet(2, *msg(2, 4, 16, req=1)), 2, 1)
    assert nack.info.error == "AccessViolation"


# -- packets a GPU may not send ------------------------------------------------------------------------

@pytest.mark.parametrize("kind, info", [(Kind.NACK, NackInfo("AccessViolation", "forged", "PUT")),
                                        (Kind.REPLY, {"group": 1}), (Kind.SHUTDOWN, None)])
def test_switch_only_kinds_are_protocol_errors(kind, info):
    # since the trust hardening the switch refuses them (a NACK to the sender) instead of raising
    sw = network()
    nack = only_nack(sw.on_packet(1, Packet(kind, src=0, dst=sw.network_addresses[0], req=3, info=info)), 1, 3)
    assert nack.info.error == "ProtocolError" and nack.info.kind == kind.name
    assert "GPU 1" in nack.info.message and f"only the switch sends {kind.name}" in nack.info.message
    assert sw.malformed == [0, 1, 0, 0] and sw.refused == [0, 1, 0, 0] and sw.violations == [0, 0, 0, 0]


def test_send_defaults_to_no_payload():
    p = Packet(Kind.PUT_ACK, 0, 1)
    assert Send(1, p) == Send(1, p, None)
    assert Send(1, p).payload is None


def test_only_the_owner_may_revoke_a_window():
    sw = network()
    na, address, _, _ = export(sw, 1, to=[0])["handle"]
    sends = sw.on_packet(0, Packet(Kind.REVOKE, src=0, dst=-1, req=9, info=RevokeInfo(na, address)))
    assert sends[0].packet.info["error"] == "AccessViolation" and "only its owner" in sends[0].packet.info["message"]
    assert address in [w.address for w in sw.tlbs[1].windows.values()]  # still mapped
