"""Helpers of the CLI tier: run the installed commands as a user would, with a time limit."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def command(name: str) -> str:
    """Path of an installed console script or launcher beside this Python (the test venv)."""
    path = BIN / name
    assert path.exists(), f"{name} is not installed beside {sys.executable}; run pip install -e '.[test]'"
    return str(path)


def run(args: list[str], timeout_s: float = 120, cwd: Path = ROOT,
        env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """(completed process with text stdout/stderr, elapsed seconds); `env`: the environment (default ours)."""
    start = time.monotonic()
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)
    return done, time.monotonic() - start


def script(tmp_path: Path, body: str, name: str = "workload.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)
