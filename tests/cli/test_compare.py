"""CLI tier: `nvlink-emu run SCRIPT --compare P1,P2,...`: a job per preset, one table of modeled step
time and link bytes (exact, against the closed forms), the bar chart; errors as one line, no hang;
the step line that workload scripts print (nvlink_emu.launch.workload)."""

import math
import textwrap

import pytest

from cli_helpers import command, run, script
from nvlink_emu.launch.workload import parse_step_line, step_line

N = 3
COUNT = 3000  # float32 elements of each AllReduce: 12000 B, three blocks of 4000 B
WORKLOAD = textwrap.dedent(f"""
    import numpy as np
    from nvlink_emu.launch.workload import timed_step

    def main(gpu):
        a = np.ones({COUNT}, np.float32)
        for i in range(2):
            with timed_step(gpu):
                gpu.compute(1000.0 * (gpu.rank + 1 + i))   # the slowest GPU, {N - 1}, sets the step time
                gpu.world.allreduce(a, "sum", "ring")
        with timed_step(gpu, "bare"):
            gpu.world.allreduce(a, "sum", "ring")
        print("the workload's own line")
""")


def table(stdout: str) -> dict:
    """{(preset, step): [steps, step_us, ratio, link_B/step, link_B/run]} of the comparison table."""
    rows = {}
    for line in stdout.splitlines()[2:]:
        preset, step, *values = line.split()
        rows[preset, step] = values
    return rows


def test_compare_prints_step_time_and_exact_link_bytes_per_preset(tmp_path):
    figure = tmp_path / "steps.png"
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, WORKLOAD), "--gpus", str(N),
                   "--compare", "dgx-a100,dgx-h100", "--plot", str(figure)], timeout_s=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[0].startswith("# workload.py on 3 GPUs: modeled step time per preset")
    assert out[1].split() == ["preset", "step", "steps", "step_us", "xdgx-a100", "link_B/step", "link_B/run"]
    rows = table(done.stdout)
    assert list(rows) == [("dgx-a100", "-"), ("dgx-a100", "bare"), ("dgx-h100", "-"), ("dgx-h100", "bare")]
    S = COUNT * 4
    ring = 2 * N * 2 * (N - 1) * S // N  # ring AllReduce: 2(N-1)/N S each way per GPU
    assert rows["dgx-a100", "-"][0] == "2" and rows["dgx-a100", "bare"][0] == "1"
    assert [int(v) for v in rows["dgx-a100", "-"][3:]] == [ring, 3 * ring]
    assert [int(v) for v in rows["dgx-h100", "bare"][3:]] == [ring, 3 * ring]
    # the timed steps: compute of the slowest GPU (3000 ns, then 4000 ns) then the AllReduce: their mean
    bare_a100, bare_h100 = float(rows["dgx-a100", "bare"][1]), float(rows["dgx-h100", "bare"][1])
    assert math.isclose(float(rows["dgx-a100", "-"][1]), bare_a100 + 3.5, abs_tol=2e-3)
    assert math.isclose(float(rows["dgx-h100", "-"][1]), bare_h100 + 3.5, abs_tol=2e-3)
    assert rows["dgx-a100", "bare"][2] == "1.00"
    assert rows["dgx-h100", "bare"][2] == f"{bare_h100 / bare_a100:.2f}" and bare_h100 < bare_a100
    # the workload's lines, each after its preset's name, and progress go to stderr; no link tables
    assert done.stderr.count("[dgx-h100] [gpu 1] the workload's own line") == 1
    assert "nvlink-emu: run --compare: 2/2 dgx-h100 done" in done.stderr
    assert "# per-link counters" not in done.stderr and f"wrote {figure}" in done.stderr
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000


def test_the_chart_goes_to_a_default_file_named_after_the_script(tmp_path):
    body = "def main(gpu):\n    gpu.compute(10.0 * gpu.rank)\n    print('step_ns=%s' % (10.0 * gpu.rank))\n"
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body, "tiny.py"), "--gpus", "2",
                   "--compare", "pcie-gen4,h100-ib"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # GPU 1's line is not read: the step line is GPU 0's
    assert [line.split()[:4] for line in done.stdout.splitlines()[2:]] == [["pcie-gen4", "-", "1", "0.000"],
                                                                        ["h100-ib", "-", "1", "0.000"]]
    assert (tmp_path / "tiny-compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FAILS_ON_H100 = textwrap.dedent("""
    def main(gpu):
        if gpu.config.name == "dgx-h100" and gpu.rank == 1:
            raise RuntimeError("no luck on this one")
        gpu.world.barrier()
        print("step_ns=5")
""")


def test_a_script_failing_on_one_preset_names_it_and_shows_its_output(tmp_path):
    script(tmp_path, FAILS_ON_H100)
    done, elapsed = run([command("nvlink-emu"), "run", "workload.py", "--gpus", "2",
                         "--compare", "dgx-a100,dgx-h100,pcie-gen4", "--timeout", "60"], cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "nvlink-emu: error: workload.py failed on preset dgx-h100 (exit status 1); its output is above, "
        "after [dgx-h100]")
    assert "[nvlink-emu gpu 1] RuntimeError: no luck on this one" in done.stderr
    assert "[pcie-gen4]" not in done.stderr and "1/3 dgx-a100 done" in done.stderr  # stops at the failure
    assert elapsed < 40, f"took {elapsed:.0f} s: it must not wait for the 60 s deadline"
    assert not (tmp_path / "workload-compare.png").exists()


@pytest.mark.parametrize("body,message", [
    ("def main(gpu):\n    print('no step here')\n",
     "workload.py printed no step time on preset dgx-a100: GPU 0 must print a line step_ns=<float>"),
    ("def main(gpu):\n    print('step_ns=fast')\n",
     "workload.py on preset dgx-a100: GPU 0 printed a malformed step line: not a step line"),
    ("def main(gpu):\n    print('step_ns=1' if gpu.config.name == 'dgx-a100' else 'step_ns=1 step=other')\n",
     "workload.py: its steps differ between presets: dgx-a100 printed (unnamed), dgx-h100 printed other"),
])
def test_a_run_without_a_readable_step_time_is_one_line(tmp_path, body, message):
    script(tmp_path, body)
    done, _ = run([command("nvlink-emu"), "run", "workload.py", "--gpus", "2", "--compare", "dgx-a100,dgx-h100"],
                  cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith(f"nvlink-emu: error: {message}")


@pytest.mark.parametrize("argv,message", [
    (["--compare", "dgx-a100,dgx-h99"], "preset: unknown preset 'dgx-h99'; known: dgx-h100"),
    (["--compare", "dgx-a100"], "--compare dgx-a100: takes two or more presets"),
    (["--compare", "dgx-a100,dgx-a100"], "--compare dgx-a100,dgx-a100: names dgx-a100 more than once"),
    (["--compare", "dgx-a100,dgx-h100", "--preset", "h100-ib"], "--compare takes the presets, P1,P2,..., instead"),
    (["--compare", "dgx-a100,dgx-h100", "--report-json", "r.json"], "--report-json: one report per run"),
    (["--compare", "dgx-a100,dgx-h100", "--no-label"], "--no-label: --compare reads GPU 0's step lines by their"),
    (["--compare", "dgx-a100,dgx-h100", "--plot", "steps.txt"], "--plot steps.txt: name a .png, .svg or .pdf file"),
    (["--plot", "steps.png"], "--plot: draws the step times of --compare; give --compare P1,P2,... too"),
    (["--project-nodes", "4"], "--project-nodes: projects the step times of --compare; give --compare P1,P2,... too"),
    (["--compare", "dgx-a100,dgx-h100", "--project-nodes", "0"], "--project-nodes: must be a positive integer, got 0"),
])
def test_bad_compare_options_are_one_line_before_any_job(tmp_path, argv, message):
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, "def main(gpu):\n    pass\n"), "--gpus", "2",
                         *argv], cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"nvlink-emu: error: {message}") and done.stderr.count("\n") == 1
    assert elapsed < 15


def test_step_lines_round_trip_and_other_lines_are_not_steps():
    line = step_line(1234.5678, "overlap", 4096)
    assert line == "step_ns=1234.568 step=overlap link_bytes=4096"
    # start_ns (the step's start on GPU 0's clock, which --project-nodes reads) came later: a new key of
    # the parsed line, None when absent, so the lines printed before it still parse
    assert parse_step_line(line) == {"step_ns": 1234.568, "step": "overlap", "link_bytes": 4096, "start_ns": None}
    assert parse_step_line("[gpu 0] step_ns=7") == {"step_ns": 7.0, "step": None, "link_bytes": None,
                                                    "start_ns": None}
    timed = step_line(5.0, None, 8, 0.1 + 0.2)
    assert timed == "step_ns=5.000 link_bytes=8 start_ns=0.30000000000000004"  # start exact: calls placed by it
    assert parse_step_line(timed)["start_ns"] == 0.1 + 0.2
    assert parse_step_line("[gpu 1] step_ns=7") is None  # GPU 0's lines only
    assert parse_step_line("largest weight difference 1e-7") is None
    for bad in ("step_ns=", "step_ns=-1", "step_ns=nan", "step_ns=1 step_ns=2", "step_ns=1 speed=3",
                "step_ns=1 link_bytes=1.5", "step_ns=1 start_ns=-1", "step_ns=1 start_ns=inf"):
        with pytest.raises(ValueError):
            parse_step_line(bad)
    with pytest.raises(Exception, match="one token"):
        step_line(1.0, "two words")
