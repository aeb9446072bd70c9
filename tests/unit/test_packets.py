"""fabric.packets: immutable headers, msgpack wire round trip, ProtocolError on garbage, segmentation."""

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.errors import ProtocolError

from nvlink_emu.fabric.packets import (MAX_KEY_PARTS, CallRecord, CountersInfo, ExportInfo, GroupInfo, Kind, LoadInfo, McastInfo, MsgInfo,
                            NackInfo, Packet, ReduceInfo, RevokeInfo, TraceInfo, raw_bytes, segments)

ints = st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1)
text = st.text(max_size=12)
keys = st.lists(st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), text), max_size=MAX_KEY_PARTS).map(tuple)
int_lists = st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=8).map(tuple)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.text(max_size=12),
                 st.binary(max_size=12), st.floats(allow_nan=False))
info_values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
free_maps = st.one_of(st.none(), st.dictionaries(st.text(max_size=8), info_values, max_size=4))
calls = st.builds(CallRecord, text, ints, text, text, ints, text, text, st.none() | ints, ints, st.floats(0, 1e15),
                  st.floats(0, 1e15), ints, ints)
counters = st.builds(CountersInfo, st.dictionaries(text, st.dictionaries(text, st.integers(0, 2 ** 40), max_size=4),
                                                   max_size=3),
                     st.lists(keys.map(list), max_size=3), st.floats(0, 1e15), st.lists(calls, max_size=3).map(tuple),
                     st.integers(0, 2 ** 40))
RECORDS = {
    Kind.NACK: st.builds(NackInfo, text, text, text),
    Kind.MSG: st.builds(MsgInfo, keys),
    Kind.REDUCE: st.builds(ReduceInfo, ints, int_lists, text, text, int_lists, keys),
    Kind.MCAST: st.builds(McastInfo, ints, keys),
    Kind.LOAD_REDUCE: st.builds(LoadInfo, ints, int_lists, text, text, int_lists, keys, keys),
    Kind.LOAD: st.builds(LoadInfo, ints, int_lists, text, text, int_lists, keys, keys),
    Kind.EXPORT: st.builds(ExportInfo, ints, ints, st.none() | int_lists, st.booleans(), st.booleans()),
    Kind.REVOKE: st.builds(RevokeInfo, ints, ints),
    Kind.GROUP: st.builds(GroupInfo, text, ints, int_lists, text),
    Kind.TRACE: st.builds(TraceInfo, st.booleans()),
    Kind.COUNTERS: counters,
    Kind.REPLY: free_maps,
    Kind.SHUTDOWN: free_maps,
}
packets = st.sampled_from(list(Kind)).flatmap(lambda kind: st.builds(
    Packet, kind=st.just(kind), src=ints, dst=ints, address=ints, nbytes=st.integers(min_value=0, max_value=2 ** 64 - 1),
    req=ints, info=RECORDS.get(kind, st.none())))


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
    p = Packet(Kind.NACK, src=-1, dst=0x1AB, req=7, info=NackInfo("AccessViolation", "no", "PUT"))
    assert Packet.from_wire(p.to_wire()) == p


def test_a_kind_carries_only_its_own_record():
    with pytest.raises(TypeError, match="REDUCE packet carries a ReduceInfo"):
        Packet(Kind.REDUCE, src=1, dst=2, nbytes=64, info={"g": 1})
    with pytest.raises(TypeError, match="MSG packet carries a MsgInfo"):
        Packet(Kind.MSG, src=1, dst=2, info=None)


def wire(kind, info, **header):
    fields = dict(src=0, dst=0, address=0, nbytes=0, req=0, **header)
    return msgpack.packb([int(kind), fields["src"], fields["dst"], fields["address"], fields["nbytes"], fields["req"],
                          info, 0.0, 0.0])


@pytest.mark.parametrize("kind, info, complaint", [
    (Kind.REDUCE, None, "needs 6 fields"),                                        # the crash of issue 8
    (Kind.REDUCE, {"g": 1}, "needs 6 fields"),                                     # the old free-form map
    (Kind.REDUCE, [1, [0], "sum", "float32", [0]], "needs 6 fields"),              # one short
    (Kind.REDUCE, ["1", [0], "sum", "float32", [0], ["k"]], "'group' must be an integer"),
    (Kind.REDUCE, [1, [0.5], "sum", "float32", [0], ["k"]], "'slot' must be a list"),
    (Kind.REDUCE, [1, [0], 7, "float32", [0], ["k"]], "'op' must be a string"),
    (Kind.REDUCE, [1, [0], "sum", "float32", [True], ["k"]], "'dest' must be a list"),
    (Kind.MSG, [[["nested"]]], "'key' must be a flat list"),
    (Kind.MSG, [list(range(MAX_KEY_PARTS + 1))], "'key' must be a flat list"),
    (Kind.MCAST, [1, ["k", 1.5]], "'key' must be a flat list"),
    (Kind.EXPORT, [0, 64, None, "no", True], "'writable' must be true or false"),
    (Kind.EXPORT, [0, 64, "0", True, True], "'to' must be a list"),
    (Kind.COUNTERS, [{"gpu0->sw0": {"packets": "many"}}, [], 0.0, [], 0], "'links' must be"),
    (Kind.COUNTERS, [{}, [], float("nan"), [], 0], "'now_ns' must be a finite number"),
    (Kind.COUNTERS, [{}, [], 0.0, [["world", 0, "allreduce"]], 0], "'calls' must be .*record 0: its record needs 13"),
    (Kind.COUNTERS, [{}, [], 0.0, [["world", "0", "allreduce", "ring", 4, "float32", "sum", None, 3, 0.0, 1.0, 8, 8]],
                     0], "'calls' must be .*record 0: field 'seq' must be an integer"),
    (Kind.COUNTERS, [{}, [], 0.0, [["world", 0, "allreduce", "ring", 4, "float32", "sum", None, 3, 0.0, float("inf"),
                                    8, 8]], 0], "record 0: field 'm_end_ns' must be a finite number"),
    (Kind.COUNTERS, [{}, [], 0.0, [], None], "'calls_unrecorded' must be an integer"),
    (Kind.TRACE, [1], "'on' must be true or false"),
    (Kind.PUT, {"key": 1}, "carries no record"),
    (Kind.REPLY, [1, 2], "'info' must be a map"),
])
def test_malformed_records_are_protocol_errors_naming_the_field(kind, info, complaint):
    with pytest.raises(ProtocolError, match=complaint) as raised:
        Packet.from_wire(wire(kind, info))
    assert kind.name in str(raised.value)


@settings(max_examples=300, deadline=None)
@given(packet=packets, data=st.data())
def test_mutated_records_decode_to_typed_records_or_protocol_error(packet, data):
    """Flip, drop or replace one element of a valid header: the result decodes to the kind's record
    type, or is a ProtocolError; nothing else (a receiver never sees an untyped field)."""
    fields = msgpack.unpackb(packet.to_wire(), raw=False, strict_map_key=False)
    target = data.draw(st.integers(0, len(fields) - 1))
    value = fields[target]
    if isinstance(value, list) and value and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        value[index] = data.draw(info_values)
    else:
        fields[target] = data.draw(info_values)
    try:
        back = Packet.from_wire(msgpack.packb(fields))
    except ProtocolError:
        return
    record = RECORDS.get(back.kind)
    if back.kind not in (Kind.REPLY, Kind.SHUTDOWN) and record is not None:
        assert type(back.info).__name__ == type(data.draw(record)).__name__


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
