"""fabric.memory.DeviceMemory: aligned first-fit allocation, OutOfMemory, free with coalescing, offset_of."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.errors import ConfigError, FabricError, OutOfMemory
from nvlink_emu.fabric.memory import DeviceMemory

KiB = 1024


def test_offsets_are_aligned_and_disjoint():
    mem = DeviceMemory(gpu=0, capacity_bytes=64 * KiB, alignment_bytes=256)
    a = mem.allocate(1)
    b = mem.allocate(300)
    c = mem.allocate(256)
    d = mem.allocate(0)
    assert (a, b, c, d) == (0, 256, 768, 1024)  # sizes round up to 256, 512, 256, 256 (zero -> one unit)
    for offset in (a, b, c, d):
        assert offset % 256 == 0
    assert mem.used_bytes == 256 + 512 + 256 + 256
    assert mem.free_bytes == 64 * KiB - mem.used_bytes


@pytest.mark.parametrize("alignment", [64, 256, 4096])
def test_alignment_respected(alignment):
    mem = DeviceMemory(gpu=0, capacity_bytes=256 * KiB, alignment_bytes=alignment)
    offsets = [mem.allocate(n) for n in (1, 17, alignment + 1, 3 * alignment - 1, 5)]
    assert all(o % alignment == 0 for o in offsets)


def test_negative_size_refused():
    mem = DeviceMemory(gpu=0, capacity_bytes=4 * KiB)
    with pytest.raises(FabricError, match="-1"):
        mem.allocate(-1)


def test_out_of_memory_names_requested_and_free():
    mem = DeviceMemory(gpu=3, capacity_bytes=4096, alignment_bytes=256)
    mem.allocate(1024)
    with pytest.raises(OutOfMemory) as info:
        mem.allocate(5000)
    text = str(info.value)
    assert "5000" in text
    assert "3072" in text  # free bytes
    assert "GPU 3" in text
    assert isinstance(info.value, FabricError)
    # the failed allocation changed nothing
    assert mem.free_bytes == 3072
    assert mem.allocate(3072) == 1024


def test_fragmented_memory_refuses_large_block():
    mem = DeviceMemory(gpu=0, capacity_bytes=4 * 256, alignment_bytes=256)
    blocks = [mem.allocate(256) for _ in range(4)]
    mem.release(blocks[0])
    mem.release(blocks[2])
    assert mem.free_bytes == 512
    with pytest.raises(OutOfMemory, match="largest block 256"):
        mem.allocate(512)


def test_free_and_coalesce_back_to_full_capacity():
    cap = 16 * KiB
    mem = DeviceMemory(gpu=0, capacity_bytes=cap, alignment_bytes=256)
    blocks = [mem.allocate(n) for n in (256, 1000, 2048, 300, 512, 4000)]
    # release in an order that needs merging with the left, the right and both neighbours
    for index in (1, 3, 2, 5, 0, 4):
        mem.release(blocks[index])
    assert mem.used_bytes == 0
    assert mem.free_bytes == cap
    assert mem.allocate(cap) == 0  # one block of the full capacity fits again
    with pytest.raises(OutOfMemory):
        mem.allocate(1)


def test_freed_hole_is_reused_first_fit():
    mem = DeviceMemory(gpu=0, capacity_bytes=8 * KiB, alignment_bytes=256)
    a = mem.allocate(512)
    mem.allocate(512)
    mem.release(a)
    assert mem.allocate(256) == a
    assert mem.allocate(256) == a + 256


def test_double_free_refused():
    mem = DeviceMemory(gpu=2, capacity_bytes=4 * KiB)
    a = mem.allocate(100)
    mem.release(a)
    with pytest.raises(FabricError, match="GPU 2"):
        mem.release(a)
    assert mem.free_bytes == 4 * KiB


def test_free_of_interior_offset_refused():
    mem = DeviceMemory(gpu=0, capacity_bytes=4 * KiB)
    a = mem.allocate(1024)
    with pytest.raises(FabricError, match="not the start"):
        mem.release(a + 256)
    assert mem.used_bytes == 1024


def test_allocation_at():
    mem = DeviceMemory(gpu=0, capacity_bytes=4 * KiB)
    mem.allocate(256)
    b = mem.allocate(300)
    assert mem.allocation_at(b) == (b, 512)
    assert mem.allocation_at(b + 511) == (b, 512)
    assert mem.allocation_at(b + 512) is None


def test_view_and_offset_of():
    mem = DeviceMemory(gpu=0, capacity_bytes=64 * KiB)
    off = mem.allocate(100 * 4)
    view = mem.view(off, 100, np.float32)
    assert view.dtype == np.float32 and view.shape == (100,)
    assert mem.offset_of(view) == off
    assert mem.offset_of(view[10:]) == off + 40
    view[:] = 1.5
    assert np.all(mem.array[off:off + 400].view(np.float32) == 1.5)
    assert mem.offset_of(mem.array) == 0


def test_offset_of_foreign_array_refused():
    mem = DeviceMemory(gpu=5, capacity_bytes=64 * KiB)
    with pytest.raises(FabricError, match="GPU 5"):
        mem.offset_of(np.zeros(16, dtype=np.float32))
    other = DeviceMemory(gpu=6, capacity_bytes=64 * KiB)
    with pytest.raises(FabricError):
        mem.offset_of(other.view(0, 8, np.int32))


def test_offset_of_non_contiguous_refused():
    mem = DeviceMemory(gpu=0, capacity_bytes=64 * KiB)
    view = mem.view(0, 64, np.int32)
    with pytest.raises(FabricError, match="contiguous"):
        mem.offset_of(view[::2])


def test_offset_of_view_running_past_the_end_refused():
    mem = DeviceMemory(gpu=0, capacity_bytes=4 * KiB)
    # a view that starts inside the memory but is larger than what is left of it
    tail = np.lib.stride_tricks.as_strided(mem.array[4 * KiB - 8:], shape=(16,), strides=(1,))
    with pytest.raises(FabricError):
        mem.offset_of(tail)


# -- property: allocate/release never overlaps, bytes are conserved ----------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=0, max_value=3000)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=1000)),
    ),
    max_size=60,
)


def _holes(spans, cap):
    """Free gaps between sorted (start, end) spans of [0, cap)."""
    holes, cursor = [], 0
    for start, end in spans:
        holes.append(start - cursor)
        cursor = end
    holes.append(cap - cursor)
    return holes


@settings(max_examples=200, deadline=None)
@given(ops=ops, alignment=st.sampled_from([64, 256, 1024]))
def test_property_no_overlap_and_conservation(ops, alignment):
    cap = 16 * KiB
    mem = DeviceMemory(gpu=0, capacity_bytes=cap, alignment_bytes=alignment)
    live: dict[int, int] = {}  # offset -> requested bytes
    for op, value in ops:
        if op == "alloc":
            try:
                offset = mem.allocate(value)
            except OutOfMemory:
                # a refusal is only allowed when no gap between live blocks is big enough
                needed = max(-(-value // alignment) * alignment, alignment)
                spans = sorted((s, s + z) for s, z in (mem.allocation_at(o) for o in live))
                assert needed > max(_holes(spans, cap))
                continue
            assert offset % alignment == 0
            assert offset not in live
            live[offset] = value
        elif live:
            offset = sorted(live)[value % len(live)]
            mem.release(offset)
            del live[offset]
        # invariants after every step
        assert mem.free_bytes + mem.used_bytes == cap
        blocks = [mem.allocation_at(off) for off in live]
        for off, n, (start, size) in zip(live, live.values(), blocks):
            assert start == off and size >= max(n, 1) and size % alignment == 0
        spans = sorted((start, start + size) for start, size in blocks)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, f"overlapping live blocks {spans}"
        assert all(0 <= s and e <= cap for s, e in spans)
        assert mem.used_bytes == sum(size for _, size in blocks)
    for offset in list(live):
        mem.release(offset)
    assert mem.free_bytes == cap and mem.allocate(cap) == 0


def test_a_capacity_the_host_cannot_map_is_a_config_error_naming_the_key_and_the_gpu(monkeypatch):
    """numpy's MemoryError (1 PiB on a host that maps less; issue 25, item 7) becomes the config's error."""
    from nvlink_emu.fabric import memory

    def refuse(count, dtype):
        raise MemoryError(f"Unable to allocate {count} bytes")  # numpy's _ArrayMemoryError is a MemoryError

    monkeypatch.setattr(memory.np, "zeros", refuse)
    with pytest.raises(ConfigError, match=r"^memory_capacity_bytes: GPU 5's 1099511627776 bytes cannot be mapped on "
                                          r"this host \(more than it can allocate\); lower memory_capacity_bytes$"):
        DeviceMemory(gpu=5, capacity_bytes=1 << 40)
