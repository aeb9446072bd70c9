"""A GPU's buffers bound for the switch's LOADs (NVLS): the switch load-reduces them through a multicast group, and
the GPU serves each LOAD in program order from the buffer bound under its key."""

from typing import Any, cast

import numpy as np

from nvlink_emu.fabric.errors import AccessViolation
from nvlink_emu.fabric.packets import LoadInfo, Packet

GIVEN_UP_KEPT = 64  # bound buffers a GPU gave up (take) whose late LOADs it still refuses at once


class BoundBuffers:
    """GPU `rank`'s bound buffers and the LOADs filed for them. unserved(load): the GPU tells the switch it will
    not serve `load` (a control notice)."""

    def __init__(self, rank: int, unserved):
        self.rank, self.unserved = rank, unserved
        self.bound: dict[tuple, Any] = {}        # buffer key -> bytes the switch may LOAD (uint8 array)
        self.filed: dict[tuple, tuple] = {}       # (group, buffer key, slot) -> (LOAD, its downlink seq) until served
        self.given_up: dict[tuple, None] = {}     # (group, buffer key) a refused LOAD gave up, latest last

    def bind(self, key: tuple, data) -> None:
        self.bound[tuple(key)] = data

    def unbind(self, key: tuple) -> None:
        """Unbind `key`; one a refused LOAD gave up (take) is unbound already, and a program's cleanup after that
        refusal is no second error."""
        key = tuple(key)
        if key not in self.bound and any(given == key for _, given in self.given_up):
            return
        del self.bound[key]

    def file(self, packet: Packet, seq: int | None) -> None:
        """A LOAD came from the switch: filed until the program serves it, or refused at once if its buffer
        was given up."""
        info = cast(LoadInfo, packet.info)  # a LOAD carries a LoadInfo (Packet checks the record of its kind)
        if (info.group, info.source) in self.given_up:
            self.unserved(packet)
        else:
            self.filed[(info.group, info.source, info.slot)] = (packet, seq)

    def came(self, lookup: tuple) -> bool:
        """Whether the LOAD `lookup` (group, key, slot) came and waits to be served."""
        return lookup in self.filed

    def check(self, group: int, key: tuple, slot: tuple, requester: str) -> None:
        """AccessViolation if the buffer bound as `key` for `group` was given up."""
        if (group, tuple(key)) in self.given_up:
            raise AccessViolation(f"GPU {self.rank}: {requester}'s load-reduce (slot {list(slot)}): the buffer bound "
                                  f"as {list(key)} was given up after a LOAD past its end; not served")

    def take(self, lookup: tuple, requester: str) -> tuple[Packet, int | None, np.ndarray]:
        """(LOAD, seq, the bytes it reads) of the filed LOAD `lookup` (group, key, slot). A LOAD past the buffer's
        end (a requester's range, which the switch cannot check: it does not know the buffer) gives the buffer
        up: it is unbound, this LOAD and every other of it, come or to come, is answered with the notice
        "unserved" (so that each requester's leaf gives the request's budget back), and AccessViolation names
        this GPU, the requester, the slot and the bytes."""
        packet, seq = self.filed.pop(lookup)
        buffer, bound = lookup[:2], self.bound[lookup[1]]
        if packet.address + packet.nbytes > bound.nbytes:
            del self.bound[lookup[1]]
            self.given_up[buffer] = None
            if len(self.given_up) > GIVEN_UP_KEPT:
                del self.given_up[next(iter(self.given_up))]
            for filed in [k for k in self.filed if k[:2] == buffer]:
                self.unserved(self.filed.pop(filed)[0])
            self.unserved(packet)
            raise AccessViolation(f"GPU {self.rank}: {requester}'s load-reduce (slot {list(lookup[2])}) reads bytes "
                                  f"{packet.address}+{packet.nbytes} of a bound buffer of {bound.nbytes}; not served")
        return packet, seq, bound[packet.address:packet.address + packet.nbytes]
