"""fabric.tlb.LinkTLB: translation, byte-exact bounds, authorisation, revoke, hit/miss/fault counts, LRU."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlink_emu.fabric.addressing import NETWORK_VIRTUAL_BASE
from nvlink_emu.fabric.errors import AccessViolation
from nvlink_emu.fabric.tlb import LinkTLB

PS = 4096
ALL = frozenset({0, 1, 2, 3})


def make(entries=64, owner=1):
    return LinkTLB(owner=owner, page_size_bytes=PS, entries=entries)


def test_map_and_translate():
    tlb = make()
    w = tlb.map(phys_offset=3 * PS, size_bytes=2 * PS, allowed=ALL, partition=0)
    assert w.address >= NETWORK_VIRTUAL_BASE
    assert w.owner == 1 and w.size_bytes == 2 * PS and w.phys_offset == 3 * PS
    assert tlb.translate(w.address, 8, requester=0, requester_partition=0, write=True) == 3 * PS
    assert tlb.translate(w.address + 5000, 8, 0, 0, write=False) == 3 * PS + 5000


def test_unaligned_physical_offset_keeps_in_page_offset():
    tlb = make()
    w = tlb.map(phys_offset=PS + 100, size_bytes=50, allowed=ALL, partition=0)
    assert w.address % PS == 100
    assert tlb.translate(w.address, 50, 0, 0, True) == PS + 100
    assert tlb.translate(w.address + 49, 1, 0, 0, True) == PS + 149
    # the byte just before the window is on a mapped page but outside the window
    with pytest.raises(AccessViolation, match="out of bounds"):
        tlb.translate(w.address - 1, 1, 0, 0, True)


def test_windows_do_not_overlap_in_virtual_space():
    tlb = make()
    a = tlb.map(0, 5000, ALL, 0)
    b = tlb.map(0, 5000, ALL, 0)  # the same physical bytes exported twice: two distinct windows
    assert a.window_id != b.window_id
    assert b.address >= a.address + a.size_bytes


@pytest.mark.parametrize("size", [5000, 2 * PS, 1])
def test_byte_bounds(size):
    tlb = make()
    w = tlb.map(phys_offset=0, size_bytes=size, allowed=ALL, partition=0)
    # exactly to the end: accepted
    assert tlb.translate(w.address, size, 0, 0, True) == 0
    assert tlb.translate(w.address + size - 1, 1, 0, 0, True) == size - 1
    # one byte past the end: refused, whether that byte is on a mapped page or on the guard page
    with pytest.raises(AccessViolation):
        tlb.translate(w.address, size + 1, 0, 0, True)
    with pytest.raises(AccessViolation):
        tlb.translate(w.address + size, 1, 0, 0, True)
    with pytest.raises(AccessViolation):
        tlb.translate(w.address + size - 1, 2, 0, 0, False)


def test_out_of_bounds_message_names_window():
    tlb = make()
    w = tlb.map(0, 5000, ALL, 0)
    with pytest.raises(AccessViolation, match="out of bounds") as info:
        tlb.translate(w.address + 4999, 2, 2, 0, True)
    text = str(info.value)
    assert "GPU 2" in text and "write of 2 bytes" in text and "GPU 1" in text


def test_requester_not_allowed():
    tlb = make()
    w = tlb.map(0, PS, frozenset({0, 2}), 0)
    assert tlb.translate(w.address, 4, 2, 0, True) == 0
    with pytest.raises(AccessViolation, match="allowed set"):
        tlb.translate(w.address, 4, 3, 0, True)


def test_other_partition_refused():
    tlb = make()
    w = tlb.map(0, PS, ALL, partition=1)
    assert tlb.translate(w.address, 4, 2, 1, True) == 0
    with pytest.raises(AccessViolation, match="partition"):
        tlb.translate(w.address, 4, 2, 0, True)


@pytest.mark.parametrize("permission, refused, text", [("writable", True, "not writable"),
                                                        ("readable", False, "not readable")])
def test_read_only_and_write_only_windows(permission, refused, text):
    tlb = make()
    w = tlb.map(0, PS, ALL, 0, **{permission: False})
    assert tlb.translate(w.address, 4, 0, 0, write=not refused) == 0
    with pytest.raises(AccessViolation, match=text):
        tlb.translate(w.address, 4, 0, 0, write=refused)


def test_revoke():
    tlb = make()
    keep = tlb.map(0, PS, ALL, 0)
    gone = tlb.map(PS, 2 * PS, ALL, 0)
    tlb.translate(gone.address + PS, 4, 0, 0, True)  # cache its second page
    assert tlb.unmap(gone.address) == gone
    for address in (gone.address, gone.address + PS + 10):
        with pytest.raises(AccessViolation, match="revoked"):
            tlb.translate(address, 4, 0, 0, True)
    assert tlb.translate(keep.address, 4, 0, 0, True) == 0
    with pytest.raises(AccessViolation, match="no live window"):
        tlb.unmap(gone.address)
    with pytest.raises(AccessViolation):
        tlb.unmap(keep.address + 1)  # not the start of a window


def test_unmapped_address_refused():
    tlb = make()
    with pytest.raises(AccessViolation, match="not mapped"):
        tlb.translate(NETWORK_VIRTUAL_BASE, 1, 0, 0, False)
    with pytest.raises(AccessViolation, match="not mapped"):
        tlb.translate(0, 1, 0, 0, False)


def test_range_crossing_into_another_window_refused():
    tlb = make()
    a = tlb.map(0, 2 * PS, ALL, 0)
    b = tlb.map(2 * PS, 2 * PS, ALL, 0)
    span = b.address + 16 - (a.address + PS)
    with pytest.raises(AccessViolation):
        tlb.translate(a.address + PS, span, 0, 0, True)
    with pytest.raises(AccessViolation):
        tlb.translate(a.address, b.address + b.size_bytes - a.address, 0, 0, False)


def test_hit_miss_fault_counts_exact():
    tlb = make(entries=16)
    w = tlb.map(phys_offset=2 * PS, size_bytes=3 * PS, allowed=frozenset({0, 1}), partition=0)
    assert tlb.stats() == {"tlb_hits": 0, "tlb_misses": 0, "tlb_faults": 0}
    tlb.translate(w.address, 10, 0, 0, True)            # page 0: miss
    tlb.translate(w.address + 100, 10, 0, 0, True)      # page 0: hit
    tlb.translate(w.address + PS - 6, 10, 0, 0, True)   # page 0 hit, page 1 miss
    with pytest.raises(AccessViolation):
        tlb.translate(w.address + 3 * PS, 1, 0, 0, True)  # guard page: fault, no lookup hit/miss
    with pytest.raises(AccessViolation):
        tlb.translate(w.address + 8, 4, 5, 0, True)      # page 0 hit, then refused: fault
    assert tlb.stats() == {"tlb_hits": 3, "tlb_misses": 2, "tlb_faults": 2}


def test_lru_capacity_two():
    tlb = make(entries=2)
    w = tlb.map(0, 3 * PS, ALL, 0)
    page = [w.address + k * PS for k in range(3)]
    for k in (0, 1, 2, 0, 2, 1):
        tlb.translate(page[k], 1, 0, 0, False)
    # 0 miss, 1 miss, 2 miss (evicts 0), 0 miss (evicts 1), 2 hit, 1 miss (evicts 0)
    assert (tlb.hits, tlb.misses, tlb.faults) == (1, 5, 0)
    tlb.translate(page[2], 1, 0, 0, False)
    tlb.translate(page[1], 1, 0, 0, False)
    assert (tlb.hits, tlb.misses) == (3, 5)
    tlb.translate(page[0], 1, 0, 0, False)
    assert (tlb.hits, tlb.misses) == (3, 6)


def test_lru_large_enough_only_misses_once_per_page():
    tlb = make(entries=3)
    w = tlb.map(0, 3 * PS, ALL, 0)
    for _ in range(4):
        for k in range(3):
            tlb.translate(w.address + k * PS, 1, 0, 0, False)
    assert (tlb.hits, tlb.misses) == (9, 3)


# -- property: translate succeeds iff the access is inside a live window and authorised -----------

window_spec = st.tuples(
    st.integers(0, 64 * PS),                                  # phys_offset
    st.integers(1, 3 * PS),                                   # size_bytes
    st.frozensets(st.integers(0, 3), min_size=1),             # allowed
    st.integers(0, 1),                                        # partition
    st.booleans(), st.booleans(),                             # writable, readable
    st.booleans(),                                            # revoke it
)
access = st.tuples(
    st.integers(0, 5),                                        # window index (mod count)
    st.integers(-PS - 1, 4 * PS + 1),                         # offset from the window start
    st.integers(1, 2 * PS),                                   # nbytes
    st.integers(0, 3), st.integers(0, 1), st.booleans(),      # requester, partition, write
)


@settings(max_examples=150, deadline=None)
@given(windows=st.lists(window_spec, min_size=1, max_size=5), accesses=st.lists(access, max_size=25),
       entries=st.integers(1, 4))
def test_property_translate_iff_inside_live_window_and_allowed(windows, accesses, entries):
    tlb = make(entries=entries)
    mapped = []
    for phys, size, allowed, part, wr, rd, _ in windows:
        mapped.append(tlb.map(phys, size, allowed, part, writable=wr, readable=rd))
    live = []
    for w, spec in zip(mapped, windows):
        if spec[-1]:
            tlb.unmap(w.address)
        else:
            live.append(w)
    for index, delta, nbytes, requester, rpart, write in accesses:
        address = mapped[index % len(mapped)].address + delta
        expected = None
        for w in live:
            if (w.address <= address and address + nbytes <= w.address + w.size_bytes
                    and requester in w.allowed and rpart == w.partition
                    and (w.writable if write else w.readable)):
                expected = w.phys_offset + (address - w.address)
        faults = tlb.faults
        if expected is None:
            with pytest.raises(AccessViolation):
                tlb.translate(address, nbytes, requester, rpart, write)
            assert tlb.faults == faults + 1
        else:
            assert tlb.translate(address, nbytes, requester, rpart, write) == expected
            assert tlb.faults == faults
