"""The process's context: the GPU the layer is bound to, its algorithm, staging in GPU memory, progress."""

import time

import numpy as np

from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.ranks import collectives

from .constants import ALGORITHM_ENV
from .errors import _unsupported


class _Context:
    gpu = None
    real = None  # the real mpi4py.MPI (only its names are read: which calls the layer lacks)
    algorithm = "auto"
    engines: list = []
    attached = None
    start = time.time()


_ctx = _Context()


def _gpu():
    if _ctx.gpu is None:
        raise _unsupported("(any call)", "the layer is only installed while a program runs under nvlink-emu --mpi4py")
    return _ctx.gpu


def _algorithm(collective: str) -> str:
    """The algorithm of a call: NVLINK_EMU_MPI4PY_ALGORITHM where that algorithm implements the
    collective, else the fabric's auto."""
    name = _ctx.algorithm
    if name != "auto" and hasattr(collectives.ALGORITHMS[name], collective):
        return name
    return "auto"


def check_algorithm(name: str) -> str:
    """The value of NVLINK_EMU_MPI4PY_ALGORITHM, checked (auto or a registered algorithm)."""
    if name != "auto" and name not in collectives.ALGORITHMS:
        raise UnsupportedOperation(f"{ALGORITHM_ENV}={name!r}: known algorithms are auto, "
                                   f"{', '.join(collectives.ALGORITHMS)}")
    return name


def _stage(values: np.ndarray) -> np.ndarray:
    """A copy of `values` in this GPU's memory (host work, not link traffic)."""
    values = np.ascontiguousarray(values).reshape(-1)
    staged = _gpu().alloc(values.size, values.dtype)
    staged[:] = values
    return staged


def _staging(count: int, dtype) -> np.ndarray:
    return _gpu().alloc(int(count), dtype)


def _free(*arrays) -> None:
    for array in arrays:
        if array is not None:
            _gpu().free(array)


# What point to point needs beyond sending and taking messages (MPI's ANY_SOURCE, ANY_TAG and Iprobe must
# see which messages have arrived without naming one): the GPU's probe, poll and wait.
def _has_message(key: tuple, peer: int) -> bool:
    """Whether GPU `peer`'s message in slot `key` has arrived (read-only)."""
    return _gpu().has_message(key, peer)


def _peek_message(key: tuple, peer: int):
    """GPU `peer`'s message in slot `key` if it arrived, left in the mailbox (read-only), else None."""
    return _gpu().peek_message(key, peer)


def _poll() -> None:
    """Serve the fabric once, without waiting (what Iprobe and Test do)."""
    _gpu().poll()


def _wait(done, what: str, whom: str) -> None:
    """Serve the fabric until done(), FabricTimeout at the run's deadline."""
    _gpu().wait(done, what, whom)


def _progress_until(found, what: str):
    """found()'s first non-None value, serving the fabric (pulling arrived messages) until there is one."""
    while True:
        for engine in _ctx.engines:
            engine.pull()
        value = found()
        if value is not None and value is not False:
            return value
        _wait(lambda: any(engine.arrived() for engine in _ctx.engines), f"MPI {what}", "a matching message")
