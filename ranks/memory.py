"""A GPU's memory as its program uses it: the allocations in it (alloc, free) and the windows exported from them."""

import numpy as np

from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.memory import DeviceMemory

from .callcheck import is_integer


class Allocations:
    """GPU `rank`'s memory (`array`: all of it, uint8), the arrays alloc() returned and the windows exported."""

    def __init__(self, rank: int, config: FabricConfig):
        self.rank = rank
        self.device = DeviceMemory(rank, config.memory_capacity_bytes, config.alignment_bytes)
        self.array = self.device.array
        self.live: dict[int, tuple[np.ndarray, int]] = {}  # id(array) -> (the array alloc returned, offset)
        self.exports: list[tuple[int, int, Handle]] = []   # live windows: (physical offset, bytes, handle)

    def alloc(self, count: int, dtype="float32") -> np.ndarray:
        """A new array of `count` elements of `dtype`, a view into this GPU's memory."""
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise FabricError(f"GPU {self.rank}: alloc: {dtype!r} is not a numpy dtype") from None
        if dtype.hasobject or dtype.itemsize == 0:  # Python objects cannot live in device memory
            raise FabricError(f"GPU {self.rank}: alloc: dtype {dtype} has no fixed-size binary layout")
        if not is_integer(count) or count < 0:
            raise FabricError(f"GPU {self.rank}: alloc: count must be a non-negative integer, got {count!r}")
        offset = self.device.allocate(int(count) * dtype.itemsize)
        array = self.device.view(offset, int(count), dtype)
        self.live[id(array)] = (array, offset)
        return array

    def free(self, array: np.ndarray) -> None:
        """Release the array alloc() returned (that object itself, once); an exported array must be
        revoked first."""
        entry = self.live.get(id(array))
        if entry is None or entry[0] is not array:
            # by identity: an empty array's address, a view's or a freed array's, would name another block
            raise FabricError(f"GPU {self.rank}: free of an array that is not a live allocation (free takes "
                              f"the very array gpu.alloc returned, once)")
        offset = entry[1]
        block = self.device.allocation_at(offset)
        assert block is not None  # the offset of a live allocation
        end = block[0] + block[1]
        live = [h for start, size, h in self.exports if start < end and offset < start + size]
        if live:
            raise FabricError(f"GPU {self.rank}: free of memory still exported as {', '.join(map(str, live))}; "
                              f"revoke first")
        self.device.release(offset)
        del self.live[id(array)]

    @property
    def free_bytes(self) -> int:
        """Bytes of this GPU's memory not allocated."""
        return self.device.free_bytes

    def offset_of(self, array: np.ndarray) -> int:
        """Physical offset of `array` in this GPU's memory."""
        return self.device.offset_of(array)

    def exportable(self, array: np.ndarray) -> int:
        """The physical offset of `array`, which export() may name: not empty, inside one allocation."""
        offset = self.device.offset_of(array)
        if array.nbytes == 0:
            raise FabricError(f"GPU {self.rank}: export of an empty array")
        block = self.device.allocation_at(offset)
        if block is None or offset + array.nbytes > block[0] + block[1]:
            raise FabricError(f"GPU {self.rank}: export of memory at {offset:#x}+{array.nbytes} that is not "
                              f"inside one allocation (export what gpu.alloc returned, or a part of it)")
        return offset

    def exported(self, offset: int, nbytes: int, handle: Handle) -> None:
        """A window of `nbytes` at physical `offset` was exported as `handle` (free refuses its memory)."""
        self.exports.append((offset, nbytes, handle))

    def revoked(self, handle: Handle) -> None:
        """The window exported as `handle` was revoked."""
        self.exports = [e for e in self.exports if e[2] != handle]
