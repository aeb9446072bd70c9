"""Base classes of the layer's objects: a name mpi4py has and the layer lacks is MissingCall, by name."""

from .context import _ctx
from .errors import MissingCall


def _missing(owner: str, name: str):
    """MissingCall for MPI.`owner`.`name` if the real mpi4py has it (the module the emulator's transport
    loaded, saved while the layer is installed), else a plain AttributeError."""
    real = _ctx.real
    if real is not None and not name.startswith("__") and hasattr(getattr(real, owner, real) if owner else real,
                                                                   name):
        return MissingCall(f"MPI.{owner + '.' if owner else ''}{name}: mpi4py has it, the layer does not "
                           f"(nvlink-emu --mpi4py; see docs/guide/mpi4py.md)")
    return AttributeError(f"{'MPI.' + owner if owner else 'module mpi4py.MPI'} has no attribute {name!r}")


class _Mpi4pyNames:
    """Unknown attributes of a layer object: MissingCall when mpi4py's class `_mpi4py` has them."""

    _mpi4py = ""

    def __getattr__(self, name: str):
        raise _missing(self._mpi4py, name)


class _Handle(_Mpi4pyNames):
    """An MPI handle: true unless null, equal to another of its family (`_family`) that refers to the
    same thing (the object in attribute `_held`)."""

    _family: type = object
    _held = ""

    def __bool__(self):
        return getattr(self, self._held) is not None

    def __eq__(self, other):
        if not isinstance(other, self._family):
            return NotImplemented
        return getattr(self, self._held) is getattr(other, self._held)

    __hash__ = object.__hash__
