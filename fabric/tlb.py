"""Link TLB: page-granular translation network-virtual address -> physical, with authorisation.

On a real H100 the Link TLB sits in the destination GPU; in this emulator the switch rank keeps one
per destination port and translates there. The page table is the fabric manager's full mapping; the
TLB caches `entries` pages (LRU): a cached page is a hit, a page filled from the table is a miss, a
refused translation is a fault.
"""

from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

from .addressing import NETWORK_VIRTUAL_BASE
from .errors import AccessViolation, ResourceExhausted

REVOKED_KEPT = 4096  # revoked windows remembered, so that a late access says "was revoked"


@dataclass(frozen=True)
class Window:
    """One export: `size_bytes` at network-virtual `address`, backed by physical `phys_offset`."""

    window_id: int
    owner: int
    address: int
    size_bytes: int
    phys_offset: int
    allowed: frozenset[int]
    partition: int
    writable: bool = True
    readable: bool = True

    def describe(self) -> str:
        return f"window {self.address:#x}+{self.size_bytes} of GPU {self.owner}"


class LinkTLB:
    """Translation and authorisation for accesses into one GPU's exported windows."""

    def __init__(self, owner: int, page_size_bytes: int, entries: int, max_pages: int | None = None):
        self.owner = owner
        self.max_pages = max_pages  # the page table's size (None: unbounded)
        self.page_size = page_size_bytes
        self.entries = entries
        self.windows: dict[int, Window] = {}
        self.revoked: OrderedDict[int, Window] = OrderedDict()  # the latest REVOKED_KEPT
        self._pages: dict[int, tuple[int, int]] = {}  # virtual page -> (physical page, window id)
        self._cache: OrderedDict[int, None] = OrderedDict()
        self._next_page = NETWORK_VIRTUAL_BASE // page_size_bytes
        self._next_id = 1
        self.hits = self.misses = self.faults = 0

    def map(self, phys_offset: int, size_bytes: int, allowed: frozenset[int], partition: int,
            writable: bool = True, readable: bool = True) -> Window:
        """Map a new window over physical bytes [phys_offset, phys_offset + size_bytes)."""
        ps = self.page_size
        in_page = phys_offset % ps
        pages = -(-(in_page + size_bytes) // ps)
        if self.max_pages is not None and len(self._pages) + pages > self.max_pages:
            raise ResourceExhausted(f"export of {size_bytes} bytes on GPU {self.owner}: its Link TLB page table holds "
                                    f"{len(self._pages)} of {self.max_pages} pages; revoke windows first")
        first_vpage, first_ppage = self._next_page, phys_offset // ps
        self._next_page += pages + 1  # one unmapped guard page between windows
        window = Window(self._next_id, self.owner, first_vpage * ps + in_page, size_bytes, phys_offset,
                        allowed, partition, writable, readable)
        self._next_id += 1
        for k in range(pages):
            self._pages[first_vpage + k] = (first_ppage + k, window.window_id)
        self.windows[window.window_id] = window
        return window

    def unmap(self, address: int) -> Window:
        """Revoke the window that starts at `address`; cached pages are shot down too."""
        window = next((w for w in self.windows.values() if w.address == address), None)
        if window is None:
            raise AccessViolation(f"revoke of {address:#x} on GPU {self.owner}: no live window starts there")
        del self.windows[window.window_id]
        self.revoked[window.window_id] = window
        if len(self.revoked) > REVOKED_KEPT:
            self.revoked.popitem(last=False)
        first = window.address // self.page_size
        for vpage in range(first, -(-(window.address + window.size_bytes) // self.page_size)):
            del self._pages[vpage]
            self._cache.pop(vpage, None)
        return window

    def translate(self, address: int, nbytes: int, requester: int, requester_partition: int,
                  write: bool) -> int:
        """Physical offset for an access of `nbytes` at `address` by GPU `requester`; AccessViolation if refused."""
        op = "write" if write else "read"
        what = f"Link TLB of GPU {self.owner}: {op} of {nbytes} bytes at {address:#x} by GPU {requester}"
        ps = self.page_size
        last = address + max(nbytes, 1) - 1
        window_id: int | None = None
        for vpage in range(address // ps, last // ps + 1):
            entry = self._lookup(vpage)
            if entry is None:
                self.faults += 1
                revoked = next((w for w in self.revoked.values()
                                if w.address <= address < w.address + w.size_bytes), None)
                if revoked is not None:
                    raise AccessViolation(f"{what}: {revoked.describe()} was revoked")
                raise AccessViolation(f"{what}: address {vpage * ps:#x} is not mapped")
            if window_id is None:
                window_id = entry[1]
            elif entry[1] != window_id:
                self.faults += 1
                raise AccessViolation(f"{what}: range crosses from one window into another")
        window = self.windows[cast(int, window_id)]  # the loop ran at least once (max(nbytes, 1))
        reason = None
        if address < window.address or last >= window.address + window.size_bytes:
            reason = f"out of bounds of {window.describe()}"
        elif requester_partition != window.partition:
            reason = f"GPU {requester} is in partition {requester_partition}, the window in {window.partition}"
        elif requester not in window.allowed:
            reason = f"GPU {requester} is not in the allowed set {sorted(window.allowed)} of {window.describe()}"
        elif write and not window.writable or not write and not window.readable:
            reason = f"{window.describe()} is not {'writable' if write else 'readable'}"
        if reason:
            self.faults += 1
            raise AccessViolation(f"{what}: {reason}")
        return window.phys_offset + (address - window.address)

    def _lookup(self, vpage: int) -> tuple[int, int] | None:
        if vpage in self._cache:
            self._cache.move_to_end(vpage)
            self.hits += 1
            return self._pages[vpage]
        entry = self._pages.get(vpage)
        if entry is not None:
            self.misses += 1
            self._cache[vpage] = None
            if len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        return entry

    def stats(self) -> dict[str, int]:
        return {"tlb_hits": self.hits, "tlb_misses": self.misses, "tlb_faults": self.faults}
