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


def pytest_sessionstart(session):
    # Every rank of every job a test starts imports the package, and every rank of a pytest job (the
    # tiers, the plugin's tests) also the test modules and the plugins, which pytest rewrites for its
    # asserts (hypothesis: ~70 modules). Where PYTHONDONTWRITEBYTECODE is set (some shells and images
    # set it), each would compile all of it from source again and keep nothing: measured 10.5 s of CPU
    # for `mpiexec -n 4 pytest --with-mpi --co tests/mpi` against 4.1 s with bytecode written. So the
    # suite compiles the package once and lets its jobs write and read bytecode, as Python does by default.
    import os
    import sys
    if sys.dont_write_bytecode:
        import compileall
        from pathlib import Path
        root = Path(__file__).resolve().parents[1]
        for folder in ("fabric", "ranks", "launch", "tests"):
            compileall.compile_dir(root / folder, quiet=1, workers=1)
        sys.dont_write_bytecode = False
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
