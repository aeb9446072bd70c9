"""tests/benchmarks/floor.py runs its job (messages of 16 KiB: a 64 KiB call in several) and checks its patterns'
results against MPI's own (the figures are a benchmark: nothing about them is asserted)."""

import sys
from pathlib import Path

from cli_helpers import run

FLOOR = str(Path(__file__).parents[1] / "benchmarks" / "floor.py")


def test_floor_prints_a_row_per_pattern_and_a_column_per_size():
    done, _ = run([sys.executable, FLOOR, "--gpus", "3", "-b", "4K", "-e", "64K", "-f", "4",
                   "--chunk", "16K", "-n", "2", "--timeout", "60"], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "### 3 GPUs + a relay rank: wall time / MPI's own Allreduce, per call" in lines
    assert "| pattern | 4 KiB | 16 KiB | 64 KiB |" in lines
    rows = [line for line in lines if line.startswith("| relay") or line.startswith("| MPI's own")]
    assert [row.split(" | ")[0] for row in rows] == ["| relay ring", "| relay sharp", "| MPI's own"]
    assert all(row.count("x (") == 3 for row in rows), rows


def test_floor_refuses_a_bad_sweep():
    done, _ = run([sys.executable, FLOOR, "-b", "64K", "-e", "4K"], timeout_s=60)
    assert done.returncode != 0 and "need 0 < -b <= -e" in done.stderr
