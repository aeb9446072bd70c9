"""Helpers of the CLI tier: run the installed commands as a user would, with a time limit."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def command(name: str) -> str:
    """Path of an installed console script or launcher beside this Python (the test venv)."""
    path = BIN / name
    assert path.exists(), f"{name} is not installed beside {sys.executable}; run pip install -e '.[test]'"
    return str(path)


def run(args: list[str], timeout_s: float = 120, cwd: Path = ROOT,
        env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """(completed process with text stdout/stderr, elapsed seconds); `env`: the environment (default ours)."""
    start = time.monotonic()
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)
    return done, time.monotonic() - start


class Started:
    """A command started in the background (its output to files, so that a chatty one never blocks on a
    full pipe while nobody reads it); result() waits for it as run() does."""

    def __init__(self, args: list[str], cwd: Path = ROOT, env: dict | None = None):
        self.start = time.monotonic()
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(args, stdout=self._out, stderr=self._err, text=True, cwd=cwd, env=env)
        self.args, self.end = args, None
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.process.wait()
        self.end = time.monotonic()

    def ended(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the job to end; whether it did."""
        self._waiter.join(timeout_s)
        return self.end is not None

    def result(self, timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
        """(completed process with text stdout/stderr, its run time in seconds); TimeoutExpired (the job
        killed) if it has not ended within timeout_s of its start."""
        self._waiter.join(max(0.0, timeout_s - (time.monotonic() - self.start)))
        if self.end is None:
            self.kill()
            raise subprocess.TimeoutExpired(self.args, timeout_s)
        outputs = []
        for file in (self._out, self._err):
            file.seek(0)
            outputs.append(file.read())
            file.close()
        return subprocess.CompletedProcess(self.args, self.process.returncode, *outputs), self.end - self.start

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def script(tmp_path: Path, body: str, name: str = "workload.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


# The session's heavy jobs (the multi-rank tiers, mpi4py's own files): started in two lanes as soon as the
# tests are collected, so that they run beside the quick CLI tests and the unit tier, each lane one job
# at a time (tests/cli/conftest.py starts them; a test takes its job's result with heavy_result).
HEAVY: dict[str, "Started | BaseException"] = {}
HEAVY_TIMEOUT_S = 900  # one job, from its start


def start_lanes(lanes: list[list[tuple[str, object]]]) -> None:
    """Run each lane's jobs, (test node id, a function returning the command), one after the other in a
    thread of its own; HEAVY[node id] is the job once started (or the exception making its command)."""
    def lane(jobs):
        for nodeid, make in jobs:
            try:
                HEAVY[nodeid] = job = Started(make())
            except BaseException as error:  # its test fails with it
                HEAVY[nodeid] = error
                continue
            if not job.ended(HEAVY_TIMEOUT_S):
                job.kill()  # its test fails on the killed job's output; the lane goes on

    for jobs in lanes:
        if jobs:
            threading.Thread(target=lane, args=(jobs,), daemon=True).start()


def heavy_result(nodeid: str, timeout_s: float = 3 * HEAVY_TIMEOUT_S) -> tuple[subprocess.CompletedProcess, float]:
    """The result of the heavy job of test `nodeid` (run(): (completed process, seconds)), once its lane
    started and ended it."""
    deadline = time.monotonic() + timeout_s
    while nodeid not in HEAVY:
        assert time.monotonic() < deadline, f"{nodeid}: its job never started"
        time.sleep(0.1)
    job = HEAVY[nodeid]
    if isinstance(job, BaseException):
        raise job
    return job.result(max(0.0, deadline - time.monotonic()))


def stop_lanes() -> None:
    for job in list(HEAVY.values()):  # a lane may still be adding its next job
        if isinstance(job, Started):
            job.kill()
