"""The pytest plugin from the outside: sample test files run by pytest under mpiexec, as a user would."""

import re
import sys
import textwrap

import pytest

from cli_helpers import command, run

WORLD = 4           # 3 GPUs + the switch
DEADLINE_S = 60     # every sample's fabric deadline: a job that waited for it took too long
ENDS_WITHIN_S = 30  # s: what a failing job may take to end (it takes ~3 s here)

HEADER = textwrap.dedent("""
    import numpy as np
    import pytest

    from nvlink_emu.fabric import OutOfMemory

    pytestmark = pytest.mark.mpi(min_size=4)
""")

SAMPLES = {
    "passes": """
        def test_allreduce_sums_on_every_gpu(fabric_run):
            def main(gpu):
                data = np.full(1000, gpu.rank + 1, np.float32)
                gpu.world.allreduce(data)
                return float(data[0])

            result = fabric_run(main, preset="dgx-a100", timeout_s=DEADLINE)
            assert result.report["fabric"] == "dgx-a100" and result.report["gpus"] == 3
            if result.role == "gpu":
                assert result.value == 1 + 2 + 3
    """,
    "gpu 1 raises": """
        def test_gpu_1_raises(fabric_run):
            def main(gpu):
                if gpu.rank == 1:
                    raise RuntimeError("boom on GPU 1")
                gpu.world.barrier()

            fabric_run(main, timeout_s=DEADLINE)


        def test_never_reached():
            pass
    """,
    "raises in a collective": """
        def test_gpu_2_raises_while_the_others_reduce(fabric_run):
            def main(gpu):
                data = np.ones(1 << 16, np.float32)
                if gpu.rank == 2:
                    raise ValueError("GPU 2 gives up")
                gpu.world.allreduce(data, algorithm="ring")

            fabric_run(main, timeout_s=DEADLINE)
    """,
    "every gpu raises, the test catches it": """
        def test_the_switch_would_wait_forever(fabric_run):
            def main(gpu):
                gpu.alloc(1 << 40, "uint8")

            with pytest.raises(OutOfMemory):
                fabric_run(main, timeout_s=DEADLINE)
    """,
}


def run_sample(tmp_path, body: str, *flags: str, ini: str | None = None):
    """(completed mpiexec process, elapsed s) of pytest on one sample test file on WORLD ranks."""
    path = tmp_path / "test_sample.py"
    path.write_text(HEADER + f"DEADLINE = {DEADLINE_S}\n\n" + textwrap.dedent(body))
    if ini is not None:
        (tmp_path / "pytest.ini").write_text(ini)
    return run([command("mpiexec"), "-n", str(WORLD), sys.executable, "-m", "pytest", "--with-mpi",
                "-p", "no:cacheprovider", *flags, path.name], timeout_s=120, cwd=tmp_path)


@pytest.mark.parametrize("capture", [[], ["-s"]], ids=["captured", "-s"])
def test_a_passing_workload_passes_on_every_rank(tmp_path, capture):
    done, _ = run_sample(tmp_path, SAMPLES["passes"], *capture)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert re.findall(r"(\d+) passed", output) == ["1"] * WORLD, output[-3000:]


@pytest.mark.parametrize("capture", [[], ["-s"]], ids=["captured", "-s"])
def test_a_failing_gpu_ends_the_job_with_its_name_and_traceback(tmp_path, capture):
    done, elapsed = run_sample(tmp_path, SAMPLES["gpu 1 raises"], *capture)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < ENDS_WITHIN_S, f"the job took {elapsed:.1f} s to end; it must not wait for the deadline"
    ours = [line for line in done.stderr.splitlines() if line.startswith("[nvlink-emu")]
    assert ours[0] == ("[nvlink-emu gpu 1] test_sample.py::test_gpu_1_raises: GPU 1 failed: RuntimeError: "
                       "boom on GPU 1; ending the job")
    assert {line.split("]")[0] for line in ours} == {"[nvlink-emu gpu 1"}  # only the failing GPU reports
    # its traceback, as pytest reports it: the test's line, the workload's line, the error
    for shown in (">       fabric_run(main, timeout_s=DEADLINE)", '>           raise RuntimeError("boom on GPU 1")',
                  "E           RuntimeError: boom on GPU 1"):
        assert f"[nvlink-emu gpu 1] {shown}" in ours, "\n".join(ours)
    assert re.fullmatch(r"\[nvlink-emu gpu 1\] test_sample.py:\d+: RuntimeError", ours[-1]), ours[-1]
    assert "passed" not in done.stdout  # the job ended: test_never_reached did not run


@pytest.mark.parametrize("capture", [[], ["-s"]], ids=["captured", "-s"])
def test_a_gpu_failing_while_the_others_are_in_a_collective_ends_the_job(tmp_path, capture):
    done, elapsed = run_sample(tmp_path, SAMPLES["raises in a collective"], *capture)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < ENDS_WITHIN_S, f"the job took {elapsed:.1f} s to end; it must not wait for the deadline"
    assert ("[nvlink-emu gpu 2] test_sample.py::test_gpu_2_raises_while_the_others_reduce: GPU 2 failed: "
            "ValueError: GPU 2 gives up; ending the job") in done.stderr
    assert "[nvlink-emu gpu 2] E           ValueError: GPU 2 gives up" in done.stderr


def test_a_run_that_failed_ends_the_job_even_if_the_test_caught_it(tmp_path):
    # every GPU raises, so none tells the switch it is done: the switch would serve for ever
    done, elapsed = run_sample(tmp_path, SAMPLES["every gpu raises, the test catches it"])
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < ENDS_WITHIN_S
    assert re.search(r"\[nvlink-emu gpu \d\] test_sample.py::test_the_switch_would_wait_forever: GPU \d failed: "
                     r"OutOfMemory: GPU \d: alloc of 1099511627776 bytes does not fit: .* \(the test passed, but the "
                     r"other ranks cannot finish the run without this one\); ending the job", done.stderr), done.stderr
    assert re.search(r"\[nvlink-emu gpu \d\]   File .*test_sample.py\", line \d+, in main", done.stderr)


def test_the_ini_option_ends_the_job_at_any_failed_test(tmp_path):
    # what the repo's own tier relies on: its tests call run_fabric themselves, not the fixture
    body = """
        from mpi4py import MPI

        def test_rank_1_fails_while_the_others_wait():
            if MPI.COMM_WORLD.Get_rank() == 1:
                assert 1 + 1 == 3
            MPI.COMM_WORLD.barrier()
    """
    done, elapsed = run_sample(tmp_path, body, ini="[pytest]\nnvlink_emu_abort_on_failure = true\n")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < ENDS_WITHIN_S
    assert ("[nvlink-emu rank 1] test_sample.py::test_rank_1_fails_while_the_others_wait: rank 1 failed: "
            "assert (1 + 1) == 3; ending the job") in done.stderr
