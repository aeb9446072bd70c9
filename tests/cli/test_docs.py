"""The documentation: the site builds in strict mode (a broken link or anchor fails), the CLI reference is
generated from the parser and names every option, and the README stays short and gives CI's command."""

import argparse
import os
import sys

import pytest

from cli_helpers import ROOT, run
from nvlink_emu.launch.cli import build_parser

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import cli_reference  # noqa: E402  (the hook mkdocs loads from mkdocs.yml)


@pytest.mark.slow  # a whole mkdocs build
def test_the_site_builds_in_strict_mode_with_the_generated_cli_reference(tmp_path):
    done, _ = run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                   "-d", str(tmp_path / "site")], env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), timeout_s=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "--gpus-per-node" in (tmp_path / "site" / "guide" / "cli-reference" / "index.html").read_text()
    assert not (ROOT / "docs" / cli_reference.PAGE).exists()  # generated at build time, never committed


def test_the_cli_reference_names_every_option_of_every_command():
    page = cli_reference.reference()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        section = page.split(f"## nvlink-emu {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section, (name, flag)


def test_the_readme_is_short_and_gives_ci_s_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    (command,) = [line for line in ci if line.startswith("python3 -m venv")]
    assert f"```sh\n{command}\n```" in readme
    assert "mkdocs serve" in readme and "mkdocs build --strict" in readme
