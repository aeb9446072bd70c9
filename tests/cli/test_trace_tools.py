"""CLI tier: a traced multi-rank run, merged into Chrome trace JSON and reported; cut-short files."""

import json
import os
import shutil
import textwrap
from collections import defaultdict

import msgpack
import pytest

from cli_helpers import command, run, script
from nvlink_emu.fabric.trace import read_directory, read_trace
from nvlink_emu.launch.traces import bytes_by_algorithm, link_totals

WORKLOAD = textwrap.dedent("""
    import numpy as np

    def main(gpu):
        window = gpu.alloc(1 << 14, "uint8")
        handles = gpu.world.allgather_object(gpu.export(window, to=[0, 1]))
        if gpu.rank == 2:                       # refused: not in the allowed set
            gpu.put(handles[0], np.ones(64, np.uint8))
            try:
                gpu.fence()
            except Exception:
                pass
        gpu.put(handles[(gpu.rank + 1) % 2], np.ones(1 << 14, np.uint8)) if gpu.rank < 2 else None
        gpu.world.barrier()
        for algorithm in ("ring", "direct", "sharp", "nvls"):
            gpu.world.allreduce(np.ones(3 * 40000, np.float32), "sum", algorithm)
        gpu.world.all2all(np.ones(3 * 1000, np.float32), np.empty(3 * 1000, np.float32))
""")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One traced run of 3 GPUs: (trace dir, the link table the run printed, as rows of numbers)."""
    tmp = tmp_path_factory.mktemp("traced")
    done, _ = run([command("nvlink-emu"), "run", script(tmp, WORKLOAD), "--gpus", "3",
                   "--trace-dir", str(tmp / "trace")])
    assert done.returncode == 0, done.stderr
    return tmp / "trace", table_rows(done.stderr)  # the run prints its table on stderr


def table_rows(text):
    """{link row: [tx payload, tx raw, tx pkts, rx payload, rx raw, rx pkts]} of a printed link table."""
    return {line.split()[0]: [int(v) for v in line.split()[1:7]] for line in text.splitlines()
            if "<->sw0" in line or line.startswith("total")}


@pytest.mark.parametrize("time_base", ["modeled", "wall"])
def test_merged_trace_is_chrome_json_with_paired_flows_and_no_overlaps(traced, tmp_path, time_base):
    trace_dir, printed = traced
    out = tmp_path / "trace.json"
    done, _ = run([command("nvlink-emu"), "trace", str(trace_dir), "-o", str(out), "--time", time_base])
    assert done.returncode == 0, done.stderr
    events = json.load(open(out))["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"GPU 0", "GPU 1", "GPU 2", "switch (rank 3)"}
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"gpu0->sw0 send", "gpu0->sw0 receive", "sw0->gpu2 send", "sw0->gpu2 receive", "collectives"} <= tracks
    starts, ends = {}, {}
    for e in events:
        if e["ph"] == "s":
            starts[e["id"]] = e
        elif e["ph"] == "f":
            ends[e["id"]] = e
    assert starts and set(starts) == set(ends)  # every flow has both ends
    assert all(ends[i]["ts"] >= starts[i]["ts"] for i in starts)  # no receive before its send
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    collectives = [e["name"] for e in events if e["ph"] == "X" and e["pid"] == 0 and "(" in e["name"]]
    assert collectives == ["allreduce (ring)", "allreduce (direct)", "allreduce (sharp)", "allreduce (nvls)",
                           "all2all (direct)"] or time_base == "wall"
    assert any(e["ph"] == "i" and e["name"] == "reduce" for e in events)
    counters = defaultdict(list)
    for e in events:
        if e["ph"] == "C":
            counters[(e["pid"], e["name"])].append((e["ts"], e["args"]["payload bytes"]))
    for points in counters.values():
        values = [v for _, v in sorted(points, key=lambda point: point[0])]
        assert values == sorted(values)  # bytes sent so far never go down
    for g in range(3):  # and end at what the run printed for the GPU's uplink
        assert counters[(g, f"bytes gpu{g}->sw0")][-1][1] == printed[f"gpu{g}<->sw0"][0]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] in ("X", "i")} <= named  # every track has a name
    if time_base == "modeled":  # instants are on the same (modeled) time axis as the spans
        last = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
        assert all(0 <= e["ts"] <= last for e in events if e["ph"] == "i")
        assert {"tlb", "refused", "mcast"} <= {e["name"] for e in events if e["ph"] == "i"}


def test_report_totals_equal_the_counters_the_run_printed(traced, tmp_path):
    trace_dir, printed = traced
    done, _ = run([command("nvlink-emu"), "report", str(trace_dir), "-o", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    assert table_rows(done.stdout) == printed  # byte for byte, every link and the totals
    assert "allreduce" in done.stdout and "sharp" in done.stdout and "truncated" not in done.stdout
    for name in ("traffic-matrix.png", "bytes-per-algorithm.png"):
        assert f"wrote {tmp_path / name}" in done.stdout
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_byte_of_a_collective_is_attributed_to_its_algorithm(tmp_path):
    # small messages, so that a fast member's data reaches a slow one while it is still in the call check
    config = tmp_path / "small.toml"
    config.write_text('base = "dgx-h100"\nchunk_bytes = 1024\nswitch_buffer_bytes = 8192\n')
    body = textwrap.dedent("""
        import numpy as np

        def main(gpu):
            a = np.ones(3 * (1 << 14), np.float32)
            for algorithm in ("ring", "direct", "sharp", "nvls"):
                gpu.world.broadcast(a, 0, algorithm)
                gpu.world.allreduce(a, "sum", algorithm)
            gpu.world.all2all(a, np.empty_like(a))
    """)
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--config", str(config),
                   "--trace-dir", str(tmp_path / "trace")])
    assert done.returncode == 0, done.stderr
    traces, warnings = read_directory(tmp_path / "trace")
    assert not warnings
    by_algorithm = bytes_by_algorithm(traces)
    assert set(by_algorithm) == {f"{c}/{a}" for c in ("broadcast", "allreduce") for a in ("ring", "direct", "sharp",
                                                                                        "nvls")} | {"all2all/direct"}
    for link, row in link_totals(traces).items():
        assert sum(links.get(link, 0) for links in by_algorithm.values()) == row["payload_bytes"], link


def test_a_cut_short_trace_is_reported_not_accepted_silently(traced, tmp_path):
    trace_dir, _ = traced
    copy = tmp_path / "cut"
    shutil.copytree(trace_dir, copy)
    victim = copy / "rank-00001.msgpack"
    victim.write_bytes(victim.read_bytes()[:-5])
    for tool in (["trace", str(copy), "-o", str(tmp_path / "t.json")], ["report", str(copy), "-o", str(tmp_path)]):
        done, _ = run([command("nvlink-emu"), *tool])
        assert done.returncode == 0, done.stderr
        assert (done.stdout + done.stderr).count("rank-00001.msgpack: truncated: cut short") == 1


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_failed_rank_leaves_an_error_record_and_no_end(tmp_path):
    body = "def main(gpu):\n    if gpu.rank == 1:\n        raise RuntimeError('boom')\n    gpu.world.barrier()\n"
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--timeout", "30",
                   "--trace-dir", str(tmp_path / "trace")])
    assert done.returncode != 0
    from nvlink_emu.fabric.trace import read_trace
    trace = read_trace(tmp_path / "trace" / "rank-00001.msgpack")
    assert trace.truncated and trace.end is None
    assert trace.events[-1]["ev"] == "error" and trace.events[-1]["message"] == "boom"
    # the tools still read what is there, and say what is missing
    for tool in (["trace", str(tmp_path / "trace"), "-o", str(tmp_path / "t.json")],
                 ["report", str(tmp_path / "trace"), "-o", str(tmp_path)]):
        done, _ = run([command("nvlink-emu"), *tool])
        assert done.returncode == 0, done.stderr
        assert "rank-00001.msgpack: truncated" in done.stdout + done.stderr
    # and the report shows the error the failed rank recorded
    assert "GPU 1 (rank 1) failed at modeled" in done.stdout and "RuntimeError: boom" in done.stdout


NODES_WORKLOAD = textwrap.dedent("""
    import numpy as np

    def main(gpu):
        x = np.arange(3 * 4096, dtype=np.float32)
        gpu.world.allreduce(x, algorithm="ring")
        gpu.world.all2all(np.ones(4 * 1000, np.float32), np.empty(4 * 1000, np.float32))
""")


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_traced_run_of_two_nodes_shows_the_leaves_spines_and_their_links(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, NODES_WORKLOAD), "--preset", "superpod-h100-ib",
                   "--nodes", "2", "--gpus-per-node", "2", "--trace-dir", str(tmp_path / "trace")])
    assert done.returncode == 0, done.stderr
    assert "2 nodes x 2 GPUs, 2 leaf switches + 2 spines" in done.stderr
    printed = {line.split()[0]: [int(v) for v in line.split()[1:7]] for line in done.stderr.splitlines()
               if line.startswith(("gpu", "sw"))}
    assert set(printed) == {"gpu0<->sw0", "gpu1<->sw0", "gpu2<->sw1", "gpu3<->sw1",
                            "sw0<->sw2", "sw0<->sw3", "sw1<->sw2", "sw1<->sw3"}
    # the trace's own sums (a GPU's links at the GPU end, a leaf-spine link at its sender) are the run's
    totals = link_totals(read_directory(tmp_path / "trace")[0])
    for row, counts in printed.items():
        a, b = row.split("<->")
        assert [totals[f"{a}->{b}"][f] for f in ("payload_bytes", "raw_bytes", "packets")] == counts[:3]
        assert [totals[f"{b}->{a}"][f] for f in ("payload_bytes", "raw_bytes", "packets")] == counts[3:]
    out = tmp_path / "trace.json"
    done, _ = run([command("nvlink-emu"), "trace", str(tmp_path / "trace"), "-o", str(out)])
    assert done.returncode == 0, done.stderr
    events = json.load(open(out))["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"GPU 0", "GPU 1", "GPU 2", "GPU 3", "leaf 0 (rank 4)", "leaf 1 (rank 5)", "spine 0 (rank 6)",
                     "spine 1 (rank 7)"}
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"sw0->sw2 send", "sw0->sw2 receive", "sw2->sw1 send", "sw2->sw1 receive"} <= tracks
    done, _ = run([command("nvlink-emu"), "report", str(tmp_path / "trace"), "-o", str(tmp_path / "report")])
    assert done.returncode == 0, done.stderr
    assert "# leaf-spine links" in done.stdout and "sw1<->sw3" in done.stdout


def test_a_hostile_trace_directory_is_warnings_and_files_beside_not_a_hang_a_crash_or_a_write_elsewhere(
        traced, tmp_path):
    # a directory someone else could write into: the run's own files, plus files named like traces that
    # are a FIFO, a link to /dev/zero, headers no run writes (one sorts first), a record no rank writes;
    # and links planted where the figures and the merged JSON go
    trace_dir, printed = traced
    hostile, out = tmp_path / "hostile", tmp_path / "out"
    shutil.copytree(trace_dir, hostile)
    out.mkdir()
    os.mkfifo(hostile / "rank-00004.msgpack")
    (hostile / "rank-00005.msgpack").symlink_to("/dev/zero")
    header = read_trace(trace_dir / "rank-00000.msgpack").header
    for name, bad in (("rank-0-first.msgpack", {"gpus": 300000}), ("rank-00006.msgpack", {"gpus": 0}),
                      ("rank-00007.msgpack", {"role": None})):
        (hostile / name).write_bytes(msgpack.packb({k: v for k, v in {**header, **bad}.items() if v is not None}))
    (hostile / "rank-99999.msgpack").write_bytes(b"\x81\x91\x01\x02")  # a map keyed by a list: TypeError
    (hostile / "rank-0000.msgpack").write_bytes(msgpack.packb({**header, "config_hash": "0" * 16}))  # sorts first
    genuine = read_trace(trace_dir / "rank-00002.msgpack")
    at = next(i for i, event in enumerate(genuine.events) if event["ev"] == "tx")
    forged = [genuine.header, *genuine.events[:at], {**genuine.events[at], "link": "gpu9->sw0"},
              *genuine.events[at:], genuine.end]
    (hostile / "rank-00002.msgpack").write_bytes(b"".join(msgpack.packb(r) for r in forged))
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    for name in ("traffic-matrix.png", "bytes-per-algorithm.png", "trace.json"):
        (out / name).symlink_to(victim)
    warned, stdout = [], []
    for tool in (["report", str(hostile), "-o", str(out)], ["trace", str(hostile), "-o", str(out / "trace.json")]):
        done, _ = run([command("nvlink-emu"), *tool], timeout_s=60)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        warned.append(sorted(line for line in done.stderr.splitlines() if line.startswith("warning: ")))
        stdout.append(done.stdout)
    assert warned[0] == warned[1] == [
        "warning: rank-0-first.msgpack: left out: header gpus: an integer from 1 to 3840, got 300000",
        "warning: rank-0000.msgpack: left out: header rank: the file's name is not a trace file's "
        "(rank-NNNNN.msgpack, the rank in 5 digits or more)",
        f"warning: rank-00002.msgpack: read up to event {at}: tx link: a link of this fabric (3 GPUs, 1 switches: "
        "gpuG->swS, swS->gpuG, swS->swT), got 'gpu9->sw0'",
        "warning: rank-00004.msgpack: left out: a FIFO, not a trace file: not read",
        "warning: rank-00005.msgpack: left out: a symbolic link to a character device, not a trace file: not read",
        "warning: rank-00006.msgpack: left out: header gpus: an integer from 1 to 3840, got 0",
        "warning: rank-00007.msgpack: left out: header role: gpu for rank 0 of 3 GPUs, got None",
        "warning: rank-99999.msgpack: left out: undecodable data after record 0: unhashable type: 'list'",
    ]
    assert victim.read_text() == "not yours\n"
    for name in ("traffic-matrix.png", "bytes-per-algorithm.png", "trace.json"):  # files of their own now
        assert (out / name).is_file() and not (out / name).is_symlink() and (out / name).stat().st_size > 1000
    assert sorted(p.name for p in out.iterdir()) == ["bytes-per-algorithm.png", "trace.json", "traffic-matrix.png"]  # no temporary file left
    rows = table_rows(stdout[0])  # the other GPUs' rows are the counts the run printed
    assert rows["gpu0<->sw0"] == printed["gpu0<->sw0"] and rows["gpu1<->sw0"] == printed["gpu1<->sw0"]
    # a directory of nothing a run wrote: one line, no traceback
    for name in ("rank-00000.msgpack", "rank-00001.msgpack", "rank-00002.msgpack", "rank-00003.msgpack"):
        (hostile / name).unlink()
    done, _ = run([command("nvlink-emu"), "report", str(hostile), "-o", str(out)], timeout_s=60)
    assert done.returncode == 2 and done.stderr == (
        f"nvlink-emu: error: {hostile}: no trace file a run wrote (rank-00004.msgpack: left out: a FIFO, not a "
        f"trace file: not read; rank-00005.msgpack: left out: a symbolic link to a character device, not a trace "
        f"file: not read; rank-99999.msgpack: left out: undecodable data after record 0: unhashable type: 'list'; "
        f"rank-0-first.msgpack: left out: header gpus: an integer from 1 to 3840, got 300000; "
        f"rank-0000.msgpack: left out: header rank: the file's name is not a trace file's (rank-NNNNN.msgpack, "
        f"the rank in 5 digits or more); rank-00006.msgpack: left out: header gpus: an integer from 1 to 3840, "
        f"got 0; rank-00007.msgpack: left "
        f"out: header role: gpu for rank 0 of 3 GPUs, got None)\n")
