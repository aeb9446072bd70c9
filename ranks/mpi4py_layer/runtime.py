"""MPI's module functions in the layer (time, versions, init, memory), and bind/unbind of a program's GPU."""

import os
import pickle as _pickle
import platform
import time

import numpy as np

from . import win as _win
from .buffers import Memory
from .comm import COMM_SELF, COMM_WORLD, Comm, Solo
from .constants import ALGORITHM_ENV, ERR_ARG, SUBVERSION, THREAD_MULTIPLE, THREAD_SINGLE, VERSION
from .context import _ctx, _gpu, check_algorithm
from .errors import Exception, _unsupported  # noqa: A004 - MPI.Exception


def Wtime() -> float:
    """Wall-clock seconds (as MPI_Wtime); modeled_time_ns() is the fabric's modeled clock."""
    return time.time() - _ctx.start


def Wtick() -> float:
    return time.get_clock_info("time").resolution


def modeled_time_ns() -> float:
    """This GPU's modeled clock, in ns (the emulator's gpu.now_ns)."""
    return float(_gpu().now_ns)


def link_counters() -> dict:
    """This GPU's link counters (payload and raw bytes, packets, per direction): gpu.link_counters()."""
    return _gpu().link_counters()


def emulated_gpu():
    """The emulator's Gpu object of this rank (the workload API: compute, alloc, world, ...)."""
    return _gpu()


def Get_version() -> tuple[int, int]:
    return VERSION, SUBVERSION


def Get_library_version() -> str:
    return f"nvlink-emu mpi4py layer (MPI {VERSION}.{SUBVERSION} interface subset) on an emulated fabric"


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    return "nvlink-emu", (0, 1, 0)


def Get_processor_name() -> str:
    return f"{platform.node()}:gpu{_gpu().rank}"


def Query_thread() -> int:
    return THREAD_SINGLE


def Is_thread_main() -> bool:
    return True


def Is_initialized() -> bool:
    return True


def Is_finalized() -> bool:
    return False


def Init() -> None:
    pass


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    return THREAD_SINGLE


def Finalize() -> None:
    pass


def Alloc_mem(size: int, info=None):
    """`size` bytes of this GPU's memory (gpu.alloc): a window over it (Win.Create) is that memory."""
    block = _gpu().alloc(int(size), np.uint8)
    return Memory.over(block, block)


def Free_mem(mem) -> None:
    block = getattr(mem, "_block", None)
    if block is None:
        raise Exception(ERR_ARG, "MPI.Free_mem of memory Alloc_mem did not return")
    _gpu().free(block)
    mem._block = None


def Attach_buffer(buf) -> None:
    _ctx.attached = buf


def Detach_buffer():
    buf, _ctx.attached = _ctx.attached, None
    return buf


def Compute_dims(nnodes: int, dims):
    raise _unsupported("Compute_dims", "process topologies are not in the layer's scope")


def Pcontrol(level: int) -> None:
    pass


class _Pickle:
    """MPI.pickle: the serializer of the lowercase calls."""

    PROTOCOL = _pickle.HIGHEST_PROTOCOL
    THRESHOLD = 256 * 1024

    def dumps(self, obj):
        return _pickle.dumps(obj, self.PROTOCOL)

    def loads(self, data):
        return _pickle.loads(data)


pickle = _Pickle()


def bind(gpu, real=None) -> None:
    """Make this module the MPI of `gpu`'s program: COMM_WORLD over gpu.world, COMM_SELF over itself,
    the algorithm from NVLINK_EMU_MPI4PY_ALGORITHM; `real`: the real mpi4py.MPI, if loaded (its names
    tell an unsupported call from a misspelt one)."""
    _ctx.gpu, _ctx.real = gpu, real
    _ctx.algorithm = check_algorithm(os.environ.get(ALGORITHM_ENV, "auto").strip() or "auto")
    _ctx.engines = []
    _ctx.start = time.time()
    _win.reset()
    for target, emu, name in ((COMM_WORLD, gpu.world, "MPI_COMM_WORLD"),
                              (COMM_SELF, Solo(f"self{gpu.rank}"), "MPI_COMM_SELF")):
        made = Comm._over(emu, name)
        target._emu, target._engine, target._name = made._emu, made._engine, made._name


def unbind() -> None:
    _ctx.gpu = _ctx.real = None
    _ctx.engines = []
    for target in (COMM_WORLD, COMM_SELF):
        target._emu = target._engine = None  # type: ignore[assignment]  # COMM_NULL (PointToPoint._engine)
