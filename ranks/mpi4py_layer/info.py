"""MPI.Info and MPI.Errhandler in the layer: accepted, kept, not acted on (the layer raises every error)."""

from .handles import _Handle


class Info(_Handle):
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


class Errhandler(_Handle):
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
