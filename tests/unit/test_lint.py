"""The linter (ruff, pyflakes' rules and syntax errors; pyproject.toml [tool.ruff]) finds nothing in the
package folders and the tests: an unused import or name, an undefined name, an f-string without fields."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "fabric", "ranks",
                           "launch", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
