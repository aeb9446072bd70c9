"""Non-blocking operations: a Request per call, run in issue order on one stream per GPU.

Modeled time: a request starts at max(its issue time, the end of the GPU's previous collective) -
one stream per GPU, as NCCL runs a communicator's operations on one CUDA stream - and runs on its own
clock, so compute the program models meanwhile (gpu.compute) overlaps it; wait() moves the GPU's
clock to max(now, the request's end). Links are shared: whatever the program sends later takes its
turn on them after the request's transfers.

Host: a pending request moves its bytes at this GPU's next call that uses the links (a collective,
put, get, send or receive) or at a wait/test, in issue order, as an MPI library without an
asynchronous progress thread progresses inside MPI calls. Links are therefore always booked in
program order, and modeled times do not depend on how the host schedules the ranks.
"""

from nvlink_emu.fabric.errors import CollectiveMismatch, FabricError, ResourceExhausted


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
        self._error: FabricError | None = None

    def __repr__(self) -> str:
        state = "pending" if self.end_ns is None else f"{self.start_ns:.1f}..{self.end_ns:.1f} ns"
        return f"<Request {self.what} on GPU {self.gpu.rank}: {state}>"

    def _run(self) -> None:
        """Move the bytes now, on the request's own modeled clock (the GPU's is put back after)."""
        gpu = self.gpu
        saved = gpu.now_ns
        gpu.now_ns = self.start_ns = max(self.issue_ns, gpu._stream_ns)
        try:
            self._execute()
        except (CollectiveMismatch, ResourceExhausted) as exc:
            self._error = exc  # raised on every member alike, the communicator stays usable: at wait/test
        except BaseException as exc:
            self._error = exc  # anything else (a timeout, a refusal) ends the job: raised here, now
            raise
        finally:
            self.end_ns = gpu._stream_ns = gpu.now_ns
            gpu.now_ns = saved

    def _complete(self) -> None:
        """Run this request (and the ones issued before it) if it has not run; raise its error."""
        if self.end_ns is None:
            self.gpu._drain(upto=self)
        if self._error is not None:
            raise self._error

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
    """Wait for every request; the clock moves to the latest end."""
    requests = list(requests)
    for request in requests:
        request._complete()
    for request in requests:
        request.wait()


def wait_any(requests) -> int:
    """Wait for the request that completes first in modeled time (the first in the list among equals);
    returns its index."""
    requests = list(requests)
    if not requests:
        raise FabricError("wait_any of no requests")
    for request in requests:
        request._complete()
    index = min(range(len(requests)), key=lambda i: (requests[i].end_ns, i))
    requests[index].wait()
    return index
