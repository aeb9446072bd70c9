"""Helpers of the attack tests on one node (tests/mpi/test_trust.py) and across nodes
(tests/nodes/test_nodes_trust.py): they reach GPU internals as a hostile script could."""

import tempfile
import time
from pathlib import Path


def lone_attacker(gpus: int) -> dict:
    """GPU 0 alone in partition 0; every other of the `gpus` GPUs in partition 1."""
    return {"partitions": ((0,), tuple(range(1, gpus)))}


def until(gpu, done, what: str, timeout_s: float = 10.0) -> None:
    """Serve this GPU's traffic until done() holds (a test's own wait on internals)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"GPU {gpu.rank}: {what} did not happen within {timeout_s} s"
        gpu.poll()


def refusals(gpu, count: int) -> list:
    """Wait for `count` refusals of this GPU's packets (NACKs) and take them."""
    until(gpu, lambda: len(gpu.raw_port().refusals) >= count, f"{count} refusals")
    taken = gpu.raw_port().take_refusals()
    return taken


class Flag:
    """A flag one GPU raises and another waits for outside the fabric (a file), for a test in which the
    waiting GPU must receive nothing while another works: a wait in the fabric would serve the waiter's
    traffic, and a raw MPI message to it could be swept up as a stray. Collective over gpu.world."""

    def __init__(self, gpu):
        made = tempfile.mkdtemp(prefix="nvlink-emu-flag-") if gpu.rank == 0 else None
        self.path = Path(gpu.world.allgather_object(made)[0]) / "raised"

    def raise_(self) -> None:
        self.path.touch()

    def wait(self, gpu, what: str, timeout_s: float = 30.0) -> None:
        """Sleep (serving nothing) until the flag is raised; then take it down."""
        deadline = time.monotonic() + timeout_s
        while not self.path.exists():
            assert time.monotonic() < deadline, f"GPU {gpu.rank}: {what} did not happen within {timeout_s} s"
            time.sleep(0.01)
        self.path.unlink()
        self.path.parent.rmdir()
