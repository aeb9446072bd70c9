"""mpi4py's own test files, unmodified, against the mpi4py layer (`nvlink-emu run --mpi4py`) at 3 GPUs.

The files come from the source distribution of the installed mpi4py version, downloaded with pip into
~/.cache/nvlink-emu (or $NVLINK_EMU_CACHE) once; they are never copied into this repo. A failed
download fails the test (it is not skipped). The deselected tests are listed, each with its reason,
in tests/mpi4py_suite/deselected.txt.
"""

import compileall
import json
import os
import re
import sys
import tarfile
from pathlib import Path

import mpi4py
import pytest

from cli_helpers import ROOT, command, heavy_result, run

SUITE = ROOT / "tests" / "mpi4py_suite"
FILES = ("test_cco_buf.py", "test_cco_obj.py", "test_cco_nb_buf.py", "test_cco_vec.py", "test_p2p_buf.py",
         "test_p2p_obj.py")
# Which of arrayimpl's array classes the buffer tests loop over (CI time: each class repeats every test
# for each of its typecodes). ArrayNumPy has all 17 typecodes (bool, unsigned, complex and long double take
# the layer's local-reduction paths); ArrayArray (array.array, the plain buffer protocol) the 7 C types.
# NVLINK_EMU_MPI4PY_BACKENDS=all runs all six classes.
BACKENDS = "ArrayNumPy,ArrayArray"
# One GPU count: 3, odd, so every reduce-scatter and ring has a remainder and a non-power-of-two fold. No
# file needs 4: what changes with the count is the fabric's collectives under the layer, which tests/mpi
# checks at 3 and 8 GPUs; the layer itself (argument handling, datatypes, requests, windows) is the same
# code at any count. NVLINK_EMU_MPI4PY_GPUS=3,4 runs more counts by hand.
GPU_COUNTS = [int(g) for g in os.environ.get("NVLINK_EMU_MPI4PY_GPUS", "3").split(",")]
# tests per file (mpi4py 4.1.2), and how many of them the deselect list removes
EXPECTED = {"test_cco_buf.py": (72, 0), "test_cco_obj.py": (40, 0), "test_cco_nb_buf.py": (70, 0),
            "test_cco_vec.py": (62, 12), "test_p2p_buf.py": (52, 4), "test_p2p_obj.py": (92, 4)}


def mpi4py_tests() -> Path:
    """The test/ folder of the installed mpi4py's source distribution, downloaded and unpacked once."""
    version = mpi4py.__version__
    cache = Path(os.environ.get("NVLINK_EMU_CACHE", Path.home() / ".cache" / "nvlink-emu"))
    testdir = cache / f"mpi4py-{version}" / "test"
    if (testdir / "mpiunittest.py").is_file():
        compileall.compile_dir(testdir, quiet=1)  # every rank imports them (see tests/conftest.py)
        return testdir
    cache.mkdir(parents=True, exist_ok=True)
    # --no-binary for mpi4py alone: with :all:, pip also builds the sdist's build requirements (Cython) from
    # source to read its metadata, which took over 300 s on 2 cores once a Cython without a built wheel came
    done, _ = run([sys.executable, "-m", "pip", "download", "--no-binary", "mpi4py", "--no-deps", "-q",
                   f"mpi4py=={version}", "-d", str(cache)], timeout_s=300)
    assert done.returncode == 0, f"cannot download mpi4py {version}'s source distribution:\n{done.stderr[-3000:]}"
    with tarfile.open(cache / f"mpi4py-{version}.tar.gz") as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(f"mpi4py-{version}/test/")]
        archive.extractall(cache, members=members, filter="data")
    assert (testdir / "mpiunittest.py").is_file(), f"{testdir}: no mpiunittest.py in the source distribution"
    compileall.compile_dir(testdir, quiet=1)
    return testdir


# One-sided communication (MPI.Win): every Put, Get, accumulate and lock is a round trip through the
# switch rank, thousands per file, so CI loops over array.array's 7 C types
RMA_FILES = ("test_rma.py", "test_win.py", "test_rma_nb.py")
RMA_EXPECTED = {"test_rma.py": (36, 0), "test_win.py": (100, 24), "test_rma_nb.py": (14, 0)}
# (files, their expected counts, the array classes by default) of each job
JOBS = {"buffers": (FILES, EXPECTED, BACKENDS), "rma": (RMA_FILES, RMA_EXPECTED, "ArrayArray")}


def suite_command(gpus: int, job: str) -> list[str]:
    files, _, backends = JOBS[job]
    return [command("nvlink-emu"), "run", "--mpi4py", str(SUITE / "run_suite.py"), "--gpus", str(gpus), "--timeout",
            "60", "--", str(mpi4py_tests()), str(SUITE / "deselected.txt"),
            os.environ.get("NVLINK_EMU_MPI4PY_BACKENDS", backends), *files]


def heavy_jobs(items) -> dict:
    """The selected jobs for tests/cli/conftest.py's lanes, first in each: the buffer job in lane 0, the
    RMA job in lane 1 (each a run of small round trips in which the ranks wait for each other much of
    the time: a GPU rank of the RMA job slept in select() for 18 of its 30 s, profiled)."""
    lanes = {0: [], 1: []}
    for item in items:
        if item.originalname == "test_mpi4py_own_files_pass_on_the_layer":
            gpus, job = item.callspec.params["gpus"], item.callspec.params["job"]
            lanes[0 if job == "buffers" else 1].append((item.nodeid, lambda g=gpus, j=job: suite_command(g, j), 0))
    return lanes


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_mpi4py_own_files_pass_on_the_layer(request, gpus, job):
    """mpi4py's test files of `job` at `gpus` GPUs: each has the tests and deselections expected, and
    none fails or skips itself."""
    files, expected, _ = JOBS[job]
    done, elapsed = heavy_result(request.node.nodeid)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    rows = {m["file"]: m for m in (re.search(r"file=(?P<file>\S+) tests=(?P<tests>\d+) passed=(?P<passed>\d+) "
                                             r"failed=(?P<failed>\d+) skipped=(?P<skipped>\d+) "
                                             r"deselected=(?P<deselected>\d+)", line)
                                   for line in done.stdout.splitlines()) if m}
    assert sorted(rows) == sorted(files), output[-6000:]
    assert "mpi4py-suite FAIL" not in output and "mpi4py-suite STALE" not in output, output[-6000:]
    for name, (tests, deselected) in expected.items():
        row = {k: int(v) for k, v in rows[name].groupdict().items() if k != "file"}
        assert (row["tests"], row["deselected"], row["failed"]) == (tests, deselected, 0), (name, row)
        assert row["passed"] + row["skipped"] == tests - deselected, (name, row)
        assert row["skipped"] == 0, (name, row)  # no test of these files skips itself on this layer
    print(f"mpi4py suite, {job} at {gpus} GPUs: {elapsed:.1f} s")


ALLREDUCE = """
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
a = np.full(1024, comm.Get_rank() + 1, np.float32)
comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
assert (a == sum(range(1, comm.Get_size() + 1))).all(), a[:4]
"""


@pytest.mark.parametrize("algorithm, sent", [("sharp", lambda n, s: n * s), ("ring", lambda n, s: 2 * (n - 1) * s)])
def test_an_unmodified_allreduce_moves_the_algorithms_bytes(tmp_path, algorithm, sent):
    """Every byte goes through the switch: sharp sends S per GPU, ring 2(n-1)/n S (summed: 2(n-1) S)."""
    program = tmp_path / "allreduce.py"
    program.write_text(ALLREDUCE)
    report = tmp_path / "report.json"
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(program), "--gpus", "3", "--report-json",
                   str(report)], env=dict(os.environ, NVLINK_EMU_MPI4PY_ALGORITHM=algorithm))
    assert done.returncode == 0, done.stderr[-3000:]
    links = json.loads(report.read_text())["links"]
    up = sum(links[f"gpu{g}->sw0"]["payload_bytes"] for g in range(3))
    down = sum(links[f"sw0->gpu{g}"]["payload_bytes"] for g in range(3))
    assert up == down == sent(3, 1024 * 4)
    assert "gpu0<->sw0" in done.stderr  # the usual link table


def test_the_data_parallel_example_runs_unmodified_under_mpiexec(tmp_path):
    """`mpiexec -n W python -m nvlink_emu.launch --mpi4py PROGRAM.py`: the same as nvlink-emu run."""
    done, _ = run([command("mpiexec"), "-n", "4", sys.executable, "-m", "nvlink_emu.launch", "--mpi4py",
                   str(ROOT / "launch" / "examples" / "mpi4py_dp.py"), "--gpus", "3", "--", "3"], timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[gpu 0] step   2  loss" in done.stdout
    assert "3 ranks, 3 steps" in done.stdout and "weights identical on every rank: True" in done.stdout


def test_an_unsupported_call_is_an_error_naming_it(tmp_path):
    program = tmp_path / "alltoallw.py"
    program.write_text("from mpi4py import MPI\nMPI.COMM_WORLD.Alltoallw(None, None)\n")
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(program), "--gpus", "2"])
    assert done.returncode != 0
    assert "UnsupportedOperation: MPI.Comm.Alltoallw" in done.stderr, done.stderr[-3000:]


def test_a_bad_algorithm_variable_stops_before_any_traffic(tmp_path):
    program = tmp_path / "nothing.py"
    program.write_text("from mpi4py import MPI\n")
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(program), "--gpus", "2"],
                  env=dict(os.environ, NVLINK_EMU_MPI4PY_ALGORITHM="torus"))
    assert done.returncode == 2
    assert "NVLINK_EMU_MPI4PY_ALGORITHM='torus'" in done.stderr and "known algorithms are auto" in done.stderr


EDGES = """
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
rows = [np.arange(3, dtype=np.complex64) * (k + 1) + 1j for k in range(n)]
out = np.zeros(2 if r == 0 else 1, np.complex64)  # 3 complex in blocks 2, 1: not the fabric's blocks of 6 floats
comm.Reduce_scatter(rows[r], out, [2, 1], op=MPI.SUM)
assert np.array_equal(out, sum(rows)[:2] if r == 0 else sum(rows)[2:]), out
flags = np.array([1, 0, 3], np.intc) * (r + 1) * (np.arange(3) != r)
both = np.empty_like(flags)
comm.Allreduce(flags, both, op=MPI.LAND)  # not a fabric op: allgather, then numpy in rank order
assert both.tolist() == [0, 0, 1] if n == 2 else both.tolist() == [0, 0, 0], both
pairs = np.zeros(2, MPI.DOUBLE_INT.base)
pairs["v"], pairs["i"] = [r % 2, -r], r
best = np.zeros_like(pairs)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MAXLOC)
assert best["v"].tolist() == [1, 0] and best["i"].tolist() == [1, 0], best
prefix = np.zeros(1, np.float64)
comm.Scan(np.array([r + 1.0]), prefix)
assert prefix[0] == (r + 1) * (r + 2) / 2, prefix
status = MPI.Status()
got = comm.sendrecv(r, dest=(r + 1) % n, source=MPI.ANY_SOURCE, status=status)
assert got == (r - 1) % n == status.Get_source(), (got, status.Get_source())
print("edges ok")
"""


def test_reductions_the_fabric_cannot_do_alone_are_right(tmp_path):
    """Uneven complex blocks, LAND, MAXLOC on pairs, Scan, ANY_SOURCE: numpy's answer, on 2 GPUs."""
    program = tmp_path / "edges.py"
    program.write_text(EDGES)
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(program), "--gpus", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("edges ok") == 2
