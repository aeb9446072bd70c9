"""The one thin transport: the only module that imports mpi4py.

Fabric packets travel as a msgpack header message (TAG_HEADER) followed, when the packet carries a
payload, by the raw bytes as a second message (TAG_PAYLOAD) sent straight from the numpy buffer.
MPI keeps messages between two ranks in order per tag, so the n-th payload from a rank belongs to
the n-th payload-carrying header from it. Every send is non-blocking: a rank waiting for anything
keeps serving, so two ranks sending to each other never deadlock.
"""

import os
import pickle
import sys
import time

import numpy as np
from mpi4py import MPI

from fabric.errors import FabricTimeout
from fabric.packets import Packet

TAG_HEADER = 11
TAG_PAYLOAD = 12
TAG_CONTROL = 13
ABORT_GRACE_S = 0.5  # s, between a failing rank's report and MPI_Abort


def world_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def count_failed_ranks(failed: bool, timeout_s: float) -> int:
    """How many ranks of the job failed to get ready (each says whether it did); FabricTimeout if some
    rank has not said within timeout_s (it is stuck before the fabric starts)."""
    send, count = np.array([int(failed)], np.int64), np.zeros(1, np.int64)
    _complete(MPI.COMM_WORLD.Iallreduce(send, count, MPI.SUM), timeout_s,
              f"rank {world_rank()}: not every rank loaded the fabric and the script within {timeout_s:g} s")
    return int(count[0])


def _complete(request, timeout_s: float, late: str) -> None:
    """Wait, backing off, until a non-blocking MPI `request` completes; FabricTimeout(late) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    idle = Idle()
    while not request.Test():
        if time.monotonic() > deadline:
            raise FabricTimeout(late)
        idle()


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (after the caller printed its report)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # MPI_Abort makes the launcher kill every rank; what this rank just wrote may still sit in the pipe
    # to the launcher (MPICH's hydra loses it then), so give the launcher time to forward it first.
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # MPI_Abort may return before the launcher kills us; never run on


class Idle:
    """Back-off for polling loops: yield the core first, then sleep, longer the longer nothing comes,
    up to max_sleep_s (ranks may share few cores: a spinning rank would starve the one it waits for)."""

    def __init__(self, yields: int = 8, max_sleep_s: float = 5e-3, sending_nap_s: float = 3e-4):
        self.spins = 0
        self.yields = yields
        self.max_sleep_s = max_sleep_s
        self.sending_nap_s = sending_nap_s

    def reset(self) -> None:
        self.spins = 0

    def __call__(self, sending: bool = False) -> None:
        """Wait a little. `sending`: a large message of ours is in flight; the receiver copies it while
        we sleep, so nap a fixed while rather than spin (measured: All2All 16 MiB on 8 GPUs ran
        3.3-4.5x native MPI with this, 4.4-5.5x without; short naps keep latency and noise low)."""
        if sending:
            time.sleep(self.sending_nap_s)
            return
        self.spins += 1
        if self.spins < self.yields:
            os.sched_yield()
        else:
            time.sleep(min(self.max_sleep_s, 1e-5 * (self.spins - self.yields + 1)))


class Transport:
    """Packets between the ranks of one fabric (GPUs 0..G-1 and the switch G) on a private communicator."""

    def __init__(self, comm=None):
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._pending: list[tuple[list, object]] = []  # (requests, buffers kept alive until sent)
        self.pending_bytes = 0
        self._status = MPI.Status()

    def send(self, dest: int, packet: Packet, payload: np.ndarray | None = None) -> list:
        """Post `packet` (and its payload bytes) to `dest`; returns the requests, complete when sent."""
        header = packet.to_wire()
        requests = [self.comm.Isend([header, MPI.BYTE], dest, TAG_HEADER)]
        nbytes = 0
        if packet.payload_bytes:
            if payload is None or payload.nbytes != packet.payload_bytes:
                raise ValueError(f"{packet.kind.name} to rank {dest}: payload of "
                                 f"{None if payload is None else payload.nbytes} bytes, header says "
                                 f"{packet.payload_bytes}")
            requests.append(self.comm.Isend([payload, MPI.BYTE], dest, TAG_PAYLOAD))
            nbytes = payload.nbytes
        self._pending.append((requests, (header, payload, nbytes)))
        self.pending_bytes += nbytes
        return requests

    def progress(self) -> bool:
        """Retire completed sends; True if any completed."""
        if not self._pending:
            return False
        still, done = [], False
        for requests, keep in self._pending:
            if MPI.Request.Testall(requests):
                self.pending_bytes -= keep[2]
                done = True
            else:
                still.append((requests, keep))
        self._pending = still
        return done

    @staticmethod
    def sent(requests: list) -> bool:
        """Whether the sends behind `requests` completed (their buffers may be reused)."""
        return all(r == MPI.REQUEST_NULL for r in requests) or MPI.Request.Testall(requests)

    @property
    def idle(self) -> bool:
        return not self._pending

    def poll(self) -> tuple[int, Packet] | None:
        """The next header from any rank, or None; its payload must be taken with recv_payload next."""
        if not self.comm.Iprobe(MPI.ANY_SOURCE, TAG_HEADER, self._status):
            return None
        source, count = self._status.Get_source(), self._status.Get_count(MPI.BYTE)
        buffer = bytearray(count)
        self.comm.Recv([buffer, MPI.BYTE], source, TAG_HEADER)
        return source, Packet.from_wire(bytes(buffer))

    def recv_payload(self, source: int, out: np.ndarray, deadline_s: float, what: str) -> None:
        """Receive the payload that follows a header from `source` into `out` (uint8, contiguous)."""
        request = self.comm.Irecv([out, MPI.BYTE], source, TAG_PAYLOAD)
        idle = Idle()
        while not request.Test():
            # keep our own sends moving: the peer may be waiting for them before it sends this payload
            if self.progress():
                idle.reset()
            if time.monotonic() > deadline_s:
                request.Cancel()
                raise FabricTimeout(f"rank {self.rank}: payload of {what} from rank {source} did not arrive "
                                    f"before the deadline")
            idle()

    def barrier(self, timeout_s: float) -> None:
        """Every rank of the fabric meets here (at setup only, before any traffic); FabricTimeout if
        some rank has not come within timeout_s."""
        _complete(self.comm.Ibarrier(), timeout_s, f"rank {self.rank}: setup barrier of the fabric's {self.size} "
                  f"ranks timed out after {timeout_s:g} s (a rank never reached it)")

    def close(self) -> None:
        self.comm.Free()


class ControlChannel:
    """Out-of-band control messages between GPU ranks (pickled objects); never counted on links."""

    def __init__(self, comm):
        self.comm = comm
        self._pending: list = []

    def send(self, dest: int, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._pending.append((self.comm.Isend([data, MPI.BYTE], dest, TAG_CONTROL), data))

    def progress(self) -> bool:
        before = len(self._pending)
        self._pending = [(r, d) for r, d in self._pending if not r.Test()]
        return len(self._pending) != before

    @property
    def idle(self) -> bool:
        return not self._pending

    def poll(self) -> tuple[int, object] | None:
        status = MPI.Status()
        if not self.comm.Iprobe(MPI.ANY_SOURCE, TAG_CONTROL, status):
            return None
        buffer = bytearray(status.Get_count(MPI.BYTE))
        self.comm.Recv([buffer, MPI.BYTE], status.Get_source(), TAG_CONTROL)
        return status.Get_source(), pickle.loads(buffer)


_NATIVE_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


def native_collective(channel: ControlChannel, collective: str, send: np.ndarray, recv: np.ndarray,
                      op: str = "sum", root: int = 0):
    """Start MPI's own non-blocking collective over the GPU ranks (the reference the bench and the
    tests compare with); returns the request. avg is sum here (the caller divides)."""
    comm = channel.comm
    if collective == "allreduce":
        return comm.Iallreduce(send, recv, _NATIVE_OPS["sum" if op == "avg" else op])
    if collective == "reduce_scatter":
        return comm.Ireduce_scatter_block(send, recv, _NATIVE_OPS["sum" if op == "avg" else op])
    if collective == "allgather":
        return comm.Iallgather(send, recv)
    if collective == "broadcast":
        return comm.Ibcast(recv, root)
    if collective == "all2all":
        return comm.Ialltoall(send, recv)
    raise ValueError(f"no native {collective}")


def split_gpus(transport: Transport, is_gpu: bool) -> ControlChannel | None:
    """A control channel over the GPU ranks only (collective over the transport's communicator)."""
    comm = transport.comm.Split(0 if is_gpu else MPI.UNDEFINED, transport.rank)
    return ControlChannel(comm) if is_gpu else None
