"""fabric.switch.SwitchLogic's trust checks (pure, no MPI): header validation before any look-up,
forged replies, forged multicast, per-partition shares of the switch, and a fuzz of hostile packets."""

import copy
import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.errors import ProtocolError
from nvlink_emu.fabric.packets import (ExportInfo, GroupInfo, Kind, LoadInfo, McastInfo, MsgInfo, NackInfo, Packet, ReduceInfo,
                            RevokeInfo)
from switch_helpers import (MEMORY, export, group_call, handle_of, link, mcast_packet, msg, network, only_nack,
                            payload_for, put, ready_group, reduce_packet, serves_put)

TWO = ((0, 1), (2, 3))   # two tenants of two GPUs each
LATENCY = 250.0          # the default link profile's switch_latency_ns: a NACK leaves t_end + 250 ns


def refused_as_malformed(sw, sends, gpu, req, kind, complaint):
    """`sends` is one ProtocolError NACK to `gpu` naming `complaint`, counted as malformed on its port only."""
    nack = only_nack(sends, gpu, req)
    assert nack.info.error == "ProtocolError" and nack.info.kind == kind.name
    assert complaint in nack.info.message and f"GPU {gpu}" in nack.info.message
    expected = [1 if g == gpu else 0 for g in range(sw.config.gpus)]
    assert sw.malformed == expected and sw.refused == expected and sw.violations == [0] * sw.config.gpus
    return nack


# -- check_header: every field against the config, before anything is taken or looked up ---------------

def test_put_of_2_40_bytes_refused_before_any_allocation():
    sw = network()
    h = handle_of(export(sw, 1))
    packet = Packet(Kind.PUT, 0, h.network_address, h.address, 2 ** 40, req=3, t_start=900.0, t_end=1000.0)
    # what the switch rank asks before it allocates a buffer for the payload
    with pytest.raises(ProtocolError, match="1099511627776 bytes is more than a GPU's 1048576 bytes"):
        sw.check_header(0, packet)
    nack = refused_as_malformed(sw, sw.on_packet(0, packet), 0, 3, Kind.PUT, "1099511627776 bytes")  # no payload
    assert (nack.t_start, nack.t_end) == (1000.0 + LATENCY, 1000.0 + LATENCY)
    assert (sw.tlbs[1].hits, sw.tlbs[1].misses, sw.tlbs[1].faults) == (0, 0, 0)   # nothing looked up
    assert sw.counters.snapshot() == {downlink(0): link(0)}                         # only the NACK went out
    serves_put(sw, 2, h)


@pytest.mark.parametrize("address, nbytes", [(2 ** 64, 4), (2 ** 64 - 2, 4), (-1, 4)])
def test_address_outside_the_64_bit_space_refused(address, nbytes):
    sw = network()
    h = handle_of(export(sw, 1))
    sends = sw.on_packet(0, *put(0, h.network_address, address, nbytes, req=4))
    refused_as_malformed(sw, sends, 0, 4, Kind.PUT, "outside the 64-bit space")
    assert sw.tlbs[1].faults == 0
    serves_put(sw, 2, h)


@pytest.mark.parametrize("t_start, t_end, nack_ns", [(-1.0, 0.0, LATENCY), (math.nan, 10.0, 10.0 + LATENCY),
                                                     (0.0, math.inf, LATENCY), (5.0, 4.0, 4.0 + LATENCY),
                                                     (-math.inf, -math.inf, LATENCY), (0.0, math.nan, LATENCY)])
def test_impossible_modeled_times_refused(t_start, t_end, nack_ns):
    sw = network()
    h = handle_of(export(sw, 1))
    packet = Packet(Kind.PUT, 0, h.network_address, h.address, 64, req=5, t_start=t_start, t_end=t_end)
    nack = refused_as_malformed(sw, sw.on_packet(0, packet, payload_for(packet)), 0, 5, Kind.PUT, "modeled times")
    assert (nack.t_start, nack.t_end) == (nack_ns, nack_ns)  # a NACK's own times are always finite
    serves_put(sw, 2, h)


@pytest.mark.parametrize("kind, info", [(Kind.NACK, NackInfo("AccessViolation", "forged", "PUT")),
                                        (Kind.LOAD, LoadInfo(1, (0,), "sum", "float32", (0,), ("w",), ("w",))),
                                        (Kind.REPLY, {"handle": [0, 0, 0, 0]}), (Kind.SHUTDOWN, None)])
def test_switch_only_kinds_from_a_gpu_refused(kind, info):
    sw = network()
    h = handle_of(export(sw, 1))
    sends = sw.on_packet(3, Packet(kind, src=-1, dst=sw.network_addresses[0], req=6, info=info))
    refused_as_malformed(sw, sends, 3, 6, kind, f"only the switch sends {kind.name}")
    assert sw.counters.snapshot() == {downlink(3): link(0)}  # nothing reached GPU 0
    serves_put(sw, 2, h)


@pytest.mark.parametrize("kind", [Kind.PUT, Kind.MSG], ids=lambda k: k.name)
@pytest.mark.parametrize("size", [63, 65, None])
def test_payload_of_another_size_than_the_header_refused(kind, size):
    sw = network()
    h = handle_of(export(sw, 1))
    packet = put(0, h.network_address, h.address, 64, req=7)[0] if kind is Kind.PUT else \
        msg(0, sw.network_addresses[1], 64, req=7)[0]
    payload = None if size is None else np.zeros(size, np.uint8)
    refused_as_malformed(sw, sw.on_packet(0, packet, payload), 0, 7, kind, f"header says 64 bytes, {size} came")
    assert sw.counters.snapshot() == {downlink(0): link(0)}
    serves_put(sw, 2, h)


@pytest.mark.parametrize("kind", [Kind.PUT, Kind.MSG, Kind.MCAST, Kind.PUT_ACK, Kind.GET], ids=lambda k: k.name)
def test_stray_bytes_beside_a_zero_byte_header_never_leave_the_switch(kind):
    # a payload is only ever matched with the header it came with: 16 bytes beside a header that says 0
    # are refused (ProtocolError) or dropped, never forwarded under a header that does not count them
    sw = network()
    h, mine = handle_of(export(sw, 1)), handle_of(export(sw, 0, req=2))
    gid = ready_group(sw, (0, 1))
    sw.on_packet(2, *put(0, mine.network_address, mine.address, 4, req=8))  # the request GPU 0's PUT_ACK answers
    packet = {Kind.PUT: Packet(Kind.PUT, 0, h.network_address, h.address, 0, req=8),
              Kind.MSG: Packet(Kind.MSG, 0, sw.network_addresses[1], nbytes=0, req=8, info=MsgInfo((0,))),
              Kind.MCAST: Packet(Kind.MCAST, 0, -1, nbytes=0, req=8, info=McastInfo(gid, ("world", 0))),
              Kind.PUT_ACK: Packet(Kind.PUT_ACK, 0, sw.network_addresses[2], req=8),
              Kind.GET: Packet(Kind.GET, 0, h.network_address, h.address, 16, req=8)}[kind]
    sends = sw.on_packet(0, packet, np.full(16, 0xEE, np.uint8))
    assert sends
    for send in sends:
        assert send.payload is None or send.payload.nbytes == 0, f"{kind.name}'s stray bytes went to GPU {send.port}"
        assert send.packet.payload_bytes == 0
    serves_put(sw, 2, h)


@pytest.mark.parametrize("kind", [Kind.MCAST, Kind.REDUCE], ids=lambda k: k.name)
def test_zero_byte_in_switch_operation_does_not_crash_the_switch(kind):
    # the switch rank hands on_packet no payload (None) for a 0-byte header; a bound member may send one
    sw = network()
    h = handle_of(export(sw, 1))
    gid = ready_group(sw, (0, 1))
    info = McastInfo(gid, ("world", 0)) if kind is Kind.MCAST else \
        ReduceInfo(gid, (0,), "sum", "float32", (0, 1), ("world", 0))
    sends = sw.on_packet(0, Packet(kind, 0, -1, nbytes=0, req=9, info=info), None)
    # either refused, or served as 0-byte copies to the members (a REDUCE waits for GPU 1's part)
    served = [(False, 0), (False, 1)] if kind is Kind.MCAST else []
    assert [(s.packet.kind is Kind.NACK, s.port) for s in sends] in ([(True, 0)], served)
    assert all(s.packet.nbytes == 0 and (s.payload is None or s.payload.nbytes == 0) for s in sends)
    serves_put(sw, 2, h)


def test_reduce_with_an_unknown_op_refused_not_crashing():
    # `op` is only a string on the wire; the switch must check it like the dtype, not fail when combining
    sw = network()
    h = handle_of(export(sw, 1))
    gid = ready_group(sw, (0, 1))
    answers = {gpu: sw.on_packet(gpu, *reduce_packet(gid, (0,), "xyz", "float32", (0, 1), ("world", 0),
                                                     np.ones(4, np.float32), req=10 + gpu)) for gpu in (0, 1)}
    nacks = [only_nack(sends, gpu, 10 + gpu) for gpu, sends in answers.items() if sends]
    assert nacks and all(n.info.error in ("FabricError", "ProtocolError") and "'xyz'" in n.info.message
                         for n in nacks)
    assert not any(s.packet.kind is Kind.MCAST for sends in answers.values() for s in sends)
    serves_put(sw, 2, h)


# -- the control plane: refusals are REPLYs, counted as refused but not as violations -------------------

@pytest.mark.parametrize("phys_offset, size", [(MEMORY - 4096, 8192), (-4096, 4096), (0, 0), (0, MEMORY + 1)])
def test_export_outside_the_gpus_memory_refused(phys_offset, size):
    sw = network()
    info = export(sw, 2, phys_offset=phys_offset, size=size, req=3)
    assert info["error"] == "AccessViolation" and "not inside its 1048576 bytes of memory" in info["message"]
    assert "handle" not in info and sw.tlbs[2].windows == {}
    assert sw.refused == [0, 0, 1, 0] and sw.violations == [0, 0, 0, 0] and sw.malformed == [0, 0, 0, 0]
    assert sw.counters.snapshot() == {}
    assert "handle" in export(sw, 2, phys_offset=MEMORY - 4096, size=4096, req=4)  # the last page is fine


def test_export_to_nobody_refused():
    sw = network()
    info = export(sw, 1, to=())
    assert info["error"] == "FabricError" and "names no GPU" in info["message"]
    assert sw.tlbs[1].windows == {} and sw.refused == [0, 1, 0, 0] and sw.violations == [0, 0, 0, 0]


# -- forged replies: PUT_ACK / GET_DATA only for a request the switch forwarded -------------------------

def forwarded_get(sw, requester=0, replier=1, nbytes=300, req=5):
    """A GET of `nbytes` from `requester` into `replier`'s window, forwarded; the window's handle."""
    h = handle_of(export(sw, replier))
    sends = sw.on_packet(requester, Packet(Kind.GET, 0, h.network_address, h.address, nbytes, req=req))
    assert [s.port for s in sends] == [replier] and sw.awaited_replies == 1
    return h


def get_data(sw, to, nbytes, req):
    packet = Packet(Kind.GET_DATA, 0, sw.network_addresses[to], nbytes=nbytes, req=req)
    return packet, payload_for(packet)


def test_get_data_without_a_forwarded_get_refused():
    sw = network()
    nack = only_nack(sw.on_packet(2, *get_data(sw, 0, 300, 5)), 2, 5)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "GET_DATA"
    assert "answers no request the switch forwarded from GPU 0 to GPU 2" in nack.info.message
    assert sw.violations == [0, 0, 1, 0] and sw.refused == [0, 0, 1, 0]
    assert sw.counters.snapshot() == {uplink(2): link(300), downlink(2): link(0)}  # nothing reached GPU 0


def test_get_data_naming_another_gpus_request_refused():
    sw = network()
    h = forwarded_get(sw)                          # GPU 0 asked GPU 1 (request 5)
    for forger in (2, 3, 0):                       # the others, and the requester itself
        nack = only_nack(sw.on_packet(forger, *get_data(sw, 0 if forger else 1, 300, 5)), forger, 5)
        assert nack.info.error == "AccessViolation"
    assert sw.violations == [1, 0, 1, 1] and sw.awaited_replies == 1
    assert sw.counters.snapshot()[downlink(0)] == link(0)  # only GPU 0's own NACK: no forged bytes
    assert sw.on_packet(1, *get_data(sw, 0, 300, 5))[0].port == 0  # the genuine one still comes through
    serves_put(sw, 2, h)


def test_genuine_reply_forwarded_exactly_once():
    sw = network()
    forwarded_get(sw)
    packet, payload = get_data(sw, 0, 300, 5)
    sends = sw.on_packet(1, packet, payload)
    assert len(sends) == 1 and sends[0].port == 0 and sends[0].payload is payload
    assert sends[0].packet.src == sw.network_addresses[1] and sw.awaited_replies == 0
    nack = only_nack(sw.on_packet(1, packet, payload), 1, 5)      # a second copy answers nothing
    assert nack.info.error == "AccessViolation" and "answers no request" in nack.info.message
    assert sw.violations == [0, 1, 0, 0]
    assert sw.counters.snapshot()[downlink(0)] == link(300)        # GPU 0 got the bytes once


@pytest.mark.parametrize("nbytes", [299, 301, 0])
def test_get_data_with_the_wrong_byte_count_refused(nbytes):
    sw = network()
    forwarded_get(sw)
    nack = only_nack(sw.on_packet(1, *get_data(sw, 0, nbytes, 5)), 1, 5)
    assert nack.info.error == "AccessViolation" and f"GET_DATA of {nbytes} bytes" in nack.info.message
    assert sw.violations == [0, 1, 0, 0] and sw.awaited_replies == 1
    assert sw.on_packet(1, *get_data(sw, 0, 300, 5))[0].port == 0


def test_put_ack_answering_a_get_refused():
    sw = network()
    h = forwarded_get(sw, req=7)
    nack = only_nack(sw.on_packet(1, Packet(Kind.PUT_ACK, 0, sw.network_addresses[0], req=7)), 1, 7)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "PUT_ACK"
    # and the other way round: GET_DATA answering a PUT
    sw.on_packet(0, *put(0, h.network_address, h.address, 16, req=8))
    assert only_nack(sw.on_packet(1, *get_data(sw, 0, 16, 8)), 1, 8).info.error == "AccessViolation"
    assert sw.violations == [0, 2, 0, 0] and sw.awaited_replies == 2
    assert sw.on_packet(1, Packet(Kind.PUT_ACK, 0, sw.network_addresses[0], req=8))[0].port == 0


# -- forged multicast: a bound member, for keys of its own communicator ---------------------------------

def groups_for_forgery(sw):
    """alpha = GPUs 0, 1 (both bound); beta = GPUs 2, 3 (both bound); gamma = GPUs 0, 1, 2 (GPU 2 unbound)."""
    alpha, beta = ready_group(sw, (0, 1), name="alpha"), ready_group(sw, (2, 3), name="beta")
    gamma = group_call(sw, 0, action="create", members=(0, 1, 2), name="gamma")["group"]
    for gpu in (0, 1):
        group_call(sw, gpu, action="bind", group=gamma)
    return alpha, beta, gamma


@pytest.mark.parametrize("sender, which, key, complaint", [
    (2, "alpha", ("alpha", 1), "not a member of group"),
    (2, "gamma", ("gamma", 1), "it has not bound group"),
    (0, "alpha", ("beta", 1), "is not one of group"),
    (0, "alpha", (), "is not one of group"),
    (0, "alpha", (1, "alpha"), "is not one of group"),
])
def test_forged_mcast_refused_nothing_delivered(sender, which, key, complaint):
    sw = network()
    gid = dict(zip(("alpha", "beta", "gamma"), groups_for_forgery(sw)))[which]
    nack = only_nack(sw.on_packet(sender, *mcast_packet(gid, key, np.full(64, 7, np.uint8), req=3)), sender, 3)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "MCAST" and complaint in nack.info.message
    assert sw.violations == [1 if g == sender else 0 for g in range(4)]
    assert sw.counters.snapshot() == {uplink(sender): link(64), downlink(sender): link(0)}


def test_reduce_with_another_communicators_key_refused():
    sw = network()
    alpha, _, _ = groups_for_forgery(sw)
    packet, payload = reduce_packet(alpha, (0,), "sum", "int32", (0, 1), ("beta", 0), np.ones(4, np.int32), req=4)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 4)
    assert nack.info.error == "AccessViolation" and "'alpha'" in nack.info.message
    assert sw.groups.held_bytes == 0 and sw.violations == [1, 0, 0, 0]


@pytest.mark.parametrize("key, source", [(("alpha", 1), ("beta", "buf")), (("beta", 1), ("alpha", "buf"))])
def test_load_reduce_for_another_communicator_refused(key, source):
    sw = network()
    alpha, _, _ = groups_for_forgery(sw)
    info = LoadInfo(alpha, (0,), "sum", "float32", (0,), key, source)
    nack = only_nack(sw.on_packet(0, Packet(Kind.LOAD_REDUCE, 0, -1, nbytes=64, req=5, info=info)), 0, 5)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "LOAD_REDUCE"
    assert sw.violations == [1, 0, 0, 0]
    assert sw.counters.snapshot() == {uplink(0): link(0), downlink(0): link(0)}  # no LOAD went to anyone


# -- partitions: each gets an equal share of the switch's groups and buffer -----------------------------

def test_a_partition_past_its_group_share_is_refused_the_other_is_not():
    sw = network(partitions=TWO)
    assert sw.group_share == 64
    first = [group_call(sw, 0, action="create", members=(0, 1), name="p0")["group"] for _ in range(64)]
    full = group_call(sw, 1, action="create", members=(0, 1), name="p0")
    assert full["error"] == "ResourceExhausted" and "partition 0 holds 64 groups" in full["message"]
    # the other tenant still gets its whole share
    second = [group_call(sw, 2, action="create", members=(2, 3), name="p1")["group"] for _ in range(64)]
    assert first == list(range(1, 65)) and second == list(range(65, 129))
    assert group_call(sw, 3, action="create", members=(2, 3), name="p1")["error"] == "ResourceExhausted"
    assert sw.refused == [0, 1, 0, 1] and sw.violations == [0, 0, 0, 0]
    group_call(sw, 0, action="bind", group=first[0])  # only a bound member releases
    group_call(sw, 0, action="release", group=first[0])
    assert group_call(sw, 1, action="create", members=(0, 1), name="p0") == {"group": 129}


def test_contributions_past_a_partitions_buffer_share_refused_the_other_reduces():
    sw = network(partitions=TWO, switch_buffer_bytes=2048, chunk_bytes=1024)
    assert sw.buffer_share_bytes == 1024
    p0, p1 = ready_group(sw, (0, 1), name="p0"), ready_group(sw, (2, 3), name="p1")
    half = np.arange(128, dtype=np.int32)  # 512 bytes
    for slot in (0, 1):
        assert sw.on_packet(0, *reduce_packet(p0, (slot,), "sum", "int32", (0, 1), ("p0", slot), half)) == []
    assert sw.groups.held_by(0) == 1024
    packet, payload = reduce_packet(p0, (2,), "sum", "int32", (0, 1), ("p0", 2), np.ones(1, np.int32), req=6)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 6)
    assert nack.info.error == "ResourceExhausted"
    assert "partition 0's share of the in-switch buffer (1024 bytes" in nack.info.message
    assert sw.groups.held_by(0) == 1024 and sw.refused == [1, 0, 0, 0] and sw.violations == [0, 0, 0, 0]
    # partition 1 holds and completes its own reductions meanwhile
    assert sw.on_packet(2, *reduce_packet(p1, (0,), "sum", "int32", (2, 3), ("p1", 0), half)) == []
    sends = sw.on_packet(3, *reduce_packet(p1, (0,), "sum", "int32", (2, 3), ("p1", 0), half * 3))
    assert [(s.port, s.packet.info) for s in sends] == [(2, McastInfo(p1, ("p1", 0))), (3, McastInfo(p1, ("p1", 0)))]
    np.testing.assert_array_equal(sends[0].payload.view(np.int32), half * 4)
    assert sw.on_packet(2, *reduce_packet(p1, (1,), "sum", "int32", (2, 3), ("p1", 1), np.ones(256, np.int32))) == []
    assert (sw.groups.held_by(0), sw.groups.held_by(1)) == (1024, 1024)


def test_a_contribution_that_completes_a_reduction_is_taken_at_the_share():
    sw = network(partitions=TWO, switch_buffer_bytes=2048, chunk_bytes=1024)
    p0 = ready_group(sw, (0, 1), name="p0")
    half = np.arange(128, dtype=np.int32)
    for slot in (0, 1):
        sw.on_packet(0, *reduce_packet(p0, (slot,), "sum", "int32", (0, 1), ("p0", slot), half))
    sends = sw.on_packet(1, *reduce_packet(p0, (0,), "sum", "int32", (0, 1), ("p0", 0), half))  # frees 512 bytes
    assert [s.port for s in sends] == [0, 1]
    np.testing.assert_array_equal(sends[1].payload.view(np.int32), half * 2)
    assert sw.groups.held_by(0) == 512 and sw.refused == [0, 0, 0, 0]


# -- fuzz: hostile packets from every port of a live two-tenant fabric ----------------------------------

def live_fabric():
    """Two tenants (GPUs 0, 1 and 2, 3), each with a live window, a bound group, a held contribution and
    a forwarded request awaiting its reply; the switch, and the windows and groups a forger would name."""
    sw = network(partitions=TWO)
    w1, w3 = handle_of(export(sw, 1, to=[0, 1])), handle_of(export(sw, 3))
    g0, g1 = ready_group(sw, (0, 1), name="p0"), ready_group(sw, (2, 3), name="p1")
    for gpu, gid, name in ((0, g0, "p0"), (2, g1, "p1")):
        members = (gpu, gpu + 1)
        assert sw.on_packet(gpu, *reduce_packet(gid, (0,), "sum", "float32", members, (name, 0),
                                                np.ones(4, np.float32))) == []
    assert len(sw.on_packet(0, Packet(Kind.GET, 0, w1.network_address, w1.address, 32, req=7))) == 1
    assert len(sw.on_packet(2, *put(0, w3.network_address, w3.address, 16, req=8))) == 1
    return sw, (w1, w3, g0, g1)


_, (W1, W3, G0, G1) = live_fabric()
NA = network(partitions=TWO).network_addresses
LOAD0 = LoadInfo(G0, (1,), "sum", "float32", (0,), ("p0", 3), ("p0", "b"))
LOAD1 = LoadInfo(G1, (1,), "max", "int32", (3,), ("p1", 3), ("p1", "b"))
TEMPLATES = [  # (the GPU that would send it, a valid header)
    (0, put(0, W1.network_address, W1.address, 16, req=1)[0]),
    (2, Packet(Kind.GET, 0, W3.network_address, W3.address, 32, req=2)),
    (1, Packet(Kind.GET_DATA, 0, NA[0], nbytes=32, req=7)),
    (3, Packet(Kind.PUT_ACK, 0, NA[2], req=8)),
    (0, msg(0, NA[1], 8, key=("p0", 1))[0]),
    (2, msg(0, NA[3], 8, key=("p1", 1))[0]),
    (1, Packet(Kind.MCAST, 0, -1, nbytes=8, info=McastInfo(G0, ("p0", 2)))),
    (3, Packet(Kind.MCAST, 0, -1, nbytes=8, info=McastInfo(G1, ("p1", 2)))),
    (1, Packet(Kind.REDUCE, 0, -1, nbytes=16, info=ReduceInfo(G0, (0,), "sum", "float32", (0, 1), ("p0", 0)))),
    (3, Packet(Kind.REDUCE, 0, -1, nbytes=16, info=ReduceInfo(G1, (0,), "sum", "float32", (2, 3), ("p1", 0)))),
    (0, Packet(Kind.LOAD_REDUCE, 0, -1, nbytes=16, info=LOAD0)),
    (3, Packet(Kind.LOAD_REDUCE, 0, -1, nbytes=16, info=LOAD1)),
    (0, Packet(Kind.LOAD, -1, NA[0], nbytes=16, info=LOAD0)),
    (1, Packet(Kind.NACK, -1, NA[0], req=7, info=NackInfo("AccessViolation", "forged", "GET"))),
    (1, Packet(Kind.REPLY, -1, NA[0], req=7, info={"group": G0})),
    (3, Packet(Kind.EXPORT, 0, -1, req=3, info=ExportInfo(0, 4096, (2, 3), True, True))),
    (1, Packet(Kind.REVOKE, 0, -1, req=4, info=RevokeInfo(W1.network_address, W1.address))),
    (2, Packet(Kind.GROUP, 0, -1, req=5, info=GroupInfo("create", 0, (2, 3), "p1"))),
    (2, Packet(Kind.GROUP, 0, -1, req=6, info=GroupInfo("bind", G1, (), ""))),
    (0, Packet(Kind.GROUP, 0, -1, req=6, info=GroupInfo("release", G0, (), ""))),
]
# values a forger reuses, by type: other GPUs' addresses, requests, windows, groups' ids and keys; edge lengths
LENGTHS = [0, 0, 0, 1, 15, 17, 31, 33, 2 ** 20, 2 ** 20 + 1, 2 ** 40, 2 ** 64 - 1]
INTS = [0, 1, 2, 3, -1, 7, 8, 16, 32, *LENGTHS, 2 ** 63 - 1, -2 ** 63, *NA, W1.address, W3.address, W1.address + 4096,
        W3.address - 1, G0, G1, 99]
TEXTS = ["p0", "p1", "p0.1:0", "", "sum", "max", "xyz", "float32", "int8", "create", "bind", "release", "GET"]
LISTS = [["p0", 0], ["p1", 0], ["p1", 2], ["p0", "b"], ["p1", "b"], [], [0, 1], [2, 3], [1, 0], [0], [3], [0, 1, 2, 3]]
ANY = [*INTS, 0.0, -1.0, 1e300, math.nan, math.inf, *TEXTS, *LISTS, None, True, {}]
anything = st.sampled_from(ANY).map(copy.deepcopy) | st.integers(-2 ** 63, 2 ** 64 - 1) | st.text(max_size=4)
LIKE = {int: st.sampled_from(INTS) | st.integers(-2 ** 63, 2 ** 64 - 1), float: st.sampled_from(
    [0.0, -1.0, 5.0, 1e300, math.nan, math.inf, -math.inf]), str: st.sampled_from(TEXTS) | st.text(max_size=4),
    list: st.sampled_from(LISTS).map(copy.deepcopy), bool: st.booleans()}


def replacement(draw, value):
    """Mostly a value of the same type as `value` (so the header still decodes), sometimes anything."""
    like = LIKE.get(type(value))
    return draw(anything if like is None or draw(st.integers(0, 4)) == 0 else like)


@st.composite
def hostile(draw):
    """(ingress, wire bytes): a valid header from its sender or any other port, with up to three changes:
    a wrong length, a field or record entry replaced by a reused value, a record entry dropped or added;
    or bytes at random."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.integers(0, 3)), draw(st.binary(max_size=64) | st.lists(anything, min_size=9, max_size=9)
                                             .map(lambda v: msgpack.packb(v, use_bin_type=True)))
    sender, packet = draw(st.sampled_from(TEMPLATES))
    ingress = draw(st.sampled_from([sender, sender, 0, 1, 2, 3]))
    fields = msgpack.unpackb(packet.to_wire(), raw=False, strict_map_key=False)
    for _ in range(draw(st.integers(0, 3))):
        change = draw(st.sampled_from(["length", "length", "field", "field", "entry", "entry", "drop", "add"]))
        record = fields[6]
        if change == "length":
            fields[4] = draw(st.sampled_from(LENGTHS))
        elif change == "field" or not isinstance(record, list) or not record:
            index = draw(st.integers(0, 8))
            fields[index] = int(draw(st.sampled_from(Kind))) if index == 0 and draw(st.booleans()) else \
                replacement(draw, fields[index])  # another kind with this kind's fields
        elif change == "entry":
            index = draw(st.integers(0, len(record) - 1))
            record[index] = replacement(draw, record[index])
        elif change == "drop":
            record.pop(draw(st.integers(0, len(record) - 1)))
        else:
            record.append(draw(anything))
    return ingress, msgpack.packb(fields, use_bin_type=True)


def payload_beside(draw, packet):
    """What a hostile sender gets handed on: the right size (None for a 0-byte header, as the switch rank
    passes it), one byte off, nothing, or empty."""
    size = packet.payload_bytes
    choice = draw(st.sampled_from(["exact", "short", "long", "none", "empty"]))
    if choice == "none" or choice == "exact" and size == 0 or size > 2 * MEMORY and choice != "empty":
        return None  # (and nobody allocates 2**40 bytes for a fuzz)
    length = {"exact": size, "short": max(size - 1, 0), "long": size + 1, "empty": 0}[choice]
    return np.full(length, packet.kind.value, np.uint8)


# ranks/switch/ serves DONE, TRACE and COUNTERS itself; they never reach on_packet (which raises for them)
RANK_KINDS = {Kind.DONE, Kind.TRACE, Kind.COUNTERS}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_hostile_packets_never_crash_the_switch_or_cross_partitions(data):
    sw, live = live_fabric()
    assert live == (W1, W3, G0, G1)  # the fabric is built the same way every time
    part = sw.config.partition_of
    origin_of = {}   # id of every payload handed in -> the partition it came from
    handed_in = []   # ... kept alive, so that ids are not reused
    for _ in range(data.draw(st.integers(1, 6), label="packets")):
        ingress, wire = data.draw(hostile(), label="ingress, wire")
        try:
            packet = Packet.from_wire(wire)
        except ProtocolError:
            continue
        if packet.kind in RANK_KINDS:
            continue
        payload = payload_beside(data.draw, packet)
        if payload is not None:
            origin_of[id(payload)] = part(ingress)
            handed_in.append(payload)
        sends = sw.on_packet(ingress, packet, payload)
        for send in sends:
            if send.packet.kind in (Kind.NACK, Kind.REPLY):
                assert send.port == ingress and send.payload is None
            assert part(send.port) == part(ingress), f"{packet} from GPU {ingress} sent to GPU {send.port}"
            if send.payload is None or send.payload.nbytes == 0:
                continue
            if id(send.payload) in origin_of:
                assert origin_of[id(send.payload)] == part(send.port)
            else:  # bytes of the switch's own (an in-switch result): only its group's members, in one partition
                assert send.packet.kind is Kind.MCAST
                group = sw.groups.groups[send.packet.info.group]
                assert send.port in group.members and group.partition == part(send.port)
    # both tenants are still served
    w = handle_of(export(sw, 1, req=90))
    serves_put(sw, 0, w)
    assert [s.port for s in sw.on_packet(2, *msg(0, sw.network_addresses[3], 8, key=("p1", 9)))] == [3]


# -- found by the attacker's review ------------------------------------------------------------------

def test_held_contributions_are_bounded_in_number_and_counted_without_a_scan():
    """Zero-byte contributions to ever new slots (a member that never completes them) cost no bytes,
    so they are bounded by count; the held totals are kept as they change, so the other partition's
    reductions cost what they always did."""
    sw = network(partitions=TWO)
    p0, p1 = ready_group(sw, (0, 1), name="p0"), ready_group(sw, (2, 3), name="p1")
    nothing = np.empty(0, np.int32)
    for slot in range(sw.held_parts_share):
        assert sw.on_packet(0, *reduce_packet(p0, (slot,), "sum", "int32", (0, 1), ("p0", slot), nothing)) == []
    nack = only_nack(sw.on_packet(0, *reduce_packet(p0, (-1,), "sum", "int32", (0, 1), ("p0", -1), nothing, req=3)),
                     0, 3)
    assert nack.info.error == "ResourceExhausted" and f"{sw.held_parts_share} contributions" in nack.info.message
    assert sw.groups.held_by(0) == 0 and sw.groups.held_by(1) == 0
    # the other tenant reduces as ever
    one = np.arange(4, dtype=np.int32)
    assert sw.on_packet(2, *reduce_packet(p1, (0,), "sum", "int32", (2, 3), ("p1", 0), one)) == []
    assert sw.groups.held_by(1) == 16
    sends = sw.on_packet(3, *reduce_packet(p1, (0,), "sum", "int32", (2, 3), ("p1", 0), one))
    assert sorted(s.port for s in sends) == [2, 3] and (sends[0].payload.view(np.int32) == 2 * one).all()
    assert sw.groups.held_by(1) == 0 and sw.groups.held_bytes == 0
    group_call(sw, 0, action="release", group=p0)  # releasing drops the held slots and their count
    assert sw.groups.held_by(0) == 0 and sw.groups._held[0] == [0, 0]


def test_a_multicast_waits_for_every_member_to_bind():
    sw = network()
    gid = group_call(sw, 3, action="create", members=(3, 1, 2), name="w")["group"]
    assert group_call(sw, 3, action="bind", group=gid) == {"group": gid}
    nack = only_nack(sw.on_packet(3, *mcast_packet(gid, ("w", 0), np.zeros(32, np.uint8), req=4)), 3, 4)
    assert nack.info.error == "AccessViolation" and "not bound by all members" in nack.info.message


def test_a_gpu_with_too_many_unanswered_requests_is_refused_more(monkeypatch):
    import nvlink_emu.fabric.switch.p2p as p2p

    monkeypatch.setattr(p2p, "MAX_AWAITED", 3)
    sw = network()
    window = handle_of(export(sw, 1, size=4096))
    for req in range(3):  # forwarded to GPU 1, which does not answer
        sends = sw.on_packet(0, Packet(Kind.GET, 0, window.network_address, window.address, 64, req))
        assert [s.port for s in sends] == [1]
    nack = only_nack(sw.on_packet(0, Packet(Kind.GET, 0, window.network_address, window.address, 64, 9)), 0, 9)
    assert nack.info.error == "ResourceExhausted" and "3 of its requests are still unanswered" in nack.info.message
    sw.on_packet(1, Packet(Kind.GET_DATA, 0, sw.network_addresses[0], 0, 64, 0), np.zeros(64, np.uint8))
    assert [s.port for s in sw.on_packet(0, Packet(Kind.GET, 0, window.network_address, window.address, 64, 10))] == [1]


def test_a_stamp_lasts_its_bytes_time_on_a_gpu_link_at_most():
    """A GPU's (t_start, t_end) is its word on when a transfer left it: a MSG stamped (0, 1e15) leaves
    the switch lasting its bytes' time on a GPU link (else it would book the links between switches,
    which every tenant shares, until 1e15 ns); an honest stamp, exactly that long, is untouched."""
    from dataclasses import replace

    from nvlink_emu.fabric.packets import raw_bytes
    sw = network()
    packet, payload = msg(0, sw.route_key(1), 1000)
    duration = raw_bytes(1000, sw.config.mtu_bytes, sw.config.header_bytes) / sw.timing.bandwidth_gbytes_per_s
    for stamp, end in (((0.0, 1e15), duration), ((500.0, 500.0 + duration), 500.0 + duration)):
        out, = sw.on_packet(0, replace(packet, t_start=stamp[0], t_end=stamp[1]), payload)
        assert (out.packet.t_start, out.packet.t_end) == (stamp[0] + LATENCY, end + LATENCY)


class _Trace:
    """A switch's TraceWriter stand-in: keeps the records written while enabled."""

    def __init__(self):
        self.enabled, self.records = True, []

    def write(self, record: dict, force: bool = False) -> None:
        if self.enabled or force:
            self.records.append(record)


def test_a_gpu_s_tracing_off_leaves_out_its_own_traffic_only_whatever_source_it_names():
    """Tenants (0, 1) and (2, 3) on one switch. Found in the round-3 attack (issue 25): GPU 0's TRACE turned
    every record of the switch off (and any other GPU's TRACE was refused). Now each GPU's word speaks for
    its own traffic, named by the port it came in on: GPU 2 asks for none, naming GPU 0 as its source.
    GPU 0's message to GPU 1 and GPU 3's to GPU 2 are recorded; GPU 2's to GPU 3, and its refused message
    to GPU 0 (the NACK and the refusal event, both GPU 2's), are not; once GPU 2 asks again, its
    traffic is recorded again."""
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.packets import TraceInfo
    from nvlink_emu.ranks.switch import SwitchRank

    from switch_helpers import Intake

    config = preset("dgx-h100", gpus=4, partitions=((0, 1), (2, 3)))
    trace = _Trace()
    rank = SwitchRank(config, Intake(), 5.0, trace=trace)
    key = rank.logic.route_key

    def send(g, dst, nbytes=64):
        packet, payload = msg(0, key(dst), nbytes)
        rank._handle(g, packet, payload)

    def seen():
        got = [(r["ev"], r.get("origin", r.get("gpu")), r.get("link")) for r in trace.records]
        trace.records.clear()
        return got

    rank._handle(2, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(False)), None)
    send(0, 1)
    send(3, 2)
    send(2, 3)
    send(2, 0)
    assert rank.logic.refused[2] == 1 and trace.enabled
    assert seen() == [("rx", 0, "gpu0->sw0"), ("tx", 0, "sw0->gpu1"), ("rx", 3, "gpu3->sw0"), ("tx", 3, "sw0->gpu2")]
    rank._handle(2, Packet(Kind.TRACE, key(2), -1, info=TraceInfo(True)), None)
    send(2, 3)
    assert seen() == [("rx", 2, "gpu2->sw0"), ("tx", 2, "sw0->gpu3")]
    for g in range(4):  # every GPU off: no records at all (the bench's tracing off)
        rank._handle(g, Packet(Kind.TRACE, 0, -1, info=TraceInfo(False)), None)
    send(0, 1)
    assert not trace.enabled and seen() == []


class _LeafIntake:
    """A Transport stand-in for leaf 0 of a 2-node fabric of 4 GPUs (rank 4): keeps what is sent."""

    rank = 4

    def __init__(self):
        self.sent = []
        self.pending_bytes_to: dict[int, int] = {}

    def send(self, dest, packet, payload=None):
        self.sent.append((dest, packet.kind, packet.info))
        return []


@pytest.mark.parametrize("traced", [False, True])
def test_a_gpu_toggling_its_tracing_word_costs_the_switches_a_bounded_rate(traced, monkeypatch):
    """Found in the round-4 attack (F8, /tmp/attack/a3.py): GPU 0 sent its leaf 90,600 TRACE words in 10 s,
    each relayed to every spine and on to every other leaf, and another tenant's allreduce across nodes
    took 54 ms (median) against 10 ms, seconds of backlog after. Now a run without a trace directory relays
    nothing (no switch records); with one, the leaf relays a GPU's word at most once per TRACE_RELAY_S, its
    latest only, or before the GPU's next packet to another switch (which records it by that word).
    Before: 1,000 toggles relayed 1,000 words to each of the 2 spines, with or without trace."""
    from nvlink_emu.fabric.config import preset
    from nvlink_emu.fabric.packets import TraceInfo
    from nvlink_emu.ranks.switch import tracing as switch_tracing
    from nvlink_emu.ranks.switch import SwitchRank

    monkeypatch.setattr(switch_tracing, "TRACE_RELAY_S", 3600.0)  # no relay falls due within the test
    config = preset("superpod-h100-nvlink", nodes=2, gpus=4, partitions=((0, 2), (1, 3)))
    intake = _LeafIntake()
    rank = SwitchRank(config, intake, 5.0, trace=_Trace() if traced else None)
    spines = [config.gpus + s for s in range(config.nodes, config.switches)]
    assert len(spines) == 2 and rank.index == 0 and not rank.spine
    key = rank.logic.route_key
    on = False
    for _ in range(1001):  # off, on, off, ... off
        rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(on)), None)
        on = not on
    assert rank.records.untraced == {0}
    if not traced:
        assert intake.sent == [] and rank.sent_to_switches == 0
        return
    assert intake.sent == [(s, Kind.TRACE, TraceInfo(False)) for s in spines] and rank.sent_to_switches == 2
    assert rank.records.words_held == 1000
    assert not rank.records.relay()  # not due: nothing more
    rank.records.relayed[0] = (rank.records.relayed[0][0] - 3600.0, False)
    assert not rank.records.relay() and len(intake.sent) == 2  # due, but its word is what was relayed
    rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(True)), None)  # due: relayed at once
    rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(False)), None)
    rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(True)), None)
    assert intake.sent[2:] == [(s, Kind.TRACE, TraceInfo(True)) for s in spines] and rank.records.words_held == 1002
    rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(False)), None)  # held: the latest, off
    rank.records.relayed[0] = (rank.records.relayed[0][0] - 3600.0, True)
    assert rank.records.relay() and intake.sent[4:] == [(s, Kind.TRACE, TraceInfo(False)) for s in spines]
    assert rank.sent_to_switches == 6 and rank.records.words_held == 1003 and not rank.records.pending
    rank._handle(0, Packet(Kind.TRACE, key(0), -1, info=TraceInfo(True)), None)  # held, not due
    assert len(intake.sent) == 6 and rank.records.pending == {0}
    packet, payload = msg(0, key(2), 64)  # to node 1: the spines learn GPU 0's word first
    rank._handle(0, packet, payload)
    assert intake.sent[6:8] == [(s, Kind.TRACE, TraceInfo(True)) for s in spines] and not rank.records.pending
    assert [kind for _, kind, _ in intake.sent[8:]] == [Kind.MSG] and intake.sent[8][0] in spines
