"""pytest plugin (entry point `nvlink_emu`): the `fabric_run` fixture, and a failed MPI test ending the whole job."""

import traceback
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # pytest loads this module in every session: MPI and numpy only once a test runs a fabric
    from nvlink_emu.fabric.config import FabricConfig
    from nvlink_emu.ranks.session import RunResult

ABORT_INI = "nvlink_emu_abort_on_failure"
TEST_TIMEOUT_S = 30.0  # s, every blocking wait of a test's run: short, so that a test that fails ends soon


class FabricRun:
    """What the `fabric_run` fixture gives a test: call it to run a workload, once or more."""

    def __init__(self):
        self.rank = None     # this rank, and the config of its last run, once one began
        self.config = None
        self.failure = None  # the exception a run raised on this rank, caught by the test or not

    def __call__(self, main, preset: str | None = None, *, config: "FabricConfig | None" = None,
                 gpus: int | None = None, timeout_s: float = TEST_TIMEOUT_S, trace_dir: str | None = None,
                 **overrides) -> "RunResult":
        """Run `main(gpu)` on every GPU rank of a fabric while the last rank serves as its switch; this
        rank's RunResult (main's return value on a GPU rank, the run's report on every rank).

        The fabric: `preset` (default dgx-h100) with `gpus` (default: the world size - 1) and any other
        config key as a keyword (partitions=[[0, 1], [2, 3]], sharp=False, ...), or a ready `config`
        (nvlink_emu.fabric.preset(...), load_toml(...)). `timeout_s`: the deadline of every blocking
        wait, seconds. A ConfigError before any traffic is raised on every rank alike; any other
        failure ends the whole MPI job once pytest has reported it (see pytest_runtest_makereport).
        """
        __tracebackhide__ = True  # pytest: a failure's report starts at the test, then the workload
        from nvlink_emu.fabric.config import DEFAULT_PRESET
        from nvlink_emu.fabric.config import preset as named_preset
        from nvlink_emu.fabric.errors import ConfigError
        from nvlink_emu.ranks.session import check_run, run_fabric
        from nvlink_emu.ranks.transport import world_rank, world_size

        if config is None:
            if gpus is None and world_size() < 2:
                raise ConfigError("fabric_run: a world of 1 rank has no room for a switch; run the test under "
                                  "mpiexec -n G+1 with --with-mpi and mark it @pytest.mark.mpi(min_size=G+1)")
            config = named_preset(preset or DEFAULT_PRESET, gpus=world_size() - 1 if gpus is None else gpus,
                                  **overrides)
        elif preset is not None or gpus is not None or overrides:
            raise ConfigError("fabric_run: give a preset (with gpus and overrides) or a config, not both")
        check_run(config, timeout_s, world_size())  # every rank alike, before any traffic: a plain failed test
        self.rank, self.config = world_rank(), config
        try:
            return run_fabric(config, main, timeout_s=timeout_s, abort_on_error=False, trace_dir=trace_dir)
        except BaseException as exc:
            self.failure = exc
            raise


_RUN = pytest.StashKey[FabricRun]()


@pytest.fixture
def fabric_run(request) -> FabricRun:
    """Run a workload on an emulated fabric inside a `@pytest.mark.mpi(min_size=N)` test:
    `result = fabric_run(main, preset="dgx-h100", gpus=None, timeout_s=30, **overrides)` (FabricRun)."""
    run = request.node.stash[_RUN] = FabricRun()
    return run


def pytest_addoption(parser) -> None:
    parser.addini(ABORT_INI, type="bool", default=False,
                  help="under mpiexec with --with-mpi, a failed test ends the whole MPI job after its report, "
                       "also tests that do not use fabric_run (nvlink-emu)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed on this rank ends every rank of the job, after printing its report: the
    other ranks are waiting for this one in the same run (or will be, in the next test). pytest's
    capture is suspended for it, or the report would be lost with the job."""
    report = yield
    run = item.stash.get(_RUN, None)
    if run is not None:
        caught = call.when == "call" and run.failure is not None and not report.failed
        if report.failed or caught:
            end_job(item, report, run, caught)
    elif report.failed and item.config.getini(ABORT_INI) and item.config.getoption("--with-mpi", default=False):
        end_job(item, report, None, False)
    return report


def end_job(item, report, run: FabricRun | None, caught: bool) -> None:
    """Print the failed test's report on this rank, each line labelled, and abort the MPI job (if it
    has more than this rank). `caught`: the test passed although its run failed on this rank."""
    from nvlink_emu.ranks.session import rank_name, report_failure, role_of
    from nvlink_emu.ranks.transport import abort_job, world_rank, world_size

    if world_size() < 2:
        return  # nobody waits for this rank
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend(in_=True)
    rank = world_rank()
    if run is None or run.config is None:  # no run began on this rank: no role to name
        name = who = f"rank {rank}"
    else:
        name = rank_name(rank, run.config)
        who = f"GPU {rank}" if role_of(rank, run.config) == "gpu" else f"the {name}"
    if caught:
        assert run is not None  # caught: this rank's run failed
        exc = run.failure
        message = f"{type(exc).__name__}: {exc}".split("\n")[0]
        text = "".join(traceback.format_exception(exc))
        context = f" (the test {report.outcome}, but the other ranks cannot finish the run without this one)"
    else:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = (crash.message if crash is not None else report.longreprtext).strip().split("\n")[0]
        text = report.longreprtext
        context = "" if report.when == "call" else f" (in {report.when})"
    report_failure(rank, name, text, headline=f"{item.nodeid}: {who} failed: {message}{context}; ending the job")
    abort_job(1)
