"""tests/benchmarks/speed.py's choices (the table itself is a benchmark: nothing about its figures is asserted)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))  # the benchmarks are scripts, not a package
from speed import _cpu_cell, algorithms, shape_of  # noqa: E402
from nvlink_emu.ranks.collectives import ALL2ALL


def test_shapes_name_a_preset_and_a_size():
    assert shape_of("8") == ("dgx-h100", 1, 8)
    assert shape_of("2x4") == ("superpod-h100-nvlink", 2, 4)
    for bad in ("x", "2x", "1", "0x4", "four"):
        with pytest.raises(SystemExit):
            shape_of(bad)


def test_every_algorithm_the_fabric_runs_gets_a_row():
    assert algorithms("allreduce", "dgx-h100", 1, 4)[:4] == ["ring", "direct", "sharp", "nvls"]
    assert "sharp" not in algorithms("reduce_scatter", "dgx-a100", 1, 4)  # a forwarding switch
    assert algorithms("all2all", "dgx-h100", 1, 8) == ["direct"]
    assert algorithms("all2all", "superpod-h100-nvlink", 2, 4) == list(ALL2ALL)


def test_several_nodes_offer_what_cost_nodes_covers():
    assert algorithms("allreduce", "superpod-h100-nvlink", 2, 4)[:3] == ["ring", "direct", "sharp"]
    assert "sharp" not in algorithms("allreduce", "superpod-h100-ib", 2, 4)  # its spines do not reduce
    assert "sharp" in algorithms("reduce_scatter", "superpod-h100-nvlink", 2, 4)  # two-level, and its stores
    assert "sharp" in algorithms("broadcast", "superpod-h100-nvlink", 2, 4)


def test_a_cpu_cell_weighs_the_emulators_cpu_against_what_the_cores_give():
    """CPU per call, the cores it kept busy, and that CPU over cores x TARGET x MPI's own wall time."""
    row = {"cpu_us": 12000.0, "cpu_wall_us": 6000.0, "native_wall_us": 1000.0}
    assert _cpu_cell(row, 2) == "12 ms, 2.0, 2.0x"  # 12 ms of CPU where 2 cores x 3 ms give 6
    assert _cpu_cell(row, 4) == "12 ms, 2.0, 1.0x"
    assert _cpu_cell({**row, "cpu_us": None}, 2) == "n/a"  # no /proc: nothing measured
    assert _cpu_cell({**row, "native_wall_us": None}, 2) == "n/a"  # a 16-bit type: MPI has no reference
