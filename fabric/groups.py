"""Multicast/SHARP groups in the switch: lifecycle (create, bind, release), the 128-group limit of
NVSwitch gen 3, and in-switch reductions combined in member order (never arrival order)."""

from dataclasses import dataclass, field

import numpy as np

from .errors import AccessViolation, CollectiveMismatch, FabricError, ResourceExhausted
from .reduction import check_dtype, combine, finish, switch_accumulator
from .timemodel import ReductionClock

MAX_GROUPS = 128  # NVSwitch gen 3: up to 128 concurrent SHARP groups


@dataclass
class Group:
    group_id: int
    members: tuple[int, ...]           # GPU indices in communicator rank order: the combine order
    name: str = ""                     # the communicator's name: every key of the group starts with it
    partition: int = 0                 # the partition its members are in
    bound: set[int] = field(default_factory=set)
    engine: ReductionClock | None = None  # modeled time of the group's reductions

    @property
    def ready(self) -> bool:
        return len(self.bound) == len(self.members)


@dataclass
class Reduction:
    """One in-flight in-switch reduction slot: contributions held until every member's is in."""

    op: str
    dtype: np.dtype
    nbytes: int
    delivery: tuple            # (destination GPUs, result key): every contribution must agree
    parts: dict[int, np.ndarray] = field(default_factory=dict)  # member index -> bytes
    first_ns: float = 0.0      # the latest first byte of a contribution (modeled)
    last_ns: float = 0.0       # the latest last byte of a contribution (modeled)


class GroupTable:
    """The switch's groups and the reductions in flight in them."""

    def __init__(self, limit: int = MAX_GROUPS):
        self.limit = limit
        self.groups: dict[int, Group] = {}
        self.reductions: dict[tuple, Reduction] = {}
        # held contributions per partition, kept as they change (a scan per packet would let many
        # small held reductions slow the switch for everyone): partition -> [bytes, contributions]
        self._held: dict[int, list[int]] = {}
        self._next_id = 1
        self.created = self.released = 0
        self.reduced_bytes = 0  # bytes of contributions combined in the switch

    def create(self, members: tuple[int, ...], requester: int, name: str = "", partition: int = 0) -> int:
        if len(self.groups) >= self.limit:
            raise ResourceExhausted(f"GPU {requester}: cannot create a multicast/SHARP group for GPUs "
                                    f"{list(members)}: the switch holds {len(self.groups)} groups, its limit is "
                                    f"{self.limit}; release one first")
        if requester not in members or len(set(members)) != len(members):
            raise FabricError(f"GPU {requester}: group members {list(members)} must be distinct and include it")
        group = Group(self._next_id, tuple(members), name, partition)
        self.groups[group.group_id] = group
        self._next_id += 1
        self.created += 1
        return group.group_id

    def group(self, group_id: int, gpu: int, what: str, bound: bool = False) -> Group:
        """Group `group_id`, which GPU `gpu` must be a member of (`bound`: a bound member);
        AccessViolation otherwise."""
        group = self.groups.get(group_id)
        if group is None:
            raise AccessViolation(f"{what} by GPU {gpu}: no live group {group_id}")
        if gpu not in group.members:
            raise AccessViolation(f"{what} by GPU {gpu}: not a member of group {group_id} "
                                  f"(members {list(group.members)})")
        if bound and gpu not in group.bound:
            raise AccessViolation(f"{what} by GPU {gpu}: it has not bound group {group_id}")
        return group

    def bind(self, group_id: int, gpu: int) -> None:
        self.group(group_id, gpu, "bind").bound.add(gpu)

    def release(self, group_id: int, gpu: int) -> None:
        self.group(group_id, gpu, "release")
        group = self.groups.pop(group_id)
        for key in [k for k in self.reductions if k[0] == group_id]:
            self._hold(group.partition, self.reductions.pop(key), -1)
        self.released += 1

    def engine(self, group_id: int, timing) -> ReductionClock:
        """The group's reduction engine clock (created on first use)."""
        group = self.groups[group_id]
        if group.engine is None:
            group.engine = ReductionClock(timing.reduction_gbytes_per_s, timing.reduction_latency_ns)
        return group.engine

    def contribute(self, group_id: int, slot: tuple, gpu: int, op: str, dtype: str, data: np.ndarray,
                   delivery: tuple = (), times: tuple[float, float] = (0.0, 0.0),
                   hold_limit_bytes: int | None = None, hold_limit_parts: int | None = None) -> tuple | None:
        """Hold GPU `gpu`'s contribution to `slot` (its first/last byte at `times`, modeled ns); once
        every member's is in, (the finished result, the agreed `delivery`: whom it goes to and under
        which key, (latest first byte, latest last byte)). ResourceExhausted if holding it would take
        the group's partition past `hold_limit_bytes` or `hold_limit_parts` of held contributions."""
        group = self.group(group_id, gpu, "in-switch reduction")
        if not group.ready:
            raise AccessViolation(f"in-switch reduction by GPU {gpu}: group {group_id} is not bound by all "
                                  f"members yet ({sorted(group.bound)} of {list(group.members)})")
        dtype = check_dtype(dtype)
        if data.nbytes % dtype.itemsize:
            raise FabricError(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu} sent {data.nbytes} "
                              f"bytes, not a whole number of {dtype} elements")
        key = (group_id, *slot)
        state = self.reductions.setdefault(key, Reduction(op, dtype, data.nbytes, delivery))
        if (state.op, state.nbytes, state.dtype, state.delivery) != (op, data.nbytes, dtype, delivery):
            raise CollectiveMismatch(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu} sent "
                                     f"{op}/{dtype}/{data.nbytes} B to {delivery}, others {state.op}/{state.dtype}/"
                                     f"{state.nbytes} B to {state.delivery}")
        index = group.members.index(gpu)
        if index in state.parts:
            raise CollectiveMismatch(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu} "
                                     f"contributed twice")
        held, parts = self._held.get(group.partition, (0, 0))
        if len(state.parts) + 1 < len(group.members) and (
                (hold_limit_bytes is not None and held + data.nbytes > hold_limit_bytes)
                or (hold_limit_parts is not None and parts + 1 > hold_limit_parts)):
            if not state.parts:
                del self.reductions[key]
            raise ResourceExhausted(f"in-switch reduction slot {slot} of group {group_id}: GPU {gpu}'s {data.nbytes} "
                                    f"bytes do not fit partition {group.partition}'s share of the in-switch buffer "
                                    f"({hold_limit_bytes} bytes and {hold_limit_parts} contributions; {held} bytes "
                                    f"in {parts} held)")
        state.parts[index] = data
        state.first_ns = max(state.first_ns, times[0])
        state.last_ns = max(state.last_ns, times[1])
        if len(state.parts) < len(group.members):
            self._hold(group.partition, data, +1)
            return None
        del self.reductions[key]
        self._hold(group.partition, state, -1, but=index)
        return self._reduce(state, len(group.members)), state.delivery, (state.first_ns, state.last_ns)

    def _reduce(self, state: Reduction, members: int) -> np.ndarray:
        # member order 0..n-1, in the switch's accumulator dtype (float32 for 16-bit floats)
        acc = state.parts[0].view(state.dtype).astype(switch_accumulator(state.dtype), copy=True)
        for index in range(1, members):
            combine(state.op, acc, state.parts[index].view(state.dtype).astype(acc.dtype, copy=False))
        out = np.empty(acc.shape, state.dtype)
        finish(state.op, acc, members, out)
        self.reduced_bytes += state.nbytes * members
        return out.view(np.uint8)

    def _hold(self, partition: int, what, sign: int, but: int | None = None) -> None:
        """Count a contribution (an array) or a reduction's held contributions (but member `but`'s,
        which was never held) in (+1) or out (-1) of `partition`'s held total."""
        parts = [what] if isinstance(what, np.ndarray) else [p for i, p in what.parts.items() if i != but]
        totals = self._held.setdefault(partition, [0, 0])
        totals[0] += sign * sum(p.nbytes for p in parts)
        totals[1] += sign * len(parts)

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
