"""The job and the waits of this host's ranks: world rank and size, the ready check, ending the job, and
the back-off of polling loops (Idle), woken early by the ranks of this host (Waker)."""

import os
import secrets
import select
import socket
import sys
import tempfile
import time
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from nvlink_emu.fabric.errors import FabricTimeout

ABORT_GRACE_S = 0.5  # s, between a failing rank's report and MPI_Abort


def world_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def mpi_library_version() -> str:
    """What the MPI library mpi4py is linked against says of itself (MPI_Get_library_version; callable
    before MPI_Init), e.g. "MPICH Version: 4.2.0 ..." or "Open MPI v4.1.5, ..."."""
    return MPI.Get_library_version()


def count_failed_ranks(failed: bool, timeout_s: float) -> int:
    """How many ranks of the job failed to get ready (each says whether it did); FabricTimeout if some
    rank has not said within timeout_s (it is stuck before the fabric starts)."""
    send, count = np.array([int(failed)], np.int64), np.zeros(1, np.int64)
    complete(MPI.COMM_WORLD.Iallreduce(send, count, MPI.SUM), timeout_s,
              f"rank {world_rank()}: not every rank loaded the fabric and the script within {timeout_s:g} s")
    return int(count[0])


def complete(request, timeout_s: float, late: str) -> None:
    """Wait, backing off, until a non-blocking MPI `request` completes; FabricTimeout(late) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    idle = Idle()
    while not request.Test():
        if time.monotonic() > deadline:
            raise FabricTimeout(late)
        idle()


def abort_job(code: int = 1) -> NoReturn:
    """End every rank of the job now (after the caller printed its report)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # MPI_Abort makes the launcher kill every rank; what this rank just wrote may still sit in the pipe
    # to the launcher (MPICH's hydra loses it then), so give the launcher time to forward it first.
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # MPI_Abort may return before the launcher kills us; never run on


class Waker:
    """Wake-up calls between the ranks of one host: a rank that posts a message to a rank on its host
    also sends it a one-byte datagram (`poke`), and a rank with nothing to do sleeps in select() on its
    own socket (`sleep`), so it wakes when something comes instead of at the end of its nap; a rank
    that took a payload message pokes its sender too, whose send completed then (nothing else tells
    it). A hint only: MPI carries every message, a lost poke (a full socket buffer, a rank on another
    host, a collective's internal messages, a message MPI had not delivered yet) costs at most the
    nap. Collective over `comm`'s ranks."""

    def __init__(self, comm):
        token = comm.bcast(secrets.token_hex(4) if comm.Get_rank() == 0 else None, root=0)
        name = f"nve-{token}-{comm.Get_rank()}"
        # Linux: an abstract socket (no file, none left behind by a killed job); elsewhere a file in /tmp
        self.path = "\0" + name if sys.platform.startswith("linux") else os.path.join(tempfile.gettempdir(), name)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(self.path)
            self.sock.setblocking(False)
            bound = self.path
        except OSError:  # no socket here (a path too long, a read-only /tmp): naps without wake-ups
            self.sock.close()
            self.sock, bound = None, None
        here = MPI.Get_processor_name()
        peers = comm.allgather((here, bound))
        self.peers = {rank: path for rank, (host, path) in enumerate(peers)
                      if host == here and path is not None and rank != comm.Get_rank()}

    def poke(self, rank: int) -> None:
        """Wake rank `rank` if it sleeps (nothing if it is on another host)."""
        path = self.peers.get(rank)
        if path is not None:
            try:
                self.sock.sendto(b"!", path)
            except OSError:  # its buffer is full (it has pokes to read already) or it has closed
                pass

    def sleep(self, seconds: float) -> None:
        """Sleep until poked or `seconds` pass, then take every poke waiting."""
        if self.sock is None:
            time.sleep(seconds)
            return
        select.select((self.sock,), (), (), seconds)
        try:
            while self.sock.recv(64):
                pass
        except OSError:  # none left
            pass

    def reaches(self, ranks) -> bool:
        """Whether a poke from each of `ranks` can wake this rank (all on its host, sockets on both sides)."""
        return self.sock is not None and all(rank in self.peers for rank in ranks)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if not self.path.startswith("\0"):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass


_waker: Waker | None = None  # this rank's, while a Transport is open: Idle sleeps on it


class Idle:
    """Back-off for polling loops: yield the core `yields` times first, then sleep first_nap_s, 2 x
    first_nap_s, ..., up to max_sleep_s (ranks may share few cores: a spinning rank would starve the one
    it waits for). A sleep ends early when a rank of this host posts this rank a message (Waker)."""

    def __init__(self, yields: int = 8, max_sleep_s: float = 5e-3, sending_nap_s: float = 3e-4,
                 first_nap_s: float = 1e-5):
        self.spins = 0
        self.yields = yields
        self.max_sleep_s = max_sleep_s
        self.first_nap_s = first_nap_s
        self.sending_nap_s = sending_nap_s

    def reset(self) -> None:
        self.spins = 0

    def __call__(self, sending: bool = False) -> None:
        """Wait a little. `sending`: a large message of ours is in flight; the receiver copies it while
        we sleep, so nap a fixed while rather than spin (measured: All2All 16 MiB on 8 GPUs ran
        3.3-4.5x native MPI with this, 4.4-5.5x without; short naps keep latency and noise low)."""
        nap = time.sleep if _waker is None else _waker.sleep
        if sending:
            nap(self.sending_nap_s)
            return
        self.spins += 1
        if self.spins <= self.yields:
            os.sched_yield()
        else:
            nap(min(self.max_sleep_s, self.first_nap_s * (self.spins - self.yields)))


# A wait whose every awaited message pokes its sender's Waker (the fabric's packets, control messages,
# an exchange's one round) sleeps from the start, 1 to 5 ms: the poke ends a nap, so a nap only bounds a
# poke that came before MPI delivered its message (measured, 1 KiB ring AllReduce on 8 GPUs, 50 calls: 447
# of a GPU's 716 packets found by the wake its poke caused, 8 after a nap timed out). Not longer: a burst of
# packets reaches MPI's queue at its receiver later than their pokes (with 2 to 20 ms naps at the switch,
# 514 of a 1 KiB sharp reduce_scatter's 729 packets were taken after a nap timed out)
POKED_FIRST_NAP_S = 1e-3
POKED_MAX_NAP_S = 5e-3


def poked_idle() -> "Idle":
    """The back-off of a wait that every awaited message pokes (above): no yields, naps from the start."""
    return Idle(yields=0, first_nap_s=POKED_FIRST_NAP_S, max_sleep_s=POKED_MAX_NAP_S)


def install(waker: Waker | None) -> None:
    """Make `waker` this rank's (Idle sleeps on it; None: plain naps); the one it replaces is closed."""
    global _waker
    if _waker is not None and _waker is not waker:
        _waker.close()
    _waker = waker


def uninstall(waker: Waker) -> None:
    """Forget `waker` if it is this rank's (its Transport closed)."""
    global _waker
    if _waker is waker:
        _waker = None


def poke(rank: int) -> None:
    """Wake rank `rank` through this rank's Waker, if there is one (a hint: see Waker)."""
    if _waker is not None:
        _waker.poke(rank)
