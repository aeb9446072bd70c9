"""The CLI tier's heavy jobs start as soon as the tests are collected (cli_helpers.start_lanes): a test
module names them with heavy_jobs(items) -> {lane: [(test node id, command maker, order)]}, lanes 0 and 1;
in each lane the jobs run by order (the demo -1, mpi4py's files 0, the tiers 1 and 2)."""

from cli_helpers import start_lanes, stop_lanes


def pytest_collection_finish(session):
    if session.config.option.collectonly:  # --collect-only runs nothing
        return
    lanes: dict[int, list] = {0: [], 1: []}
    for module in {item.module for item in session.items if hasattr(item, "module")}:
        if hasattr(module, "heavy_jobs"):
            for lane, jobs in module.heavy_jobs([i for i in session.items if getattr(i, "module", None) is module]).items():
                lanes[lane] += jobs
    for jobs in lanes.values():
        jobs.sort(key=lambda job: job[2] if len(job) > 2 else 0)
    start_lanes([[job[:2] for job in jobs] for jobs in lanes.values()])


def pytest_sessionfinish(session):
    stop_lanes()
