"""Communicators of GPUs: the out-of-band control exchange (barrier, allgather_object, split) and the
collectives, which run as real traffic through the switch (algorithms in ranks/collectives)."""

import collections
import hashlib
import itertools
from contextlib import contextmanager

import numpy as np

from nvlink_emu.fabric.errors import (AccessViolation, FabricError, ProtocolError,
                                      ResourceExhausted, UnsupportedOperation)
from nvlink_emu.fabric.packets import CallRecord, GroupInfo, Kind
from nvlink_emu.fabric.reduction import blocks, check_dtype, check_movable, check_op, dtype_name
from nvlink_emu.fabric.software import call_latency_ns
from nvlink_emu.fabric.tuner import all2all_algorithm  # noqa: F401 (re-exported: the tuner decides)

from nvlink_emu.fabric.plans import Plan, validate
from nvlink_emu.fabric.plans.format import has_credits

from . import collectives
from .collectives.plan import execute as run_plan
from .collectives import all2all as pairwise
from .callcheck import check_calls, is_integer
from .exchanges import exchange
from .requests import Request
from .transport import MemberComms, any_rank

PLAN_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all")  # what algorithm=Plan runs


REDUCING = frozenset({"allreduce", "reduce_scatter", "reduce"})  # the collectives that combine elements
# control numbers of sharp reduce's credits: far below the calls' (0, 1, ...) and group creation's
# (-1, -2, ...), so that a credit is never taken for either
CREDIT_SEQ = -(2 ** 62)
# communicators one GPU may be a member of at once: each holds two MPI communicators, and MPICH has
# 2048 context ids per process ("Too many communicators"), a few of which the run itself uses
MAX_COMMUNICATORS = 900
P2P_TAG_LIMIT = 2 ** 31  # tags of point-to-point messages are 0..2**31 - 1 (MPI guarantees at least 0..32767)


class Communicator:
    """A group of GPUs. rank: this GPU's index in the group; size: members; members: GPU indices in
    rank order; name: a string unique to this communicator on every member.

    Control operations (barrier, allgather_object, split, the call check before every collective)
    travel out of band, like the sockets real programs use to swap handles: not NVLink traffic, not
    counted on links. Each is one exchange by non-blocking MPI calls on an MPI communicator of the
    members alone (ranks.transport.Exchange), so no other GPU can take part in it. Collectives move
    their data through the switch and are counted.
    """

    def __init__(self, gpu, members: tuple[int, ...], name: str, mpi: MemberComms):
        self.gpu = gpu
        self.members = tuple(members)
        self.size = len(self.members)
        self.nodes = len({m // gpu.config.gpus_per_node for m in self.members})  # the nodes the members are in
        self.rank = self.members.index(gpu.rank)
        self.name = name
        self._mpi: MemberComms | None = mpi
        if (mpi.size, mpi.rank) != (self.size, self.rank):  # the MPI communicator is ours member for member
            raise ProtocolError(f"GPU {gpu.rank}: communicator {name!r}: MPI made rank {mpi.rank} of {mpi.size}, "
                                f"the members say {self.rank} of {self.size}")
        # one sequence for every operation, control or collective: each call takes exactly one number
        # on every member, so members stay in step even after a call that failed its check
        self._seq = itertools.count()
        # group creation runs inside a collective, whenever this GPU runs its pending requests: its
        # exchanges take numbers of their own (negative ones), on an MPI communicator of their own
        self._group_seq = itertools.count(-1, -1)
        self._group: int | None = None
        self._node_group: int | None = None  # hier's group of this member's node at its leaf (node_group_id)
        # point to point: messages sent to / received from (member, tag), numbering each pair's stream
        self._p2p_sent: collections.Counter = collections.Counter()
        self._p2p_received: collections.Counter = collections.Counter()
        # credits of rooted in-switch reductions (sharp reduce), numbered per sending GPU
        self._credits_sent = 0
        self._credits_taken: collections.Counter = collections.Counter()
        gpu.control.communicators[name] = self  # credits from non-members are dropped; freed at the end of the run

    @classmethod
    def world(cls, gpu, gpu_comm) -> "Communicator":
        """Every GPU (collective over all of them, at the start of the run); gpu_comm: the GPU ranks' MPI
        communicator, rank = GPU index."""
        return cls(gpu, tuple(range(gpu.size)), "world", MemberComms.dup(gpu_comm, _waiter(gpu)))

    @classmethod
    def partition_of(cls, gpu, gpu_comm) -> "Communicator":
        """This GPU's partition, its members taken from the config: collective over them alone (MPI's
        Comm_create_group), so no GPU outside the partition takes part in making it."""
        index = gpu.config.partition_of(gpu.rank)
        members = gpu.config.partitions[index]
        return cls(gpu, members, f"partition{index}", MemberComms.of_ranks(gpu_comm, members, _waiter(gpu)))

    def _live(self, op: str) -> MemberComms:
        if self._mpi is None:
            raise FabricError(f"GPU {self.gpu.rank}: {op} on communicator {self.name!r}, which was freed")
        return self._mpi

    # -- control plane ------------------------------------------------------------------------------
    def allgather_object(self, obj, op: str = "allgather_object") -> list:
        """Every member's `obj`, in member order (out of band, not counted). Members must be in the same
        control operation (`op`): a barrier met by an allgather is a CollectiveMismatch. Objects are
        plain values, tuples, sets, Handles, numpy arrays and scalars (fabric.control's encoding).
        This GPU's pending requests run first (every call progresses them, as in MPI)."""
        self._live(op)
        self.gpu.stream.drain()
        return self._exchange(obj, op, next(self._seq))

    def _exchange(self, obj, op: str, seq: int) -> list:
        """allgather_object as operation number `seq` of this communicator (ranks.exchanges.exchange)."""
        return exchange(self.gpu, self._live(op), self.members, self.name, obj, op, seq)

    def barrier(self) -> None:
        """Wait until every member reached the barrier; this GPU's puts are fenced first. Every member
        leaves at the latest member's modeled time (the barrier itself is modeled as free)."""
        self._live("barrier")
        self.gpu.fence()
        self.gpu.now_ns = max(self.allgather_object(self.gpu.now_ns, "barrier"))

    def split(self, color, key=None) -> "Communicator | None":
        """A new communicator of the members that pass the same `color`, ordered by (key, rank);
        color None leaves this GPU out (returns None). Collective over this communicator.
        ResourceExhausted on every member if a member of the new one already has MAX_COMMUNICATORS."""
        mpi = self._live("split")
        gpu = self.gpu
        gpu.stream.drain()
        seq = next(self._seq)
        choices = self._exchange((color, self.rank if key is None else key, len(gpu.control.communicators)), "split", seq)
        colors: list = []  # the distinct colors, in member order: MPI's color is the index
        for c, _, _ in choices:
            if c is not None and not any(c == d for d in colors):
                colors.append(c)
        full = [(self.members[r], n) for r, (c, _, n) in enumerate(choices) if c is not None and n >= MAX_COMMUNICATORS]
        if full:
            raise ResourceExhausted(f"GPU {gpu.rank}: split #{seq} on communicator {self.name!r}: GPU {full[0][0]} "
                                    f"already has {full[0][1]} communicators, the most one GPU may have at once "
                                    f"({MAX_COMMUNICATORS}: each takes two MPI communicators, and MPICH has 2048); "
                                    f"free some first (comm.free())")
        if color is None:
            mpi.split(None, 0, _waiter(gpu))
            return None
        chosen = sorted((k, rank) for rank, (c, k, _) in enumerate(choices) if c == color)
        members = tuple(self.members[rank] for _, rank in chosen)
        index = next(i for i, c in enumerate(colors) if c == color)
        new = mpi.split(index, members.index(gpu.rank), _waiter(gpu))
        assert new is not None  # a color: a communicator
        return Communicator(gpu, members, f"{self.name}.{seq}:{color}", new)

    def free(self) -> None:
        """Release this communicator (collective): its multicast/SHARP group in the switch, and its MPI
        communicators; any later call on it is a FabricError. world and partition live for the run."""
        gpu = self.gpu
        self._live("free")
        if self is gpu.world or self is gpu.partition:
            raise FabricError(f"GPU {gpu.rank}: free of communicator {self.name!r}: world and partition live for "
                              f"the whole run")
        self.release_group()
        self._close()

    def _close(self) -> None:
        """Free the MPI communicators (no exchange: every member does it at the same point)."""
        if self._mpi is not None:
            self._mpi.free()
            self._mpi = None
            if self.gpu.control.communicators.get(self.name) is self:
                del self.gpu.control.communicators[self.name]

    def group_id(self) -> int:
        """This communicator's multicast/SHARP group in the switch, created and bound on first use
        (collective: every member calls it at the same collective)."""
        self._live("group_id")
        if self._group is None:
            created = None
            if self.rank == 0:
                try:
                    created = self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("create", 0, self.members, self.name),
                                                     f"group create for communicator {self.name!r}")["group"]
                except FabricError as exc:
                    created = exc  # every member raises it, none is left waiting
            created = self._exchange(created, "group create", next(self._group_seq))[0]
            if isinstance(created, FabricError):
                raise type(created)(f"{created} (raised on GPU {self.members[0]}, the communicator's first member)")
            gid = created
            self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("bind", gid, (), ""), f"group bind {gid}")
            self._exchange(None, "group bind", next(self._group_seq))  # all bound before any contribution
            self._group = gid
        return self._group

    def node_group_id(self) -> int:
        """The multicast/SHARP group of this member's node: the communicator's members on this GPU's leaf
        (in rank order), created at that leaf by the first of them and bound by each on first use
        (collective: every member of the communicator calls it at the same collective; hier's node
        stages in the leaf). The same group machinery as group_id's: partitions, the 128-group limit
        and the buffer share hold unchanged."""
        self._live("node_group_id")
        if self._node_group is None:
            per_node = self.gpu.config.gpus_per_node
            here = [m for m in self.members if m // per_node == self.gpu.rank // per_node]
            created = None
            if here[0] == self.gpu.rank:
                try:
                    created = self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("create", 0, tuple(here), self.name),
                                                     f"node group create for communicator {self.name!r}")["group"]
                except FabricError as exc:
                    created = exc
            made = self._exchange(created, "node group create", next(self._group_seq))
            failed = next((x for x in made if isinstance(x, FabricError)), None)
            if failed is not None:
                if isinstance(created, int):  # undo this node's group: every member raises
                    self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("release", created, (), ""),
                                           f"node group release {created}")
                raise type(failed)(f"{failed} (raised creating a node group of communicator {self.name!r})")
            gid = made[self.members.index(here[0])]
            self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("bind", gid, (), ""), f"node group bind {gid}")
            self._exchange(None, "node group bind", next(self._group_seq))  # all bound before any use
            self._node_group = gid
        return self._node_group

    def release_group(self) -> None:
        """Release this communicator's multicast/SHARP groups in the switches (collective)."""
        self._live("release_group")
        self.gpu.stream.drain()  # this GPU's pending collectives may still use the group
        if self._group is not None or self._node_group is not None:
            self.allgather_object(None, "group release")
            if self.rank == 0 and self._group is not None:
                self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("release", self._group, (), ""),
                                       f"group release {self._group}")
            per_node = self.gpu.config.gpus_per_node
            if self._node_group is not None and self.gpu.rank == next(
                    m for m in self.members if m // per_node == self.gpu.rank // per_node):
                self.gpu.ask_fabric_manager(Kind.GROUP, GroupInfo("release", self._node_group, (), ""),
                                       f"node group release {self._node_group}")
            self._group = self._node_group = None

    # -- point to point -----------------------------------------------------------------------------
    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        """Send `array`'s bytes to member `dest` (a rank of this communicator) with `tag` (0 <= tag <
        2**31). Returns once `array` may be reused (its bytes have left this GPU); modeled time moves
        to when its last byte left the uplink. Messages to one member with one tag are received in
        the order they were sent (MPI's non-overtaking rule)."""
        data = self._p2p_args("send", array, dest, tag)
        requests = self._post_send(data, int(dest), int(tag))
        self.gpu.wait_sent([requests], f"send to member {dest} tag {tag}")
        self.gpu.now_ns = max(self.gpu.now_ns, self.gpu.sent_ns)

    def recv(self, array: np.ndarray, source: int, tag: int = 0) -> None:
        """Receive the next message of member `source` with `tag` into `array`, which must have the
        message's byte size (ProtocolError naming both GPUs, the tag and the sizes otherwise). The
        transfer takes its turn on this GPU's downlink now (modeled time)."""
        out = self._p2p_args("recv", array, source, tag, written=True)
        self._take(out, int(source), int(tag))

    def sendrecv(self, send: np.ndarray, dest: int, recv: np.ndarray, source: int, sendtag: int = 0,
                 recvtag: int | None = None) -> None:
        """Send `send` to member `dest` and receive from member `source` into `recv` at once (no
        deadlock when two members exchange with each other); recvtag None means sendtag. `recv` may be
        `send` itself (as MPI's Sendrecv_replace). dest = source = this member's rank is a local copy
        (no link bytes). Returns once both are done."""
        recvtag = sendtag if recvtag is None else recvtag
        if is_integer(dest) and dest == source == self.rank:
            self._sendrecv_self(send, recv, sendtag, recvtag)
            return
        data = self._p2p_args("sendrecv", send, dest, sendtag)
        out = self._p2p_args("sendrecv", recv, source, recvtag, written=True)
        requests = self._post_send(data, int(dest), int(sendtag))
        # the received bytes land only after the send left, so recv may share send's memory
        self._take(out, int(source), int(recvtag), before_copy=lambda: self.gpu.wait_sent(
            [requests], f"sendrecv to member {dest} tag {sendtag}"))
        self.gpu.now_ns = max(self.gpu.now_ns, self.gpu.sent_ns)

    def _sendrecv_self(self, send, recv, sendtag, recvtag) -> None:
        """sendrecv with this member itself (a shift on a one-member ring): a local copy, no link bytes."""
        for tag in (sendtag, recvtag):
            if not is_integer(tag) or not 0 <= tag < P2P_TAG_LIMIT:
                raise FabricError(f"GPU {self.gpu.rank}: sendrecv tag {tag!r}: tags are integers "
                                  f"0..{P2P_TAG_LIMIT - 1}")
        if sendtag != recvtag:
            raise FabricError(f"GPU {self.gpu.rank}: sendrecv with itself (member {self.rank} of communicator "
                              f"{self.name!r}) sends tag {sendtag} and receives tag {recvtag}: it would wait forever")
        data = self._flat(send, "sendrecv buffer").view(np.uint8)
        out = self._flat(recv, "sendrecv buffer", written=True).view(np.uint8)
        if data.nbytes != out.nbytes:
            raise ProtocolError(f"GPU {self.gpu.rank}: sendrecv with itself tag {sendtag} on communicator "
                                f"{self.name!r}: it sends {data.nbytes} bytes, its receive buffer has {out.nbytes}")
        out[:] = data.copy()  # a copy first: recv may overlap send

    def _p2p_args(self, op: str, array, peer, tag, written: bool = False) -> np.ndarray:
        """`array`'s bytes, after checking the peer member and the tag."""
        gpu = self.gpu
        self._live(op)
        if not is_integer(peer) or not 0 <= peer < self.size:
            raise FabricError(f"GPU {gpu.rank}: {op}: peer {peer!r} is not a member rank 0..{self.size - 1} of "
                              f"communicator {self.name!r}")
        if peer == self.rank:
            raise FabricError(f"GPU {gpu.rank}: {op} with itself (member {peer} of communicator {self.name!r}): "
                              f"a member does not send or receive messages to itself (sendrecv with itself as both "
                              f"dest and source is a local copy)")
        if not is_integer(tag) or not 0 <= tag < P2P_TAG_LIMIT:
            raise FabricError(f"GPU {gpu.rank}: {op} tag {tag!r}: tags are integers 0..{P2P_TAG_LIMIT - 1}")
        other = self.members[peer]
        if gpu.config.partition_of(other) != gpu.config.partition_of(gpu.rank):
            raise AccessViolation(f"GPU {gpu.rank}: {op} with GPU {other} (member {peer}): it is in partition "
                                  f"{gpu.config.partition_of(other)}, this GPU in "
                                  f"{gpu.config.partition_of(gpu.rank)}; partitions are isolated")
        flat = self._flat(array, f"{op} buffer", written=written)
        return flat.view(np.uint8)

    def _p2p_key(self, tag: int, number: int) -> tuple:
        # "p2p" where a collective's key has its (integer) sequence number: the two can never meet,
        # and the communicator's name keeps other communicators' messages apart
        return (self.name, "p2p", tag, number)

    def _post_send(self, data: np.ndarray, dest: int, tag: int) -> list:
        number = self._p2p_sent[(dest, tag)]
        self._p2p_sent[(dest, tag)] += 1
        return self.gpu.send_message(self.members[dest], self._p2p_key(tag, number), data)

    def _take(self, out: np.ndarray, source: int, tag: int, before_copy=None) -> None:
        """Wait for the next message of member `source` with `tag`, check its size, copy it into `out`."""
        gpu, peer = self.gpu, self.members[source]
        number = self._p2p_received[(source, tag)]
        self._p2p_received[(source, tag)] += 1
        # taken from the mailbox rather than posted in place, so that a message of the wrong size is
        # reported here, with the tag and both sizes, instead of in whatever wait it happens to arrive
        got = gpu.take_message(self._p2p_key(tag, number), peer,
                               f"recv from member {source} tag {tag} on communicator {self.name!r}",
                               f"GPU {peer}'s message #{number} with tag {tag}")
        if before_copy is not None:
            before_copy()
        if got.nbytes != out.nbytes:
            raise ProtocolError(f"GPU {gpu.rank}: recv from GPU {peer} (member {source}) tag {tag} on communicator "
                                f"{self.name!r}: GPU {peer} sent {got.nbytes} bytes, GPU {gpu.rank}'s receive "
                                f"buffer has {out.nbytes}")
        out[:] = got

    # -- collectives --------------------------------------------------------------------------------
    # Each collective has a blocking form and a non-blocking i-form that returns a Request
    # (ranks/requests.py: req.wait(), req.test(), gpu.wait_all). The blocking form is its i-form waited
    # for at once. Buffers of a pending i-form belong to it until its wait: not written (send) or read
    # (recv) before, as in MPI.
    def allreduce(self, array: np.ndarray, op: str = "sum", algorithm: str = "auto") -> None:
        """Reduce `array` over every member with `op` (sum, avg, max, min, prod), in place."""
        self.iallreduce(array, op, algorithm).wait()

    def iallreduce(self, array: np.ndarray, op: str = "sum", algorithm: str = "auto") -> Request:
        """Non-blocking allreduce; returns its Request."""
        with self._arguments("allreduce"):
            flat = self._flat(array, "allreduce", written=True)
        return self._collective("allreduce", algorithm, op, flat.dtype, flat.size, None, (flat,))

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str = "sum", algorithm: str = "auto") -> None:
        """recv <- block `rank` of the reduction of every member's `send` (blocks as fabric.reduction.blocks)."""
        self.ireduce_scatter(send, recv, op, algorithm).wait()

    def ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str = "sum", algorithm: str = "auto") -> Request:
        """Non-blocking reduce_scatter; returns its Request."""
        with self._arguments("reduce_scatter"):
            send, recv = self._flat(send, "reduce_scatter send"), self._flat(recv, "reduce_scatter recv", written=True)
        problem = (self._same_dtype(send, recv, "reduce_scatter")
                   or self._expect(recv.size, blocks(send.size, self.size)[self.rank], "reduce_scatter recv"))
        return self._collective("reduce_scatter", algorithm, op, send.dtype, send.size, None, (send, recv),
                                problem=problem)

    def allgather(self, send: np.ndarray, recv: np.ndarray, algorithm: str = "auto") -> None:
        """recv <- every member's `send`, concatenated in rank order."""
        self.iallgather(send, recv, algorithm).wait()

    def iallgather(self, send: np.ndarray, recv: np.ndarray, algorithm: str = "auto") -> Request:
        """Non-blocking allgather; returns its Request."""
        with self._arguments("allgather"):
            send, recv = self._flat(send, "allgather send"), self._flat(recv, "allgather recv", written=True)
        problem = (self._same_dtype(send, recv, "allgather")
                   or self._expect(send.size, blocks(recv.size, self.size)[self.rank], "allgather send"))
        return self._collective("allgather", algorithm, "sum", send.dtype, recv.size, None, (send, recv),
                                problem=problem)

    def broadcast(self, array: np.ndarray, root: int = 0, algorithm: str = "auto") -> None:
        """array <- the root member's array, on every member."""
        self.ibroadcast(array, root, algorithm).wait()

    def ibroadcast(self, array: np.ndarray, root: int = 0, algorithm: str = "auto") -> Request:
        """Non-blocking broadcast; returns its Request."""
        with self._arguments("broadcast"):
            flat = self._flat(array, "broadcast", written=True)
            if not is_integer(root) or not 0 <= root < self.size:
                raise FabricError(f"GPU {self.gpu.rank}: broadcast root {root!r} is not a member rank 0..{self.size - 1}")
        root = int(root)
        return self._collective("broadcast", algorithm, "sum", flat.dtype, flat.size, root, (flat, root))

    def all2all(self, send: np.ndarray, recv: np.ndarray, algorithm: str = "auto") -> None:
        """recv block i <- member i's send block `rank`; send and recv hold `size` equal blocks.
        algorithm: direct, pxn (collectives/pxn.py) or auto (all2all_algorithm: the faster by the cost
        model for every GPU of several nodes, else direct)."""
        self.iall2all(send, recv, algorithm).wait()

    def iall2all(self, send: np.ndarray, recv: np.ndarray, algorithm: str = "auto") -> Request:
        """Non-blocking all2all; returns its Request."""
        with self._arguments("all2all"):
            send, recv = self._flat(send, "all2all send"), self._flat(recv, "all2all recv", written=True)
            if send.size != recv.size or send.size % self.size:
                raise FabricError(f"GPU {self.gpu.rank}: all2all needs send and recv of equal size, a multiple of "
                                  f"{self.size} members (got {send.size}, {recv.size}); use all2allv for uneven blocks")
        if isinstance(algorithm, Plan):  # a collective as data (fabric.plans): run by collectives/plan.py
            return self._collective("all2all", algorithm, "sum", send.dtype, send.size, None, (send, recv),
                                    problem=self._same_dtype(send, recv, "all2all"))
        with self._arguments("all2all"):
            try:
                algorithm = all2all_algorithm(algorithm, self.gpu.config, send.size * send.dtype.itemsize, self.size,
                                              self.nodes, send.dtype.itemsize)
            except UnsupportedOperation as exc:
                raise UnsupportedOperation(f"GPU {self.gpu.rank}: {exc}") from None
        counts = [send.size // self.size] * self.size
        return self._all2allv("all2all", send, counts, recv, counts, algorithm)

    def all2allv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        """recv block i (recv_counts[i] elements, packed in order) <- member i's send block `rank`
        (its send_counts[rank] elements, packed in order)."""
        self.iall2allv(send, send_counts, recv, recv_counts).wait()

    def iall2allv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> Request:
        """Non-blocking all2allv; returns its Request."""
        with self._arguments("all2allv"):
            send, recv = self._flat(send, "all2allv send"), self._flat(recv, "all2allv recv", written=True)
            counts = []
            for what, given in (("send_counts", send_counts), ("recv_counts", recv_counts)):
                if not all(is_integer(c) for c in given):
                    raise FabricError(f"GPU {self.gpu.rank}: all2allv {what} must be integers, got {list(given)!r}")
                counts.append([int(c) for c in given])
        return self._all2allv("all2allv", send, counts[0], recv, counts[1])

    def _all2allv(self, name, send, send_counts, recv, recv_counts, algorithm: str = "direct") -> Request:
        problem = self._same_dtype(send, recv, name)
        for what, counts, array in (("send", send_counts, send), ("recv", recv_counts, recv)):
            if len(counts) != self.size or min(counts, default=0) < 0 or sum(counts) > array.size:
                problem = (f"{name} {what}_counts {counts} must be {self.size} non-negative counts summing to at "
                           f"most {array.size}")
                send_counts = recv_counts = [0] * self.size  # still take part in the call check
        return self._collective(name, algorithm, "sum", send.dtype, sum(send_counts), None,
                                (send, pairwise.offsets(send_counts), send_counts, recv, pairwise.offsets(recv_counts),
                                 recv_counts), counts=(send_counts, recv_counts), problem=problem)

    def reduce(self, send: np.ndarray, recv: np.ndarray | None, root: int = 0, op: str = "sum",
               algorithm: str = "auto") -> None:
        """The root's recv <- the reduction of every member's `send` with `op`; recv has send's size
        and dtype at the root and is not used elsewhere (None is fine there). Combine orders as each
        algorithm documents (direct, ring, sharp)."""
        self.ireduce(send, recv, root, op, algorithm).wait()

    def ireduce(self, send: np.ndarray, recv: np.ndarray | None, root: int = 0, op: str = "sum",
                algorithm: str = "auto") -> Request:
        """Non-blocking reduce; returns its Request."""
        with self._arguments("reduce"):
            root = self._root(root, "reduce")
            send = self._flat(send, "reduce send")
            recv = self._flat(recv, "reduce recv", written=True) if self.rank == root else None
        problem = None if recv is None else (self._same_dtype(send, recv, "reduce") or
                                             self._expect(recv.size, (0, send.size), "reduce recv at the root"))
        return self._collective("reduce", algorithm, op, send.dtype, send.size, root, (send, recv, root),
                                problem=problem)

    def gather(self, send: np.ndarray, recv: np.ndarray | None, root: int = 0) -> None:
        """The root's recv <- every member's `send` (all of one size), concatenated in rank order; recv
        has size x send's elements at the root and is not used elsewhere (None is fine there)."""
        self.igather(send, recv, root).wait()

    def igather(self, send: np.ndarray, recv: np.ndarray | None, root: int = 0) -> Request:
        """Non-blocking gather; returns its Request."""
        with self._arguments("gather"):
            root = self._root(root, "gather")
            send = self._flat(send, "gather send")
            recv = self._flat(recv, "gather recv", written=True) if self.rank == root else None
        problem = None if recv is None else (self._same_dtype(send, recv, "gather") or
                                             self._expect(recv.size, (0, self.size * send.size),
                                                          "gather recv at the root"))
        return self._collective("gather", "direct", "sum", send.dtype, send.size, root, (send, recv, root),
                                problem=problem)

    def scatter(self, send: np.ndarray | None, recv: np.ndarray, root: int = 0) -> None:
        """recv <- block `rank` of the root's `send`, which holds size blocks of recv's size (all of one
        size) and is not used elsewhere (None is fine there)."""
        self.iscatter(send, recv, root).wait()

    def iscatter(self, send: np.ndarray | None, recv: np.ndarray, root: int = 0) -> Request:
        """Non-blocking scatter; returns its Request."""
        with self._arguments("scatter"):
            root = self._root(root, "scatter")
            recv = self._flat(recv, "scatter recv", written=True)
            send = self._flat(send, "scatter send") if self.rank == root else None
        problem = None if send is None else (self._same_dtype(send, recv, "scatter") or
                                             self._expect(send.size, (0, self.size * recv.size),
                                                          "scatter send at the root"))
        return self._collective("scatter", "direct", "sum", recv.dtype, recv.size, root, (send, recv, root),
                                problem=problem)

    def _root(self, root, name: str) -> int:
        if not is_integer(root) or not 0 <= root < self.size:
            raise FabricError(f"GPU {self.gpu.rank}: {name} root {root!r} is not a member rank 0..{self.size - 1}")
        return int(root)

    def send_credit(self, value: int) -> None:
        """Tell every other member that `value` results of this member's in-switch reduction came back
        (sharp reduce): out of band, like the call check, so not counted and not modeled (the credits
        that bound the switch's memory are not modeled, see docs/model/time.md)."""
        number, self._credits_sent = self._credits_sent, self._credits_sent + 1
        for peer in self.members:
            if peer != self.gpu.rank:
                self.gpu.control.channel.send(peer, (self.name, CREDIT_SEQ - number, ("credit", value)))

    def credits_taken(self, source: int) -> int:
        """How many credits this GPU took from GPU `source` on this communicator (the next one's number)."""
        return self._credits_taken[source]

    def sweep_strays(self, status) -> int:
        """Drop what waits on this communicator's members' MPI communicators and no exchange expects;
        returns how many (MemberComms.sweep; none once freed)."""
        return 0 if self._mpi is None else self._mpi.sweep(status)

    def next_credit(self, member: int) -> int:
        """The value of member `member`'s next credit, waiting for it."""
        gpu, source = self.gpu, self.members[member]
        key = (self.name, CREDIT_SEQ - self._credits_taken[source], source)
        gpu.wait(lambda: gpu.control.has(*key), f"reduce on communicator {self.name!r}",
                  f"GPU {source} (the root) to report in-switch results")
        self._credits_taken[source] += 1
        got = gpu.control.take(*key)
        if not (type(got) is tuple and len(got) == 2 and got[0] == "credit" and is_integer(got[1])):
            raise ProtocolError(f"GPU {gpu.rank}: reduce on communicator {self.name!r}: GPU {source} sent "
                                f"{got!r:.80} where a credit was due")
        return int(got[1])

    def _collective(self, name, algorithm, op, dtype, count, root, args, counts=None, problem=None) -> Request:
        """Check this member's arguments now, then issue one collective as a Request (it runs when this
        GPU drains its requests: ranks/requests.py). `problem`: what is wrong with this member's own
        buffers, carried in the call check so that every member raises, not just this one."""
        gpu = self.gpu
        self._live(name)
        plan = None
        if isinstance(algorithm, Plan):  # a collective as data (fabric.plans), run by collectives/plan.py
            plan = algorithm
            with self._arguments(name):
                algorithm = self._plan_name(plan, name, root)
        with self._arguments(name):
            try:
                dtype = check_dtype(dtype) if name in REDUCING else check_movable(dtype)  # reductions: DTYPES
                check_op(op)
            except FabricError as exc:
                raise FabricError(f"GPU {gpu.rank}: {name}: {exc}") from None
            if counts is None and plan is None:
                try:
                    algorithm = collectives.choose(name, algorithm, gpu.config, count * dtype.itemsize, self.size,
                                                   self.nodes)
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
        return gpu.stream.issue(f"{name} #{seq} on communicator {self.name!r}",
                          lambda: self._execute(name, seq, algorithm, op, dtype, count, root, args, counts, call,
                                                fingerprint, plan))

    def _leaves(self) -> tuple[tuple[int, ...], ...]:
        """The members' ranks by leaf (nodes in order, each in rank order): a leaf plan's Plan.leaf, as
        node_group_id groups them."""
        per_node = self.gpu.config.gpus_per_node
        nodes: dict[int, list[int]] = {}
        for rank, gpu in enumerate(self.members):
            nodes.setdefault(gpu // per_node, []).append(rank)
        return tuple(tuple(nodes[node]) for node in sorted(nodes))

    def _plan_name(self, plan: "Plan", name: str, root: int | None = None) -> str:
        """The call check's name of `plan` ("plan:NAME:DIGEST": members passing different plans mismatch);
        FabricError if it cannot run `name` on this communicator and fabric."""
        if plan.collective != name or name not in PLAN_COLLECTIVES:
            raise UnsupportedOperation(f"GPU {self.gpu.rank}: {name} given plan {plan.name!r}, a {plan.collective} "
                                       f"plan; plans run {', '.join(PLAN_COLLECTIVES)} so far")
        if plan.gpus != self.size or self.gpu.config.mode not in plan.fabrics:
            raise UnsupportedOperation(f"GPU {self.gpu.rank}: {name}: plan {plan.name!r} is for {plan.gpus} GPUs on "
                                       f"{', '.join(plan.fabrics)} fabrics; communicator {self.name!r} has {self.size} "
                                       f"members on a {self.gpu.config.mode} fabric")
        if name == "broadcast" and plan.root != root:
            raise UnsupportedOperation(f"GPU {self.gpu.rank}: broadcast from root {root}: plan {plan.name!r} "
                                       f"broadcasts from root {plan.root}")
        if has_credits(plan):  # the registry's in-switch plans pace their pushes with them (sharp's reduce)
            raise UnsupportedOperation(f"GPU {self.gpu.rank}: {name}: plan {plan.name!r} holds credit operations; "
                                       f"they pace the registry's in-switch plans, not a plan a collective is given")
        if plan.leaf and plan.leaf != self._leaves():
            raise UnsupportedOperation(f"GPU {self.gpu.rank}: {name}: plan {plan.name!r} puts its GPUs on leaves "
                                       f"{[list(node) for node in plan.leaf]}; communicator {self.name!r}'s members "
                                       f"are on leaves {[list(node) for node in self._leaves()]} (by rank, each in "
                                       f"rank order)")
        validate(plan)
        return f"plan:{plan.name}:{hashlib.sha256(repr(plan).encode()).hexdigest()[:16]}"

    def _execute(self, name, seq, algorithm, op, dtype, count, root, args, counts, call, fingerprint,
                 plan=None) -> None:
        """Run collective `seq` (issued by _collective): the call check, then its traffic."""
        gpu = self.gpu
        # begin before the call check: no peer sends this call's data before it has our call, so every
        # byte of the call reaches this GPU between begin and end (a call failing the check has no end)
        gpu.event({"ev": "coll_begin", **fingerprint})
        start_ns, before = gpu.now_ns, gpu.program_bytes()
        calls = self._exchange((call, counts), f"{name} call check", seq)
        check_calls(gpu_rank=self.gpu.rank, comm_name=self.name, members=self.members, rank=self.rank, name=name,
                    seq=seq, calls=calls)
        # NCCL's launch and protocol latency (fabric.software), the same the cost models add: all2allv's S is
        # the most bytes a member sends, as fabric.software.call_bytes takes it
        nbytes = count if counts is None else max(sum(c[1][0]) for c in calls)
        gpu.now_ns += call_latency_ns(name, algorithm, self.size, self.nodes, nbytes * dtype.itemsize, gpu.config)
        if count or counts is not None:
            if algorithm in collectives.IN_SWITCH:
                self.group_id()  # collective: every member, even one with an empty block, takes part
            work = collectives.Call(self, seq, op, dtype)
            if plan is not None:  # allreduce (array,), broadcast (array, root), the others (send, recv)
                inp, out = (args[0], args[0]) if name in ("allreduce", "broadcast") else args
                # a plan not in place reads its input as it was while it writes its output, and may write its
                # input chunks too (MSCCL's): it gets a copy; the caller's buffer is the output alone
                run_plan(work, plan, inp.copy() if not plan.inplace or name == "reduce_scatter" else inp, out)
            elif counts is not None:  # all2all, all2allv
                work.counts = tuple(tuple(int(x) for x in c[1][0]) for c in calls)  # every member's, checked
                collectives.ALL2ALL[algorithm](work, *args)
            else:
                collectives.run(algorithm, name, work, *args)
        gpu.event({"ev": "coll_end", **fingerprint})
        # the call's own bytes: a one-sided transfer the host delivered meanwhile is not the call's
        after = gpu.program_bytes()
        gpu.record_call(CallRecord(self.name, seq, name, algorithm, count, dtype_name(dtype), op, root, self.size,
                                   float(start_ns), float(gpu.now_ns), after[0] - before[0], after[1] - before[1]))

    @contextmanager
    def _arguments(self, name: str):
        """Check this member's own arguments of collective `name`. An invalid one still takes part in
        the call check, so that every member fails at once instead of waiting for it to the deadline
        (they raise CollectiveMismatch naming it); then it raises its own error here."""
        try:
            yield
        except FabricError as exc:
            self.gpu.stream.drain()  # the members run this GPU's earlier requests first, so must it
            seq = next(self._seq)
            call = {"collective": name, "seq": seq, "problem": f"{type(exc).__name__}: {exc}"}
            self._exchange((call, None), f"{name} call check", seq)
            raise

    def _flat(self, array: object, what: str, written: bool = False) -> np.ndarray:
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


def close_communicators(gpu) -> None:
    """Free the MPI communicators of every communicator `gpu` still has, and the GPU ranks' own (the end
    of its run; collective over every GPU). If some GPU left an exchange that timed out, every GPU keeps
    them instead: that exchange's messages may still wait at the members, and a later communicator
    given the same MPI context would take them for its own."""
    if any_rank(gpu.control.channel.comm, gpu.control.abandoned_exchanges > 0, _waiter(gpu), "the end-of-run check of exchanges"):
        gpu.control.communicators.clear()
        return
    for comm in list(gpu.control.communicators.values()):
        comm._close()
    gpu.control.channel.comm.Free()


def _waiter(gpu):
    """wait(done, what) for ranks.transport: served through gpu.wait_for_mpi, with the run's deadline (its
    back-off started afresh, as in _exchange)."""
    def wait(done, what):
        gpu.wake_for_mpi(())
        gpu.wait_for_mpi(done, what, "the other members")
    return wait
