"""Ingress checks of a leaf: what a GPU may send (every header field in range, checked before its payload
is taken or anything is looked up), how long its stamp may say its bytes take, whether its payload is
the header's, and the trust check of a load-reduce's slot. Pure functions of the config and the packet."""

import math

import numpy as np

from ..config import FabricConfig, Timing
from ..errors import AccessViolation, ProtocolError
from ..groups import Group
from ..packets import WIRE_INT_MAX, Kind, LoadInfo, Packet, raw_bytes

# what a GPU may send to its switch; NACK, LOAD, REPLY and SHUTDOWN are the switch's own
FROM_GPU = frozenset({Kind.PUT, Kind.PUT_ACK, Kind.GET, Kind.GET_DATA, Kind.MSG, Kind.REDUCE, Kind.MCAST,
                      Kind.LOAD_REDUCE, Kind.EXPORT, Kind.REVOKE, Kind.GROUP, Kind.TRACE, Kind.DONE,
                      Kind.COUNTERS})
NO_BYTES = np.empty(0, np.uint8)  # the payload of a transfer of 0 bytes


def check_header(config: FabricConfig, ingress: int, packet: Packet) -> None:
    """ProtocolError unless `packet`, arriving from GPU `ingress`, is one a GPU may send, with every
    field in range; checked before its payload is taken or anything is looked up."""
    limit = config.memory_capacity_bytes  # the largest transfer a GPU may send or request: its whole memory
    what = f"{packet.kind.name} from GPU {ingress}"
    if packet.kind not in FROM_GPU:
        raise ProtocolError(f"{what}: only the switch sends {packet.kind.name} packets")
    if not 0 <= packet.nbytes <= limit:
        raise ProtocolError(f"{what}: {packet.nbytes} bytes is more than a GPU's {limit} "
                            f"bytes of memory")
    if not 0 <= packet.address <= WIRE_INT_MAX - packet.nbytes:
        raise ProtocolError(f"{what}: address {packet.address:#x}+{packet.nbytes} is outside the 64-bit space")
    if not 0 <= packet.req <= WIRE_INT_MAX:
        raise ProtocolError(f"{what}: request number {packet.req} is negative")
    if not (math.isfinite(packet.t_start) and math.isfinite(packet.t_end)
            and 0 <= packet.t_start <= packet.t_end):
        raise ProtocolError(f"{what}: modeled times {packet.t_start}..{packet.t_end} ns are not "
                            f"0 <= start <= end")


def checked_payload(ingress: int, packet: Packet, payload: np.ndarray | None) -> np.ndarray | None:
    """The bytes to carry on for `packet` of GPU `ingress`: `payload` if its kind carries one (an empty
    array for 0 bytes), else None; ProtocolError if their number is not the header's."""
    if packet.kind.has_payload:
        if payload is None and packet.nbytes == 0:
            payload = NO_BYTES
        if payload is None or payload.nbytes != packet.nbytes:
            raise ProtocolError(f"{packet.kind.name} from GPU {ingress}: header says {packet.nbytes} "
                                f"bytes, {None if payload is None else payload.nbytes} came")
        return payload
    return None  # bytes beside a header that carries none go nowhere


def bounded_stamp(config: FabricConfig, timing: Timing, packet: Packet) -> Packet:
    """`packet` (from a GPU, checked) with its last byte at most its bytes' time on a GPU link after
    its first (ns; `timing`: config.timing, which the config builds anew at each read): a GPU's stamp
    is its word on when its transfer left it, not on how long the transfer occupies the links after
    it. An honest GPU's stamp is exactly that long; a longer one would book the links between
    switches, which every tenant's transfers share, for as long as the GPU liked."""
    raw = raw_bytes(packet.payload_bytes, config.mtu_bytes, config.header_bytes)
    longest = packet.t_start + raw / timing.bandwidth_gbytes_per_s
    if packet.t_end <= longest * (1 + 1e-9):  # rounding of an honest stamp's start + duration
        return packet
    return packet.but(t_end=longest)


def check_requester(ingress: int, group: Group, info: LoadInfo) -> None:
    """AccessViolation unless GPU `ingress`'s load-reduce names its rank in `group` second in its slot (after
    the call's seq: nvls.py's (seq, r, c, r + c), hier's node RS (seq, position, phase, slice, chunk),
    hier_plan.leaf_slot). Every member files the LOADs of a slot under the slot alone, so a member that
    asked another's slot first would take over its answer (and the other's request would wait for ever),
    on one switch as across nodes."""
    rank = group.members.index(ingress)
    if len(info.slot) < 2 or info.slot[1] != rank:
        raise AccessViolation(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: a "
                              f"load-reduce names its requester's rank {rank} in the group second in its slot")
