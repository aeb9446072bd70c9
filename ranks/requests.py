"""Non-blocking operations: a Request per call, run in issue order on one stream per GPU.

Modeled time: a request starts at max(its issue time, the end of the GPU's previous collective) -
one stream per GPU, as NCCL runs a communicator's operations on one CUDA stream - and runs on its own
clock, so compute the program models meanwhile (gpu.compute) overlaps it; wait() moves the GPU's
clock to max(now, the request's end). Links are shared: whatever the program sends later takes its
turn on them after the request's transfers, but for a put or get beside a channelled request that still
sends, which takes a lane of its own (fabric.timemodel.LinkEnd.post; docs/model/time.md, "A put beside a
collective").

Host: a pending request moves its bytes at this GPU's next call that uses the links (a collective,
put, get, send or receive) or at a wait/test, in issue order, as an MPI library without an
asynchronous progress thread progresses inside MPI calls. Links are therefore always booked in
program order, and modeled times do not depend on how the host schedules the ranks.
"""

import collections

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricTimeout, ResourceExhausted


class Stream:
    """One GPU's stream of non-blocking operations: requests issued and not yet run, run on the host in
    issue order. end_ns: modeled end of the GPU's latest collective (where the next request starts)."""

    def __init__(self, gpu):
        self.gpu = gpu
        self.end_ns = 0.0
        self._pending: collections.deque[Request] = collections.deque()  # issued, not yet run
        self._draining = False                          # running pending requests (no nested drain)
        self._failed: list[Request] = []                # failed requests the program has not waited for

    def issue(self, what: str, execute) -> "Request":
        """A pending request that runs `execute` (a collective's traffic) when its turn comes."""
        request = Request(self.gpu, what, execute, self.gpu.now_ns)
        self._pending.append(request)
        return request

    def drain(self, upto: "Request | None" = None) -> None:
        """Run pending requests on the host, in issue order: all of them, or up to `upto`. Every call
        that uses the links drains first, so links are booked in program order."""
        if self._draining or not self._pending:
            return
        self._draining = True
        try:
            while self._pending:
                request = self._pending.popleft()
                request._run(for_another_call=request is not upto)
                if request is upto:
                    break
        finally:
            self._draining = False

    def finish(self) -> float:
        """At the end of main: run every request, raise the first failure nobody waited for (it is not
        lost); returns end_ns."""
        self.drain()
        if self._failed:
            self._failed[0]._complete()
        return self.end_ns


class Request:
    """One non-blocking operation of one GPU. start_ns, end_ns: its modeled start and end (None until
    it has run); what: the operation, for messages."""

    def __init__(self, gpu, what: str, execute, issue_ns: float):
        self.gpu = gpu
        self.what = what
        self.issue_ns = issue_ns
        self.start_ns: float | None = None
        self.end_ns: float | None = None
        self._execute = execute
        self._error: BaseException | None = None  # raised at wait/test (see _run)

    def __repr__(self) -> str:
        state = "pending" if self.end_ns is None else f"{self.start_ns:.1f}..{self.end_ns:.1f} ns"
        return f"<Request {self.what} on GPU {self.gpu.rank}: {state}>"

    def _run(self, for_another_call: bool) -> None:
        """Move the bytes now, on the request's own modeled clock (the GPU's is put back after).
        for_another_call: run because some other call came (not this request's own wait)."""
        gpu = self.gpu
        saved, lane = gpu.now_ns, gpu.lane  # run from inside a channel of another call: not on its lane
        gpu.now_ns = self.start_ns = max(self.issue_ns, gpu.stream.end_ns)
        gpu.lane = None
        try:
            self._execute()
        except (CollectiveMismatch, ResourceExhausted) as exc:
            self._error = exc  # raised on every member alike, the communicator stays usable: at wait/test,
            gpu.stream._failed.append(self)  # or at the end of main if the program never waits for it
        except FabricTimeout as exc:  # it ends the job, raised here and now; say which request it came from
            if not for_another_call:
                self._error = exc
                raise
            self._error = type(exc)(f"{exc} (while running {self.what}, issued earlier and pending until this "
                                    f"call: a GPU's collectives run in issue order, on every communicator)")
            raise self._error from None
        except BaseException as exc:
            self._error = exc  # anything else (a refusal) ends the job: raised here, now
            raise
        finally:
            self.end_ns = gpu.stream.end_ns = gpu.now_ns
            gpu.now_ns, gpu.lane = saved, lane

    def _complete(self) -> None:
        """Run this request (and the ones issued before it) if it has not run; raise its error."""
        self._run_now()
        if self._error is not None:
            if self in self.gpu.stream._failed:
                self.gpu.stream._failed.remove(self)  # seen by the program
            raise self._error

    def _run_now(self) -> None:
        if self.end_ns is None:
            self.gpu.stream.drain(upto=self)

    def wait(self) -> None:
        """Return when the operation completed; this GPU's clock moves to its end if that is later."""
        self._complete()
        self.gpu.now_ns = max(self.gpu.now_ns, self.end_ns)

    def test(self) -> bool:
        """Whether the operation has completed by this GPU's modeled clock (`while not req.test():
        gpu.compute(...)` models polling; the answer is the same run after run). Does not move the clock."""
        self._complete()
        return self.end_ns <= self.gpu.now_ns


def wait_all(requests) -> None:
    """Wait for every request; the clock moves to the latest end. If some failed, the first failure
    (in list order) is raised after all of them were waited for."""
    requests = list(requests)
    first = None
    for request in requests:
        try:
            request.wait()
        except (CollectiveMismatch, ResourceExhausted) as exc:
            first = first or exc
    if first is not None:
        raise first


def wait_any(requests) -> int:
    """Wait for the request that ends first in modeled time (the first in the list among equals) and
    return its index; its error, if it failed, is raised. Requests stay valid after a wait: one already
    waited for is chosen again, as an MPI request that completed is not (there is no inactive state)."""
    requests = list(requests)
    for request in requests:
        request._run_now()
    index = min(range(len(requests)), key=lambda i: (requests[i].end_ns, i))
    requests[index].wait()
    return index
