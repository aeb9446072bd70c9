"""Multicast/SHARP groups in the switch: lifecycle (create, bind, release), the 128-group limit of
NVSwitch gen 3, and in-switch reductions combined in member order (never arrival order).

A group that spans several nodes has a copy in every switch it spans (fabric.switch): at each leaf
its inputs are the node's members, in communicator rank order, and the leaf's result is a *partial*,
the accumulator (float32 for float16/bfloat16) unfinished; at each spine its inputs are the leaves of
the group's nodes, in node order, their partials arrive in the accumulator dtype, and the spine
finishes (avg divides by every member of the group, once; 16-bit floats round once)."""

from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import numpy as np

from .errors import AccessViolation, CollectiveMismatch, FabricError, ResourceExhausted
from .reduction import check_dtype, combine, finish, switch_accumulator
from .config import Timing
from .timemodel import ReductionClock

V = TypeVar("V")  # ByGroup's values
T = TypeVar("T")  # ByGroup.pop's default
Key = tuple[Any, ...]  # a ByGroup's or a reduction slot's key: the group id first

MAX_GROUPS = 128  # NVSwitch gen 3: up to 128 concurrent SHARP groups


@dataclass
class Group:
    group_id: int
    members: tuple[int, ...]           # GPU indices in communicator rank order: the combine order
    name: str = ""                     # the communicator's name: every key of the group starts with it
    partition: int = 0                 # the partition its members are in
    bound: set[int] = field(default_factory=set)
    engine: ReductionClock | None = None  # modeled time of the group's reductions
    # who contributes here, in combine order: the members (one node), the node's members (a leaf of a
    # group spanning nodes) or leaf switch indices (a spine); None: the members
    inputs: tuple[int, ...] = None  # type: ignore[assignment]  # None: the members, set by __post_init__
    stage: str = "whole"               # whole: one switch; leaf: partials up; spine: partials in, finished

    def __post_init__(self) -> None:
        if self.inputs is None:
            self.inputs = self.members
        if self.stage == "spine":
            self.bound = set(self.inputs)  # leaves are trusted switches: nothing to bind

    @property
    def ready(self) -> bool:
        return self.bound >= set(self.inputs)


@dataclass
class Reduction:
    """One in-flight in-switch reduction slot: contributions held until every member's is in."""

    op: str
    dtype: np.dtype
    nbytes: int
    delivery: tuple[Any, ...]  # (destination GPUs, result key): every contribution must agree
    parts: dict[int, np.ndarray] = field(default_factory=dict)  # member index -> bytes
    first_ns: float = 0.0      # the latest first byte of a contribution (modeled)
    last_ns: float = 0.0       # the latest last byte of a contribution (modeled)


class ByGroup(dict[Key, V]):
    """A dict whose keys are tuples that start with a group id, which also keeps each group's keys, so
    that a group's release touches only what that group holds (`of`), not every tenant's entries.
    V: the type of its values (for the type checker; at run time a plain dict subclass)."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[int, dict[Key, None]] = {}  # gid -> its keys, in insertion order

    def __setitem__(self, key: Key, value: V) -> None:
        if key not in self:
            self._keys.setdefault(key[0], {})[key] = None
        super().__setitem__(key, value)

    def __delitem__(self, key: Key) -> None:
        super().__delitem__(key)
        keys = self._keys[key[0]]
        del keys[key]
        if not keys:
            del self._keys[key[0]]

    @overload
    def pop(self, key: Key) -> V: ...

    @overload
    def pop(self, key: Key, default: T, /) -> V | T: ...

    def pop(self, key: Key, *default: Any) -> Any:
        if key in self:
            value = self[key]
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def setdefault(self, key: Key, default: V = None) -> V:  # type: ignore[assignment]  # None: a set's value
        if key not in self:
            self[key] = default
        return self[key]

    def add(self, key: Key) -> None:
        """As a set's add (a ByGroup used as a set of keys)."""
        self[key] = None  # type: ignore[assignment]  # a set's: ByGroup[None]

    def of(self, group_id: int) -> list[Key]:
        """Group `group_id`'s keys (a copy: the caller may delete them)."""
        return list(self._keys.get(group_id, ()))


class GroupTable:
    """The switch's groups and the reductions in flight in them."""

    def __init__(self, limit: int = MAX_GROUPS, step: int = 1, offset: int = 0):
        self.limit = limit
        self._step, self._offset = step, offset  # ids: k x step + offset (a leaf of `step` nodes: its index)
        self.groups: dict[int, Group] = {}
        self.reductions: dict[Key, Reduction] = {}
        # each group's keys in `reductions` (gid -> its keys, in order), so that a group's release touches
        # only its own slots, not every tenant's (a scan of every held slot made each release cost O(held))
        self._slots: dict[int, dict[Key, None]] = {}
        # held contributions per partition, kept as they change (a scan per packet would let many
        # small held reductions slow the switch for everyone): partition -> [bytes, contributions]
        self._held: dict[int, list[int]] = {}
        # what they count against the partition's share of the buffer: each at least slot_bytes (a held
        # slot takes switch memory, about 0.7 KiB measured, however few bytes it holds), partition -> bytes
        self.slot_bytes = 0
        self._charged: dict[int, int] = {}
        self._next_id = 1
        self.created = self.released = 0
        self.reduced_bytes = 0  # bytes of contributions combined in the switch

    def create(self, members: tuple[int, ...], requester: int, name: str = "", partition: int = 0,
               group_id: int | None = None, inputs: tuple[int, ...] | None = None, stage: str = "whole",
               who: str | None = None) -> int:
        """A new group (id: the next one, or `group_id`, a spanning group's id chosen at its first
        member's leaf); `who` names the requester in errors (default: GPU `requester`)."""
        who = who or f"GPU {requester}"
        if len(self.groups) >= self.limit:
            raise ResourceExhausted(f"{who}: cannot create a multicast/SHARP group for GPUs "
                                    f"{list(members)}: the switch holds {len(self.groups)} groups, its limit is "
                                    f"{self.limit}; release one first")
        if (stage != "spine" and requester not in members) or len(set(members)) != len(members):
            raise FabricError(f"{who}: group members {list(members)} must be distinct and include it")
        gid = self.next_id() if group_id is None else group_id
        if gid in self.groups:
            raise FabricError(f"{who}: group {gid} exists already")
        group = Group(gid, tuple(members), name, partition, inputs=inputs,  # type: ignore[arg-type]  # None: members
                      stage=stage)
        self.groups[gid] = group
        self.created += 1
        return gid

    def next_id(self) -> int:
        """A new group id (also for create(group_id=...)): k x step + offset, k = 1, 2, ... (a leaf of N
        nodes: step N, offset its index, so that ids never collide between leaves)."""
        gid = self._next_id * self._step + self._offset
        self._next_id += 1
        return gid

    def group(self, group_id: int, gpu: int, what: str, bound: bool = False) -> Group:
        """Group `group_id`, which GPU `gpu` must be a member of (`bound`: a bound member);
        AccessViolation otherwise."""
        group = self.groups.get(group_id)
        if group is None:
            raise AccessViolation(f"{what} by GPU {gpu}: no live group {group_id}")
        if gpu not in (group.inputs if group.stage == "spine" else group.members):
            raise AccessViolation(f"{what} by {_who(group, gpu)}: not a member of group {group_id} "
                                  f"(members {list(group.members)}, leaves {list(group.inputs)})"
                                  if group.stage == "spine" else
                                  f"{what} by GPU {gpu}: not a member of group {group_id} "
                                  f"(members {list(group.members)})")
        if bound and gpu not in group.bound:
            raise AccessViolation(f"{what} by GPU {gpu}: it has not bound group {group_id}")
        return group

    def bind(self, group_id: int, gpu: int) -> None:
        self.group(group_id, gpu, "bind").bound.add(gpu)

    def release(self, group_id: int, gpu: int) -> None:
        self.group(group_id, gpu, "release")
        group = self.groups.pop(group_id)
        for key in self._slots.pop(group_id, ()):
            self._hold(group.partition, self.reductions.pop(key), -1)
        self.released += 1

    def engine(self, group_id: int, timing: Timing) -> ReductionClock:
        """The group's reduction engine clock (created on first use)."""
        group = self.groups[group_id]
        if group.engine is None:
            group.engine = ReductionClock(timing.reduction_gbytes_per_s, timing.reduction_latency_ns)
        return group.engine

    def contribute(self, group_id: int, slot: tuple[int, ...], gpu: int, op: str, dtype: str | np.dtype,
                   data: np.ndarray, delivery: tuple[Any, ...] = (), times: tuple[float, float] = (0.0, 0.0),
                   hold_limit_bytes: int | None = None, hold_limit_parts: int | None = None
                   ) -> tuple[np.ndarray, tuple[Any, ...], tuple[float, float]] | None:
        """Hold GPU `gpu`'s contribution to `slot` (its first/last byte at `times`, modeled ns); once
        every member's is in, (the finished result, the agreed `delivery`: whom it goes to and under
        which key, (latest first byte, latest last byte)). ResourceExhausted if holding it would take
        the group's partition past `hold_limit_bytes` or `hold_limit_parts` of held contributions."""
        group = self.group(group_id, gpu, "in-switch reduction")
        if not group.ready:
            raise AccessViolation(f"in-switch reduction by GPU {gpu}: group {group_id} is not bound by all "
                                  f"members yet ({sorted(group.bound)} of {list(group.members)})")
        dtype = check_dtype(dtype)
        given = switch_accumulator(dtype) if group.stage == "spine" else dtype  # a partial: the accumulator
        if data.nbytes % given.itemsize:
            raise FabricError(f"in-switch reduction slot {slot} of group {group_id}: {_who(group, gpu)} sent "
                              f"{data.nbytes} bytes, not a whole number of {given} elements")
        key = (group_id, *slot)
        state = self.reductions.get(key)
        if state is None:
            state = self.reductions[key] = Reduction(op, dtype, data.nbytes, delivery)
            self._slots.setdefault(group_id, {})[key] = None
        if (state.op, state.nbytes, state.dtype, state.delivery) != (op, data.nbytes, dtype, delivery):
            raise CollectiveMismatch(f"in-switch reduction slot {slot} of group {group_id}: {_who(group, gpu)} sent "
                                     f"{op}/{dtype}/{data.nbytes} B to {delivery}, others {state.op}/{state.dtype}/"
                                     f"{state.nbytes} B to {state.delivery}")
        if gpu not in group.inputs:
            raise AccessViolation(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu} contributes to it "
                                  f"at another switch (its inputs here: {list(group.inputs)})")
        index = group.inputs.index(gpu)
        if index in state.parts:
            raise CollectiveMismatch(f"in-switch reduction slot {slot} of group {group_id}: {_who(group, gpu)} "
                                     f"contributed twice")
        held, parts = self._held.get(group.partition, (0, 0))
        charged = self._charged.get(group.partition, 0)
        if len(state.parts) + 1 < len(group.inputs) and (
                (hold_limit_bytes is not None and charged + max(data.nbytes, self.slot_bytes) > hold_limit_bytes)
                or (hold_limit_parts is not None and parts + 1 > hold_limit_parts)):
            if not state.parts:
                self._forget(key)
            raise ResourceExhausted(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu}'s {data.nbytes} "
                                    f"bytes do not fit partition {group.partition}'s share of the in-switch buffer "
                                    f"({hold_limit_bytes} bytes and {hold_limit_parts} contributions, each counted "
                                    f"at least {self.slot_bytes} bytes; {held} bytes in {parts} held, counted "
                                    f"{charged})")
        state.parts[index] = data
        state.first_ns = max(state.first_ns, times[0])
        state.last_ns = max(state.last_ns, times[1])
        if len(state.parts) < len(group.inputs):
            self._hold(group.partition, data, +1)
            return None
        self._forget(key)
        self._hold(group.partition, state, -1, but=index)
        return self._reduce(state, group), state.delivery, (state.first_ns, state.last_ns)

    def _reduce(self, state: Reduction, group: Group) -> np.ndarray:
        # input order 0..n-1, in the switch's accumulator dtype (float32 for 16-bit floats); a spine's
        # inputs are partials in that dtype already, a leaf's result stays one (finished at the spine)
        wide = switch_accumulator(state.dtype)
        inputs = len(group.inputs)
        given = wide if group.stage == "spine" else state.dtype
        acc = state.parts[0].view(given).astype(wide, copy=True)
        for index in range(1, inputs):
            combine(state.op, acc, state.parts[index].view(given).astype(wide, copy=False))
        self.reduced_bytes += state.nbytes * inputs
        if group.stage == "leaf":
            return acc.view(np.uint8)
        out = np.empty(acc.shape, state.dtype)
        finish(state.op, acc, len(group.members), out)
        return out.view(np.uint8)

    def _forget(self, key: Key) -> None:
        """Drop slot `key` (group id first) from `reductions` and its group's keys."""
        del self.reductions[key]
        keys = self._slots[key[0]]
        del keys[key]
        if not keys:
            del self._slots[key[0]]

    def _hold(self, partition: int, what: np.ndarray | Reduction, sign: int, but: int | None = None) -> None:
        """Count a contribution (an array) or a reduction's held contributions (but member `but`'s,
        which was never held) in (+1) or out (-1) of `partition`'s held total (and what they are
        counted against its share: each at least slot_bytes)."""
        parts = [what] if isinstance(what, np.ndarray) else [p for i, p in what.parts.items() if i != but]
        totals = self._held.setdefault(partition, [0, 0])
        totals[0] += sign * sum(p.nbytes for p in parts)
        totals[1] += sign * len(parts)
        self._charged[partition] = self._charged.get(partition, 0) + \
            sign * sum(max(p.nbytes, self.slot_bytes) for p in parts)

    @property
    def held_bytes(self) -> int:
        """Bytes of contributions the switch holds now."""
        return sum(held for held, _ in self._held.values())

    def held_by(self, partition: int) -> int:
        """Bytes of contributions the switch holds now for groups of `partition`."""
        return self._held.get(partition, (0, 0))[0]

    def count_in(self, partition: int) -> int:
        """Live groups of `partition`."""
        return sum(1 for g in self.groups.values() if g.partition == partition)


def _who(group: Group, source: int) -> str:
    """An input of `group` as errors name it: a leaf switch at a spine, a GPU elsewhere."""
    return f"leaf {source}" if group.stage == "spine" else f"GPU {source}"
