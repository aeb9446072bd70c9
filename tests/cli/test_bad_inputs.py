"""CLI tier, bad inputs (issue 8): each ends the job at once with one clear line, never a traceback or a hang."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli_helpers import ROOT, command, run, script

BARRIER = "def main(gpu):\n    gpu.world.barrier()\n"


def entry_point(how: str, gpus: int) -> list[str]:
    """The command line that runs a workload script on `gpus` GPUs, before the script's path."""
    if how == "nvlink-emu run":
        return [command("nvlink-emu"), "run"]
    return [command("mpiexec"), "-n", str(gpus + 1), sys.executable, "-m", "nvlink_emu.launch"]


def only_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def running(marker: str) -> list[str]:
    """Command lines of the processes still running whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


# -- the fabric and the trace directory ------------------------------------------------------------

def test_config_that_is_a_directory(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, BARRIER), "--config", str(tmp_path)])
    assert done.returncode == 2
    assert only_line(done.stderr) == f"nvlink-emu: error: {tmp_path}: is a directory, not a config file"


def test_config_that_is_a_binary_file(tmp_path):
    config = tmp_path / "fabric.toml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, BARRIER), "--config", str(config)])
    assert done.returncode == 2
    assert only_line(done.stderr) == f"nvlink-emu: error: {config}: not a TOML file: byte 0 is not UTF-8 text"


@pytest.mark.parametrize("how", ["nvlink-emu run", "mpiexec"])
@pytest.mark.parametrize("where", ["is a file", "under a file"])
def test_trace_dir_that_cannot_be_a_directory(tmp_path, how, where):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file\n")
    trace_dir = blocker if where == "is a file" else blocker / "traces"
    done, _ = run([*entry_point(how, 2), script(tmp_path, BARRIER), "--gpus", "2", "--trace-dir", str(trace_dir)])
    assert done.returncode == 2
    expected = "is a file, not a directory" if where == "is a file" else \
        f"lies under {blocker}, which is a file, not a directory"
    assert only_line(done.stderr) == f"nvlink-emu: error: --trace-dir {trace_dir}: {expected}"
    assert blocker.read_text() == "a file\n"


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("how", ["nvlink-emu run", "mpiexec"])
@pytest.mark.parametrize("signature", ["()", "(a, b)", "(*, gpu)"])
def test_main_with_the_wrong_signature_is_refused_before_traffic(tmp_path, how, signature):
    body = f"def main{signature}:\n    raise AssertionError('main must not be called')\n"
    path = script(tmp_path, body)
    done, _ = run([*entry_point(how, 2), path, "--gpus", "2"])
    assert done.returncode == 2
    # GPU 0 found it (the script ran there): under nvlink-emu its line carries GPU 0's label, as the MPI
    # launcher told it who wrote the line
    label = "[gpu 0] " if how == "nvlink-emu run" else ""
    assert only_line(done.stderr) == (f"{label}nvlink-emu: error: {path}: main must take one argument, the GPU "
                                      f"(def main(gpu)); it is def main{signature}")
    assert "per-link counters" not in done.stdout + done.stderr  # no fabric started


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("signature", ["(gpu)", "(gpu, verbose=False)", "(*args)"])
def test_main_callable_with_one_argument_runs(tmp_path, signature):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, f"def main{signature}:\n    pass\n"),
                   "--gpus", "2"])
    assert done.returncode == 0, done.stderr


# -- sys.exit in a workload ------------------------------------------------------------------------

@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("how", ["nvlink-emu run", "mpiexec"])
def test_sys_exit_on_one_rank_ends_the_job_with_its_status(tmp_path, how):
    body = textwrap.dedent("""
        import sys
        def main(gpu):
            if gpu.rank == 1:
                sys.exit(3)
            gpu.world.barrier()
    """)
    done, elapsed = run([*entry_point(how, 3), script(tmp_path, body), "--gpus", "3", "--timeout", "60"])
    assert done.returncode == 3, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("[nvlink-emu")]
    assert ours == ["[nvlink-emu gpu 1] sys.exit(3) in the workload; ending the job with status 3"]
    assert "Traceback" not in done.stderr
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end; it must not wait for the 60 s deadline"


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_sys_exit_with_a_message_ends_the_job_with_status_1(tmp_path):
    body = "import sys\ndef main(gpu):\n    if gpu.rank == 0:\n        sys.exit('no data')\n    gpu.world.barrier()\n"
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "2", "--timeout", "60"])
    assert done.returncode == 1
    assert "[nvlink-emu gpu 0] sys.exit('no data') in the workload; ending the job with status 1" in done.stderr


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_sys_exit_0_is_a_normal_return_of_main(tmp_path):
    body = textwrap.dedent("""
        import sys
        def main(gpu):
            gpu.world.barrier()
            if gpu.rank == 1:
                sys.exit(0)
            if gpu.rank == 2:
                sys.exit()
    """)
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3"])
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("# per-link counters") == 1
    assert "[nvlink-emu" not in done.stderr


# -- Ctrl-C ------------------------------------------------------------------------------------------

def _sigint_default():
    """A user's shell starts the command with SIGINT at its default; a test suite started in the background
    of a non-interactive shell has it ignored, which every child would inherit (and never see the Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted(tmp_path, to: str, setup: str = "") -> tuple[subprocess.Popen, str, float, str]:
    """Start a 2-GPU job whose workload runs `setup`, then sleeps; once every rank runs, SIGINT `to` the
    command alone or its process group (a terminal's Ctrl-C: mpiexec and the ranks receive it too). (the
    ended job, its stderr, seconds from the SIGINT to its end, the workload's path)."""
    body = textwrap.dedent(f"""
        import signal, time
        from pathlib import Path
        def main(gpu):
            {setup}
            Path({str(tmp_path)!r}, f"started-{{gpu.rank}}").touch()
            time.sleep(300)
    """)
    path = script(tmp_path, body)
    job = subprocess.Popen([command("nvlink-emu"), "run", path, "--gpus", "2", "--timeout", "600"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"), preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started-{g}").exists() for g in range(2)):
            assert job.poll() is None and time.monotonic() < deadline, "the workload did not start"
            time.sleep(0.1)
        start = time.monotonic()
        if to == "the process group":
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job, stderr, elapsed, path


def _no_rank_left(path: str) -> None:
    deadline = time.monotonic() + 5
    while running(path) and time.monotonic() < deadline:  # the ranks' exit may trail mpiexec's by a moment
        time.sleep(0.1)
    assert running(path) == [], "ranks were left running after Ctrl-C"


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("to", ["nvlink-emu only", "the process group"])
def test_ctrl_c_stops_the_job_with_one_line_and_status_130(tmp_path, to):
    job, stderr, elapsed, path = _interrupted(tmp_path, to)
    assert job.returncode == 130, stderr
    assert stderr.count("nvlink-emu: error:") == 1
    assert "nvlink-emu: error: interrupted (Ctrl-C); the job was stopped" in stderr
    assert "Traceback" not in stderr and "[nvlink-emu" not in stderr, stderr
    assert elapsed < 15, f"the job took {elapsed:.1f} s to stop after Ctrl-C"
    _no_rank_left(path)


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_ctrl_c_ends_ranks_that_ignore_it(tmp_path):
    """Ranks that do not end on SIGINT (here they ignore it) still end, and the command with them (MPICH's
    mpiexec ends them at the second SIGINT; where mpiexec itself does not end, stop_interrupted kills it
    and every process below it, which would otherwise hold the command's output open)."""
    job, stderr, _, path = _interrupted(tmp_path, "nvlink-emu only", "signal.signal(signal.SIGINT, signal.SIG_IGN)")
    assert job.returncode == 130, stderr
    assert "nvlink-emu: error: interrupted (Ctrl-C); the job was stopped" in stderr, stderr
    _no_rank_left(path)


# -- a trace directory whose disk fills up ---------------------------------------------------------

FULL_DISK = textwrap.dedent("""
    import errno
    import numpy as np

    class FullDisk:
        # the trace file of a disk that has just filled up
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")
        def flush(self):
            pass
        def close(self):
            pass

    def main(gpu):
        window = gpu.alloc(4096, "uint8")
        handles = gpu.world.allgather_object(gpu.export(window))
        if gpu.rank == 1:
            gpu.trace._file = FullDisk()
            for _ in range(1000):  # more records than the writer buffers: a write fails mid-run
                gpu.put(handles[0], np.ones(256, np.uint8))
            raise AssertionError("no trace write failed")
        gpu.world.barrier()
""")


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_full_disk_under_the_trace_dir_ends_the_job_with_one_labelled_error(tmp_path):
    trace_dir = tmp_path / "traces"
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, FULL_DISK), "--gpus", "3",
                         "--timeout", "30", "--trace-dir", str(trace_dir)], timeout_s=90)
    assert done.returncode == 1, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("[nvlink-emu")]
    assert ours == [f"[nvlink-emu gpu 1] cannot write trace file {trace_dir / 'rank-00001.msgpack'}: "
                    f"No space left on device; ending the job"], done.stderr
    assert "Traceback" not in done.stderr and "AssertionError" not in done.stderr
    assert elapsed < 15, f"the job took {elapsed:.1f} s to end; it must not wait for the 30 s deadline"


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_failed_request_nobody_waited_for_ends_the_job(tmp_path):
    """Its mismatch surfaces when main returns, even after a later call ran it (issue 12 review)."""
    body = textwrap.dedent("""\
        import numpy as np

        def main(gpu):
            gpu.world.iallreduce(np.ones(64 if gpu.rank else 128, np.float32))  # never waited for
            gpu.world.allreduce(np.ones(16, np.float32))  # runs the bad one first
        """)
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--timeout", "20"])
    assert done.returncode != 0, done.stdout + done.stderr
    assert "CollectiveMismatch" in done.stderr and "allreduce #0" in done.stderr, done.stderr[-3000:]
