"""Runs the multi-rank tier (tests/mpi) under mpiexec at two world sizes, so plain `pytest` runs it too."""

import re
import sys

import pytest

from cli_helpers import ROOT, command, run


@pytest.mark.parametrize("world_size", [4, 6, 9])  # 3, 5 and 8 GPUs (a DGX), plus the switch rank
def test_multi_rank_tier_passes_with_nothing_skipped(world_size):
    done, _ = run([command("mpiexec"), "-n", str(world_size), sys.executable, "-m", "pytest", "--with-mpi",
                   "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "mpi")], timeout_s=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    summaries = re.findall(r"(\d+) passed in", output)
    assert len(summaries) == world_size, output[-3000:]       # every rank ran the tier ...
    assert len(set(summaries)) == 1 and int(summaries[0]) > 0  # ... the same tests, all passed
    assert not re.search(r"\d+ (skipped|failed|error)", output), output[-3000:]
