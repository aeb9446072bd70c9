"""Packets: immutable headers with an explicit wire format (msgpack), segmentation at the MTU.

A packet's payload travels beside its header (the transport sends the numpy bytes as they are), so a
header never copies data. One header stands for a burst of MTU-sized packets of one transfer: the
wire carries the burst as one message, and the counters count the packets and header bytes the
fabric would carry (see `segments`).
"""

import enum
from dataclasses import dataclass, field

import msgpack

from .errors import ProtocolError


class Kind(enum.IntEnum):
    # data plane: crosses links and is counted
    PUT = 1          # write `nbytes` at `address` of `dst`; payload = the bytes
    PUT_ACK = 2      # the target wrote request `req`
    GET = 3          # read `nbytes` at `address` of `dst`
    GET_DATA = 4     # the bytes read for request `req`; payload = the bytes
    NACK = 5         # the switch refused request `req`; info = {"error": class name, "message": text}
    MSG = 6          # collective traffic to a peer GPU's mailbox; info["key"] names the slot
    REDUCE = 7       # a contribution to an in-switch reduction; info names group, slot, op, dtype
    MCAST = 8        # a multicast store: the switch copies the payload out of every member port
    LOAD_REDUCE = 9  # NVLS load-reduce: ask the switch for the reduction of a range of members' buffers
    LOAD = 10        # the switch reads a range of a member's bound buffer (answered by a REDUCE)
    # control plane: fabric-manager traffic, not NVLink data, never counted
    EXPORT = 20      # map a window in this GPU's Link TLB
    REVOKE = 21      # unmap it
    REPLY = 22       # answer to EXPORT / REVOKE / group calls; info carries the result or the error
    GROUP = 23       # multicast/SHARP group lifecycle: create, bind, release
    TRACE = 24       # turn the switch's trace records on or off (info["on"])
    DONE = 30        # this GPU's script returned and its requests completed
    SHUTDOWN = 31    # every GPU is done: report counters and leave
    COUNTERS = 32    # a GPU's counters, in answer to SHUTDOWN

    @property
    def counted(self) -> bool:
        """Whether the packet crosses an NVLink link (and so is counted)."""
        return self < Kind.EXPORT

    @property
    def has_payload(self) -> bool:
        return self in _WITH_PAYLOAD


_WITH_PAYLOAD = frozenset({Kind.PUT, Kind.GET_DATA, Kind.MSG, Kind.REDUCE, Kind.MCAST})


@dataclass(frozen=True)
class Packet:
    """One header. `dst` is a routing key: a network address (network mode), a GPU index (classic
    mode) or -1 (classic request: route by the physical `address`). `src` is set by the switch to the
    ingress port's routing key, so a GPU cannot claim to be another. `nbytes` is the payload length,
    or the requested length of a GET."""

    kind: Kind
    src: int
    dst: int
    address: int = 0
    nbytes: int = 0
    req: int = 0
    info: dict = field(default=None, hash=False, compare=True)
    t_start: float = 0.0  # modeled ns: first byte ready at the packet's current point
    t_end: float = 0.0    # modeled ns: last byte ready there

    def to_wire(self) -> bytes:
        return msgpack.packb((int(self.kind), self.src, self.dst, self.address, self.nbytes, self.req,
                              self.info, float(self.t_start), float(self.t_end)), use_bin_type=True)

    @classmethod
    def from_wire(cls, data: bytes) -> "Packet":
        try:
            kind, src, dst, address, nbytes, req, info, t_start, t_end = msgpack.unpackb(
                data, raw=False, strict_map_key=False)
            kind = Kind(kind)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"undecodable packet header ({len(data)} bytes): {exc}") from None
        numbers = (src, dst, address, nbytes, req)
        if (not all(type(v) is int for v in numbers) or nbytes < 0 or not (info is None or isinstance(info, dict))
                or not all(type(t) in (int, float) for t in (t_start, t_end))):
            raise ProtocolError(f"malformed {kind.name} header: src, dst, address, nbytes, req must be integers "
                                f"(nbytes >= 0), info a map and the times numbers, got {numbers} "
                                f"{type(info).__name__} {t_start!r} {t_end!r}")
        return cls(kind, src, dst, address, nbytes, req, info, float(t_start), float(t_end))

    @property
    def payload_bytes(self) -> int:
        """Bytes of payload that travel with this header."""
        return self.nbytes if self.kind.has_payload else 0


def segments(payload_bytes: int, mtu_bytes: int) -> int:
    """Packets a transfer of `payload_bytes` takes on a link: ceil(payload / MTU), at least one."""
    return max(1, -(-payload_bytes // mtu_bytes))


def raw_bytes(payload_bytes: int, mtu_bytes: int, header_bytes: int) -> int:
    """Bytes on the wire for a transfer: payload plus one header per packet."""
    return payload_bytes + segments(payload_bytes, mtu_bytes) * header_bytes
