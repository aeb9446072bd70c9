"""MPI.Win's synchronisation in the layer: epochs (fence, locks, PSCW) and the two copies of a window.

Memory. A program's `Win.Create(buf, ...)` buffer is host memory of the GPU's process, which the
fabric cannot reach, and NVLink does not merge memories. So a window made of a buffer that is not
already in GPU memory is MPI's *separate* memory model (WIN_MODEL = WIN_SEPARATE): the public copy is
the exported GPU region, the private copy the program's buffer, and the two are made the same (a
three-way merge: bytes the program stored since the last merge go to the GPU, the rest come back)
where MPI says they are: Fence, Post, Wait, Test, Lock/Unlock and Lock_all/Unlock_all of the owner
on its own window, Sync and Free. `Win.Allocate` (and `Create` over GPU memory: MPI.Alloc_mem's, or
`MPI.emulated_gpu().alloc`'s) is the GPU region itself: WIN_UNIFIED, `tomemory()` is that memory.
"""

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .constants import ERR_GROUP, ERR_LOCKTYPE, LOCK_EXCLUSIVE, LOCK_SHARED, TAG
from .errors import _error

if TYPE_CHECKING:
    from ..comm import Communicator
    from ..gpu import Gpu


class Epochs:
    """Win's synchronisation calls (a part of MPI.Win)."""

    # what these calls use of the window, which Win._make sets (rma_ops.Operations, win.Win)
    _wid: str | None                  # None: WIN_NULL (freed)
    _gpu: "Gpu"
    _emu: "Communicator"              # the communicator's emulated one (control exchanges)
    _members: tuple[int, ...]         # GPU of each group rank
    _rank: int                        # this GPU's group rank
    _region: np.ndarray               # this GPU's part (uint8, GPU memory): the public copy
    _user: np.ndarray | None          # the program's buffer (separate model), or None (unified)
    _snapshot: np.ndarray | None      # _user as of the last merge
    _holders: dict[int, int]
    _waiting: collections.deque
    _answers: dict[int, tuple]
    _posts: collections.Counter
    _completes: collections.Counter
    _numbers: Iterator[int]
    _access: tuple
    _exposure: tuple
    _live: Callable[[str], Any]       # Win's methods
    _target: Callable[[Any, str], int | None]
    _serve: Callable[..., list]

    def _merge(self) -> None:
        """Make the private and public copies the same (separate model): bytes the program stored since
        the last merge go to the GPU region, the rest (what Puts and accumulates wrote) come back."""
        if self._user is None:
            return
        stored = self._user != self._snapshot
        self._region[stored] = self._user[stored]
        self._user[:] = self._region
        self._snapshot[:] = self._region  # type: ignore[index]  # set with _user (Win._make)

    def Fence(self, assertion: int = 0) -> None:
        """End one epoch and start the next (collective): every member's Puts and accumulates of the
        epoch are visible where they went."""
        self._live("Fence")
        self._merge()
        self._gpu.fence()
        self._emu.barrier()
        self._merge()

    def Flush(self, rank: int) -> None:
        """This GPU's operations to `rank` are complete there (gpu.fence: every put acknowledged)."""
        self._target(rank, "Flush")
        self._gpu.fence()

    def Flush_all(self) -> None:
        self._live("Flush_all")
        self._gpu.fence()

    Flush_local = Flush
    Flush_local_all = Flush_all

    def Sync(self) -> None:
        self._live("Sync")
        self._merge()

    def _notice(self, rank: int, verb: str, *args, answer: bool = True):
        """Send a request to group rank `rank`'s GPU (this GPU's own: served here); with `answer`, wait
        for its answer."""
        number = next(self._numbers)
        gpu = self._gpu
        if rank == self._rank:
            self._send_all(self._deliver(self._serve(gpu.rank, verb, number, args, None)))
        else:
            gpu.wait_sent([gpu.send_message(self._members[rank], (TAG, self._wid, verb, number, *args),
                                            np.zeros(0, np.uint8))], f"MPI.Win {verb}")
        if answer:
            gpu.wait(lambda: number in self._answers, f"MPI.Win {verb}", f"GPU {self._members[rank]} (rank {rank})")
            self._answers.pop(number)

    def _send_all(self, replies: list) -> None:
        """Send what serving this GPU's own request answered other GPUs (locks granted on release)."""
        gpu = self._gpu
        gpu.wait_sent([gpu.send_message(peer, key, data) for peer, key, data in replies], "MPI.Win answers")

    def Lock(self, rank: int, lock_type: int = LOCK_EXCLUSIVE, assertion: int = 0) -> None:
        """Start a passive-target epoch at `rank` (waits until the target's GPU grants the lock)."""
        if self._target(rank, "Lock") is None:
            return
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise _error(ERR_LOCKTYPE, f"MPI.Win.Lock: lock type {lock_type}")
        self._notice(rank, "lock", int(lock_type))  # its own lock: queued with the others' requests, here
        if rank == self._rank:
            self._merge()

    def Unlock(self, rank: int) -> None:
        """End it: this GPU's operations to `rank` are complete there, then the lock is released."""
        if self._target(rank, "Unlock") is None:
            return
        self._gpu.fence()
        if rank == self._rank:
            self._merge()
        self._notice(rank, "unlock", answer=False)  # the operations are complete (fenced): no answer needed

    def Lock_all(self, assertion: int = 0) -> None:
        for rank in range(len(self._live("Lock_all")._members)):
            self.Lock(rank, LOCK_SHARED)

    def Unlock_all(self) -> None:
        for rank in range(len(self._live("Unlock_all")._members)):
            self.Unlock(rank)

    def _ranks_of(self, group, call: str) -> list[int]:
        try:
            return [self._members.index(gpu) for gpu in group._members]
        except ValueError:
            raise _error(ERR_GROUP, f"MPI.Win.{call}: the group has GPUs outside the window's") from None

    def Post(self, group, assertion: int = 0) -> None:
        """Expose this GPU's window to `group` (PSCW): each member's Start may go on."""
        ranks = self._ranks_of(group, "Post")
        self._merge()
        self._exposure = tuple(ranks)
        for rank in ranks:
            self._notice(rank, "post", answer=False)

    def Start(self, group, assertion: int = 0) -> None:
        """Start an access epoch to `group`: waits for each member's Post."""
        ranks = self._ranks_of(group, "Start")
        whom = [self._members[r] for r in ranks]
        self._gpu.wait(lambda: all(self._posts[g] for g in whom), "MPI.Win.Start", f"Post of GPUs {whom}")
        for g in whom:
            self._posts[g] -= 1
        self._access = tuple(ranks)

    def Complete(self) -> None:
        """End the access epoch: this GPU's operations are complete at every target, which are told."""
        self._live("Complete")
        self._gpu.fence()
        for rank in self._access:
            self._notice(rank, "complete")
        self._access = ()

    def _exposure_done(self) -> bool:
        return all(self._completes[self._members[r]] for r in self._exposure)

    def Wait(self) -> None:
        """End the exposure epoch: waits for each origin's Complete."""
        self._live("Wait")
        whom = [self._members[r] for r in self._exposure]
        self._gpu.wait(self._exposure_done, "MPI.Win.Wait", f"Complete of GPUs {whom}")
        self._end_exposure()

    def Test(self) -> bool:
        self._live("Test")
        self._gpu.poll()
        if not self._exposure_done():
            return False
        self._end_exposure()
        return True

    def _end_exposure(self) -> None:
        for rank in self._exposure:
            self._completes[self._members[rank]] -= 1
        self._exposure = ()
        self._merge()


    def _deliver(self, replies: list) -> list:
        """Replies to this GPU itself (a lock of its own window granted) are taken here; the others are
        returned (to be sent)."""
        me = self._gpu.rank
        for peer, key, data in replies:
            if peer == me:
                self._answers[key[3]] = (key[4], data)
        return [reply for reply in replies if reply[0] != me]

    def _grant(self) -> list:
        """Grant queued locks in order while they are compatible with the held ones."""
        granted = []
        while self._waiting:
            sender, number, kind = self._waiting[0]
            exclusive = kind == LOCK_EXCLUSIVE
            if self._holders and (exclusive or LOCK_EXCLUSIVE in self._holders.values()):
                break
            self._waiting.popleft()
            self._holders[sender] = kind
            granted.append((sender, (TAG, self._wid, "ans", number, 0), np.zeros(0, np.uint8)))
        return granted
