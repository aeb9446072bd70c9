"""fabric.control: control objects on the wire - typed, no code run on decode, nothing built larger
than the message."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric import FabricError, Handle, ProtocolError, ResourceExhausted
from nvlink_emu.fabric.control import MAX_CONTROL_BYTES, decode, encode


def test_what_control_exchanges_carry_round_trips_with_its_types():
    call = ({"collective": "allreduce", "count": 3000, "dtype": "float32", "op": "sum", "root": None, "seq": 7}, None)
    obj = [call, Handle(0x1AB, 0x7F0000000000, 4096, 2), np.float32(2.5), np.arange(6, dtype=np.int16).reshape(2, 3),
           {1, 2}, frozenset({"a"}), (1, "a", (2.0,)), ResourceExhausted("full"), 1 + 2j, 2 ** 70, -(2 ** 70), b"\x00",
           {(1, 2): "tuple key", 3: [4]}, True, None]
    back = decode(encode(obj))
    assert back[:2] == obj[:2] and back[4:7] == obj[4:7] and back[8:] == obj[8:]
    assert type(back[2]) is np.float32 and back[2] == 2.5
    assert back[3].dtype == np.int16 and back[3].shape == (2, 3) and (back[3] == obj[3]).all()
    assert type(back[7]) is ResourceExhausted and str(back[7]) == "full"
    assert type(back[6]) is tuple and type(back[6][2]) is tuple


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=256))
def test_any_bytes_decode_or_are_a_protocol_error(data):
    try:
        decode(data)
    except ProtocolError:
        pass


class _RunsCode:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize("payload", [
    pickle.dumps(_RunsCode()),                                   # the old control channel ran this
    pickle.dumps(np.empty(0)),                                   # a pickle is not a control message at all
    encode(np.zeros(3)).replace(b"<f8", b"|O8"),                 # an object array: nothing to build it from
    encode(np.zeros(3)).replace(b"\x91\x03", b"\x91\xce\x05\xf5\xe1\x00"),  # shape 1e8 claimed, 24 bytes sent
    b"\xff" * 8,
])
def test_code_objects_and_amplifying_claims_are_refused(payload):
    with pytest.raises(ProtocolError, match="undecodable control message"):
        decode(payload)


def test_a_message_longer_than_the_limit_is_refused_unread():
    with pytest.raises(ProtocolError, match=f"more than {MAX_CONTROL_BYTES}"):
        decode(b"\x00" * (MAX_CONTROL_BYTES + 1))


@pytest.mark.parametrize("value", [object(), np.array([None]), lambda: 1])
def test_objects_that_are_not_control_values_are_a_fabric_error_at_the_sender(value):
    with pytest.raises(FabricError, match="control objects are plain values"):
        encode(value)
