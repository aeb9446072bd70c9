"""Runs the multi-rank tiers under mpiexec, so plain `pytest` runs them too: tests/mpi on one node,
tests/nodes on several (tests/nodes/nodes_helpers.py's SHAPES). Each tier runs whole at its first world
size and, at its second, only its tests marked `both_sizes` (those whose result depends on the shape)."""

import re
import sys

import pytest

from cli_helpers import ROOT, command, heavy_result
from nvlink_emu.launch.tiers import TIER_WORLD_SIZES


# mpi: 4 and 9, 3 GPUs (uneven blocks) and 8 (a DGX), plus the switch rank; nodes: 8 and 10, 2 nodes x 2 GPUs
# + 2 leaves + 2 spines, 3 x 2 + 3 leaves + 1 spine. One table, the one `nvlink-emu model` names as validated.
RUNS = [(tier, size, "all" if i == 0 else "both_sizes")
        for tier, sizes in TIER_WORLD_SIZES.items() for i, size in enumerate(sizes)]


def tier_command(tier: str, world_size: int, which: str) -> list[str]:
    select = [] if which == "all" else ["-m", which]
    # no hypothesis in the tiers (the unit tier's): its plugin would import ~70 modules in every rank
    return [command("mpiexec"), "-n", str(world_size), sys.executable, "-m", "pytest", "--with-mpi", "-q",
            "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *select, str(ROOT / "tests" / tier)]


def heavy_jobs(items) -> dict:
    """The selected runs for tests/cli/conftest.py's lanes: the mpi tier's after mpi4py's buffer job in
    lane 0, the nodes tier's after its RMA job in lane 1; each tier's whole run first (ranks of a run
    wait for each other much of the time, so two jobs share the 2 cores' idle time; never more than two
    heavy jobs, so that no test's deadline is tried by a crowd)."""
    lanes = {0: [], 1: []}
    for item in items:
        if item.originalname == "test_multi_rank_tier_passes_with_nothing_skipped":
            tier, size, which = (item.callspec.params[k] for k in ("tier", "world_size", "which"))
            lanes[0 if tier == "mpi" else 1].append((item.nodeid, lambda run=(tier, size, which): tier_command(*run),
                                                     1 + TIER_WORLD_SIZES[tier].index(size)))
    return lanes


@pytest.mark.slow
@pytest.mark.parametrize("tier, world_size, which", RUNS)
def test_multi_rank_tier_passes_with_nothing_skipped(request, tier, world_size, which):
    done, _ = heavy_result(request.node.nodeid)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    summaries = re.findall(r"(\d+) passed(?:, \d+ deselected)?(?:, \d+ xfailed)? in", output)  # xfail(strict): a known, described gap
    assert len(summaries) == world_size, output[-3000:]       # every rank ran the tier ...
    assert len(set(summaries)) == 1 and int(summaries[0]) > 0  # ... the same tests, all passed
    assert not re.search(r"\d+ (skipped|failed|error)", output), output[-3000:]
    if which != "all":  # the selection is a strict part of the tier: deselected tests exist, and some ran
        assert re.search(r"\d+ deselected", output), output[-3000:]
