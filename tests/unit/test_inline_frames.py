"""Inline frames (ranks.transport): a payload of at most INLINE_PAYLOAD_BYTES travels in its header's
MPI message. The receiver sizes the payload by what arrived and refuses a frame whose lengths do not
add up, before anything is decoded or allocated for it."""

import msgpack
import numpy as np
import pytest

from nvlink_emu.fabric.errors import ProtocolError
from nvlink_emu.fabric.packets import Kind, MsgInfo, Packet
from nvlink_emu.ranks.transport import frame, unframe
from nvlink_emu.ranks.transport.packets import INLINE_FRAME_BYTES, INLINE_MARK, INLINE_PAYLOAD_BYTES


def test_a_frame_gives_back_its_header_and_payload_without_copying_the_payload():
    packet = Packet(Kind.MSG, 1, 2, 0, 1000, 7, MsgInfo(("world", 3, "ar", 0)), 10.0, 20.0)
    payload = np.arange(1000, dtype=np.uint16).astype(np.uint8)
    data = bytearray(frame(packet.to_wire(), payload))
    assert data[0] == INLINE_MARK and len(data) == 5 + len(packet.to_wire()) + 1000
    header, inline = unframe(data, 1 << 16)
    assert Packet.from_wire(header) == packet
    assert inline.dtype == np.uint8 and inline.nbytes == 1000 and (inline == payload).all()
    data[-1] ^= 0xFF  # a view of the message received, not a copy of it
    assert inline[-1] == payload[-1] ^ 0xFF


def test_a_plain_header_is_no_frame():
    wire = Packet(Kind.GET, 1, 2, 0, 64, 3).to_wire()
    header, inline = unframe(bytearray(wire), 1 << 16)
    assert bytes(header) == wire and inline is None
    assert Packet.from_wire(header).payload_bytes == 0


def test_an_empty_inline_payload_is_a_payload_of_zero_bytes_not_none():
    header, inline = unframe(bytearray(frame(b"\x90", np.empty(0, np.uint8))))
    assert bytes(header) == b"\x90" and inline is not None and inline.nbytes == 0


@pytest.mark.parametrize("data, match", [
    (bytes([INLINE_MARK, 1, 0]), "an inline frame of 3 bytes, shorter than its 5-byte prefix"),
    (bytes([INLINE_MARK]) + (1000).to_bytes(4, "little") + b"x" * 10,
     "an inline frame of 15 bytes says its header has 1000"),
    (bytes([INLINE_MARK]) + (200).to_bytes(4, "little") + b"x" * 200, "headers are at most 100 bytes"),
    (bytes([INLINE_MARK]) + (2).to_bytes(4, "little") + b"\x90\x90" + bytes(INLINE_PAYLOAD_BYTES + 1),
     f"inline payloads at most {INLINE_PAYLOAD_BYTES}"),
    (b"\x90" * 101, "a header of more than 100 bytes"),
])
def test_a_frame_whose_lengths_do_not_add_up_is_refused(data, match):
    with pytest.raises(ProtocolError, match=match):
        unframe(bytearray(data), 100)


def test_no_plain_header_starts_with_the_mark():
    """msgpack never writes INLINE_MARK, and a packet's header is a msgpack array (0x99...)."""
    assert Packet(Kind.DONE, 0, -1).to_wire()[0] == 0x99
    with pytest.raises(msgpack.UnpackException):  # 0xC1 is msgpack's "never used" byte
        msgpack.unpackb(bytes([INLINE_MARK]))
    assert INLINE_FRAME_BYTES == 5 + INLINE_PAYLOAD_BYTES
