"""fabric.addressing: classic physical addresses, network addresses, handles."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.addressing import (PHYSICAL_GPU_SHIFT, PHYSICAL_OFFSET_MASK, Handle, assign_network_addresses,
                               decode_physical, physical_address)
from nvlink_emu.fabric.errors import AccessViolation


def test_physical_address_layout():
    assert physical_address(0, 0) == 0
    assert physical_address(0, 123) == 123
    assert physical_address(3, 0x10) == (3 << 40) | 0x10
    assert PHYSICAL_GPU_SHIFT == 40
    assert PHYSICAL_OFFSET_MASK == (1 << 40) - 1


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(1, 256), data=st.data())
def test_physical_round_trip(gpus, data):
    gpu = data.draw(st.integers(0, gpus - 1))
    offset = data.draw(st.integers(0, PHYSICAL_OFFSET_MASK))
    assert decode_physical(physical_address(gpu, offset), gpus) == (gpu, offset)


def test_decode_out_of_range_gpu():
    with pytest.raises(AccessViolation, match="GPU 8"):
        decode_physical(physical_address(8, 0), 8)
    with pytest.raises(AccessViolation):
        decode_physical(physical_address(100, 5), 8)
    assert decode_physical(physical_address(7, PHYSICAL_OFFSET_MASK), 8) == (7, PHYSICAL_OFFSET_MASK)


def test_decode_negative_address():
    with pytest.raises(AccessViolation):
        decode_physical(-1, 8)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 64, 256])
def test_network_addresses_unique_deterministic_unrelated(gpus):
    addresses = assign_network_addresses(gpus)
    assert len(addresses) == gpus
    assert len(set(addresses)) == gpus
    assert addresses == assign_network_addresses(gpus)
    assert list(addresses) != list(range(gpus))
    assert all(isinstance(a, int) and a >= 0 for a in addresses)
    assert all(a not in range(gpus) for a in addresses)  # no address can be mistaken for a rank


def test_network_addresses_depend_on_seed():
    assert assign_network_addresses(8, seed=1) != assign_network_addresses(8, seed=2)


def test_handle_is_a_plain_value():
    h = Handle(network_address=0x1AB, address=0x7F0000000000, size_bytes=4096, owner=2)
    assert h == Handle(0x1AB, 0x7F0000000000, 4096, 2)
    assert hash(h) == hash(Handle(0x1AB, 0x7F0000000000, 4096, 2))
    text = str(h)
    assert "0x1ab" in text and "4096" in text and "GPU 2" in text
