"""MPI one-sided communication (MPI.Win) of the mpi4py layer, on the fabric's own windows.

Every window is memory of the target GPU (gpu.alloc) that the GPU exports to exactly the window's
group (gpu.export(region, to=members)): Put and Get are gpu.put / gpu.get with that handle, so the
switch's Link TLB checks every access, refuses one from outside the group (AccessViolation, counted
on the requester's port), counts the bytes per link and times them as any put or get. Classic NVLink
(no Link TLB) uses the region's physical address instead: any GPU may reach it, as on the hardware.
A dynamic window (`Create_dynamic`) exports each block `Attach`ed (GPU memory) to the group; an origin
addresses it by the owner's absolute address and asks the owner which block holds it ("where").
Synchronisation and the memory model: rma_epochs.py; Put, Get, accumulates: rma_ops.py.
"""

import collections
import itertools
from typing import Any

import numpy as np

from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.errors import UnsupportedOperation

from .buffers import BOTTOM, Get_address, Memory, as_array
from .comm import COMM_SELF
from .constants import (ERR_ARG, ERR_RANK, ERR_RMA_RANGE, ERR_WIN, INBOX_SLOT_DYNAMIC, INBOX_SLOT_MAX,
                        INBOX_SLOT_MIN, PROC_NULL, TAG, WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT,
                        WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_CREATE, WIN_FLAVOR_DYNAMIC, WIN_MODEL, WIN_SEPARATE,
                        WIN_SIZE, WIN_UNIFIED)
from .context import _gpu
from .errors import _error
from .groups import Group, comm_members
from .handles import _Handle
from .info import ERRORS_ARE_FATAL, Errhandler, Info
from .rma_epochs import Epochs
from .rma_ops import Operations

open_windows: dict[str, "Win"] = {}                  # window id -> this GPU's live window
_made: collections.Counter = collections.Counter()  # communicator name -> windows made on it (ids)
refused: collections.Counter = collections.Counter()  # requests this GPU's windows dropped: {reason: count}


class NotOnWindows(UnsupportedOperation, NotImplementedError):
    """A window kind the layer does not make: UnsupportedOperation, and NotImplementedError, which is how
    mpi4py says an MPI lacks a feature (its own tests probe for it so)."""


def reset() -> None:
    """A new program (MPI.bind): no windows yet."""
    open_windows.clear()
    _made.clear()
    refused.clear()


class Win(Epochs, Operations, _Handle):
    """MPI.Win over GPU windows (see the docstrings of this module, rma_epochs and rma_ops)."""

    _mpi4py, _held = "Win", "_wid"

    # set by _make, beside what Epochs and Operations declare
    _name: str
    _comm: Any                        # the Comm it was made on
    _owned: bool                      # _region was allocated for the window (freed with it)
    _model: int                       # WIN_SEPARATE or WIN_UNIFIED
    _targets: list                    # each member's window target (Handle, physical address or None)
    _attached: list                   # dynamic: (address, block, window target)
    _info: Info | None
    _errhandler: Errhandler | None

    def __init__(self, win=None):
        if win is not None and not isinstance(win, Win):
            raise TypeError(f"MPI.Win({win!r}): expecting a Win")
        self.__dict__.update(win.__dict__ if win is not None else {"_wid": None, "_name": ""})

    def __reduce__(self):
        raise ValueError("cannot pickle MPI.Win")

    def __repr__(self):
        return f"<Win {self._wid or 'WIN_NULL'}>"

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def Create(cls, memory, disp_unit: int = 1, info=None, comm=None) -> "Win":
        """A window over `memory` (a buffer, or None / MPI.BOTTOM for none) on `comm` (collective)."""
        gpu = _gpu()
        if memory is None or memory is BOTTOM:
            user = np.zeros(0, np.uint8)
        else:
            user = as_array(memory, readonly=False).reshape(-1).view(np.uint8)
        region = _in_gpu_memory(gpu, user)
        if region is not None:  # already GPU memory: the window is that memory
            return cls._make(comm, region, disp_unit, WIN_FLAVOR_CREATE, user=None, owned=False)
        region = gpu.alloc(user.nbytes, np.uint8)
        region[:] = user
        return cls._make(comm, region, disp_unit, WIN_FLAVOR_CREATE, user=user, owned=True)

    @classmethod
    def Allocate(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> "Win":
        """A window of `size` new bytes of this GPU's memory (tomemory() is that memory; collective)."""
        size = int(size)
        if size < 0:
            raise _error(ERR_ARG, f"MPI.Win.Allocate: negative size {size}")
        region = _gpu().alloc(size, np.uint8)
        region[:] = 0
        return cls._make(comm, region, disp_unit, WIN_FLAVOR_ALLOCATE, user=None, owned=True)

    @classmethod
    def Allocate_shared(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> "Win":
        raise NotOnWindows(
            "MPI.Win.Allocate_shared: a shared-memory window is one block of memory that every member loads "
            "and stores directly; NVLink does not merge GPU memories into one (each GPU owns its HBM, and "
            "another GPU reaches it only through the switch, by a window's network address or a physical "
            "address): use Win.Allocate or Win.Create and Put/Get")

    @classmethod
    def Create_dynamic(cls, info=None, comm=None) -> "Win":
        """A window of no memory yet (collective): each member Attaches its own (GPU memory, as MPI.Alloc_mem
        returns), and the origins address it by absolute address (MPI.Get_address on the owner)."""
        return cls._make(comm, np.zeros(0, np.uint8), 1, WIN_FLAVOR_DYNAMIC, user=None, owned=False)

    def Attach(self, memory) -> None:
        """Expose `memory` (bytes of this GPU's memory: MPI.Alloc_mem, or MPI.emulated_gpu().alloc) in this
        dynamic window: exported to the window's group, addressed by MPI.Get_address(memory)."""
        self._live("Attach")
        if self._flavor != WIN_FLAVOR_DYNAMIC:
            raise _error(ERR_WIN, "MPI.Win.Attach: the window was not made by Create_dynamic")
        array = as_array(memory, readonly=False).reshape(-1).view(np.uint8)
        block = _in_gpu_memory(self._gpu, array)
        if block is None:
            raise UnsupportedOperation("MPI.Win.Attach: the memory is not this GPU's (the switch reaches GPU "
                                       "memory only; attach what MPI.Alloc_mem returned)")
        self._attached.append((Get_address(block), block, _expose(self._gpu, block, self._members)))

    def Detach(self, memory) -> None:
        """Stop exposing memory Attach exposed (its window is revoked: later accesses are refused)."""
        self._live("Detach")
        address = Get_address(memory)
        for i, (base, block, target) in enumerate(self._attached):
            if base == address:
                if target is not None and not isinstance(target, int):
                    self._gpu.revoke(target)
                del self._attached[i]
                return
        raise _error(ERR_WIN, f"MPI.Win.Detach: no memory attached at {address:#x}")

    def _block_at(self, address: int, nbytes: int):
        """(block, byte offset) of this GPU's attached memory holding [address, address + nbytes), or None."""
        for base, block, _ in self._attached:
            if base <= address and address + nbytes <= base + block.nbytes:
                return block, address - base
        return None

    def _reach(self, rank: int, address: int, nbytes: int, call: str):
        """(local array, None, offset) for this GPU's own part, or (None, window target, offset) of
        another's: a dynamic window's owner is asked which attached block holds the bytes."""
        if self._flavor != WIN_FLAVOR_DYNAMIC:
            return (self._region, None, address) if rank == self._rank else (None, self._targets[rank], address)
        if rank == self._rank:
            found = self._block_at(address, nbytes)
            if found is None:
                raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: bytes {address:#x}+{nbytes} are not attached here")
            return found[0], None, found[1]
        number = next(self._numbers)
        gpu = self._gpu
        gpu.wait_sent([gpu.send_message(self._members[rank], (TAG, self._wid, "where", number, address, nbytes),
                                        np.zeros(0, np.uint8))], f"MPI.Win.{call}")
        gpu.wait(lambda: number in self._answers, f"MPI.Win.{call}", f"GPU {self._members[rank]} (rank {rank})")
        _, data = self._answers.pop(number)
        kind, a, b, c, d, base = data.view(np.int64).tolist()
        if kind == 0:
            raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: bytes {address:#x}+{nbytes} are not attached at rank "
                                        f"{rank} (GPU {self._members[rank]})")
        return None, (Handle(a, b, c, d) if kind == 1 else a), address - base

    @classmethod
    def _make(cls, comm, region, disp_unit, flavor, user, owned) -> "Win":
        gpu = _gpu()
        comm = COMM_SELF if comm is None else comm  # mpi4py's default
        emu = comm._live("Win.Create")
        disp_unit = int(disp_unit)
        if disp_unit <= 0:
            raise _error(ERR_ARG, f"MPI.Win: disp_unit must be positive, got {disp_unit}")
        members = comm_members(comm)
        name = getattr(emu, "name", comm._name)
        wid = f"{name}#{_made[name]}"
        _made[name] += 1
        win = cls()
        win._wid, win._name, win._gpu, win._comm, win._emu = wid, "", gpu, comm, emu
        win._members, win._rank, win._flavor = members, members.index(gpu.rank), flavor
        win._region, win._user, win._owned = region, user, owned
        win._snapshot = None if user is None else user.copy()
        win._model = WIN_SEPARATE if user is not None else WIN_UNIFIED
        # the inbox: one slot per member, where each puts the operands of its accumulates to this GPU
        win._slot = max(INBOX_SLOT_MIN, min(INBOX_SLOT_MAX, -(-region.nbytes // 16) * 16)) \
            if flavor != WIN_FLAVOR_DYNAMIC else INBOX_SLOT_DYNAMIC
        win._inbox = gpu.alloc(win._slot * len(members), np.uint8)
        mine = (_expose(gpu, region, members), _expose(gpu, win._inbox, members), region.nbytes, disp_unit, win._slot)
        everyone = emu.allgather_object(mine) if len(members) > 1 else [mine]
        win._targets = [entry[0] for entry in everyone]
        win._inboxes = [entry[1] for entry in everyone]
        win._sizes = [entry[2] for entry in everyone]
        win._units = [entry[3] for entry in everyone]
        win._slots = [entry[4] for entry in everyone]
        # as a target: locks held and asked for; as an origin: answers and notices received
        win._holders = {}                                 # GPU -> lock type it holds here
        win._waiting = collections.deque()                # (GPU, number, type) queued for the lock
        win._answers = {}                                 # request number -> (status, bytes)
        win._posts, win._completes = collections.Counter(), collections.Counter()  # GPU -> notices
        win._numbers = itertools.count(1)
        win._access, win._exposure = (), ()               # PSCW: GPUs of Start, of Post
        win._info = None
        win._attached = []                                 # dynamic: (address, block, window target)
        win._errhandler = None
        open_windows[wid] = win
        gpu.serve_messages(TAG, serve)  # the one server of every window of this GPU (set again: the same)
        return win

    def Free(self) -> None:
        """Free the window (collective): every member's accesses end first."""
        self._live("Free")
        gpu = self._gpu
        gpu.fence()
        self._emu.barrier()  # nobody reads or writes it any more
        self._merge()
        for target in (self._targets[self._rank], self._inboxes[self._rank], *(t for _, _, t in self._attached)):
            if target is not None and not isinstance(target, int):
                gpu.revoke(target)
        gpu.free(self._inbox)
        if self._owned:
            gpu.free(self._region)
        del open_windows[self._wid]  # type: ignore[arg-type]  # not None: _live("Free") checked it
        self._wid = None

    free = Free

    def _live(self, call: str) -> "Win":
        if self._wid is None:
            raise _error(ERR_WIN, f"MPI.Win.{call} on WIN_NULL")
        return self

    # -- queries ------------------------------------------------------------------------------------
    def Get_group(self) -> Group:
        return Group(members=self._live("Get_group")._members)

    group = property(Get_group)
    group_size = property(lambda self: len(self._live("group_size")._members))
    group_rank = property(lambda self: self._live("group_rank")._rank)

    def _private(self) -> np.ndarray:
        return self._region if self._user is None else self._user

    def Get_attr(self, keyval):
        self._live("Get_attr")
        if keyval == WIN_BASE:
            return 0 if self._flavor == WIN_FLAVOR_DYNAMIC else Get_address(self._private())
        if keyval == WIN_SIZE:
            return self._region.nbytes
        if keyval == WIN_DISP_UNIT:
            return self._units[self._rank]
        if keyval == WIN_CREATE_FLAVOR:
            return self._flavor
        if keyval == WIN_MODEL:
            return self._model
        return None

    attrs = property(lambda self: (self.Get_attr(WIN_BASE), self.Get_attr(WIN_SIZE), self.Get_attr(WIN_DISP_UNIT)))
    flavor = property(lambda self: self.Get_attr(WIN_CREATE_FLAVOR))
    model = property(lambda self: self.Get_attr(WIN_MODEL))

    def tomemory(self):
        """This GPU's part of the window, as a byte buffer (the private copy)."""
        return Memory.over(self._live("tomemory")._private())

    def Shared_query(self, rank: int):
        """(memory, disp unit) of `rank`'s part that this process may load and store: its own part; another
        GPU's is reached only through the switch (Put/Get), so its memory here is empty (MPI 4.1's answer
        for a window that is not shared). PROC_NULL: rank 0's."""
        rank = 0 if rank == PROC_NULL else self._target(rank, "Shared_query")
        memory = self._private() if rank == self._rank else np.zeros(0, np.uint8)
        return Memory.over(memory), self._units[rank]

    def Get_name(self) -> str:
        return self._name if self._wid is not None else "MPI_WIN_NULL"

    def Set_name(self, name: str) -> None:
        self._name = str(name)

    name = property(Get_name, Set_name)

    # -- addressing -----------------------------------------------------------------------------------
    def _target(self, rank, call: str):
        """(GPU, window target, byte size, disp unit) of group rank `rank`; None for PROC_NULL."""
        self._live(call)
        if rank == PROC_NULL:
            return None
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < len(self._members):
            raise _error(ERR_RANK, f"MPI.Win.{call}: rank {rank} is not 0..{len(self._members) - 1}")
        return int(rank)


    # -- info and error handlers (accepted, not used) ----------------------------------------------------
    def Get_info(self) -> Info:
        return Info.Create(getattr(self._live("Get_info")._info, "_items", None) or {})

    def Set_info(self, info) -> None:
        self._live("Set_info")._info = Info(info)

    info = property(Get_info, Set_info)

    def Get_errhandler(self) -> Errhandler:
        return Errhandler(self._live("Get_errhandler")._errhandler or ERRORS_ARE_FATAL)

    def Set_errhandler(self, errhandler) -> None:
        self._live("Set_errhandler")._errhandler = Errhandler(errhandler)

    # -- the target's side: served in its progress loop ------------------------------------------------
    def _serve(self, sender: int, verb: str, number: int, args: tuple, data: np.ndarray) -> list:
        answer = (TAG, self._wid, "ans", number)
        if verb == "ans":
            self._answers[number] = (args[0], data)
            return []
        if verb == "post":
            self._posts[sender] += 1
            return []
        if verb == "complete":
            self._completes[sender] += 1
            return [(sender, (*answer, 0), np.zeros(0, np.uint8))]
        if verb == "lock":
            self._waiting.append((sender, number, args[0]))
            return self._grant()
        if verb == "unlock":
            self._holders.pop(sender, None)
            return self._grant()
        if verb == "where":
            found = self._block_at(*args)
            if found is None:
                return [(sender, (*answer, 0), np.zeros(6, np.int64).view(np.uint8))]
            base = args[0] - found[1]
            target = next(t for b, _, t in self._attached if b == base)
            fields = [1, target.network_address, target.address, target.size_bytes, target.owner] \
                if isinstance(target, Handle) else [2, int(target), 0, 0, 0]
            return [(sender, (*answer, 0), np.array([*fields, base], np.int64).view(np.uint8))]
        if verb == "rmw":
            # args: the request's six fields (opname ... has_operand: Operations._remote_rmw sends them)
            status, reply = self._rmw(sender, *args, data)  # type: ignore[call-arg]
            return [(sender, (*answer, status), reply)]
        refused["unknown request"] += 1
        return []


def serve(sender, key, data) -> list:
    """gpu.serve_messages's server of the window protocol: the request goes to its window, if `sender`
    is a member of it (anything else is dropped and counted in `refused`)."""
    if len(key) < 4 or not isinstance(key[1], str) or not isinstance(key[2], str):
        refused["malformed"] += 1
        return []
    win = open_windows.get(key[1])
    if win is None or sender not in win._members:
        refused["not a member" if win is not None else "no such window"] += 1
        return []
    try:
        return win._deliver(win._serve(sender, key[2], key[3], tuple(key[4:]), data))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        # a member's request this layer never sends (arguments of the wrong kind): dropped, counted,
        # never raised into whatever wait this GPU is in
        refused["malformed"] += 1
        return []


# -- helpers ------------------------------------------------------------------------------------------
def _in_gpu_memory(gpu, user: np.ndarray):
    """`user` itself if it is a whole gpu.alloc'd array's bytes (so the window can be that memory)."""
    if not user.nbytes:
        return None
    memory = gpu.memory
    start = user.__array_interface__["data"][0] - memory.__array_interface__["data"][0]
    if not 0 <= start <= memory.nbytes - user.nbytes:
        return None
    return memory[start:start + user.nbytes]


def _expose(gpu, region: np.ndarray, members: tuple[int, ...]):
    """What other members use to reach `region`: a Handle exported to exactly `members` (NVLink
    Network, or classic nodes joined by InfiniBand), else its physical address; None if empty."""
    if not region.nbytes:
        return None
    if gpu.config.windows:
        return gpu.export(region, to=list(members))
    return gpu.physical_address(region)


Win._family = Win
WIN_NULL = Win()
