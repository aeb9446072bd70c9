"""Helpers of the attack tests on one node (tests/mpi/test_trust.py) and across nodes
(tests/nodes/test_nodes_trust.py): they reach GPU internals as a hostile script could."""

import time


def lone_attacker(gpus: int) -> dict:
    """GPU 0 alone in partition 0; every other of the `gpus` GPUs in partition 1."""
    return {"partitions": ((0,), tuple(range(1, gpus)))}


def until(gpu, done, what: str, timeout_s: float = 10.0) -> None:
    """Serve this GPU's traffic until done() holds (a test's own wait on internals)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"GPU {gpu.rank}: {what} did not happen within {timeout_s} s"
        gpu._progress()


def refusals(gpu, count: int) -> list:
    """Wait for `count` refusals of this GPU's packets (NACKs) and take them."""
    until(gpu, lambda: len(gpu._traffic_errors) >= count, f"{count} refusals")
    taken, gpu._traffic_errors = gpu._traffic_errors, []
    return taken
