"""fabric.packets: immutable headers, msgpack wire round trip, ProtocolError on garbage, segmentation."""

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.errors import ProtocolError
from fabric.packets import Kind, Packet, raw_bytes, segments

ints = st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.text(max_size=12),
                 st.binary(max_size=12), st.floats(allow_nan=False))
info_values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
infos = st.one_of(st.none(), st.dictionaries(st.text(max_size=8), info_values, max_size=4))
packets = st.builds(Packet, kind=st.sampled_from(list(Kind)), src=ints, dst=ints, address=ints,
                    nbytes=st.integers(min_value=0, max_value=2 ** 64 - 1), req=ints, info=infos)


@settings(max_examples=300, deadline=None)
@given(packet=packets)
def test_wire_round_trip(packet):
    wire = packet.to_wire()
    assert isinstance(wire, bytes)
    back = Packet.from_wire(wire)
    assert isinstance(back.kind, Kind)
    assert back.kind is packet.kind
    assert (back.src, back.dst, back.address, back.nbytes, back.req) == \
        (packet.src, packet.dst, packet.address, packet.nbytes, packet.req)
    assert back.info == packet.info
    assert back == packet


def test_round_trip_typical_packet():
    p = Packet(Kind.NACK, src=-1, dst=0x1AB, req=7, info={"error": "AccessViolation", "message": "no"})
    assert Packet.from_wire(p.to_wire()) == p


def test_round_trip_int_keys_in_info():
    p = Packet(Kind.REDUCE, src=1, dst=2, nbytes=64, info={1: "a", "slot": 3})
    assert Packet.from_wire(p.to_wire()).info == {1: "a", "slot": 3}


def test_packet_is_immutable():
    p = Packet(Kind.PUT, src=1, dst=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.src = 5


def test_defaults():
    p = Packet(Kind.GET, src=1, dst=2)
    assert (p.address, p.nbytes, p.req, p.info) == (0, 0, 0, None)


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",                                          # a byte msgpack never uses
    b"\x01",                                          # an int, not a header
    b"\x93\x01\x02\x03",                              # too few fields
    b"\x97\x01\x02",                                  # truncated
    msgpack.packb([999, 0, 0, 0, 0, 0, None]),        # no such kind
    msgpack.packb([1, 0, 0, 0, 0, 0, None, 8]),       # too many fields
    msgpack.packb({"kind": 1}),                       # a map
    msgpack.packb([1, 0, 0, 0, 0, 0, None]) + b"\x00",  # trailing bytes
    b"hello world, this is not a packet",
])
def test_garbage_is_protocol_error(data):
    with pytest.raises(ProtocolError, match="undecodable"):
        Packet.from_wire(data)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes_decode_or_protocol_error(data):
    try:
        packet = Packet.from_wire(data)
    except ProtocolError:
        return
    assert isinstance(packet.kind, Kind)


@pytest.mark.parametrize("fields", [
    [1, "a", 0, 0, 0, 0, None],
    [1, 0, None, 0, 0, 0, None],
    [1, 0, 0, 0, 1.5, 0, None],
    [1, 0, 0, 0, 0, 0, 5],
    [1, 0, 0, 0, -1, 0, None],
    [1, True, 0, 0, 0, 0, None],
])
def test_wrong_field_types_are_protocol_error(fields):
    with pytest.raises(ProtocolError):
        Packet.from_wire(msgpack.packb(fields))


def test_kind_properties():
    data_plane = {Kind.PUT, Kind.PUT_ACK, Kind.GET, Kind.GET_DATA, Kind.NACK, Kind.MSG, Kind.REDUCE, Kind.MCAST,
                  Kind.LOAD_REDUCE, Kind.LOAD}
    control = {Kind.EXPORT, Kind.REVOKE, Kind.REPLY, Kind.GROUP, Kind.DONE, Kind.SHUTDOWN, Kind.COUNTERS}
    assert all(k.counted for k in data_plane)
    assert not any(k.counted for k in control)
    assert all(k.has_payload for k in (Kind.PUT, Kind.GET_DATA, Kind.MSG, Kind.REDUCE, Kind.MCAST))
    assert not any(k.has_payload for k in (Kind.GET, Kind.PUT_ACK, Kind.NACK))
    assert not any(k.has_payload for k in control)


def test_payload_bytes():
    assert Packet(Kind.PUT, 0, 1, nbytes=100).payload_bytes == 100
    assert Packet(Kind.GET, 0, 1, nbytes=100).payload_bytes == 0  # a GET carries only the request
    assert Packet(Kind.GET_DATA, 0, 1, nbytes=100).payload_bytes == 100
    assert Packet(Kind.PUT_ACK, 0, 1, nbytes=100).payload_bytes == 0


# -- segmentation closed forms -------------------------------------------------------------------------

@pytest.mark.parametrize("payload, mtu, expected", [
    (0, 256, 1), (1, 256, 1), (255, 256, 1), (256, 256, 1), (257, 256, 2),
    (512, 256, 2), (513, 256, 3), (256 * 1000, 256, 1000), (256 * 1000 + 1, 256, 1001), (10, 1, 10),
])
def test_segments(payload, mtu, expected):
    assert segments(payload, mtu) == expected


@pytest.mark.parametrize("payload, mtu, header, expected", [
    (0, 256, 16, 16),                # an empty transfer is still one packet with a header
    (256, 256, 16, 256 + 16),
    (257, 256, 16, 257 + 32),
    (1024, 256, 16, 1024 + 64),
    (1025, 256, 16, 1025 + 80),
    (1000, 256, 0, 1000),
])
def test_raw_bytes(payload, mtu, header, expected):
    assert raw_bytes(payload, mtu, header) == expected


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 10_000), mtu=st.integers(1, 9000), header=st.integers(0, 64))
def test_segments_closed_form_multiples(k, mtu, header):
    assert segments(k * mtu, mtu) == k
    assert segments(k * mtu + 1, mtu) == k + 1
    assert raw_bytes(k * mtu, mtu, header) == k * mtu + k * header
    assert raw_bytes(k * mtu + 1, mtu, header) == k * mtu + 1 + (k + 1) * header
