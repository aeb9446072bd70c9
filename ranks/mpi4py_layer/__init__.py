"""Unmodified mpi4py programs on the emulated fabric: the program's `mpi4py.MPI` is this layer (MPI.py)."""

import runpy
import sys
import types
from contextlib import contextmanager

from . import MPI

SHADOWED = ("mpi4py", "mpi4py.MPI")


class _Submodules:
    """A finder that refuses mpi4py's other modules (mpi4py.util, mpi4py.futures, ...) by name while the
    layer is mpi4py: they would drive the real MPI, not the emulated GPUs."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname.startswith("mpi4py.") and fullname != "mpi4py.MPI":
            from nvlink_emu.fabric.errors import UnsupportedOperation
            raise UnsupportedOperation(f"import {fullname}: the mpi4py layer provides mpi4py.MPI only "
                                       f"(nvlink-emu --mpi4py; see docs/guide/mpi4py.md)")
        return None


@contextmanager
def installed(gpu):
    """While the block runs, `import mpi4py` and `from mpi4py import MPI` give the layer bound to `gpu`;
    the real mpi4py (the emulator's own transport uses it) is back in sys.modules afterwards."""
    saved = {name: sys.modules.get(name) for name in SHADOWED}
    submodules = {name: module for name, module in sys.modules.items() if name.startswith("mpi4py.")
                  and name != "mpi4py.MPI"}
    package = types.ModuleType("mpi4py", "mpi4py's interface over nvlink-emu's emulated GPUs")
    package.MPI = MPI
    package.__version__ = MPI.__version__
    package.__path__ = []  # a package: `import mpi4py.MPI` resolves through sys.modules
    package.rc = types.SimpleNamespace(initialize=True, threads=True, thread_level="multiple", finalize=None,
                                       fast_reduce=True, recv_mprobe=False, irecv_bufsz=32768, errors="exception")
    package.get_include = package.get_config = lambda: {}
    MPI.bind(gpu, saved["mpi4py.MPI"])
    sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = package, MPI
    for name in submodules:  # the real package's, loaded by the emulator: hidden from the program
        del sys.modules[name]
    sys.meta_path.insert(0, _Submodules)
    try:
        yield MPI
    finally:
        sys.meta_path.remove(_Submodules)
        sys.modules.update(submodules)
        MPI.unbind()
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def program(path: str, argv: list[str]):
    """A main(gpu) that runs the mpi4py program at `path` as __main__ with sys.argv = [path, *argv]."""
    def main(gpu):
        saved_argv, saved_path = sys.argv, list(sys.path)
        sys.argv = [path, *argv]
        sys.path.insert(0, str(__import__("pathlib").Path(path).resolve().parent))  # as `python PROGRAM.py`
        try:
            with installed(gpu):
                runpy.run_path(path, run_name="__main__")
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
    return main
