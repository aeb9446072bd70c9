"""Shared test setup: the MPI tier is collected only with --with-mpi, and under MPI one failing rank
ends the whole job with its traceback instead of leaving the other ranks waiting."""

import sys

import pytest


def pytest_ignore_collect(collection_path, config):
    # tests/mpi needs mpiexec; tests/cli/test_mpi_tier.py runs it that way, so a plain `pytest` runs it too.
    if collection_path.name == "mpi" and collection_path.parent.name == "tests":
        return not config.getoption("--with-mpi", default=False)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.config.getoption("--with-mpi", default=False):
        from nvlink_emu.ranks.transport import abort_job, world_rank, world_size

        if world_size() > 1:
            capture = item.config.pluginmanager.getplugin("capturemanager")
            if capture is not None:
                capture.suspend_global_capture(in_=True)  # or the report dies with the job
            rank = world_rank()
            text = "".join(f"[rank {rank}] {line}\n" for line in report.longreprtext.splitlines())
            sys.stderr.write(f"[rank {rank}] {item.nodeid} failed; aborting the job\n{text}")
            abort_job(1)
