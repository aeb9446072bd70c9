"""Device memory of one GPU: a uint8 numpy array and a first-fit allocator with alignment and free."""

import numpy as np
import numpy.typing as npt

from .errors import ConfigError, FabricError, OutOfMemory


class DeviceMemory:
    """One GPU's memory: `capacity_bytes` of uint8, handed out as typed views by alloc()."""

    def __init__(self, gpu: int, capacity_bytes: int, alignment_bytes: int = 256):
        self.gpu = gpu
        self.capacity_bytes = capacity_bytes
        self.alignment_bytes = alignment_bytes
        # np.zeros maps pages lazily, so a large capacity costs host memory only where it is touched; a
        # host that will not map that much (more than its memory and swap, under Linux's overcommit
        # heuristic) refuses at once: a config error, named, not numpy's
        try:
            self.array = np.zeros(capacity_bytes, dtype=np.uint8)
        except MemoryError:
            raise ConfigError(f"memory_capacity_bytes: GPU {gpu}'s {capacity_bytes} bytes cannot be mapped on "
                              f"this host (more than it can allocate); lower memory_capacity_bytes") from None
        self._free: list[tuple[int, int]] = [(0, capacity_bytes)]  # sorted (offset, size) holes
        self._used: dict[int, int] = {}  # offset -> size of live allocations

    @property
    def free_bytes(self) -> int:
        """Bytes not allocated (possibly fragmented)."""
        return sum(size for _, size in self._free)

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def allocate(self, nbytes: int) -> int:
        """Offset (bytes) of a new block of `nbytes`, aligned to alignment_bytes; OutOfMemory if none fits."""
        if nbytes < 0:
            raise FabricError(f"GPU {self.gpu}: alloc of {nbytes} bytes: size must be >= 0")
        size = max(_round_up(nbytes, self.alignment_bytes), self.alignment_bytes)
        for index, (offset, hole) in enumerate(self._free):
            if hole >= size:
                if hole == size:
                    del self._free[index]
                else:
                    self._free[index] = (offset + size, hole - size)
                self._used[offset] = size
                return offset
        largest = max((hole for _, hole in self._free), default=0)
        raise OutOfMemory(
            f"GPU {self.gpu}: alloc of {nbytes} bytes does not fit: {self.free_bytes} bytes free "
            f"(largest block {largest}) of {self.capacity_bytes}; each GPU has its own memory, "
            f"NVLink does not merge VRAM across GPUs")

    def release(self, offset: int) -> None:
        """Return the block at `offset` to the free list, merging neighbours."""
        size = self._used.pop(offset, None)
        if size is None:
            raise FabricError(f"GPU {self.gpu}: free of offset {offset:#x}: not the start of a live allocation")
        self._free.append((offset, size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for off, sz in self._free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + sz)
            else:
                merged.append((off, sz))
        self._free = merged

    def view(self, offset: int, count: int, dtype: npt.DTypeLike) -> np.ndarray:
        """A typed view of `count` elements at byte `offset`."""
        dtype = np.dtype(dtype)
        return self.array[offset:offset + count * dtype.itemsize].view(dtype)

    def offset_of(self, array: np.ndarray) -> int:
        """Byte offset of `array` inside this memory; FabricError if it is not a contiguous view of it."""
        if not isinstance(array, np.ndarray):
            raise FabricError(f"GPU {self.gpu}: expected an array from gpu.alloc, got {type(array).__name__}")
        base = self.array.__array_interface__["data"][0]
        start: int = array.__array_interface__["data"][0] - base  # addresses: ints
        if not array.flags.c_contiguous or start < 0 or start + array.nbytes > self.capacity_bytes:
            raise FabricError(f"GPU {self.gpu}: array is not a contiguous view of this GPU's memory "
                              f"(allocate it with gpu.alloc)")
        return start

    def allocation_at(self, offset: int) -> tuple[int, int] | None:
        """(start, size) of the live allocation that contains byte `offset`, if any."""
        for start, size in self._used.items():
            if start <= offset < start + size:
                return start, size
        return None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
