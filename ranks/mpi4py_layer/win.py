"""MPI one-sided communication (MPI.Win) of the mpi4py layer, on the fabric's own windows.

Every window is memory of the target GPU (gpu.alloc) that the GPU exports to exactly the window's
group (gpu.export(region, to=members)): Put and Get are gpu.put / gpu.get with that handle, so the
switch's Link TLB checks every access, refuses one from outside the group (AccessViolation, counted
on the requester's port), counts the bytes per link and times them as any put or get. Classic NVLink
(no Link TLB) uses the region's physical address instead: any GPU may reach it, as on the hardware.

Memory. A program's `Win.Create(buf, ...)` buffer is host memory of the GPU's process, which the
fabric cannot reach, and NVLink does not merge memories. So a window made of a buffer that is not
already in GPU memory is MPI's *separate* memory model (WIN_MODEL = WIN_SEPARATE): the public copy is
the exported GPU region, the private copy the program's buffer, and the two are made the same (a
three-way merge: bytes the program stored since the last merge go to the GPU, the rest come back)
where MPI says they are: Fence, Post, Wait, Test, Lock/Unlock and Lock_all/Unlock_all of the owner
on its own window, Sync and Free. `Win.Allocate` (and `Create` over GPU memory: MPI.Alloc_mem's, or
`MPI.emulated_gpu().alloc`'s) is the GPU region itself: WIN_UNIFIED, `tomemory()` is that memory. A
dynamic window (`Create_dynamic`) exports each block `Attach`ed (GPU memory) to the group; an origin
addresses it by the owner's absolute address and asks the owner which block holds it ("where").

Accumulates, atomics and locks are answered by the target GPU's memory without its program, as the
hardware's atomics are: the origin puts its operand into its own slot of the target's *inbox* (a
second region exported to the same group, so the switch checks that write too), then asks the target
with a message; the target serves the request in its progress loop (gpu.serve_messages), which runs
one request at a time, so each read-modify-write is atomic per element (and per call), and answers
with a message (the old values for the fetching forms). Lock requests and the PSCW notices are
messages served the same way. As in MPI, passive-target progress needs the target to be in some
call of the layer (any blocking wait serves it).
"""

import ast
import collections
import itertools

import numpy as np

from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.errors import FabricError, UnsupportedOperation

from . import MPI as _mpi
from .buffers import as_array, as_datatype, message_simple

PREDEFINED_OPS = ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR", "MAXLOC", "MINLOC")
TAG = "rma"                # message keys of the window protocol: (TAG, window id, verb, number, ...)
INBOX_SLOT_MAX = 1 << 20   # bytes of one origin's slot in a target's inbox; a larger operand goes in pieces
INBOX_SLOT_MIN = 64        # a slot holds at least a compare-and-swap's two values of any type
INBOX_SLOT_DYNAMIC = 1 << 16  # a dynamic window's (its memory comes later)

LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1024, 2048, 4096, 8192, 16384
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = 0x66000001, 0x66000003, 0x66000005, 0x66000007, \
    0x66000009
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
ERR_GROUP, ERR_WIN, ERR_DISP, ERR_LOCKTYPE, ERR_RMA_RANGE = 8, 45, 28, 46, 55  # MPICH's error classes

_open: dict[str, "Win"] = {}                  # window id -> this GPU's live window
_made: collections.Counter = collections.Counter()  # communicator name -> windows made on it (ids)
refused = collections.Counter()              # requests this GPU's windows dropped: {reason: count}


class NotOnWindows(UnsupportedOperation, NotImplementedError):
    """A window kind the layer does not make: UnsupportedOperation, and NotImplementedError, which is how
    mpi4py says an MPI lacks a feature (its own tests probe for it so)."""


def reset() -> None:
    """A new program (MPI.bind): no windows yet."""
    _open.clear()
    _made.clear()
    refused.clear()


class Memory(np.ndarray):
    """Bytes as mpi4py's MPI.buffer (what Alloc_mem and Win.tomemory return): a uint8 array, format "B",
    never false; `_block`: the gpu.alloc array it is (Alloc_mem), for Free_mem."""

    @classmethod
    def over(cls, array: np.ndarray, block=None) -> "Memory":
        memory = array.reshape(-1).view(np.uint8).view(cls)
        memory._block = block
        return memory

    def __bool__(self):
        return True

    format = property(lambda self: "B")
    address = property(lambda self: int(self.__array_interface__["data"][0]))


# -- groups (what Win.Get_group, Comm.Get_group and PSCW take) --------------------------------------
class Group(_mpi._Mpi4pyNames):
    """MPI.Group: an ordered set of GPUs (world indices); `rank` is this GPU's place in it."""

    _mpi4py = "Group"

    def __init__(self, group=None, members=()):
        self._members = tuple(group._members) if isinstance(group, Group) else tuple(members)
        self._freed = False

    def _me(self) -> int:
        return _mpi._gpu().rank

    def Get_size(self) -> int:
        return len(self._members)

    def Get_rank(self) -> int:
        me = self._me()
        return self._members.index(me) if me in self._members else _mpi.UNDEFINED

    size, rank = property(Get_size), property(Get_rank)

    def Incl(self, ranks) -> "Group":
        return Group(members=[self._members[r] for r in ranks])

    def Excl(self, ranks) -> "Group":
        out = set(ranks)
        return Group(members=[m for r, m in enumerate(self._members) if r not in out])

    def Translate_ranks(self, ranks=None, group=None):
        ranks = range(len(self._members)) if ranks is None else ranks
        if group is None:
            return [self._members[r] for r in ranks]
        return [group._members.index(self._members[r]) if self._members[r] in group._members else _mpi.UNDEFINED
                for r in ranks]

    @staticmethod
    def Compare(group1, group2) -> int:
        if group1._members == group2._members:
            return _mpi.IDENT
        return _mpi.SIMILAR if sorted(group1._members) == sorted(group2._members) else _mpi.UNEQUAL

    def Dup(self) -> "Group":
        return Group(self)

    def Free(self) -> None:
        self._freed = True

    def __eq__(self, other):
        return isinstance(other, Group) and other._members == self._members

    __hash__ = None


GROUP_EMPTY = Group()


def comm_members(comm) -> tuple:
    """World GPU indices of an MPI.Comm's members, in rank order."""
    emu = comm._live("Get_group")
    return tuple(getattr(emu, "members", (_mpi._gpu().rank,)))


# -- hints and error handlers: accepted, kept, not acted on (the layer raises every error) -------------
class Info(_mpi._Handle):
    """MPI.Info: string hints (key -> value); the layer takes them and uses none."""

    _mpi4py, _held = "Info", "_items"

    def __init__(self, info=None):
        self._items = dict(info._items) if isinstance(info, Info) and info._items is not None else None

    @classmethod
    def Create(cls, items=()) -> "Info":
        made = cls()
        made._items = dict(items)
        return made

    def Dup(self) -> "Info":
        return Info.Create(self._items or {})

    def Free(self) -> None:
        self._items = None

    def Get(self, key: str):
        return (self._items or {}).get(key)

    def Set(self, key: str, value: str) -> None:
        self._items[str(key)] = str(value)

    def Delete(self, key: str) -> None:
        del self._items[key]

    def Get_nkeys(self) -> int:
        return len(self._items or {})

    def __len__(self):
        return self.Get_nkeys()

    def __eq__(self, other):
        return isinstance(other, Info) and (self is other or (self._items is None and other._items is None))

    __hash__ = object.__hash__


INFO_NULL = Info()
INFO_ENV = Info.Create()


class Errhandler(_mpi._Handle):
    """MPI.Errhandler: ERRORS_ARE_FATAL / ERRORS_RETURN, kept per window; the layer raises either way."""

    _mpi4py, _held = "Errhandler", "_kind"

    def __init__(self, errhandler=None, kind=None):
        self._kind = errhandler._kind if isinstance(errhandler, Errhandler) else kind

    def Free(self) -> None:
        self._kind = None

    def __eq__(self, other):
        return isinstance(other, Errhandler) and self._kind == other._kind

    __hash__ = object.__hash__


ERRHANDLER_NULL = Errhandler()
ERRORS_ARE_FATAL = Errhandler(kind="ERRORS_ARE_FATAL")
ERRORS_RETURN = Errhandler(kind="ERRORS_RETURN")
ERRORS_ABORT = Errhandler(kind="ERRORS_ABORT")


# -- the window ---------------------------------------------------------------------------------------
def _error(cls, message: str):
    return _mpi.Exception(cls, message)


class Win(_mpi._Handle):
    """MPI.Win over GPU windows (see the module's docstring)."""

    _mpi4py, _held = "Win", "_wid"

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
        gpu = _mpi._gpu()
        if memory is None or memory is _mpi.BOTTOM:
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
            raise _error(_mpi.ERR_ARG, f"MPI.Win.Allocate: negative size {size}")
        region = _mpi._gpu().alloc(size, np.uint8)
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
        self._attached.append((_mpi.Get_address(block), block, _expose(self._gpu, block, self._members)))

    def Detach(self, memory) -> None:
        """Stop exposing memory Attach exposed (its window is revoked: later accesses are refused)."""
        self._live("Detach")
        address = _mpi.Get_address(memory)
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
        gpu = _mpi._gpu()
        comm = _mpi.COMM_SELF if comm is None else comm  # mpi4py's default
        emu = comm._live("Win.Create")
        disp_unit = int(disp_unit)
        if disp_unit <= 0:
            raise _error(_mpi.ERR_ARG, f"MPI.Win: disp_unit must be positive, got {disp_unit}")
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
        win._holders: dict[int, int] = {}                 # GPU -> lock type it holds here
        win._waiting: collections.deque = collections.deque()  # (GPU, number, type) queued for the lock
        win._answers: dict[int, tuple] = {}               # request number -> (status, bytes)
        win._posts, win._completes = collections.Counter(), collections.Counter()  # GPU -> notices
        win._numbers = itertools.count(1)
        win._access, win._exposure = (), ()               # PSCW: GPUs of Start, of Post
        win._info = None
        win._attached: list = []                           # dynamic: (address, block, window target)
        win._errhandler = None
        _open[wid] = win
        if TAG not in gpu._servers:
            gpu.serve_messages(TAG, _serve)
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
        del _open[self._wid]
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
            return 0 if self._flavor == WIN_FLAVOR_DYNAMIC else _mpi.Get_address(self._private())
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
        rank = 0 if rank == _mpi.PROC_NULL else self._target(rank, "Shared_query")
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
        if rank == _mpi.PROC_NULL:
            return None
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < len(self._members):
            raise _error(_mpi.ERR_RANK, f"MPI.Win.{call}: rank {rank} is not 0..{len(self._members) - 1}")
        return int(rank)

    def _layout(self, rank, target, msg, call: str) -> tuple[int, np.ndarray | None, np.dtype, int]:
        """(byte offset in the target's window, base-element indices from there or None if contiguous,
        base dtype, elements) of the target spec (None, disp, or (disp, count, datatype))."""
        disp, count, datatype = 0, msg.count, msg.datatype
        if isinstance(target, (int, np.integer)):
            disp = int(target)
        elif isinstance(target, (list, tuple)):
            parts = list(target) + [None] * (3 - len(target))
            disp = int(parts[0] or 0)
            count = msg.count if parts[1] is None else int(parts[1])
            datatype = msg.datatype if parts[2] is None else as_datatype(parts[2])
        elif target is not None:
            raise ValueError(f"MPI.Win.{call}: target must be None, a displacement or (disp, count, datatype)")
        if disp < 0:
            raise _error(ERR_DISP, f"MPI.Win.{call}: negative displacement {disp}")
        if datatype.base != msg.base or count * len(datatype.offsets) != msg.count * msg.elements:
            raise _error(_mpi.ERR_TYPE, f"MPI.Win.{call}: the origin's {msg.count} x {msg.datatype} and the "
                                        f"target's {count} x {datatype} differ")
        offset = disp * self._units[rank]
        itemsize = datatype.base.itemsize
        if datatype.contiguous:
            index, span = None, count * len(datatype.offsets) * itemsize
        else:
            index = datatype._items(np.arange(count, dtype=np.int64) * datatype._extent)
            span = (int(index.max()) + 1) * itemsize if index.size else 0
        if self._flavor != WIN_FLAVOR_DYNAMIC and offset + span > self._sizes[rank]:
            raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: bytes {offset}..{offset + span} of rank {rank}'s "
                                             f"window of {self._sizes[rank]} (GPU {self._members[rank]})")
        return offset, index, datatype.base, count * len(datatype.offsets)

    # -- data movement ------------------------------------------------------------------------------
    def Put(self, origin, target_rank: int, target=None) -> None:
        """Write the origin buffer into `target_rank`'s window: gpu.put per contiguous run of the target
        datatype. Visible there at the next Fence / Flush / Unlock / Complete."""
        rank = self._target(target_rank, "Put")
        msg = message_simple(origin, readonly=True, null=rank is None)
        if rank is None:
            return
        offset, index, base, elements = self._layout(rank, target, msg, "Put")
        values = msg.pack().reshape(-1)
        for start, stop, at in _runs(index, elements):
            data = np.ascontiguousarray(values[start:stop]).view(np.uint8)
            if not data.nbytes:
                continue
            local, remote, where = self._reach(rank, offset + at * base.itemsize, data.nbytes, "Put")
            if local is not None:  # this GPU's own memory: a local copy, as a GPU stores to its HBM
                local[where:where + data.nbytes] = data
            else:
                self._gpu.put(remote, data, where)

    def Get(self, origin, target_rank: int, target=None) -> None:
        """Read `target_rank`'s window into the origin buffer: gpu.get per contiguous run (complete at once)."""
        rank = self._target(target_rank, "Get")
        msg = message_simple(origin, readonly=False, null=rank is None)
        if rank is None:
            return
        offset, index, base, elements = self._layout(rank, target, msg, "Get")
        values = np.empty(elements, base)
        for start, stop, at in _runs(index, elements):
            data = values[start:stop].view(np.uint8)
            if not data.nbytes:
                continue
            local, remote, where = self._reach(rank, offset + at * base.itemsize, data.nbytes, "Get")
            if local is not None:
                data[:] = local[where:where + data.nbytes]
            else:
                self._gpu.get(remote, data, where)
        msg.unpack(values)

    def Accumulate(self, origin, target_rank: int, target=None, op=None) -> None:
        """target = target op origin, element by element, atomically per element (see the module)."""
        self._accumulate("Accumulate", origin, None, None, target_rank, target, _mpi.SUM if op is None else op)

    def Get_accumulate(self, origin, result, target_rank: int, target=None, op=None) -> None:
        """As Accumulate, and the target's values before it into `result`."""
        self._accumulate("Get_accumulate", origin, result, None, target_rank, target, _mpi.SUM if op is None else op)

    def Fetch_and_op(self, origin, result, target_rank: int, target_disp: int = 0, op=None) -> None:
        """One element: result = target; target = target op origin (atomic)."""
        self._accumulate("Fetch_and_op", origin, result, None, target_rank, int(target_disp),
                         _mpi.SUM if op is None else op, single=True)

    def Compare_and_swap(self, origin, compare, result, target_rank: int, target_disp: int = 0) -> None:
        """One element: result = target; if target == compare, target = origin (atomic)."""
        self._accumulate("Compare_and_swap", origin, result, compare, target_rank, int(target_disp), None, single=True)

    def _accumulate(self, call, origin, result, compare, target_rank, target, op, single=False) -> None:
        rank = self._target(target_rank, call)
        fetch = result is not None
        ignore_origin = op is _mpi.NO_OP and fetch
        res = message_simple(result, readonly=False, null=rank is None) if fetch else None
        if ignore_origin and (origin is None or single):
            msg = res if not single else _checked_single(call, origin, res, "origin")
        else:
            msg = message_simple(origin, readonly=True, null=rank is None)
        if rank is None:
            return
        if single:
            msg = _checked_single(call, origin, res, "origin") if not ignore_origin else msg
            if compare is not None:
                _checked_single(call, compare, res, "compare")
            if res.count != 1:
                raise ValueError(f"MPI.Win.{call}: the result buffer must hold one {res.datatype}, holds {res.count}")
        if op is not None and (not isinstance(op, _mpi.Op) or op._array is None):
            raise _error(_mpi.ERR_OP, f"MPI.Win.{call}: {op!r} is not a predefined operation")
        shape = res if ignore_origin and origin is None else msg
        offset, index, base, elements = self._layout(rank, target, shape, call)
        if op is not None:
            op.combine(np.zeros(1, base), np.zeros(1, base))  # an op the type does not take: refused here
        if fetch and (res.count * res.elements != elements or res.base != base):
            raise _error(_mpi.ERR_TYPE, f"MPI.Win.{call}: the result buffer holds {res.count} x {res.datatype}, "
                                        f"the operation {elements} elements of {base}")
        values = None if ignore_origin else msg.pack().reshape(-1)
        if compare is not None:
            values = np.concatenate([values, message_simple(compare, readonly=True).pack().reshape(-1)])
        old = np.empty(elements, base)
        step = max(1, self._slots[rank] // (base.itemsize * (2 if compare is not None else 1)))
        for first in range(0, elements, step):
            last = min(elements, first + step)
            pieces = None if values is None else values[first:last]
            if compare is not None:
                pieces = np.concatenate([values[first:last], values[elements + first:elements + last]])
            fetched = self._remote_rmw(rank, call, "CAS" if compare is not None else op.name, base, offset,
                                       None if index is None else index[first:last], first, last, pieces, fetch)
            if fetch:
                old[first:last] = fetched
        if fetch:
            res.unpack(old)

    def _remote_rmw(self, rank, call, opname, base, offset, index, first, last, operand, fetch):
        """One piece of an accumulate: the operand into this GPU's inbox slot at the target (a put the
        switch checks), then the request; waits for the answer (the old values if `fetch`)."""
        gpu = self._gpu
        start = offset + (first * base.itemsize if index is None else 0)
        if rank == self._rank:  # its own memory: applied here (no request is being served meanwhile)
            status, data = self._apply(opname, base, start, last - first, operand,
                                       None if index is None else np.asarray(index, np.int64), fetch)
            return self._answered(rank, call, status, data, base, fetch)
        slot = self._rank * self._slots[rank]
        if operand is not None and operand.size:
            gpu.put(self._inboxes[rank], np.ascontiguousarray(operand).view(np.uint8), slot)
            gpu.fence()  # the operand is there before the request is
        number = next(self._numbers)
        elements = last - first
        where = np.zeros(0, np.int64) if index is None else np.ascontiguousarray(index, np.int64)
        key = (TAG, self._wid, "rmw", number, opname, _dtype_text(base), start, elements, int(fetch),
               int(operand is not None and operand.size > 0))
        gpu.wait_sent([gpu.send_message(self._members[rank], key, where.view(np.uint8))], call)
        gpu.wait(lambda: number in self._answers, f"MPI.Win.{call}", f"GPU {self._members[rank]} (rank {rank})")
        status, data = self._answers.pop(number)
        return self._answered(rank, call, status, data, base, fetch)

    def _answered(self, rank, call, status, data, base, fetch):
        if status:
            raise _error(ERR_RMA_RANGE, f"MPI.Win.{call}: GPU {self._members[rank]} (rank {rank}) refused it: "
                                        f"{bytes(data).decode(errors='replace')}")
        return data.view(base) if fetch else None

    def Rput(self, origin, target_rank: int, target=None):
        self.Put(origin, target_rank, target)
        return _done()

    def Rget(self, origin, target_rank: int, target=None):
        self.Get(origin, target_rank, target)
        return _done()

    def Raccumulate(self, origin, target_rank: int, target=None, op=None):
        self.Accumulate(origin, target_rank, target, op)
        return _done()

    def Rget_accumulate(self, origin, result, target_rank: int, target=None, op=None):
        self.Get_accumulate(origin, result, target_rank, target, op)
        return _done()

    # -- synchronisation ----------------------------------------------------------------------------
    def _merge(self) -> None:
        """Make the private and public copies the same (separate model): bytes the program stored since
        the last merge go to the GPU region, the rest (what Puts and accumulates wrote) come back."""
        if self._user is None:
            return
        stored = self._user != self._snapshot
        self._region[stored] = self._user[stored]
        self._user[:] = self._region
        self._snapshot[:] = self._region

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
            status, reply = self._rmw(sender, *args, data)
            return [(sender, (*answer, status), reply)]
        refused["unknown request"] += 1
        return []

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

    def _rmw(self, sender, opname, dtype, start, elements, fetch, has_operand, where) -> tuple:
        """Apply one accumulate piece of `sender`, its operand in its inbox slot; (status, answer bytes)."""
        try:
            base = _dtype_of(dtype)
        except (ValueError, TypeError, SyntaxError) as exc:
            return 1, np.frombuffer(f"{opname}: type {dtype!r}: {exc}".encode()[:200], np.uint8).copy()
        slot = self._members.index(sender) * self._slot
        count = elements * (2 if opname == "CAS" else 1)
        operand = self._inbox[slot:slot + count * base.itemsize].view(base) if has_operand else None
        return self._apply(opname, base, start, elements, operand, where.view(np.int64) if where.nbytes else None,
                           fetch)

    def _apply(self, opname, base, start, elements, operand, index, fetch) -> tuple:
        """The read-modify-write of `elements` of `base` at byte `start` of this GPU's region (at the
        element `index`es from there, or contiguous); (status, answer bytes: the old values if `fetch`)."""
        try:
            index = np.arange(elements, dtype=np.int64) if index is None else index
            end = start + ((int(index.max()) + 1) * base.itemsize if index.size else 0)
            memory, first = self._region, start
            if self._flavor == WIN_FLAVOR_DYNAMIC:
                found = self._block_at(start, end - start)
                if found is None:
                    raise ValueError(f"bytes {start:#x}..{end:#x} are not attached")
                memory, first = found
            if first < 0 or first + end - start > memory.nbytes or (index.size and index.min() < 0):
                raise ValueError(f"bytes {start}..{end} of a window of {memory.nbytes}")
            view = memory[first:first + end - start].view(base)
            old = view[index].copy()
            if opname == "CAS":
                if np.array_equal(old, operand[elements:]):
                    view[index] = operand[:elements]
            elif opname == "REPLACE":
                view[index] = operand
            elif opname != "NO_OP":
                op = getattr(_mpi, opname, None) if opname in PREDEFINED_OPS else None
                if op is None:
                    raise ValueError(f"{opname!r} is not a predefined operation")
                view[index] = op.combine(old, operand)
            return 0, (old.view(np.uint8) if fetch else np.zeros(0, np.uint8))
        except (ValueError, TypeError, IndexError, FabricError, _mpi.Exception) as exc:
            return 1, np.frombuffer(f"{opname} at byte {start}: {exc}".encode()[:200], np.uint8).copy()


def _serve(sender, key, data) -> list:
    """gpu.serve_messages's server of the window protocol: the request goes to its window, if `sender`
    is a member of it (anything else is dropped and counted in `refused`)."""
    if len(key) < 4 or not isinstance(key[1], str) or not isinstance(key[2], str):
        refused["malformed"] += 1
        return []
    win = _open.get(key[1])
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


def _expose(gpu, region: np.ndarray, members: tuple):
    """What other members use to reach `region`: a Handle exported to exactly `members` (NVLink
    Network, or classic nodes joined by InfiniBand), else its physical address; None if empty."""
    if not region.nbytes:
        return None
    if gpu.config.windows:
        return gpu.export(region, to=list(members))
    return gpu.physical_address(region)


def _runs(index, elements: int):
    """(first, past-last, target element) of each run of consecutive target elements."""
    if index is None:
        return [(0, elements, 0)]
    if not index.size:
        return []
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [index.size]])
    return [(int(a), int(b), int(index[a])) for a, b in zip(starts, stops)]


def _checked_single(call, buf, res, what):
    msg = message_simple(buf, readonly=True)
    if msg.count != 1:
        raise ValueError(f"MPI.Win.{call}: the {what} buffer must hold one element, holds {msg.count}")
    if res is not None and (msg.base != res.base or msg.elements != res.elements):
        raise ValueError(f"MPI.Win.{call}: the {what} buffer is {msg.datatype}, the result {res.datatype}")
    return msg


def _dtype_text(dtype: np.dtype) -> str:
    return dtype.str if dtype.fields is None else repr(dtype.descr)


def _dtype_of(text: str) -> np.dtype:
    """The numpy type a request names (_dtype_text); a type of Python objects is refused (ValueError)."""
    dtype = np.dtype(text) if not text.startswith("[") else np.dtype(ast.literal_eval(text))
    if dtype.hasobject:
        raise ValueError(f"type {text!r} holds Python objects")
    return dtype


def _done():
    return _mpi._request(_mpi._Collective([]))  # complete already


Win._family = Win
WIN_NULL = Win()
