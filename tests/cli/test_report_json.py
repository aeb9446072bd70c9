"""CLI tier: --report-json under mpiexec: the JSON equals the table the run printed, and each GPU's
collective records match the calls it made (algorithm, bytes, modeled times of its trace)."""

import json
import re
import sys
import textwrap

import pytest

from cli_helpers import command, run, script
from nvlink_emu.fabric.trace import read_directory

N = 3
S = N * 4000 * 4  # bytes of each collective's buffer (float32)
WORKLOAD = textwrap.dedent("""
    import numpy as np

    def main(gpu):
        window = gpu.alloc(1 << 16, "uint8")
        handles = gpu.world.allgather_object(gpu.export(window, to=[0, 1]))
        if gpu.rank == 2:                       # refused: not in the allowed set (a violation on port 2)
            gpu.put(handles[0], np.ones(64, np.uint8))
            try:
                gpu.fence()
            except Exception:
                pass
        else:                                   # translated by the Link TLB of the target's port
            gpu.put(handles[1 - gpu.rank], np.ones(1 << 16, np.uint8))
        gpu.world.barrier()
        a = np.ones(3 * 4000, np.float32)
        gpu.world.allreduce(a, "sum", "ring")
        gpu.world.allreduce(a, "sum", "sharp")
        gpu.world.all2all(a, np.empty_like(a))
""")


HOW = ["nvlink-emu run", "mpiexec"]


def launch(tmp_path, body: str, *options: str, how: str = "mpiexec"):
    """`nvlink-emu run SCRIPT --gpus N OPTIONS`, or the same as `mpiexec -n N+1 python -m nvlink_emu.launch`:
    the completed process."""
    start = ([command("nvlink-emu"), "run"] if how == "nvlink-emu run"
             else [command("mpiexec"), "-n", str(N + 1), sys.executable, "-m", "nvlink_emu.launch"])
    done, _ = run([*start, script(tmp_path, body), "--gpus", str(N), *options])
    return done


@pytest.fixture(scope="module", params=HOW)
def reported(tmp_path_factory, request):
    """One run of WORKLOAD with --report-json and --trace-dir: (the JSON, the output it printed, trace dir)."""
    tmp = tmp_path_factory.mktemp("report-json")
    done = launch(tmp, WORKLOAD, "--report-json", str(tmp / "run.json"), "--trace-dir", str(tmp / "trace"),
                  how=request.param)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp / "run.json").read_text()), done.stdout + done.stderr, tmp / "trace"


def printed_table(text: str) -> tuple[float, dict]:
    """(modeled elapsed us, {gpu: {column: value}}) of the per-link table a run printed."""
    elapsed = float(re.search(r"modeled elapsed ([\d.]+) us", text).group(1))
    head = next(line for line in text.splitlines() if "tx payload B" in line)
    extra = head.split("rx util", 1)[1].split()
    columns = ["tx payload", "tx raw", "tx pkts", "rx payload", "rx raw", "rx pkts", "tx busy us", "tx util",
               "rx busy us", "rx util", *extra]
    rows = {}
    for match in re.finditer(r"gpu(\d+)<->sw0 +([\d. ]+)$", text, re.MULTILINE):
        values = [float(v) for v in match.group(2).split()]
        rows[int(match.group(1))] = dict(zip(columns, values, strict=True))
    return elapsed, rows


def test_the_json_equals_the_table_the_run_printed(reported):
    doc, output, _ = reported
    assert (doc["schema"], doc["version"], doc["fabric"], doc["mode"], doc["gpus"]) == \
        ("nvlink-emu-run-report", 1, "dgx-h100", "network", N)
    elapsed, rows = printed_table(output)
    assert sorted(rows) == list(range(N))
    assert round(doc["elapsed_ns"] / 1e3, 3) == elapsed
    for gpu, row in rows.items():
        for direction, link in (("tx", f"gpu{gpu}->sw0"), ("rx", f"sw0->gpu{gpu}")):
            counters = doc["links"][link]
            assert [counters["payload_bytes"], counters["raw_bytes"], counters["packets"]] == \
                [row[f"{direction} payload"], row[f"{direction} raw"], row[f"{direction} pkts"]], link
            assert round(counters["busy_ns"] / 1e3, 3) == row[f"{direction} busy us"]
            assert round(counters["utilization"], 3) == row[f"{direction} util"]
        port = doc["ports"][str(gpu)]
        assert {k: port[k] for k in row if k in port} == {k: row[k] for k in row if k in port}
        assert {"tlb_hits", "tlb_misses", "tlb_faults", "violations", "refused", "malformed"} <= set(row)
    assert doc["ports"]["2"]["violations"] == 1 and doc["ports"]["2"]["refused"] == 1
    assert sum(doc["ports"][str(g)]["tlb_hits"] + doc["ports"][str(g)]["tlb_misses"] for g in range(N)) > 0
    assert doc["conservation"] == {} and doc["unconsumed"] == {}


def test_each_gpu_has_a_record_of_each_collective_call_with_its_algorithm_and_bytes(reported):
    doc, _, trace_dir = reported
    # per-GPU link payload for S bytes on N GPUs (docs/guide/workloads.md): ring 2(N-1)/N S, sharp S, all2all (N-1)/N S
    expected = [("allreduce", "ring", 2 * (N - 1) * S // N), ("allreduce", "sharp", S),
                ("all2all", "direct", (N - 1) * S // N)]
    traces, _ = read_directory(trace_dir)
    for gpu in range(N):
        calls = [c for c in doc["collectives"] if c["gpu"] == gpu]
        assert [(c["collective"], c["algorithm"], c["tx_bytes"]) for c in calls] == expected
        assert [c["rx_bytes"] for c in calls] == [tx for _, _, tx in expected]
        assert all(c["size_bytes"] == S and c["count"] == S // 4 and c["dtype"] == "float32" and c["members"] == N
                   and c["comm"] == "world" and c["root"] is None for c in calls)
        # the modeled times are those of the GPU's coll_begin/coll_end trace records
        events = traces[gpu].events
        begins = [e["m"] for e in events if e["ev"] == "coll_begin"]
        ends = [e["m"] for e in events if e["ev"] == "coll_end"]
        assert [(c["m_start_ns"], c["m_end_ns"]) for c in calls] == list(zip(begins, ends))
        assert all(c["modeled_ns"] == c["m_end_ns"] - c["m_start_ns"] > 0 for c in calls)
        assert doc["collectives_unrecorded"][str(gpu)] == 0
    by_call = {}
    for c in doc["collectives"]:
        by_call.setdefault((c["comm"], c["seq"]), set()).add(c["algorithm"])
    assert len(by_call) == 3 and all(len(a) == 1 for a in by_call.values())  # one seq per call, on every GPU


def test_records_past_the_budget_are_counted_and_the_run_still_ends(tmp_path):
    # 1000 calls on a communicator with a long name: far more record bytes than the end-of-run header holds
    body = textwrap.dedent("""
        import numpy as np

        def main(gpu):
            comm = gpu.world.split("c" * 200)
            for _ in range(1000):
                comm.allreduce(np.empty(0, np.float32))
    """)
    done = launch(tmp_path, body, "--report-json", str(tmp_path / "run.json"))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "run.json").read_text())
    for gpu in range(N):
        calls = [c for c in doc["collectives"] if c["gpu"] == gpu]
        assert 100 < len(calls) < 1000
        assert len(calls) + doc["collectives_unrecorded"][str(gpu)] == 1000
        assert [c["seq"] for c in calls] == sorted(c["seq"] for c in calls)  # the first calls, in order


def test_records_are_cut_to_fit_beside_many_leftover_messages(tmp_path):
    # GPU 1 never receives 200 messages with long keys: they travel in the same end-of-run header
    body = textwrap.dedent("""
        import numpy as np

        def main(gpu):
            if gpu.rank == 0:
                for i in range(200):
                    gpu.send_message(1, ("p" * 150, i), np.zeros(1, np.uint8))
            for _ in range(1000):
                gpu.world.allreduce(np.empty(0, np.float32))
    """)
    done = launch(tmp_path, body, "--report-json", str(tmp_path / "run.json"))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "run.json").read_text())
    assert len(doc["unconsumed"]["1"]) == 200
    kept = {g: len([c for c in doc["collectives"] if c["gpu"] == g]) for g in range(N)}
    assert 0 < kept[1] < kept[0] == kept[2] < 1000
    assert all(kept[g] + doc["collectives_unrecorded"][str(g)] == 1000 for g in range(N))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("where", ["missing/run.json", "."])
def test_a_report_json_that_cannot_be_written_is_one_error_before_the_run(tmp_path, where, how):
    target = tmp_path / where
    done = launch(tmp_path, "def main(gpu):\n    print('ran', flush=True)\n", "--report-json", str(target), how=how)
    assert done.returncode == 2
    assert done.stderr.count("nvlink-emu: error: --report-json") == 1 and "ran" not in done.stdout


def test_a_gpus_bad_end_of_run_report_is_its_line_and_the_others_figures_still_print(tmp_path):
    # GPU 0 ends with an empty leftover key, GPU 1 with a leftover-message list whose "more" count is
    # text, GPU 2 with a call record of dtype "evil": each crashed the summary and --report-json for
    # everyone (traceback, no table)
    body = textwrap.dedent("""
        import dataclasses
        import numpy as np

        def main(gpu):
            raw = gpu.raw_port()
            gpu.world.allreduce(np.ones(4, np.float32))
            packet = raw.counters_packet
            if gpu.rank == 0:  # an empty key: the summary indexed it
                raw.counters_packet = lambda links, leftovers: packet(links, [[]])
            elif gpu.rank == 1:
                raw.counters_packet = lambda links, leftovers: packet(links, [["...", "x"]])
            elif gpu.rank == 2:
                raw.calls = [dataclasses.replace(raw.calls[0], dtype="evil")]
    """)
    done = launch(tmp_path, body, "--report-json", str(tmp_path / "run.json"))
    assert done.returncode == 3, done.stderr  # every rank finished; a GPU's report was refused
    assert "Traceback" not in done.stderr and "# per-link counters" in done.stderr
    refused = [line for line in done.stderr.splitlines() if "end-of-run report refused" in line]
    assert len(refused) == 3
    assert refused[0].startswith("error: GPU 0's") and "unconsumed entry 0: a message key ends with its sender" \
        in refused[0]
    assert refused[1].startswith("error: GPU 1's") and "unconsumed entry 0: ['...', n] comes last" in refused[1]
    assert refused[2].startswith("error: GPU 2's") and "collectives record 0 dtype: 'evil' is no dtype name" in refused[2]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert sorted(doc["refused_reports"]) == ["0", "1", "2"] and doc["unconsumed"] == {}
    assert [(c["gpu"], c["collective"], c["size_bytes"]) for c in doc["collectives"]] == \
        [(0, "allreduce", 16), (1, "allreduce", 16)]  # GPU 2's record left out, the others' kept
    assert all(doc["links"][f"gpu{g}->sw0"]["payload_bytes"] > 0 for g in range(N))
