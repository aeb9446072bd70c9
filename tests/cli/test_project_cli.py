"""CLI tier: `nvlink-emu run dlrm.py --compare P1,P2 --project-nodes N` end to end at 2 nodes x 2 GPUs:
the projected step time is the emulated step's compute plus fabric.cost_nodes.modeled_ns of each of GPU
0's calls at auto's pick on N nodes, to the printed digit."""

import json
import math

import pytest

from cli_helpers import ROOT, command, run
from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import resolve
from nvlink_emu.launch.report import dtype_itemsize
from nvlink_emu.launch.workload import parse_step_line
from nvlink_emu.ranks.collectives import choose
from nvlink_emu.ranks.comm import all2all_algorithm

PRESETS = ("superpod-a100-ib", "superpod-h100-nvlink")
SHAPE = ["--nodes", "2", "--gpus-per-node", "2"]
PROJECT_NODES = 3
DLRM = ["--", "--steps", "1", "--batch", "8", "--tables", "2", "--rows", "50", "--big-rows", "100", "--dim", "8",
        "--hidden", "16"]


def projected_comm_ns(records: list[dict], config) -> float:
    """The sum of cost_nodes.modeled_ns over GPU 0's calls, written out here apart from launch/project.py:
    allreduce at choose's pick; all2all and all2allv as an all2all of GPU 0's send bytes rounded up to
    whole blocks of whole elements, at all2all_algorithm's pick."""
    total = 0.0
    for r in (r for r in records if r["gpu"] == 0):
        itemsize = dtype_itemsize(r["dtype"])
        S = r["count"] * itemsize
        if S == 0:
            continue
        if r["collective"] == "allreduce":
            total += cost_nodes.modeled_ns("allreduce", choose("allreduce", "auto", config, S), config.topology, S,
                                           config, itemsize)
        else:
            assert r["collective"] in ("all2all", "all2allv")
            S = -(-S // (config.gpus * itemsize)) * config.gpus * itemsize
            total += cost_nodes.modeled_ns("all2all", all2all_algorithm("auto", config, S, itemsize=itemsize),
                                           config.topology, S, config, itemsize)
    return total


@pytest.mark.slow  # a few seconds or more: MPI jobs (docs/develop/testing.md, Markers)
def test_project_nodes_equals_the_cost_models_sums(tmp_path):
    dlrm = str(ROOT / "launch" / "examples" / "dlrm.py")
    done, _ = run([command("nvlink-emu"), "run", dlrm, "--compare", ",".join(PRESETS), *SHAPE, "--project-nodes",
                   str(PROJECT_NODES), "--plot", str(tmp_path / "steps.png"), *DLRM], timeout_s=400)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    emulated, projected = lines.index(next(l for l in lines if l.startswith("# dlrm.py, emulated, 2 x 2 GPUs"))), \
        lines.index(next(l for l in lines if l.startswith("# dlrm.py, projected by the cost model, 3 x 2 GPUs")))
    rows = {(which, line.split()[0]): line.split() for which, at in (("emulated", emulated), ("projected", projected))
            for line in lines[at + 2:at + 2 + len(PRESETS)]}
    steps = {}
    for preset in PRESETS:
        # the same run again with its report: modeled time is deterministic (tests/cli/test_determinism.py),
        # so its calls are the compared run's; its step line proves it
        report = tmp_path / f"{preset}.json"
        alone, _ = run([command("nvlink-emu"), "run", dlrm, "--preset", preset, *SHAPE, "--report-json", str(report),
                        *DLRM], timeout_s=200)
        assert alone.returncode == 0, alone.stderr[-3000:]
        step = next(s for s in map(parse_step_line, alone.stdout.splitlines()) if s is not None)
        assert f"[{preset}] [gpu 0] step_ns={step['step_ns']:.3f}" in done.stderr
        records = json.loads(report.read_text())["collectives"]
        mine = [r for r in records if r["gpu"] == 0]
        assert [r["collective"] for r in mine] == ["all2allv", "all2allv", "all2all", "all2allv", "all2allv",
                                                   "allreduce", "all2allv", "all2allv"]  # dlrm.py's calls, one step
        assert all(step["start_ns"] <= r["m_start_ns"] < step["start_ns"] + step["step_ns"] for r in mine)
        comm = sum(r["m_end_ns"] - r["m_start_ns"] for r in mine)
        compute = step["step_ns"] - comm
        target = resolve(preset, None, None, PROJECT_NODES, 2)
        expected = projected_comm_ns(records, target)
        steps[preset] = (step["step_ns"], compute + expected)
        assert rows["emulated", preset][2:] == [f"{step['step_ns'] / 1e3:.3f}", rows["emulated", preset][3],
                                                f"{comm / 1e3:.3f}", f"{comm / step['step_ns']:.2f}"]
        assert rows["projected", preset][2:] == [f"{(compute + expected) / 1e3:.3f}", rows["projected", preset][3],
                                                 f"{expected / 1e3:.3f}", f"{expected / (compute + expected):.2f}"]
        assert compute > 0 and expected > 0
    first = PRESETS[0]
    for which, i in (("emulated", 0), ("projected", 1)):
        assert rows[which, PRESETS[1]][3] == f"{steps[first][i] / steps[PRESETS[1]][i]:.2f}"
        assert rows[which, first][3] == "1.00"
    assert not math.isclose(steps[first][1], steps[PRESETS[1]][1])
