"""The type checker (mypy, default mode; pyproject.toml [tool.mypy]) finds no error in nvlink_emu.fabric,
nvlink_emu.ranks and nvlink_emu.launch. The folders install under the namespace nvlink_emu (package-dir), so
mypy runs from a root whose nvlink_emu/ links to them (issue 27; every module is checked: strict mode on fabric is the next step)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing_in_fabric_ranks_and_launch(tmp_path):
    (tmp_path / "nvlink_emu").mkdir()
    for folder in ("fabric", "ranks", "launch"):
        (tmp_path / "nvlink_emu" / folder).symlink_to(ROOT / folder, target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "-p", "nvlink_emu.fabric", "-p", "nvlink_emu.ranks", "-p", "nvlink_emu.launch"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
