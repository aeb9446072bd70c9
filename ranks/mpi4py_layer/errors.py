"""The layer's errors: MPI.Exception and what it raises for a malformed message or a call it lacks."""

import builtins

from nvlink_emu.fabric.errors import ProtocolError, UnsupportedOperation

from .constants import ERR_OTHER


class Exception(RuntimeError):  # noqa: A001 - mpi4py's name
    """MPI.Exception: an MPI error class and its message."""

    def __init__(self, ierr: int = ERR_OTHER, message: str = ""):
        super().__init__(message or f"MPI error class {ierr}")
        self.error_code = ierr

    def Get_error_code(self) -> int:
        return self.error_code

    def Get_error_class(self) -> int:
        return self.error_code

    def Get_error_string(self) -> str:
        return str(self)

    error_class = property(Get_error_class)

    def __int__(self):
        return self.error_code

    def __eq__(self, other):
        if isinstance(other, int):
            return self.error_code == other
        return builtins.Exception.__eq__(self, other)

    __hash__ = RuntimeError.__hash__


class MalformedMessage(Exception, ProtocolError):
    """A peer's message the layer cannot decode: shorter than its tag header, a tag or a length field no
    honest member sends, a pickle that does not load. MPI.Exception (ERR_OTHER) for the program, the
    fabric's ProtocolError for the run's report; its message names the sender and the communicator."""

    def __init__(self, message: str):
        Exception.__init__(self, ERR_OTHER, message)


def _unsupported(call: str, why: str = "not in the mpi4py layer's scope") -> UnsupportedOperation:
    return UnsupportedOperation(f"MPI.{call}: {why} (nvlink-emu --mpi4py; see docs/guide/mpi4py.md)")


class MissingCall(UnsupportedOperation, AttributeError):
    """A name mpi4py's MPI has and this layer does not: UnsupportedOperation naming it, and an
    AttributeError too, so that hasattr() and getattr(..., default) still answer as for a missing name."""


# a traceback names them as the program does, MPI.Exception (the facade's module), not this file's
for _raised in (Exception, MalformedMessage, MissingCall):
    _raised.__module__ = __name__.rpartition(".")[0] + ".MPI"


def _error(cls, message: str):
    """MPI.Exception of error class `cls` (the window calls' errors)."""
    return Exception(cls, message)
