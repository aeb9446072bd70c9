"""Runs the multi-rank tiers under mpiexec, so plain `pytest` runs them too: tests/mpi on one node,
tests/nodes on several (tests/nodes/nodes_helpers.py's SHAPES). Each tier runs whole at its first world
size and, at its second, only its tests marked `both_sizes` (those whose result depends on the shape)."""

import re
import sys
import threading
import time

import pytest

from cli_helpers import ROOT, Started, command
from nvlink_emu.launch.model import TIER_WORLD_SIZES


# mpi: 4 and 9, 3 GPUs (uneven blocks) and 8 (a DGX), plus the switch rank; nodes: 8 and 10, 2 nodes x 2 GPUs
# + 2 leaves + 2 spines, 3 x 2 + 3 leaves + 1 spine. One table, the one `nvlink-emu model` names as validated.
TIMEOUT_S = 600  # one run
RUNS = [(tier, size, "all" if i == 0 else "both_sizes")
        for tier, sizes in TIER_WORLD_SIZES.items() for i, size in enumerate(sizes)]


def tier_command(tier: str, world_size: int, which: str) -> list[str]:
    select = [] if which == "all" else ["-m", which]
    # no hypothesis in the tiers (the unit tier's): its plugin would import ~70 modules in every rank
    return [command("mpiexec"), "-n", str(world_size), sys.executable, "-m", "pytest", "--with-mpi", "-q",
            "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *select, str(ROOT / "tests" / tier)]


@pytest.fixture(scope="module")
def tier_runs(request):
    """The selected runs, one lane per tier: the two tiers run side by side, each tier's runs one after
    the other (ranks of a tier wait for each other much of the time, so two jobs share the 2 cores' idle
    time; never more than two jobs, so that no test's deadline is tried by a crowd). {run: Started},
    filled as the lanes start them."""
    wanted = {tuple(item.callspec.params[k] for k in ("tier", "world_size", "which")) for item in request.session.items
              if item.module is request.module and item.originalname == "test_multi_rank_tier_passes_with_nothing_skipped"}
    started, stop = {}, threading.Event()

    def lane(runs):
        for run_ in runs:
            if stop.is_set():
                return
            started[run_] = job = Started(tier_command(*run_))
            if not job.ended(TIMEOUT_S):
                job.kill()  # its test fails on the killed job's output; the lane goes on

    lanes = [threading.Thread(target=lane, args=([r for r in RUNS if r[0] == tier and r in wanted],), daemon=True)
             for tier in TIER_WORLD_SIZES]
    for thread in lanes:
        thread.start()
    yield started
    stop.set()
    for job in list(started.values()):
        job.kill()


@pytest.mark.slow
@pytest.mark.parametrize("tier, world_size, which", RUNS)
def test_multi_rank_tier_passes_with_nothing_skipped(tier_runs, tier, world_size, which):
    deadline = time.monotonic() + 2 * TIMEOUT_S  # its lane runs the tier's other run first, at most
    while (tier, world_size, which) not in tier_runs:
        assert time.monotonic() < deadline, f"the {tier} tier's run at {world_size} never started"
        time.sleep(0.1)
    done, _ = tier_runs[tier, world_size, which].result(timeout_s=TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    summaries = re.findall(r"(\d+) passed(?:, \d+ deselected)?(?:, \d+ xfailed)? in", output)  # xfail(strict): a known, described gap
    assert len(summaries) == world_size, output[-3000:]       # every rank ran the tier ...
    assert len(set(summaries)) == 1 and int(summaries[0]) > 0  # ... the same tests, all passed
    assert not re.search(r"\d+ (skipped|failed|error)", output), output[-3000:]
    if which != "all":  # the selection is a strict part of the tier: deselected tests exist, and some ran
        assert re.search(r"\d+ deselected", output), output[-3000:]
