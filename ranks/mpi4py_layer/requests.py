"""MPI.Status and MPI.Request in the layer, and the pending operations behind a request."""

from collections.abc import Callable
from typing import Any

from .constants import ANY_SOURCE, ANY_TAG, SUCCESS, UNDEFINED
from .context import _progress_until
from .datatypes import BYTE
from .errors import _unsupported
from .handles import _Handle, _Mpi4pyNames


class Status(_Mpi4pyNames):
    """A receive's envelope: source, tag, error and byte count."""

    _mpi4py = "Status"

    def __init__(self, status=None):
        self.source, self.tag, self.error, self._count, self._cancelled = ANY_SOURCE, ANY_TAG, SUCCESS, 0, False
        if isinstance(status, Status):
            self.source, self.tag, self.error, self._count = status.source, status.tag, status.error, status._count

    def _set(self, source, tag, nbytes, cancelled=False):
        self.source, self.tag, self.error, self._count, self._cancelled = source, tag, SUCCESS, nbytes, cancelled

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag

    def Get_error(self):
        return self.error

    def Set_source(self, source):
        self.source = source

    def Set_tag(self, tag):
        self.tag = tag

    def Set_error(self, error):
        self.error = error

    def Get_count(self, datatype=None) -> int:
        size = (BYTE if datatype is None else datatype).Get_size()
        return self._count // size if size and self._count % size == 0 else (0 if not size else UNDEFINED)

    def Get_elements(self, datatype) -> int:
        item = datatype.base.itemsize
        return self._count // item if self._count % item == 0 else UNDEFINED

    def Set_elements(self, datatype, count):
        self._count = count * datatype.base.itemsize

    def Is_cancelled(self) -> bool:
        return self._cancelled

    def Set_cancelled(self, flag):
        self._cancelled = bool(flag)

    count = property(lambda self: self._count)
    cancelled = property(Is_cancelled)


class Request(_Handle):
    """A non-blocking operation. Falsy (REQUEST_NULL) once completed and waited/tested, as in mpi4py."""

    _mpi4py, _held = "Request", "_op"

    def __init__(self, request=None):
        self._op = request._op if isinstance(request, Request) else None

    def _finish(self, status):
        op, self._op = self._op, None
        if status is not None:
            status._set(*op.envelope)
        return op.result

    def Wait(self, status=None) -> bool:
        """Block until the operation completes."""
        self.wait(status)
        return True

    def wait(self, status=None):
        if self._op is None:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return None
        self._op.wait()
        return self._finish(status)

    def Test(self, status=None) -> bool:
        return self.test(status)[0]

    def test(self, status=None):
        if self._op is None:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return True, None
        if not self._op.test():
            return False, None
        return True, self._finish(status)

    def Get_status(self, status=None) -> bool:
        if self._op is None:
            return True
        done = self._op.test()
        if done and status is not None:
            status._set(*self._op.envelope)
        return done

    def get_status(self, status=None) -> bool:
        return self.Get_status(status)

    def Cancel(self) -> None:
        """Cancel a receive not matched yet; a send has left already, so its cancel does nothing."""
        if self._op is not None:
            self._op.cancel()

    cancel = Cancel

    def Free(self) -> None:
        if self._op is not None:
            self._op.wait()
        self._op = None

    def free(self) -> None:
        self.Free()

    # -- many requests ------------------------------------------------------------------------------
    @staticmethod
    def _statuses(statuses, n):
        if statuses is None:
            return [None] * n
        while len(statuses) < n:
            statuses.append(Status())
        return statuses

    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None) -> list:
        statuses = cls._statuses(statuses, len(requests))
        return [r.wait(s) for r, s in zip(requests, statuses)]

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        if not all(r._op is None or r._op.test() for r in requests):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests, status=None) -> int:
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        cls._wait_for_one(requests, "waitany")
        index, _, obj = cls.testany(requests, status)
        return index, obj

    @staticmethod
    def _wait_for_one(requests, what: str) -> None:
        """Serve the fabric until one of the active requests has completed (none active: return)."""
        active = [r for r in requests if r._op is not None]
        if active:
            _progress_until(lambda: any(r._op.test() for r in active) or None, f"{what} of {len(active)} requests")

    @classmethod
    def Testany(cls, requests, status=None):
        index, flag, _ = cls.testany(requests, status)
        return index, flag

    @classmethod
    def testany(cls, requests, status=None):
        active = [i for i, r in enumerate(requests) if r._op is not None]
        if not active:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return UNDEFINED, True, None
        for i in active:
            if requests[i]._op.test():
                return i, True, requests[i]._finish(status)
        return UNDEFINED, False, None

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        cls._wait_for_one(requests, "waitsome")
        return cls.testsome(requests, statuses)

    @classmethod
    def Testsome(cls, requests, statuses=None):
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        active = [i for i, r in enumerate(requests) if r._op is not None]
        if not active:
            return None, None
        done = [i for i in active if requests[i]._op.test()]
        statuses = cls._statuses(statuses, len(done))
        return done, [requests[i]._finish(s) for i, s in zip(done, statuses)]

    @classmethod
    def Startall(cls, requests):
        for request in requests:
            request.Start()

    def Start(self):
        raise _unsupported("Request.Start", "only persistent requests (Prequest) start")


Request._family = Request
REQUEST_NULL = Request()


class Prequest(Request):
    """A persistent request (Send_init/Recv_init): Start issues the operation again each time."""

    def __init__(self, request=None, make=None):
        super().__init__(request)
        self._make = make
        if isinstance(request, Prequest):
            self._make = request._make

    def __bool__(self):
        return self._make is not None

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or (not self and not other)

    __hash__ = object.__hash__

    def Start(self):
        self._op = self._make()

    def Free(self):  # waits as Request's do; only Free ends a persistent request
        if self._op is not None:
            self._op.wait()
        self._op = self._make = None


class Grequest(Request):
    @classmethod
    def Start(cls, *args, **kwargs):
        raise _unsupported("Grequest.Start", "generalized requests are not in the mpi4py layer's scope")


class _Op:
    """One pending operation behind a Request: wait(), test() (completes it if it can), cancel();
    envelope (source, tag, bytes) and result (the object of a pickle-based receive) once done."""

    envelope = (ANY_SOURCE, ANY_TAG, 0)
    result = None
    wait: Callable[[], Any]    # each kind's own
    test: Callable[[], bool]

    def cancel(self):
        pass


class _Collective(_Op):
    """Emulator requests and the step that finishes the call (copy out of GPU memory, local combine)."""

    def __init__(self, parts, finish=None):
        self._parts, self._finish, self._done = parts, finish, False

    def wait(self):
        if not self._done:
            for part in self._parts:
                part.wait()
            if self._finish is not None:
                self._finish()
            self._done = True

    def test(self):
        # the emulator has no progress thread: a collective moves its bytes at the call that tests it
        self.wait()
        return True


class _Done:
    """An emulator-like request that completed already (one-member communicators)."""

    def wait(self):
        pass

    def test(self):
        return True


def _request(op: _Op) -> Request:
    request = Request()
    request._op = op
    return request
