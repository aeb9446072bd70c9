"""launch/project.py: a timed workload projected to a larger fabric from a hand-built run report: which
calls belong to which step, compute kept, each call re-timed by fabric.cost_nodes.modeled_ns at auto's
pick, all2all bytes rounded up to whole blocks, the tables."""

import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import resolve
from nvlink_emu.launch.project import (ProjectionError, format_projection, mean_by_name, project_call,
                                       project_steps, step_calls)
from nvlink_emu.ranks.collectives import choose
from nvlink_emu.ranks.comm import all2all_algorithm

EMULATED = 4  # GPUs of the run the report comes from (2 nodes x 2)


def call(collective, count, dtype, start, end, gpu=0, members=EMULATED, seq=0):
    """A row of a run report's "collectives" (launch/report.py's keys the projection reads)."""
    return {"gpu": gpu, "comm": "world", "seq": seq, "collective": collective, "algorithm": "direct",
            "count": count, "dtype": dtype, "op": "sum", "root": None, "members": members,
            "m_start_ns": float(start), "m_end_ns": float(end)}


STEPS = [{"step_ns": 10_000.0, "step": None, "link_bytes": None, "start_ns": 1_000.0},   # [1000, 11000)
         {"step_ns": 2_000.0, "step": "b", "link_bytes": None, "start_ns": 11_000.0}]   # [11000, 13000)
RECORDS = [call("allreduce", 300, "float32", 500, 900, seq=0),          # before the first step: no step's
           call("allreduce", 1000, "float32", 1_500, 4_000, seq=1),     # 2500 ns, 4000 B
           call("allreduce", 1000, "float32", 1_500, 9_000, gpu=1),     # GPU 1's: not read
           call("all2allv", 10, "int64", 5_000, 6_000, seq=2),         # 1000 ns, 80 B -> 128 B on 8 GPUs
           call("all2all", 8, "int64", 6_500, 7_000, seq=3),           # 500 ns, 64 B: whole blocks already
           call("all2all", 0, "int64", 11_000, 11_100, seq=4)]         # the second step's (its start): 100 ns, 0 B


@pytest.fixture(scope="module")
def target():
    return resolve("superpod-h100-ib", None, None, 4, 2)  # 4 nodes x 2 GPUs: 8 GPUs


def test_a_step_holds_gpu_0s_calls_that_start_inside_it():
    assert [r["seq"] for r in step_calls(STEPS[0], RECORDS)] == [1, 2, 3]
    assert [r["seq"] for r in step_calls(STEPS[1], RECORDS)] == [4]


def test_compute_is_kept_and_each_call_re_timed_by_the_cost_model_at_autos_pick(target):
    first, second = project_steps(STEPS, RECORDS, target, EMULATED)
    assert first.compute_ns == 10_000.0 - (2_500.0 + 1_000.0 + 500.0) == 6_000.0
    assert first.comm_ns == 4_000.0
    assert [(c.collective, c.nbytes) for c in first.calls] == [("allreduce", 4000), ("all2allv", 128),
                                                               ("all2all", 64)]
    topo = target.topology
    allreduce = choose("allreduce", "auto", target, 4000)
    ragged = all2all_algorithm("auto", target, 128, itemsize=8)
    even = all2all_algorithm("auto", target, 64, itemsize=8)
    expected = [cost_nodes.modeled_ns("allreduce", allreduce, topo, 4000, target, 4),
                cost_nodes.modeled_ns("all2all", ragged, topo, 128, target, 8),
                cost_nodes.modeled_ns("all2all", even, topo, 64, target, 8)]
    assert [c.algorithm for c in first.calls] == [allreduce, ragged, even]
    assert [c.projected_ns for c in first.calls] == expected
    assert first.projected_comm_ns == sum(expected) and first.projected_ns == 6_000.0 + sum(expected)
    assert all(ns > 0 for ns in expected)
    # a call of no bytes costs nothing at any size (NCCL returns at once)
    assert (second.name, second.compute_ns, second.comm_ns, second.projected_ns) == ("b", 1_900.0, 100.0, 1_900.0)


def test_means_per_step_name_and_the_tables():
    assert mean_by_name(project_steps([STEPS[1], {**STEPS[1], "step_ns": 4_000.0, "start_ns": 13_000.0}],
                                      RECORDS + [call("all2all", 0, "int64", 13_000, 13_300, seq=5)],
                                      None, EMULATED)) == {"b": (3_000.0, 200.0, 2_800.0, 0.0)}
    means = {"p1": {None: (10_000.0, 4_000.0, 20_000.0, 10_000.0)}, "p22": {None: (5_000.0, 1_000.0, 4_000.0,
                                                                                   3_000.0)}}
    lines = format_projection("w.py", ["p1", "p22"], means, ("2 x 2 GPUs", "4 x 2 GPUs")).splitlines()
    assert lines[0].startswith("# w.py, emulated, 2 x 2 GPUs: step time (us")
    assert lines[4].startswith("# w.py, projected by the cost model, 4 x 2 GPUs: step time (us")
    assert lines[1].split() == lines[5].split() == ["preset", "step", "step_us", "speed-up", "comm_us", "comm_share"]
    assert [line.split() for line in lines[2:4] + lines[6:]] == [
        ["p1", "-", "10.000", "1.00", "4.000", "0.40"], ["p22", "-", "5.000", "2.00", "1.000", "0.20"],
        ["p1", "-", "20.000", "1.00", "10.000", "0.50"], ["p22", "-", "4.000", "5.00", "3.000", "0.75"]]
    assert len(lines) == 8


def test_calls_it_cannot_re_time_are_errors_naming_the_call(target):
    with pytest.raises(ProjectionError, match="reduce_scatter call 7 on world: the projection re-times allreduce"):
        project_call(call("reduce_scatter", 8, "float32", 0, 1, seq=7), target, EMULATED)
    with pytest.raises(ProjectionError, match="2 of the run's 4 GPUs"):
        project_call(call("allreduce", 8, "float32", 0, 1, members=2), target, EMULATED)
    with pytest.raises(ProjectionError, match="no start_ns"):
        step_calls({**STEPS[0], "start_ns": None}, RECORDS)
