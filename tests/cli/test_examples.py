"""CLI tier: the examples that check themselves (launch/examples: dp_sgd, dp_overlap, dlrm,
tp_vs_pipeline) on small sizes and 2-4 GPUs: each passes its own check against one process, prints
step lines whose link bytes follow the closed forms, and fails when its distributed part is wrong."""

import re

import pytest

from cli_helpers import ROOT, command, run
from nvlink_emu.launch.workload import parse_step_line

EXAMPLES = ROOT / "launch" / "examples"
SMALL = {
    "dp_sgd.py": ["--batch", "8", "--sizes", "16,32,32,4", "--steps", "3"],
    "dp_overlap.py": ["--batch", "16", "--sizes", "32,64,64,64,4", "--bucket-bytes", "8000", "--steps", "2"],
    "dlrm.py": ["--batch", "8", "--tables", "5", "--rows", "60", "--big-rows", "400", "--dim", "8", "--hidden", "16",
                "--steps", "2"],
    "tp_vs_pipeline.py": ["--batch", "12", "--width", "48", "--layers", "4", "--micro", "3", "--steps", "2"],
}


def example(name: str, gpus: int, *extra: str, path=None, preset: str = "dgx-h100"):
    """Run an example with its small sizes: (completed process, GPU 0's step lines, its other lines)."""
    done, _ = run([command("nvlink-emu"), "run", str(path or EXAMPLES / name), "--gpus", str(gpus), "--preset", preset,
                   "--", *SMALL[name], *extra], timeout_s=120)
    steps = [s for s in map(parse_step_line, done.stdout.splitlines()) if s is not None]
    said = [line.removeprefix("[gpu 0] ") for line in done.stdout.splitlines() if line.startswith("[gpu 0] ")
            and parse_step_line(line) is None]
    return done, steps, said


def differences(lines: list[str]) -> list[float]:
    """The largest differences from the reference that the example printed, one or more per line."""
    found = []
    for line in lines:
        match = re.search(r"reference[^0-9]* ([0-9.e+-]+)(?: / ([0-9.e+-]+))?", line)
        if match:
            found += [float(g) for g in match.groups() if g is not None]
    return found


def broken(tmp_path, name: str, old: str, new: str):
    """A copy of example `name` with `old` replaced by `new` (once): a bug in its distributed part."""
    text = (EXAMPLES / name).read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {name}"
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def test_dp_sgd_matches_one_process_every_step():
    done, steps, said = example("dp_sgd.py", 3, "--algorithm", "sharp")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(steps) == 3 and len(said) == 4  # the header, then a line per step
    assert all(0 <= d < 1e-5 for d in differences(said)) and len(differences(said)) == 3
    # sharp: every GPU sends its gradients once and receives the average once: 2 N S over the links
    params = 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4
    assert all(s["link_bytes"] == 2 * 3 * 4 * params and s["step_ns"] > 0 for s in steps)
    assert len({s["step_ns"] for s in steps}) == 1  # the same work each step: the same modeled time


def test_dp_overlap_hides_backward_under_the_allreduces():
    done, steps, said = example("dp_overlap.py", 3, "--algorithm", "ring")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [s["step"] for s in steps] == ["overlap", "no-overlap"] * 2
    assert all(0 <= d < 1e-5 for d in differences(said)) and len(differences(said)) == 4
    overlap, plain = steps[0], steps[1]
    assert overlap["link_bytes"] == plain["link_bytes"]  # the same buckets, the same bytes
    backward = float(re.search(r"backward compute ([0-9.]+) us", said[-1]).group(1)) * 1e3
    saved = plain["step_ns"] - overlap["step_ns"]
    assert 0 < saved <= backward + 1  # overlap hides at most the backward pass's compute


def test_dlrm_matches_one_process_with_tables_sharded_by_table_and_by_row():
    done, steps, said = example("dlrm.py", 4)  # 5 tables on 4 GPUs: GPU 0 owns two
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(steps) == 2 and all(s["step_ns"] > 0 and s["link_bytes"] > 0 for s in steps)
    assert all(0 <= d < 1e-5 for d in differences(said)) and len(differences(said)) == 2


@pytest.mark.parametrize("gpus", [2, 4])
def test_tp_vs_pipeline_bytes_follow_the_closed_forms(gpus):
    done, steps, said = example("tp_vs_pipeline.py", gpus, "--algorithm", "ring")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [s["step"] for s in steps] == ["tensor-parallel"] * 2 + ["pipeline"] * 2
    S = 12 * 48 * 4  # one activation of the batch; 12 x 48 splits evenly over 2 and 4 GPUs
    tp, pp = steps[0], steps[2]
    # tensor parallel: a ring AllReduce of S per pair of layers, 2(N-1)/N S each way on every GPU
    assert tp["link_bytes"] == 2 * 4 * (gpus - 1) * S
    # pipeline: S across each of the N - 1 stage boundaries, counted up and down
    assert pp["link_bytes"] == 2 * (gpus - 1) * S
    assert all(0 <= d < 1e-4 for d in differences(said)) and len(differences(said)) == 2


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_an_example_runs_under_run_compare(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", str(EXAMPLES / "tp_vs_pipeline.py"), "--gpus", "2",
                   "--compare", "dgx-a100,dgx-h100", "--plot", str(tmp_path / "tp.png"), "--",
                   *SMALL["tp_vs_pipeline.py"]], timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split()[:3] for line in done.stdout.splitlines()[2:]]
    assert rows == [["dgx-a100", "tensor-parallel", "2"], ["dgx-a100", "pipeline", "2"],
                    ["dgx-h100", "tensor-parallel", "2"], ["dgx-h100", "pipeline", "2"]]
    assert (tmp_path / "tp.png").stat().st_size > 10_000


@pytest.mark.parametrize("name,gpus,old,new", [
    ("dp_sgd.py", 3, 'gpu.world.allreduce(grads, op="avg"', 'gpu.world.allreduce(grads, op="sum"'),
    ("dp_overlap.py", 3, "op=\"avg\",\n", "op=\"sum\",\n"),
    ("dlrm.py", 3, "scatter_add(gpu, shard, requests - lo, d_requests, -args.lr / n)",
     "scatter_add(gpu, shard, requests - lo, d_requests, -args.lr)"),
    ("tp_vs_pipeline.py", 2, "comm.recv(h, r - 1, tag=ACTIVATIONS)", "comm.recv(h, r - 1, tag=ACTIVATIONS); h *= 1.001"),
])
def test_an_example_fails_when_its_distributed_part_is_wrong(tmp_path, name, gpus, old, new):
    done, _, _ = example(name, gpus, path=broken(tmp_path, name, old, new))
    assert done.returncode != 0
    assert re.search(r"AssertionError: GPU \d+: .*differs? from the one-process reference by", done.stderr)


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100"])
def test_the_mpi4py_halo_exchange_by_windows_matches_one_process(preset):
    """launch/examples/mpi4py_halo.py, unmodified mpi4py (MPI.Win Put + Fence, Accumulate): the same rod
    as one process, bit for bit, on NVLink Network windows (dgx-h100) and classic physical addresses
    (dgx-a100); each rank's Puts move exactly 2 x 8 bytes a step on its uplink."""
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(EXAMPLES / "mpi4py_halo.py"), "--gpus", "3",
                   "--preset", preset, "--", "8", "5"], timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[gpu 0] 3 ranks, 8 cells each, 5 steps: largest difference from one process 0, total heat" in done.stdout
    assert "[gpu 0] link bytes of the Puts per rank: [80, 80, 80] (2 x 8 bytes a step: 80)" in done.stdout


def test_the_mpi4py_halo_exchange_fails_when_a_halo_goes_the_wrong_way(tmp_path):
    path = broken(tmp_path, "mpi4py_halo.py", "halo.Put(u[1:2], left, cells + 1)", "halo.Put(u[1:2], right, cells + 1)")
    done, _ = run([command("nvlink-emu"), "run", "--mpi4py", str(path), "--gpus", "3", "--", "8", "5"], timeout_s=120)
    assert done.returncode != 0
    assert "halo exchange differs from one process" in done.stderr + done.stdout
