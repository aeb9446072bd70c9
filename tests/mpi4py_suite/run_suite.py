"""Run mpi4py's own test files (unmodified, from its source distribution) on every GPU rank of the
emulated fabric, as mpi4py's test/main.py does on every MPI rank, minus the deselected tests.

    nvlink-emu run --mpi4py run_suite.py --gpus 4 -- TESTDIR DESELECTED.txt BACKENDS test_cco_buf.py ...

BACKENDS: the array classes of mpi4py's test/arrayimpl.py the buffer tests loop over, comma-separated
class names (ArrayNumPy, ArrayArray, DLPackArray, DLPackNumPy, FakeGPUArrayBasic, FakeGPUArrayNumPy),
or `all`: a selection of what the unmodified tests iterate over, as mpi4py's own runner selects with
--no-numpy / --no-array.

A plain mpi4py program itself (run under --mpi4py). GPU 0 prints, per file, one line
`mpi4py-suite file=F tests=T passed=P failed=X skipped=S deselected=D seconds=W` (a test passed if it
passed on every GPU; W: GPU 0's wall time for the file), then the id and first traceback of every test that failed on some GPU.
"""

import fnmatch
import importlib
import sys
import time
import unittest
from pathlib import Path

from mpi4py import MPI


def deselected(path: str) -> list[str]:
    """The patterns of DESELECTED.txt: `pattern  # reason` lines (fnmatch on module.Class.test ids)."""
    patterns = []
    for line in Path(path).read_text().splitlines():
        pattern = line.split("#", 1)[0].strip()
        if pattern:
            if "#" not in line or not line.split("#", 1)[1].strip():
                raise SystemExit(f"{path}: {pattern}: every deselected test needs a reason after #")
            patterns.append(pattern)
    return patterns


def flatten(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from flatten(test)
        else:
            yield test


class Result(unittest.TestResult):
    """Outcome per test id: "pass", "fail" (with its traceback) or "skip"."""

    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def addSuccess(self, test):
        self.outcomes.setdefault(test.id(), ("pass", ""))

    def _failed(self, test, err):
        self.outcomes[test.id()] = ("fail", self._exc_info_to_string(err, test))

    addFailure = addError = _failed

    def addSkip(self, test, reason):
        self.outcomes[test.id()] = ("skip", reason)

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._failed(test, err)


def main():
    testdir, listing, backends, *files = sys.argv[1:]
    sys.path.insert(0, testdir)
    if backends != "all":
        import arrayimpl

        wanted = backends.split(",")
        unknown = set(wanted) - {cls.__name__ for cls in arrayimpl.ArrayBackends}
        if unknown:
            raise SystemExit(f"run_suite: no array backend {sorted(unknown)} in arrayimpl")
        arrayimpl.ArrayBackends[:] = [cls for cls in arrayimpl.ArrayBackends if cls.__name__ in wanted]
    patterns = deselected(listing)
    comm = MPI.COMM_WORLD
    used = set()
    status = 0
    for name in files:
        module = importlib.import_module(Path(name).stem)
        tests = list(flatten(unittest.defaultTestLoader.loadTestsFromModule(module)))
        keep, dropped = [], 0
        for test in tests:
            hits = [p for p in patterns if fnmatch.fnmatchcase(test.id(), p)]
            used.update(hits)
            if hits:
                dropped += 1
            else:
                keep.append(test)
        result, start = Result(), time.monotonic()
        unittest.TestSuite(keep).run(result)
        every = comm.allgather(result.outcomes)  # through the switch, as any pickle-based call
        failed = {tid: (rank, text) for rank, outcomes in enumerate(every)
                  for tid, (kind, text) in outcomes.items() if kind == "fail"}
        skipped = {tid for tid, (kind, _) in result.outcomes.items() if kind == "skip"} - set(failed)
        passed = len(keep) - len(failed) - len(skipped)
        if comm.Get_rank() == 0:
            print(f"mpi4py-suite file={name} tests={len(tests)} passed={passed} failed={len(failed)} "
                  f"skipped={len(skipped)} deselected={dropped} seconds={time.monotonic() - start:.1f}", flush=True)
            for tid, (rank, text) in sorted(failed.items()):
                print(f"mpi4py-suite FAIL {tid} (gpu {rank}):\n{text}", flush=True)
        status |= bool(failed)
    if comm.Get_rank() == 0:
        for pattern in patterns:
            if pattern not in used and any(fnmatch.fnmatchcase(f"{Path(f).stem}.x", pattern.split(".")[0] + ".x")
                                           for f in files):
                print(f"mpi4py-suite STALE {pattern}: deselects no test", flush=True)


if __name__ == "__main__":
    main()
