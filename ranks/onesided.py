"""A GPU's one-sided access through the switch: puts and gets of a window (NVLink Network) or a physical address
(classic), what they wait for, and the refusals they raise."""

from typing import cast

import numpy as np

from nvlink_emu.fabric import errors
from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.errors import AccessViolation, FabricError, UnsupportedOperation
from nvlink_emu.fabric.packets import WIRE_INT_MAX, Kind, NackInfo, Packet
from nvlink_emu.fabric import reduction

from .callcheck import is_integer


def raise_remote(error: str, message: str, context: str):
    """Re-raise an error the switch reported (a fabric.errors class name and its message), as that class."""
    cls = getattr(errors, error, FabricError)
    if not (isinstance(cls, type) and issubclass(cls, FabricError)):
        cls = FabricError
    raise cls(f"{context}: {message}")


class OneSided:
    """The puts and gets of `gpu` (its facade: gpu.put, gpu.get, gpu.fence), which lends it its packet sends
    (send(packet, payload=None) -> requests), its check of an array's bytes (as_bytes(array, op, written)), its
    request numbers (next_request()) and the replies it files (req -> packet). puts: req -> what, until
    acknowledged; gets: req -> destination bytes, until data arrives; got_ns: GET req -> modeled arrival of its
    data; acked_ns: the latest acknowledgement of a put (modeled); refusals: refusals of puts not raised yet;
    beside_end: a put's last byte out, when it went beside a channelled call."""

    def __init__(self, gpu, key: int, send, as_bytes, next_request, replies: dict):
        self.gpu, self.key = gpu, key
        self.send, self.as_bytes, self.next_request, self.replies = send, as_bytes, next_request, replies
        self.beside_end: float | None = None
        self.puts: dict[int, str] = {}
        self.gets: dict[int, np.ndarray] = {}
        self.got_ns: dict[int, float] = {}
        self.acked_ns = 0.0
        self.refusals: list[FabricError] = []

    def put(self, target, array: np.ndarray, offset: int = 0) -> None:
        """gpu.put: write `array`'s bytes at byte `offset` of `target`; returns once `array` may be reused."""
        gpu = self.gpu
        gpu.stream.drain()
        self.raise_refused()
        data = self.as_bytes(array, "put")
        dst, address = self.destination(target, offset, data.nbytes, "put")
        sends, self.beside_end = [], None
        for start, stop in self.chunks(data.nbytes):
            req = self.next_request()
            self.puts[req] = f"put to {describe(target)}"
            sends.append(self.send(Packet(Kind.PUT, self.key, dst, address + start, stop - start, req),
                                   data[start:stop]))
        gpu.wait_sent(sends, "put")
        # the data has left: `array` may be reused; beside a channelled call, once its own bytes left (not the call's)
        gpu.now_ns = max(gpu.now_ns, gpu.sent_ns if self.beside_end is None else self.beside_end)

    def get(self, target, array: np.ndarray, offset: int = 0) -> None:
        """gpu.get: read `array.nbytes` bytes at byte `offset` of `target` into `array`."""
        gpu = self.gpu
        gpu.stream.drain()
        self.raise_refused()
        data = self.as_bytes(array, "get", written=True)
        dst, address = self.destination(target, offset, data.nbytes, "get")
        reqs = []
        for start, stop in self.chunks(data.nbytes):
            req = self.next_request()
            self.gets[req] = data[start:stop]
            self.send(Packet(Kind.GET, self.key, dst, address + start, stop - start, req))
            reqs.append(req)
        owner = getattr(target, "owner", "the target")
        gpu.wait(lambda: all(r not in self.gets for r in reqs), "get", f"GPU {owner}")
        gpu.now_ns = max([gpu.now_ns] + [self.got_ns.pop(r, 0.0) for r in reqs])
        for req in reqs:
            nack = self.replies.pop(req, None)
            if nack is not None:
                raise_remote(nack.info.error, nack.info.message, f"GPU {gpu.rank}: get from {describe(target)}")

    def fence(self) -> None:
        """gpu.fence: return when every put is visible at its target; raise any refusal."""
        self.gpu.wait(lambda: not self.puts, "fence", "acknowledgements of puts")
        self.gpu.now_ns = max(self.gpu.now_ns, self.acked_ns)
        self.raise_refused()

    # -- what the switch sends back (Gpu._handle) ---------------------------------------------------
    def acked(self, req: int, arrived_ns: float) -> None:
        """The PUT_ACK of put packet `req` arrived at `arrived_ns`: its bytes are visible at the target."""
        self.puts.pop(req, None)
        self.acked_ns = max(self.acked_ns, arrived_ns)

    def take_get(self, req: int) -> np.ndarray | None:
        """The bytes GET packet `req` reads into, no longer awaited; None if this GPU made no such request."""
        return self.gets.pop(req, None)

    def got(self, req: int, arrived_ns: float) -> None:
        """GET packet `req`'s data arrived at `arrived_ns`."""
        self.got_ns[req] = arrived_ns

    def sent_beside(self, end_ns: float) -> None:
        """A put packet's last byte left at `end_ns` on a lane of its own beside a channelled call."""
        self.beside_end = max(end_ns, self.beside_end or end_ns)

    def refused(self, packet: Packet, arrived_ns: float) -> FabricError | None:
        """A NACK arrived at `arrived_ns`. A put's refusal is what its fence waits for, and is raised at the
        next put, get or fence; a get's is its answer (filed as its reply); any other (a refusal of the GPU's
        other traffic) is returned, for its next wait to raise."""
        req = packet.req
        if req in self.puts:
            self.acked_ns = max(self.acked_ns, arrived_ns)
        elif req in self.gets:
            self.got_ns[req] = arrived_ns
        what = self.puts.pop(req, None)
        if req in self.gets:
            del self.gets[req]
            self.replies[req] = packet
            return None
        info = cast(NackInfo, packet.info)
        try:
            raise_remote(info.error, info.message, f"GPU {self.gpu.rank}: {what or info.kind}")
        except FabricError as exc:
            if what:
                self.refusals.append(exc)
                return None
            return exc
        return None

    def raise_refused(self) -> None:
        """Raise the first refusal of a put not raised yet (counting the others)."""
        if self.refusals:
            first, rest = self.refusals[0], len(self.refusals) - 1
            self.refusals = []
            if rest:
                raise type(first)(f"{first} (and {rest} more refused)")
            raise first

    def destination(self, target, offset: int, nbytes: int, op: str) -> tuple[int, int]:
        """(dst routing key, address) of a put/get of `nbytes` at byte `offset` of `target`; checked
        before anything is sent or left pending."""
        gpu = self.gpu
        if not is_integer(offset) or offset < 0:
            raise FabricError(f"GPU {gpu.rank}: {op} offset must be a non-negative integer of bytes, got {offset!r}")
        offset = int(offset)
        if gpu.config.mode == "network":
            if not isinstance(target, Handle):
                raise UnsupportedOperation(f"GPU {gpu.rank}: {op} on NVLink Network needs a Handle from "
                                           f"export(), got {target!r}")
            dst, base = target.network_address, target.address
            if not (is_integer(dst) and is_integer(base) and 0 <= dst <= WIRE_INT_MAX):
                raise FabricError(f"GPU {gpu.rank}: {op} to {target!r}: not a handle export() returned")
        elif isinstance(target, Handle) and gpu.config.windows:  # a registered window of classic nodes
            dst, base = target.network_address, target.address
            if not (is_integer(dst) and is_integer(base) and 0 <= dst < gpu.size):
                raise FabricError(f"GPU {gpu.rank}: {op} to {target!r}: not a handle export() returned")
        else:
            if isinstance(target, Handle) or not is_integer(target):
                raise UnsupportedOperation(f"GPU {gpu.rank}: {op} on classic NVLink takes a physical address "
                                           f"(gpu.physical_address(array)), got {target!r}")
            dst, base = -1, target
        address = int(base) + offset
        if not 0 <= address <= WIRE_INT_MAX - nbytes:
            raise AccessViolation(f"GPU {gpu.rank}: {op} of {nbytes} bytes at {address:#x} ({describe(target)} + "
                                  f"offset {offset}): outside the 64-bit address space")
        return int(dst), address

    def chunks(self, nbytes: int) -> list[tuple[int, int]]:
        """The (start, stop) byte ranges of a put/get: packets of at most config.chunk_bytes (one if empty)."""
        return reduction.chunks(0, nbytes, self.gpu.config.chunk_bytes) or [(0, 0)]


def describe(target) -> str:
    return str(target) if isinstance(target, Handle) else f"physical {int(target):#x}"
