"""Packets: immutable headers with one explicit wire format per kind (msgpack), segmentation at the MTU.

A packet's payload travels beside its header (the transport sends the numpy bytes as they are), so a
header never copies data. One header stands for a burst of MTU-sized packets of one transfer: the
wire carries the burst as one message, and the counters count the packets and header bytes the
fabric would carry (see `segments`).

Every kind that carries fields beyond the fixed header has its own frozen record (`MsgInfo`,
`ReduceInfo`, ...), sent as a msgpack array in field order and checked field by field on decode,
so a receiver only ever sees a well-typed record (or a `ProtocolError`). REPLY and SHUTDOWN carry a
free map: only the switch sends them, and a GPU accepts packets from its switch alone.
"""

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Self, cast

import msgpack

from .errors import ProtocolError

WIRE_INT_MIN, WIRE_INT_MAX = -(2 ** 63), 2 ** 64 - 1  # msgpack's integer range
MAX_KEY_PARTS = 16      # parts of a message key (collective keys have at most 7)
MAX_TEXT = 4096         # characters of a string field (names, dtypes, error messages)
MAX_LIST = 4096         # entries of a list field (GPU lists, slots)
# A switch takes a header of at most MAX_HEADER_BYTES from any rank (ranks/switch.py). It re-encodes what it
# passes on, and that can be longer than what the GPU sent: msgpack packs an integer in 1 to 9 bytes and a
# number in 1 (a small int) to 9 (a float64). The switches write src (the ingress port's routing key: +8
# bytes at most), dst and address (a request translated at its target's leaf: +8 each), nbytes (a leaf's
# partial of 16-bit floats has twice its members' bytes: +4), the two modeled times (always float64: +8
# each) and a group's id (a create's 0 in the span the leaf sends the spines: +8); the rest (kind, req, the
# records: canonical msgpack) only shrinks. That is 52 bytes at most, once: the next switch's copy has them
# at full length already (tests/unit/test_switch_cross_node_attack.py measures each kind). So a GPU's
# header past MAX_GPU_HEADER_BYTES is refused at its leaf: whatever the switches make of one, the next takes.
MAX_HEADER_BYTES = 1 << 16     # a header from any rank to a switch (the longest honest one: ~48 KiB, COUNTERS)
HEADER_GROWTH_BYTES = 64       # most the switches' re-encoding adds to a GPU's header (52, above), rounded up
MAX_GPU_HEADER_BYTES = MAX_HEADER_BYTES - HEADER_GROWTH_BYTES


class Kind(enum.IntEnum):
    # data plane: crosses links and is counted
    PUT = 1          # write `nbytes` at `address` of `dst`; payload = the bytes
    PUT_ACK = 2      # the target wrote request `req`
    GET = 3          # read `nbytes` at `address` of `dst`
    GET_DATA = 4     # the bytes read for request `req`; payload = the bytes
    NACK = 5         # the switch refused request `req` (NackInfo)
    MSG = 6          # traffic to a peer GPU's mailbox slot (MsgInfo)
    REDUCE = 7       # a contribution to an in-switch reduction (ReduceInfo)
    MCAST = 8        # a multicast store: the switch copies the payload out of every member port (McastInfo)
    LOAD_REDUCE = 9  # NVLS load-reduce: ask the switch for the reduction of a range of members' buffers (LoadInfo)
    LOAD = 10        # the switch reads a range of a member's bound buffer (LoadInfo; answered by a REDUCE)
    # control plane: fabric-manager traffic, not NVLink data, never counted
    EXPORT = 20      # map a window in this GPU's Link TLB (ExportInfo)
    REVOKE = 21      # unmap it (RevokeInfo)
    REPLY = 22       # answer to EXPORT / REVOKE / group calls: a map with the result or the error
    GROUP = 23       # multicast/SHARP group lifecycle: create, bind, release (GroupInfo)
    TRACE = 24       # turn the switch's trace records on or off (TraceInfo)
    CREDIT = 25      # between leaves: nbytes > 0 returns that many bytes of GPU src's port to the leaf of
                     # GPU dst; nbytes 0 asks the leaf of GPU dst for the credit of its port (ranks/switch.py);
                     # from a leaf to GPU dst: asks for the mailbox credit of GPU src's messages (ranks/gpu.py)
    DONE = 30        # this GPU's script returned and its requests completed
    SHUTDOWN = 31    # every GPU is done: report counters and leave (a map: the run's report)
    COUNTERS = 32    # a GPU's counters, in answer to SHUTDOWN (CountersInfo)

    @property
    def counted(self) -> bool:
        """Whether the packet crosses an NVLink link (and so is counted)."""
        return self < Kind.EXPORT

    @property
    def has_payload(self) -> bool:
        return self in _WITH_PAYLOAD


_WITH_PAYLOAD = frozenset({Kind.PUT, Kind.GET_DATA, Kind.MSG, Kind.REDUCE, Kind.MCAST})
_KIND_OF = {int(kind): kind for kind in Kind}  # Kind(n) without the enum's lookup machinery (per packet)
_NUMBER = (int, float)
_SEQUENCE = (list, tuple)


# -- field checkers: each returns the field's value in its canonical type or raises ProtocolError ----
class _Bad(Exception):
    pass


def _int(v: object) -> int:
    if type(v) is not int:
        raise _Bad(f"an integer, got {type(v).__name__}")
    return v


def _num(v: Any) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise _Bad(f"a finite number, got {v!r}")
    return float(v)


def _bool(v: object) -> bool:
    if type(v) is not bool:
        raise _Bad(f"true or false, got {type(v).__name__}")
    return v


def _text(v: object) -> str:
    if type(v) is not str or len(v) > MAX_TEXT:
        raise _Bad(f"a string of at most {MAX_TEXT} characters, got {type(v).__name__}")
    return v


def _ints(v: Any) -> tuple[int, ...]:
    if type(v) not in _SEQUENCE or len(v) > MAX_LIST:
        raise _Bad(f"a list of at most {MAX_LIST} integers, got {v!r:.80}")
    for x in v:  # a loop, not all(...) over a generator: every header of the collectives has one or two
        if type(x) is not int:
            raise _Bad(f"a list of at most {MAX_LIST} integers, got {v!r:.80}")
    return tuple(v)


def _key(v: Any) -> tuple[int | str, ...]:
    """A message key: a flat tuple of ints and strings."""
    if type(v) not in _SEQUENCE or len(v) > MAX_KEY_PARTS:
        raise _Bad(f"a flat list of at most {MAX_KEY_PARTS} integers and strings, got {v!r:.80}")
    for x in v:
        if type(x) is not int and (type(x) is not str or len(x) > MAX_TEXT):
            raise _Bad(f"a flat list of at most {MAX_KEY_PARTS} integers and strings, got {v!r:.80}")
    return tuple(v)


def _optional_ints(v: object) -> tuple[int, ...] | None:
    return None if v is None else _ints(v)


def _optional_int(v: object) -> int | None:
    return None if v is None else _int(v)


def _links(v: Any) -> dict[str, dict[str, float]]:
    """A GPU's link counters: {link name: {counter: number}}."""
    if type(v) is not dict or len(v) > MAX_LIST:
        raise _Bad("a map of links")
    for name, stats in v.items():
        _text(name)
        if type(stats) is not dict or not all(type(k) is str and type(x) in (int, float) and math.isfinite(x)
                                              for k, x in stats.items()):
            raise _Bad(f"link {name!r}: a map of counters to numbers")
    return v


def _keys(v: Any) -> list[list[int | str]]:
    if type(v) not in (list, tuple) or len(v) > MAX_LIST:
        raise _Bad("a list of message keys")
    return [list(_key(k)) for k in v]


def _map(v: object) -> dict[Any, Any]:
    if type(v) is not dict:
        raise _Bad(f"a map, got {type(v).__name__}")
    return v


def _calls(v: Any) -> tuple["CallRecord", ...]:
    """A list of CallRecord wire forms, each checked field by field."""
    if type(v) not in (list, tuple) or len(v) > MAX_LIST:
        raise _Bad(f"a list of at most {MAX_LIST} call records")
    records: list[CallRecord] = []
    for i, values in enumerate(v):
        try:
            records.append(CallRecord.from_wire(Kind.COUNTERS, values))
        except ProtocolError as exc:  # name the record and its field, not the whole header again
            raise _Bad(f"a list of call records; record {i}: {str(exc).split(': ', 1)[-1]}") from None
    return tuple(records)


def _check(kind: "Kind", name: str, checker: Callable[[Any], object], value: object) -> object:
    try:
        return checker(value)
    except _Bad as bad:
        raise ProtocolError(f"malformed {kind.name} header: field {name!r} must be {bad}") from None


def _field(checker: Callable[[Any], object]) -> Any:
    return field(metadata={"check": checker})


class Info:
    """Base of the per-kind records: wire form = the fields' values in declaration order."""

    def to_wire(self) -> list[object]:
        values = self.__dict__
        return [values[name] for name, _ in _fields_of(type(self))]

    @classmethod
    def from_wire(cls, kind: "Kind", values: object) -> Self:
        spec = _fields_of(cls)
        if type(values) is not list or len(values) != len(spec):
            raise ProtocolError(f"malformed {kind.name} header: its record needs {len(spec)} fields "
                                f"({', '.join(name for name, _ in spec)}), got {values!r:.80}")
        record = object.__new__(cls)  # its fields set as __init__ would, without a frozen __init__'s cost
        fields_ = record.__dict__
        try:
            for (name, check), value in zip(spec, values):
                fields_[name] = check(value)
        except _Bad as bad:
            raise ProtocolError(f"malformed {kind.name} header: field {name!r} must be {bad}") from None
        return record


_FIELDS: dict[type["Info"], tuple[tuple[str, Callable[[Any], object]], ...]] = {}


def _fields_of(cls: type["Info"]) -> tuple[tuple[str, Callable[[Any], object]], ...]:
    """(name, checker) of each of a record class's fields, looked up once per class (every packet decodes one)."""
    spec = _FIELDS.get(cls)
    if spec is None:
        # every Info subclass is a dataclass (Info itself has no fields and is never decoded)
        spec = _FIELDS[cls] = tuple((f.name, f.metadata["check"]) for f in fields(cls))  # type: ignore[arg-type]
    return spec


def _wire(value: object) -> object:
    """A field's wire form: nested records (CountersInfo's calls) as their own field lists."""
    if isinstance(value, Info):
        return value.to_wire()
    if isinstance(value, tuple) and value and isinstance(value[0], Info):
        return [item.to_wire() for item in value]
    return value


@dataclass(frozen=True)
class MsgInfo(Info):
    key: tuple[int | str, ...] = _field(_key)  # the receiver's mailbox slot (matched with the sender's GPU index)


@dataclass(frozen=True)
class McastInfo(Info):
    group: int = _field(_int)            # the multicast group it goes through (deliveries name it too)
    key: tuple[int | str, ...] = _field(_key)            # the receivers' slot, matched with the group


@dataclass(frozen=True)
class ReduceInfo(Info):
    group: int = _field(_int)            # the SHARP group reducing it
    slot: tuple[int, ...] = _field(_ints)          # which reduction of the group (collective seq, block, chunk...)
    op: str = _field(_text)              # sum, avg, max, min, prod
    dtype: str = _field(_text)           # element type of the payload
    dest: tuple[int, ...] = _field(_ints)          # GPU indices the result goes to
    key: tuple[int | str, ...] = _field(_key)            # the result's slot at the destinations


@dataclass(frozen=True)
class LoadInfo(Info):
    group: int = _field(_int)
    slot: tuple[int, ...] = _field(_ints)
    op: str = _field(_text)
    dtype: str = _field(_text)
    dest: tuple[int, ...] = _field(_ints)
    key: tuple[int | str, ...] = _field(_key)
    source: tuple[int | str, ...] = _field(_key)         # the members' bound buffer to load from (NVLS)

    def contribution(self) -> ReduceInfo:
        """The record of a member's REDUCE answering this LOAD."""
        return ReduceInfo(self.group, self.slot, self.op, self.dtype, self.dest, self.key)


@dataclass(frozen=True)
class NackInfo(Info):
    error: str = _field(_text)           # a fabric.errors class name
    message: str = _field(_text)
    kind: str = _field(_text)            # the refused packet's kind


@dataclass(frozen=True)
class ExportInfo(Info):
    phys_offset: int = _field(_int)      # bytes, in the exporting GPU's memory
    size_bytes: int = _field(_int)
    to: tuple[int, ...] | None = _field(_optional_ints)  # GPU indices allowed; None: the exporter's partition
    writable: bool = _field(_bool)
    readable: bool = _field(_bool)


@dataclass(frozen=True)
class RevokeInfo(Info):
    network_address: int = _field(_int)
    address: int = _field(_int)


@dataclass(frozen=True)
class GroupInfo(Info):
    action: str = _field(_text)          # create, bind, release
    group: int = _field(_int)            # bind, release: the group; create: 0
    members: tuple[int, ...] = _field(_ints)       # create: GPU indices in communicator rank order
    name: str = _field(_text)            # create: the communicator's name, the first part of its keys


@dataclass(frozen=True)
class TraceInfo(Info):
    on: bool = _field(_bool)


@dataclass(frozen=True)
class CallRecord(Info):
    """One collective call as a member GPU saw it (its own word, like its clock): part of CountersInfo."""

    comm: str = _field(_text)            # the communicator's name
    seq: int = _field(_int)              # the call's number on that communicator
    collective: str = _field(_text)      # allreduce, all2all, ...
    algorithm: str = _field(_text)       # the one that ran (auto resolved)
    count: int = _field(_int)            # elements, as in the call check
    dtype: str = _field(_text)
    op: str = _field(_text)
    root: int | None = _field(_optional_int)  # broadcast's root member; None for the others
    members: int = _field(_int)
    m_start_ns: float = _field(_num)     # the call's modeled start on this GPU (an i-form's: its request's)
    m_end_ns: float = _field(_num)       # and end
    tx_bytes: int = _field(_int)         # payload this GPU sent on its uplink during the call
    rx_bytes: int = _field(_int)         # and received on its downlink


@dataclass(frozen=True)
class CountersInfo(Info):
    links: dict[str, dict[str, float]] = _field(_links)         # this GPU's link counters (LinkCounters.snapshot)
    unconsumed: list[list[int | str]] = _field(_keys)     # message slots received but never consumed
    now_ns: float = _field(_num)         # its final modeled clock
    calls: tuple[CallRecord, ...] = _field(_calls)  # CallRecords of its first collective calls (see ranks.calllog.CALL_RECORD_BYTES)
    calls_unrecorded: int = _field(_int)  # its collective calls past those

    def to_wire(self) -> list[object]:
        return [_wire(getattr(self, name)) for name, _ in _fields_of(CountersInfo)]  # calls: records nested


INFO_OF: dict[Kind, type[Info]] = {
           Kind.NACK: NackInfo, Kind.MSG: MsgInfo, Kind.REDUCE: ReduceInfo, Kind.MCAST: McastInfo,
           Kind.LOAD_REDUCE: LoadInfo, Kind.LOAD: LoadInfo, Kind.EXPORT: ExportInfo, Kind.REVOKE: RevokeInfo,
           Kind.GROUP: GroupInfo, Kind.TRACE: TraceInfo, Kind.COUNTERS: CountersInfo}
FREE_MAP = frozenset({Kind.REPLY, Kind.SHUTDOWN})  # switch-only kinds with a free map (or nothing)
_PACKER = msgpack.Packer(use_bin_type=True)  # msgpack.packb's, made once (packb makes one per call)


@dataclass(frozen=True)
class Packet:
    """One header. `dst` is a routing key: a network address (network mode), a GPU index (classic
    mode) or -1 (classic request: route by the physical `address`; requests to the switch itself).
    `src` is set by the switch to the ingress port's routing key, so a GPU cannot claim to be another.
    `nbytes` is the payload length, or the requested length of a GET / LOAD_REDUCE. `info` is the
    kind's record (INFO_OF), a map (REPLY, SHUTDOWN) or None."""

    kind: Kind
    src: int
    dst: int
    address: int = 0
    nbytes: int = 0
    req: int = 0
    info: object = field(default=None, hash=False, compare=True)
    t_start: float = 0.0  # modeled ns: first byte ready at the packet's current point
    t_end: float = 0.0    # modeled ns: last byte ready there
    # bytes of payload that travel with this header, set from kind and nbytes; an attribute, not a property:
    # the switch asks for it about 15 times per packet (`but` copies it, and changes neither kind nor nbytes)
    payload_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        record = INFO_OF.get(self.kind)
        if record is not None and not isinstance(self.info, record):
            raise TypeError(f"a {self.kind.name} packet carries a {record.__name__}, not {self.info!r:.80}")
        object.__setattr__(self, "payload_bytes", self.nbytes if self.kind in _WITH_PAYLOAD else 0)

    def to_wire(self) -> bytes:
        info = self.info.to_wire() if isinstance(self.info, Info) else self.info
        return cast(bytes, _PACKER.pack((int(self.kind), self.src, self.dst, self.address, self.nbytes, self.req,
                             info, float(self.t_start), float(self.t_end))))

    @classmethod
    def from_wire(cls, data: bytes | bytearray | memoryview) -> "Packet":
        """The packet `data` encodes; ProtocolError for anything that is not a well-formed header."""
        try:
            kind, src, dst, address, nbytes, req, info, t_start, t_end = msgpack.unpackb(
                data, raw=False, strict_map_key=False)
            number, kind = kind, _KIND_OF.get(kind) if type(kind) is int else None
            if kind is None:
                raise ValueError(f"{number!r} is not a valid Kind")
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"undecodable packet header ({len(data)} bytes): {exc}") from None
        if (type(src) is not int or type(dst) is not int or type(address) is not int or type(nbytes) is not int
                or type(req) is not int or nbytes < 0 or type(t_start) not in _NUMBER or type(t_end) not in _NUMBER):
            raise ProtocolError(f"malformed {kind.name} header: src, dst, address, nbytes, req must be integers "
                                f"(nbytes >= 0) and the times numbers, got {(src, dst, address, nbytes, req)} "
                                f"{t_start!r} {t_end!r}")
        record = INFO_OF.get(kind)
        if record is not None:
            info = record.from_wire(kind, info)
        elif kind in FREE_MAP:
            if info is not None:
                info = _check(kind, "info", _map, info)
        elif info is not None:
            raise ProtocolError(f"malformed {kind.name} header: this kind carries no record, got {info!r:.80}")
        # the fields as __init__ and __post_init__ set them (info is the kind's record: checked above),
        # without a frozen dataclass's __init__: the switch decodes every packet
        packet = object.__new__(cls)
        packet.__dict__.update(kind=kind, src=src, dst=dst, address=address, nbytes=nbytes, req=req, info=info,
                               t_start=float(t_start), t_end=float(t_end),
                               payload_bytes=nbytes if kind in _WITH_PAYLOAD else 0)
        return packet

    def but(self, **changes: object) -> "Packet":
        """This packet with some of src, dst, address, t_start, t_end changed (dataclasses.replace, without
        its cost: every forwarded packet is copied two or three times on the switches' hot path)."""
        new = object.__new__(Packet)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return new


def segments(payload_bytes: int, mtu_bytes: int) -> int:
    """Packets a transfer of `payload_bytes` takes on a link: ceil(payload / MTU), at least one."""
    return max(1, -(-payload_bytes // mtu_bytes))


def raw_bytes(payload_bytes: int, mtu_bytes: int, header_bytes: int) -> int:
    """Bytes on the wire for a transfer: payload plus one header per packet."""
    return payload_bytes + max(1, -(-payload_bytes // mtu_bytes)) * header_bytes
