"""fabric.tuner: the one place that picks an algorithm. Its tables agree with the ranks' algorithm
modules, its tie rule is one for every collective, and `nvlink-emu model` picks without loading MPI."""

import subprocess
import sys

import pytest

from nvlink_emu.fabric import tuner
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.ranks import collectives

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter", "all2all")


def test_the_tables_are_the_modules():
    assert tuple(collectives.ALGORITHMS) == tuner.ALGORITHMS
    for name, module in collectives.ALGORITHMS.items():
        assert tuple(c for c in COLLECTIVES if hasattr(module, c)) == tuner.IMPLEMENTS[name], name
    assert tuple(collectives.ALL2ALL) == tuner.ALL2ALL
    assert collectives.choose is tuner.choose and collectives.allowed is tuner.allowed


def test_ties_go_to_the_earliest_within_tie():
    assert tuner.least({}) is None
    assert tuner.least({"ring": 100.0, "direct": 100.0 * (1 + tuner.TIE / 2), "sharp": 99.0}) == "sharp"
    assert tuner.least({"ring": 100.0 * (1 + tuner.TIE / 2), "direct": 100.0}) == "ring"  # within TIE: the earlier
    assert tuner.least({"ring": 100.0 * (1 + 2 * tuner.TIE), "direct": 100.0}) == "direct"


def test_auto_is_the_least_modeled_time_and_refusals_name_the_algorithm():
    from nvlink_emu.fabric import cost
    config = preset("dgx-h100")
    for S in (1024, 1 << 20, 256 << 20):
        times = {a: cost.modeled_ns("allreduce", a, S, 8, config) for a in ("ring", "direct", "sharp", "nvls")}
        assert tuner.choose("allreduce", "auto", config, S) == tuner.least(times)
    assert tuner.choose("all2all", "auto", config, 1 << 20) == "direct"  # one node: pxn's schedule is direct's
    with pytest.raises(UnsupportedOperation, match="'gather'.*|does not implement"):
        tuner.choose("gather", "ring", config, 1024)
    with pytest.raises(UnsupportedOperation, match="unknown algorithm 'bogus'"):
        tuner.choose("allreduce", "bogus", config, 1024)
    with pytest.raises(UnsupportedOperation, match="no in-switch"):
        tuner.choose("allreduce", "sharp", preset("dgx-a100"), 1024)


def test_help_and_model_load_no_mpi():
    """`nvlink-emu --help` and `nvlink-emu model` (the CLI's parser, the tuner, the cost models) import no
    mpi4py and no rank code: launch/options.py and ranks/status.py hold what they share with the ranks."""
    code = ("import sys, contextlib, io; from nvlink_emu.launch import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()): status = cli.main(['model', 'allreduce', '-b', '8', '-e', '8'])\n"
            "try:\n"
            "    with contextlib.redirect_stdout(io.StringIO()): cli.main(['--help'])\n"
            "except SystemExit as exc: status += exc.code\n"
            "print(status, sorted(m for m in sys.modules if m.startswith('mpi4py') or m.startswith('nvlink_emu.ranks.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["0", "['nvlink_emu.ranks.output', 'nvlink_emu.ranks.status']\n"]


def test_model_picks_without_loading_mpi():
    code = ("import sys; from nvlink_emu.launch import model; from nvlink_emu.fabric.config import preset; "
            "print(model.predict('allreduce', 'auto', preset('dgx-h100'), 1 << 20, 'float32')['algorithm']); "
            "print(any(m.startswith('mpi4py') or m.startswith('nvlink_emu.ranks') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [tuner.choose("allreduce", "auto", preset("dgx-h100"), 1 << 20), "False"]
