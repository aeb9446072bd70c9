"""The type checker (mypy; pyproject.toml [tool.mypy]) finds no error in nvlink_emu.fabric, nvlink_emu.ranks
and nvlink_emu.launch: fabric under strict mode's checks (its per-module override), ranks and launch in default
mode. The folders install under the namespace nvlink_emu (package-dir), so mypy runs from a root whose
nvlink_emu/ links to them (issue 27: every module of fabric is strict)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """mypy with the project's config, from a root whose nvlink_emu/ links to the three folders."""
    (tmp_path / "nvlink_emu").mkdir()
    for folder in ("fabric", "ranks", "launch"):
        (tmp_path / "nvlink_emu" / folder).symlink_to(ROOT / folder, target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_finds_nothing_in_fabric_ranks_and_launch(tmp_path):
    done = _mypy(tmp_path, "-p", "nvlink_emu.fabric", "-p", "nvlink_emu.ranks", "-p", "nvlink_emu.launch")
    assert done.returncode == 0, done.stdout + done.stderr


def test_strict_mode_adds_nothing_on_fabric(tmp_path):
    """--strict on fabric finds nothing the config's run does not: its override holds every per-module check
    of strict mode (and fabric passes strict's two global ones, warn_redundant_casts and warn_unused_configs)."""
    done = _mypy(tmp_path, "--strict", "-p", "nvlink_emu.fabric")
    assert done.returncode == 0, done.stdout + done.stderr
