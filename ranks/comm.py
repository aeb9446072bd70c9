"""Communicators of GPUs: the out-of-band control exchange (barrier, allgather_object, split) and the
collectives, which run as real traffic through the switch (algorithms in ranks/collectives)."""

import itertools
from contextlib import contextmanager

import numpy as np

from nvlink_emu.fabric.errors import AccessViolation, CollectiveMismatch, FabricError, UnsupportedOperation
from nvlink_emu.fabric.packets import CallRecord, GroupInfo, Kind
from nvlink_emu.fabric.reduction import blocks, check_dtype, check_op, dtype_name

from . import collectives
from .collectives import all2all as pairwise


def is_integer(value) -> bool:
    """Whether an argument is an integer, Python's or numpy's (a bool is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Communicator:
    """A group of GPUs. rank: this GPU's index in the group; size: members; members: GPU indices in
    rank order; name: a string unique to this communicator on every member.

    Control operations (barrier, allgather_object, split, the call check before every collective)
    travel out of band, like the sockets real programs use to swap handles: not NVLink traffic, not
    counted on links. Collectives move their data through the switch and are counted.
    """

    def __init__(self, gpu, members: tuple[int, ...], name: str):
        self.gpu = gpu
        self.members = tuple(members)
        self.size = len(self.members)
        self.rank = self.members.index(gpu.rank)
        self.name = name
        # one sequence for every operation, control or collective: each call takes exactly one number
        # on every member, so members stay in step even after a call that failed its check
        self._seq = itertools.count()
        self._group: int | None = None
        gpu._communicators[name] = self.members  # control messages of non-members are dropped

    # -- control plane ------------------------------------------------------------------------------
    def allgather_object(self, obj, op: str = "allgather_object") -> list:
        """Every member's `obj`, in member order (out of band, not counted). Members must be in the same
        control operation (`op`): a barrier met by an allgather is a CollectiveMismatch. Objects are
        plain values, tuples, sets, Handles, numpy arrays and scalars (fabric.control's encoding)."""
        return self._exchange(obj, op, next(self._seq))

    def _exchange(self, obj, op: str, seq: int) -> list:
        """allgather_object as operation number `seq` of this communicator."""
        gpu = self.gpu
        for peer in self.members:
            if peer != gpu.rank:
                gpu._control.send(peer, (self.name, seq, (op, obj)))
        box = gpu._control_box

        def missing():
            return [p for p in self.members if p != gpu.rank and (self.name, seq, p) not in box]

        gpu._wait(lambda: not missing(), f"{op} #{seq} on communicator {self.name!r}",
                  _LazyText(lambda: f"GPUs {missing()}"))
        got = [(op, obj) if p == gpu.rank else gpu.take_control(self.name, seq, p) for p in self.members]
        got = [g if type(g) is tuple and len(g) == 2 else ("(not a control exchange)", None) for g in got]
        if any(other != op for other, _ in got):
            listing = "; ".join(f"GPU {p}: {other}" for p, (other, _) in zip(self.members, got))
            raise CollectiveMismatch(f"GPU {gpu.rank}: control exchange #{seq} on communicator {self.name!r}: "
                                     f"members are in different operations: {listing}")
        return [value for _, value in got]

    def barrier(self) -> None:
        """Wait until every member reached the barrier; this GPU's puts are fenced first. Every member
        leaves at the latest member's modeled time (the barrier itself is modeled as free)."""
        self.gpu.fence()
        self.gpu.now_ns = max(self.allgather_object(self.gpu.now_ns, "barrier"))

    def split(self, color, key=None) -> "Communicator | None":
        """A new communicator of the members that pass the same `color`, ordered by (key, rank);
        color None leaves this GPU out (returns None). Collective over this communicator."""
        seq = next(self._seq)
        choices = self._exchange((color, self.rank if key is None else key), "split", seq)
        if color is None:
            return None
        chosen = sorted((k, rank) for rank, (c, k) in enumerate(choices) if c == color)
        members = tuple(self.members[rank] for _, rank in chosen)
        return Communicator(self.gpu, members, f"{self.name}.{seq}:{color}")

    def group_id(self) -> int:
        """This communicator's multicast/SHARP group in the switch, created and bound on first use
        (collective: every member calls it at the same collective)."""
        if self._group is None:
            created = None
            if self.rank == 0:
                try:
                    created = self.gpu._control_call(Kind.GROUP, GroupInfo("create", 0, self.members, self.name),
                                                     f"group create for communicator {self.name!r}")["group"]
                except FabricError as exc:
                    created = exc  # every member raises it, none is left waiting
            created = self.allgather_object(created, "group create")[0]
            if isinstance(created, FabricError):
                raise type(created)(f"{created} (raised on GPU {self.members[0]}, the communicator's first member)")
            gid = created
            self.gpu._control_call(Kind.GROUP, GroupInfo("bind", gid, (), ""), f"group bind {gid}")
            self.allgather_object(None, "group bind")  # every member bound before any contribution
            self._group = gid
        return self._group

    def release_group(self) -> None:
        """Release this communicator's multicast/SHARP group in the switch (collective)."""
        if self._group is not None:
            self.allgather_object(None, "group release")
            if self.rank == 0:
                self.gpu._control_call(Kind.GROUP, GroupInfo("release", self._group, (), ""),
                                       f"group release {self._group}")
            self._group = None

    # -- collectives --------------------------------------------------------------------------------
    def allreduce(self, array: np.ndarray, op: str = "sum", algorithm: str = "auto") -> None:
        """Reduce `array` over every member with `op` (sum, avg, max, min, prod), in place."""
        with self._arguments("allreduce"):
            flat = self._flat(array, "allreduce", written=True)
        self._collective("allreduce", algorithm, op, flat.dtype, flat.size, None, (flat,))

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str = "sum", algorithm: str = "auto") -> None:
        """recv <- block `rank` of the reduction of every member's `send` (blocks as fabric.reduction.blocks)."""
        with self._arguments("reduce_scatter"):
            send, recv = self._flat(send, "reduce_scatter send"), self._flat(recv, "reduce_scatter recv", written=True)
        problem = (self._same_dtype(send, recv, "reduce_scatter")
                   or self._expect(recv.size, blocks(send.size, self.size)[self.rank], "reduce_scatter recv"))
        self._collective("reduce_scatter", algorithm, op, send.dtype, send.size, None, (send, recv), problem=problem)

    def allgather(self, send: np.ndarray, recv: np.ndarray, algorithm: str = "auto") -> None:
        """recv <- every member's `send`, concatenated in rank order."""
        with self._arguments("allgather"):
            send, recv = self._flat(send, "allgather send"), self._flat(recv, "allgather recv", written=True)
        problem = (self._same_dtype(send, recv, "allgather")
                   or self._expect(send.size, blocks(recv.size, self.size)[self.rank], "allgather send"))
        self._collective("allgather", algorithm, "sum", send.dtype, recv.size, None, (send, recv), problem=problem)

    def broadcast(self, array: np.ndarray, root: int = 0, algorithm: str = "auto") -> None:
        """array <- the root member's array, on every member."""
        with self._arguments("broadcast"):
            flat = self._flat(array, "broadcast", written=True)
            if not is_integer(root) or not 0 <= root < self.size:
                raise FabricError(f"GPU {self.gpu.rank}: broadcast root {root!r} is not a member rank 0..{self.size - 1}")
        root = int(root)
        self._collective("broadcast", algorithm, "sum", flat.dtype, flat.size, root, (flat, root))

    def all2all(self, send: np.ndarray, recv: np.ndarray) -> None:
        """recv block i <- member i's send block `rank`; send and recv hold `size` equal blocks."""
        with self._arguments("all2all"):
            send, recv = self._flat(send, "all2all send"), self._flat(recv, "all2all recv", written=True)
            if send.size != recv.size or send.size % self.size:
                raise FabricError(f"GPU {self.gpu.rank}: all2all needs send and recv of equal size, a multiple of "
                                  f"{self.size} members (got {send.size}, {recv.size}); use all2allv for uneven blocks")
        counts = [send.size // self.size] * self.size
        self._all2allv("all2all", send, counts, recv, counts)

    def all2allv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        """recv block i (recv_counts[i] elements, packed in order) <- member i's send block `rank`
        (its send_counts[rank] elements, packed in order)."""
        with self._arguments("all2allv"):
            send, recv = self._flat(send, "all2allv send"), self._flat(recv, "all2allv recv", written=True)
            counts = []
            for what, given in (("send_counts", send_counts), ("recv_counts", recv_counts)):
                if not all(is_integer(c) for c in given):
                    raise FabricError(f"GPU {self.gpu.rank}: all2allv {what} must be integers, got {list(given)!r}")
                counts.append([int(c) for c in given])
        self._all2allv("all2allv", send, counts[0], recv, counts[1])

    def _all2allv(self, name, send, send_counts, recv, recv_counts) -> None:
        problem = self._same_dtype(send, recv, name)
        for what, counts, array in (("send", send_counts, send), ("recv", recv_counts, recv)):
            if len(counts) != self.size or min(counts, default=0) < 0 or sum(counts) > array.size:
                problem = (f"{name} {what}_counts {counts} must be {self.size} non-negative counts summing to at "
                           f"most {array.size}")
                send_counts = recv_counts = [0] * self.size  # still take part in the call check
        self._collective(name, "direct", "sum", send.dtype, sum(send_counts), None,
                         (send, pairwise.offsets(send_counts), send_counts, recv, pairwise.offsets(recv_counts),
                          recv_counts), counts=(send_counts, recv_counts), problem=problem)

    def _collective(self, name, algorithm, op, dtype, count, root, args, counts=None, problem=None) -> None:
        """Check, then run one collective. `problem`: what is wrong with this member's own buffers,
        carried in the call check so that every member raises, not just this one."""
        gpu = self.gpu
        with self._arguments(name):
            try:
                dtype = check_dtype(dtype)
                check_op(op)
            except FabricError as exc:
                raise FabricError(f"GPU {gpu.rank}: {name}: {exc}") from None
            if counts is None:
                try:
                    algorithm = collectives.choose(name, algorithm, gpu.config, count * dtype.itemsize, self.size)
                except UnsupportedOperation as exc:
                    raise UnsupportedOperation(f"GPU {gpu.rank}: {exc}") from None
            partitions = sorted({gpu.config.partition_of(m) for m in self.members})
            if len(partitions) > 1:
                raise AccessViolation(f"GPU {gpu.rank}: {name} on communicator {self.name!r}: its members "
                                      f"{list(self.members)} span partitions {partitions}; partitions are isolated, "
                                      f"so collectives run within one (use comm.split by partition)")
        seq = next(self._seq)
        call = {"collective": name, "count": count if counts is None else None, "dtype": dtype_name(dtype),
                "op": op, "root": root, "algorithm": algorithm, "seq": seq, **({"problem": problem} if problem else {})}
        fingerprint = {"name": name, "comm": self.name, "seq": seq, "algorithm": algorithm, "count": count,
                       "dtype": dtype_name(dtype), "op": op, "members": self.size}
        # begin before the call check: no peer sends this call's data before it has our call, so every
        # byte of the call reaches this GPU between begin and end (a call failing the check has no end)
        gpu.event({"ev": "coll_begin", **fingerprint})
        start_ns, before = gpu.now_ns, gpu.link_counters()
        calls = self._exchange((call, counts), f"{name} call check", seq)
        self._check_calls(name, seq, calls)
        if count or counts is not None:
            if algorithm in collectives.IN_SWITCH:
                self.group_id()  # collective: every member, even one with an empty block, takes part
            work = collectives.Call(self, seq, op, dtype)
            if counts is not None:
                pairwise.all2allv(work, *args)
            else:
                collectives.run(algorithm, name, work, *args)
        gpu.event({"ev": "coll_end", **fingerprint})
        after = gpu.link_counters()
        gpu.record_call(CallRecord(self.name, seq, name, algorithm, count, dtype_name(dtype), op, root, self.size,
                                   float(start_ns), float(gpu.now_ns), after["tx_bytes"] - before["tx_bytes"],
                                   after["rx_bytes"] - before["rx_bytes"]))

    def _check_calls(self, name, seq, calls) -> None:
        """CollectiveMismatch on every member, listing each member's call, before any data moves."""
        fingerprints = [c for c, _ in calls]
        problem = None
        own = [(m, c["problem"]) for m, (c, _) in zip(self.members, calls) if c.get("problem")]
        if own:
            problem = "; ".join(f"GPU {m}'s {text}" for m, text in own)
        elif any(f != fingerprints[0] for f in fingerprints):
            problem = "members called different collectives or arguments"
        elif calls[0][1] is not None:
            sends = [c[1][0] for c in calls]
            recvs = [c[1][1] for c in calls]
            bad = [(i, j) for i in range(self.size) for j in range(self.size) if sends[i][j] != recvs[j][i]]
            if bad:
                i, j = bad[0]
                problem = (f"member {i} sends {sends[i][j]} elements to member {j}, which expects "
                           f"{recvs[j][i]}")
        if problem:
            listing = "; ".join(f"GPU {self.members[i]}: {c}" + (f" counts {cnt}" if cnt else "")
                                for i, (c, cnt) in enumerate(calls))
            raise CollectiveMismatch(f"GPU {self.gpu.rank}: {name} #{seq} on communicator {self.name!r}: "
                                     f"{problem}: {listing}")

    @contextmanager
    def _arguments(self, name: str):
        """Check this member's own arguments of collective `name`. An invalid one still takes part in
        the call check, so that every member fails at once instead of waiting for it to the deadline
        (they raise CollectiveMismatch naming it); then it raises its own error here."""
        try:
            yield
        except FabricError as exc:
            seq = next(self._seq)
            call = {"collective": name, "seq": seq, "problem": f"{type(exc).__name__}: {exc}"}
            self._exchange((call, None), f"{name} call check", seq)
            raise

    def _flat(self, array: np.ndarray, what: str, written: bool = False) -> np.ndarray:
        """`array` as one dimension; `written`: the collective writes into it."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise FabricError(f"GPU {self.gpu.rank}: {what} needs a contiguous numpy array, got "
                              f"{type(array).__name__ if not isinstance(array, np.ndarray) else 'a strided view'}")
        if written and not array.flags.writeable:
            raise FabricError(f"GPU {self.gpu.rank}: {what} is a read-only array; the collective writes into it")
        return array.reshape(-1)

    def _expect(self, got: int, block: tuple[int, int], what: str) -> str | None:
        """What is wrong with a buffer's size, if anything (reported to every member by the call check)."""
        if got != block[1] - block[0]:
            return f"{what} has {got} elements; member {self.rank} of {self.size} needs {block[1] - block[0]}"
        return None

    def _same_dtype(self, a: np.ndarray, b: np.ndarray, what: str) -> str | None:
        """What is wrong with the buffers' dtypes, if anything (reported to every member)."""
        return f"{what} send is {a.dtype}, recv is {b.dtype}" if a.dtype != b.dtype else None


class _LazyText:
    """A string computed only when printed (the missing set is known only at the deadline)."""

    def __init__(self, make):
        self._make = make

    def __str__(self):
        return self._make()

    __format__ = lambda self, spec: format(str(self), spec)
