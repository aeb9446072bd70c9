"""CLI tier: fault plans from the command line (--faults): the flaky_link example survives a flapping
link by retrying (6 steps, 2 retries, the modeled wait), and the bench prints the faulted links' counters."""

import json

import pytest

from cli_helpers import ROOT, command, run

EXAMPLES = ROOT / "launch" / "examples"


def test_flaky_link_survives_two_down_phases_by_retrying():
    done, _ = run([command("nvlink-emu"), "run", str(EXAMPLES / "flaky_link.py"), "--config",
                   str(EXAMPLES / "flaky_link.toml")], timeout_s=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # closed form: steps of 20 us of compute + 4.465 us of AllReduce; checks at 44.465 us (down 40-70 us)
    # and 118.93 us (down 100-130 us) wait 25.535 + 11.07 us
    assert "[gpu 1] step 1: caught LinkDown: link gpu1->sw0 is down at 44465 ns (down since 40000 ns, up at 70000 ns)" in out
    assert "[gpu 0] step 1: modeled 50.000 us, retries so far 1" in out
    assert "[gpu 0] step 3: modeled 35.535 us, retries so far 2" in out
    assert "[gpu 0] flaky_link: 6 steps in 183.396 us modeled, 2 retries, 36.604 us of it waiting" in out


def test_bench_with_a_fault_plan_prints_crc_errors_replays_and_state(tmp_path):
    plan = tmp_path / "f.toml"
    plan.write_text('[[faults]]\nlink = "gpu1<->sw0"\nkind = "ber"\nber = 1e-5\nseed = 7\n\n'
                    '[[faults]]\nlink = "gpu2->sw0"\nkind = "degraded"\nlanes = 9\n')
    report = tmp_path / "r.json"
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--preset", "dgx-h100", "--gpus", "4", "--min-bytes",
                   "1M", "--max-bytes", "1M", "--iters", "2", "--faults", str(plan), "--report-json", str(report)],
                  timeout_s=120)
    assert done.returncode == 0, done.stderr
    row = [line for line in done.stdout.splitlines() if line.strip().startswith("1048576")][0]
    assert row.split()[-1] == "0"  # #wrong
    links = json.loads(report.read_text())["links"]
    assert links["gpu1->sw0"]["replays"] == links["gpu1->sw0"]["crc_errors"] > 0
    assert links["gpu1->sw0"]["state"] == "ber" and links["gpu2->sw0"]["state"] == "degraded"
    assert links["gpu2->sw0"]["replays"] == 0 and "replays" not in links["gpu3->sw0"]
    # 9 of 36 lanes: gpu2's uplink is busy 4x as long as gpu3's, which carries the same bytes
    assert links["gpu2->sw0"]["busy_ns"] == 4 * links["gpu3->sw0"]["busy_ns"]
    table = done.stderr + done.stdout
    assert "# faulted links" in table
    assert any(line.split()[:4] == ["gpu2->sw0", "0", "0", "degraded"] for line in table.splitlines())


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_gpus_only_link_down_ends_the_bench_with_linkdown_not_a_hang(tmp_path):
    plan = tmp_path / "down.toml"
    plan.write_text('[[faults]]\nlink = "gpu5->sw1"\nkind = "down"\nat_ns = 2000\n')
    # the line-rate twin: the golden time below was taken on its figures (superpod-h100-nvlink is calibrated)
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--nodes", "2", "--gpus-per-node", "4", "--preset",
                   "superpod-h100-nvlink-line", "--min-bytes", "1M", "--max-bytes", "1M", "--iters", "2", "--timeout", "30",
                   "--faults", str(plan)], timeout_s=90)  # well inside the ranks' 30 s deadline plus start-up
    assert done.returncode != 0
    assert ("[nvlink-emu gpu 5] nvlink_emu.fabric.errors.LinkDown: link gpu5->sw1 is down at 6502 ns (down since "
            "2000 ns, not coming back up)") in done.stderr


def test_trace_records_on_a_faulted_link_carry_its_running_replays(tmp_path):
    from nvlink_emu.launch.traces import read_run

    plan = tmp_path / "f.toml"
    plan.write_text('[[faults]]\nlink = "gpu1<->sw0"\nkind = "ber"\nber = 1e-5\nseed = 7\n')
    traces = tmp_path / "traces"
    report = tmp_path / "r.json"
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--preset", "dgx-h100", "--gpus", "4", "--min-bytes",
                   "256K", "--max-bytes", "256K", "--iters", "1", "--algorithm", "ring", "--faults", str(plan),
                   "--trace-dir", str(traces), "--report-json", str(report)], timeout_s=120)
    assert done.returncode == 0, done.stderr
    records = [e for t, in zip(read_run(traces)[0]) for e in t.events]
    tx = [e for e in records if e.get("ev") == "tx" and e.get("link") == "gpu1->sw0"]
    busy = [e for e in records if e.get("ev") == "busy" and e.get("link") == "sw0->gpu1"]
    others = [e for e in records if e.get("ev") == "tx" and e.get("link") == "gpu2->sw0"]
    assert tx and busy and others
    assert all("replays" in e and "crc_errors" in e for e in tx + busy)
    assert not any("replays" in e for e in others)  # a link without a fault: records as before
    links = json.loads(report.read_text())["links"]
    assert max(e["replays"] for e in tx) == links["gpu1->sw0"]["replays"] > 0
    assert [e["replays"] for e in tx] == sorted(e["replays"] for e in tx)  # running counts
