"""Shared test setup: the MPI tier is collected only with --with-mpi. Under MPI, one failing rank ends
the whole job with its report instead of leaving the other ranks waiting: the package's pytest plugin
(nvlink_emu.launch.pytest_plugin) does it, for every test, as pyproject.toml's
nvlink_emu_abort_on_failure asks."""


def pytest_ignore_collect(collection_path, config):
    # tests/mpi and tests/nodes need mpiexec; tests/cli/test_mpi_tier.py runs them that way, so a plain
    # `pytest` runs them too.
    if collection_path.name in ("mpi", "nodes") and collection_path.parent.name == "tests":
        return not config.getoption("--with-mpi", default=False)
    return None
