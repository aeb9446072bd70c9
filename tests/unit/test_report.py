"""launch.report: the JSON run report, traced-run reports (failed ranks, runs in subdirectories,
warnings on stderr) and figures that read (units, values in cells, labelled axes)."""

import io
import json
import re

import pytest

from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.trace import TraceWriter, find_runs, read_trace
from nvlink_emu.ranks.gpu import leftover_entry
from nvlink_emu.launch.report import (REPORT_SCHEMA_VERSION, algorithm_figure, byte_unit, check_report_path, checked,
                                      matrix_figure, print_report, report_json, run_summary, write_report_json)
from nvlink_emu.launch.traces import merge, read_run

MIB = 1 << 20
TIMING = {"bandwidth_gbytes_per_s": 450.0, "link_latency_ns": 150.0}


def run_report(mode="network") -> dict:
    """A RunResult.report as the switch builds it: int keys, one collective call per GPU."""
    tlb = {"tlb_hits": 5, "tlb_misses": 1, "tlb_faults": 0} if mode == "network" else {}
    call = {"comm": "world", "seq": 0, "collective": "allreduce", "algorithm": "ring", "count": 1000,
            "dtype": "bfloat16", "op": "sum", "root": None, "members": 2, "m_start_ns": 100.0, "m_end_ns": 350.5,
            "tx_bytes": 2000, "rx_bytes": 2000}
    return {"fabric": "dgx-h100", "mode": mode, "gpus": 2, "elapsed_ns": 500.0,
            "links": {"gpu0->sw0": {"payload_bytes": 2000, "raw_bytes": 2128, "packets": 8, "busy_ns": 125.0},
                      "sw0->gpu0": {"payload_bytes": 2000, "raw_bytes": 2128, "packets": 8, "busy_ns": 250.0}},
            "ports": {0: {**tlb, "violations": 1, "refused": 2, "malformed": 1}, 1: {**tlb, "violations": 0,
                                                                                     "refused": 0, "malformed": 0}},
            "network_addresses": [256, 257], "switch": {"peak_held_bytes": 64},
            "unconsumed": {1: [["k", 0, 1]]}, "conservation": {},
            "collectives": {0: [call], 1: [{**call, "tx_bytes": 1000}]}, "collectives_unrecorded": {0: 0, 1: 3}}


def test_report_json_has_the_schema_string_keys_and_derived_figures():
    doc = report_json(run_report())
    assert (doc["schema"], doc["version"]) == ("nvlink-emu-run-report", REPORT_SCHEMA_VERSION)
    assert doc["links"]["gpu0->sw0"] == {"payload_bytes": 2000, "raw_bytes": 2128, "packets": 8, "busy_ns": 125.0,
                                         "utilization": 0.25}
    assert doc["ports"]["0"] == {"tlb_hits": 5, "tlb_misses": 1, "tlb_faults": 0, "violations": 1, "refused": 2,
                                 "malformed": 1}
    first = doc["collectives"][0]
    assert first["gpu"] == 0 and first["size_bytes"] == 2000  # 1000 bfloat16 elements
    assert first["modeled_ns"] == 250.5
    assert [c["gpu"] for c in doc["collectives"]] == [0, 1] and doc["collectives"][1]["tx_bytes"] == 1000
    assert doc["collectives_unrecorded"] == {"0": 0, "1": 3} and doc["unconsumed"] == {"1": [["k", 0, 1]]}
    assert json.loads(json.dumps(doc)) == doc  # plain JSON: nothing is lost in the file


@pytest.mark.parametrize("field, value, why", [
    ("collectives", [{"dtype": "float32"}], "collectives record 0: a call record with the keys comm, seq"),
    ("collectives", "calls", "collectives: a list of call records, got str"),
    ("call", {"members": 3}, "collectives record 0 members: 1 to 2 (the fabric's GPUs), got 3"),
    ("call", {"root": 2}, "collectives record 0 root: null or a member, 0 to 1, got 2"),
    ("call", {"count": -1}, "collectives record 0 count: a count (an integer >= 0), got -1"),
    ("call", {"seq": 1.5}, "collectives record 0 seq: a count (an integer >= 0), got 1.5"),
    ("call", {"m_end_ns": 50.0}, "collectives record 0: m_end_ns 50.0 before m_start_ns 100.0"),
    ("call", {"m_start_ns": float("nan")}, "collectives record 0 m_start_ns: a modeled time"),
    ("call", {"dtype": "V99999999999999:x"}, "collectives record 0 dtype: 'V99999999999999:x' is no dtype name"),
    ("call", {"algorithm": "a" * 5000}, "collectives record 0 algorithm: a name (a string of 1 to 4096"),
    ("call", {"dtype": "object"}, "collectives record 0 dtype: 'object' is no dtype name"),
    ("call", {"comm": ""}, "collectives record 0 comm: a name"),
    ("collectives_unrecorded", -3, "collectives_unrecorded: a count (an integer >= 0), got -3"),
    ("unconsumed", [["...", 2], ["k", 1]], "unconsumed entry 0: ['...', n] comes last"),
    ("unconsumed", [["...", 0]], "unconsumed entry 0: ['...', n] comes last"),
    ("unconsumed", [["k", [1]]], "unconsumed entry 0: a message key (a flat list of integers and strings)"),
    ("unconsumed", {"k": 1}, "unconsumed: a list of message keys, got dict"),
    ("unconsumed", [[]], "unconsumed entry 0: a message key ends with its sender (a GPU index), got []"),
    ("unconsumed", [["k", 0, "x"]], "unconsumed entry 0: a message key ends with its sender"),
    ("busy", -1.0, "links sw0->gpu1 busy_ns: a finite number of ns >= 0, got -1.0"),
])
def test_a_gpus_report_field_that_does_not_check_out_is_left_out_and_named(field, value, why):
    report = run_report()
    if field == "call":
        report["collectives"][1] = [{**report["collectives"][1][0], **value}]
        field = "collectives"
    elif field == "busy":
        report["links"]["sw0->gpu1"] = {**report["links"]["sw0->gpu0"], "busy_ns": value}
    else:
        report[field][1] = value
    clean, refused = checked(report)
    assert list(refused) == [1] and len(refused[1]) == 1 and refused[1][0].startswith(why), refused
    honest = checked(run_report())[0]
    if field == "busy":
        assert clean["links"]["sw0->gpu1"]["busy_ns"] == 0.0
    else:  # GPU 1's field left out, GPU 0's (and GPU 1's other fields) kept as they were
        assert 1 not in clean[field] and clean[field].get(0) == honest[field].get(0)
    assert {k: v for k, v in clean.items() if k not in (field, "links", "refused_reports")} == \
        {k: v for k, v in honest.items() if k not in (field, "links", "refused_reports")}
    summary = run_summary(report)  # never raises: the table, then GPU 1's line
    assert "gpu0<->sw0" in summary and summary.splitlines()[-1].startswith("error: GPU 1's end-of-run report refused")
    doc = report_json(report)
    assert doc["refused_reports"] == {"1": refused[1]} and json.loads(json.dumps(doc)) == doc


def test_a_key_of_its_own_starting_with_dots_is_never_taken_for_the_n_more_entry():
    """An honest GPU holding a message keyed ("...",) from GPU 5 lists it as ["'...'", 5], not as
    ["...", 5] ("5 more"): its report checks out and counts 2 messages, not 6."""
    keys = [leftover_entry(("...",), 5), leftover_entry(("k", 0), 1)]
    assert keys == [["'...'", 5], ["k", 0, 1]]
    assert leftover_entry(("...", *range(15)), 2) == ["'...'", *range(13), "...", 2]  # 16 parts: cut as before
    report = run_report()
    report["unconsumed"][1] = sorted(keys, key=repr)
    assert checked(report)[1] == {}
    assert "warning: GPU 1 ended with 2 message(s) never received" in run_summary(report)
    report["unconsumed"][1] = [["k", 0, 1], ["...", 4]]  # the GPU's own mark: 1 listed + 4 more
    assert "warning: GPU 1 ended with 5 message(s) never received" in run_summary(report)


def test_an_honest_report_is_refused_nothing():
    assert checked(run_report())[1] == {} and report_json(run_report())["refused_reports"] == {}


def test_classic_mode_has_no_link_tlb_so_its_counts_are_null():
    ports = report_json(run_report("classic"))["ports"]
    assert ports["1"] == {"tlb_hits": None, "tlb_misses": None, "tlb_faults": None, "violations": 0, "refused": 0,
                          "malformed": 0}


def test_the_json_file_is_written_whole_and_its_path_checked_before_the_run(tmp_path):
    target = tmp_path / "run.json"
    check_report_path(str(target))
    write_report_json(run_report(), str(target))
    assert json.loads(target.read_text()) == report_json(run_report())
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no partial file left beside it
    with pytest.raises(ConfigError, match="is a directory"):
        check_report_path(str(tmp_path))
    with pytest.raises(ConfigError, match="is not a directory"):
        check_report_path(str(tmp_path / "missing" / "run.json"))
    with pytest.raises(ConfigError, match="is not a directory"):
        check_report_path(str(target / "run.json"))  # under a file


def write_run(directory, gpus=2, failed=None, end=True):
    """Trace files of a small run: GPU g sends 3 MiB to GPU g+1 (mod gpus) inside one allreduce; GPU
    `failed` records an error and no end."""
    header = {"fabric": "dgx-h100", "mode": "network", "link": "nvlink4", "gpus": gpus, "config_hash": "abc",
              "clock_offset_s": 0.0, "network_address": None, "timing": TIMING, "mtu_bytes": 256, "header_bytes": 16}
    size = 3 * MIB
    raw = size + (size // 256) * 16
    switch = TraceWriter(directory, gpus, {**header, "role": "switch", "gpu": None})
    for g in range(gpus):
        gpu = TraceWriter(directory, g, {**header, "role": "gpu", "gpu": g})
        call = {"name": "allreduce", "comm": "world", "seq": 0, "algorithm": "ring", "count": size // 4,
                "dtype": "float32", "op": "sum", "members": gpus}
        gpu.write({"ev": "coll_begin", **call, "m": 0.0, "wall": 0.0})
        gpu.write({"ev": "tx", "link": f"gpu{g}->sw0", "seq": 0, "kind": "MSG", "payload": size, "raw": raw,
                   "m_start": 0.0, "m_end": 10.0, "wall": 0.0})
        gpu.write({"ev": "rx", "link": f"sw0->gpu{g}", "seq": 0, "kind": "MSG", "payload": size, "raw": raw,
                   "wall": 0.0})
        switch.write({"ev": "tx", "link": f"sw0->gpu{(g + 1) % gpus}", "seq": 0, "kind": "MSG", "origin": g,
                      "payload": size, "raw": raw, "m_start": 1.0, "m_end": 11.0, "wall": 0.0})
        if g == failed:
            gpu.write({"ev": "error", "error": "RuntimeError", "message": "boom", "m": 12.0, "wall": 0.0})
            gpu.close()
            continue
        gpu.write({"ev": "coll_end", **call, "m": 20.0, "wall": 0.0})
        links = {f"gpu{g}->sw0": {"payload_bytes": size, "raw_bytes": raw, "packets": size // 256},
                 f"sw0->gpu{g}": {"payload_bytes": size, "raw_bytes": raw, "packets": size // 256}}
        gpu.close({"m": 20.0, "counters": links} if end else None)
    switch.close({"m": 20.0, "counters": {}} if end and failed is None else None)


def test_a_failed_rank_s_error_is_in_the_report_and_warnings_go_to_stderr(tmp_path):
    write_run(tmp_path / "run", failed=1)
    out, err = io.StringIO(), io.StringIO()
    assert print_report(tmp_path / "run", tmp_path / "figures", out, err) == 0
    text = out.getvalue()
    assert "GPU 1 (rank 1) failed at modeled 0.012 us: RuntimeError: boom" in text
    assert "modeled elapsed 0.020 us" in text  # the latest modeled time recorded, though not every rank ended
    assert "warning" not in text
    assert "warning: rank-00001.msgpack: truncated: no end record" in err.getvalue()
    assert "warning: rank-00002.msgpack: truncated" in err.getvalue()


def test_a_directory_of_runs_is_reported_run_by_run(tmp_path):
    write_run(tmp_path / "demo" / "part1-dgx-h100")
    write_run(tmp_path / "demo" / "part2-dgx-a100", gpus=3)
    (tmp_path / "demo" / "notes").mkdir()  # a subdirectory without traces is not a run
    assert find_runs(tmp_path / "demo") == [tmp_path / "demo" / "part1-dgx-h100", tmp_path / "demo" / "part2-dgx-a100"]
    out, err = io.StringIO(), io.StringIO()
    print_report(tmp_path / "demo", None, out, err)
    text = out.getvalue()
    assert text.index("=== part1-dgx-h100") < text.index("2 GPUs") < text.index("=== part2-dgx-a100") \
        < text.index("3 GPUs")
    for part in ("part1-dgx-h100", "part2-dgx-a100"):
        for name in ("traffic-matrix.png", "bytes-per-algorithm.png"):
            assert f"wrote {tmp_path / 'demo' / part / name}" in text
    assert err.getvalue() == ""
    with pytest.raises(FileNotFoundError, match="in it or in its subdirectories"):
        find_runs(tmp_path / "demo" / "notes")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        find_runs(tmp_path / "nowhere")


@pytest.mark.parametrize("largest, unit", [(0, "B"), (1023, "B"), (1024, "KiB"), (3 * MIB, "MiB"),
                                           (5 << 30, "GiB")])
def test_byte_units_read_below_1024(largest, unit):
    scale, name = byte_unit(largest)
    assert name == unit and (largest / scale < 1024)


def drawn_axes(fig):
    fig.canvas.draw()  # offsets and tick labels are decided at draw time
    return fig.axes


def test_the_traffic_matrix_writes_its_values_in_mib_and_labels_every_axis():
    rows = ["GPU 0", "GPU 1", "switch"]
    matrix = [[0, 3 * MIB, 0], [MIB // 2, 0, 9 * MIB], [4 * MIB, 4 * MIB, 4 * MIB]]
    fig = matrix_figure(rows, matrix, "dgx-h100, 3 GPUs")
    heat, bar = drawn_axes(fig)
    cells = [t.get_text() for t in heat.texts]
    assert cells == ["0", "3.00", "0", "0.50", "0", "9.00", "4.00", "4.00", "4.00"]
    assert heat.get_xlabel().startswith("delivered to") and heat.get_ylabel() == "data from"
    assert "(MiB)" in heat.get_title() and bar.get_ylabel() == "payload (MiB)"
    for ax in (heat, bar):
        assert ax.yaxis.get_offset_text().get_text() == ""
    assert all("e" not in t.get_text() for t in bar.get_yticklabels())


def test_the_algorithm_figure_is_in_mib_with_labelled_axes_and_no_offset():
    by_algorithm = {"allreduce/ring": {"gpu0->sw0": 7 * MIB, "sw0->gpu0": 7 * MIB, "gpu1->sw0": 7 * MIB},
                    "all2all/direct": {"gpu0->sw0": MIB // 8}}
    fig = algorithm_figure(by_algorithm, 2, "dgx-h100, 2 GPUs")
    axes = drawn_axes(fig)
    assert len(axes) == 2
    for ax in axes:
        assert ax.get_xlabel() == "GPU" and ax.get_ylabel() == "payload per link (MiB)"
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert all("e" not in t.get_text() for t in ax.get_yticklabels())
    heights = {round(p.get_height(), 3) for p in axes[0].patches}
    assert heights == {7.0, 0.125, 0.0}
    assert [t.get_text() for t in axes[1].get_legend().get_texts()] == ["all2all/direct", "allreduce/ring"]


def planted(directory, name, records):
    """A file named like a rank's trace holding `records` (msgpack maps), as anyone could write one."""
    import msgpack

    (directory / name).write_bytes(b"".join(msgpack.packb(r) for r in records))


@pytest.mark.parametrize("bad, why", [
    ({"gpus": 0}, "gpus: an integer from 1 to 3840, got 0"),
    ({"gpus": "2"}, "gpus: an integer from 1 to 3840, got '2'"),
    ({"role": None}, "role: gpu for rank 0 of 2 GPUs, got None"),
    ({"role": "switch"}, "role: gpu for rank 0 of 2 GPUs, got 'switch'"),
    ({"rank": 3}, "rank: an integer from 0 to 2, got 3"),
    ({"nodes": 3}, "nodes: an integer from 1 to 2, got 3"),
    ({"spines": 5000}, "spines: an integer from 0 to 0, got 5000"),  # one node has no spines
    ({"mtu_bytes": 0}, "mtu_bytes: an integer from 1 to 1099511627776, got 0"),
    ({"timing": {"bandwidth_gbytes_per_s": 0.0, "link_latency_ns": 1.0}},
     "timing bandwidth_gbytes_per_s: a finite number > 0, got 0.0"),
    ({"schema": 2}, "schema: 1, got 2"),
])
def test_a_header_no_run_writes_is_left_out_even_sorted_first(tmp_path, bad, why):
    write_run(tmp_path / "run")
    first = {**read_trace(tmp_path / "run" / "rank-00000.msgpack").header, **bad}
    planted(tmp_path / "run", "rank-0-planted.msgpack", [{k: v for k, v in first.items() if v is not None}])
    traces, warnings = read_run(tmp_path / "run")  # what report and trace read
    assert warnings == [f"rank-0-planted.msgpack: left out: header {why}"]
    assert [t.header["rank"] for t in traces] == [0, 1, 2]  # the run's own files, though sorted after it
    for name in ("rank-00000.msgpack", "rank-00001.msgpack", "rank-00002.msgpack"):
        (tmp_path / "run" / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"no trace file a run wrote \\(rank-0-planted.msgpack: left out: "
                                                f"header {re.escape(why)}\\)"):
        print_report(tmp_path / "run", tmp_path / "figures", io.StringIO(), io.StringIO())


def test_the_runs_identity_is_its_switchs_and_a_file_counts_only_under_its_own_ranks_name(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    gpu0, switch = read_trace(run / "rank-00000.msgpack"), read_trace(run / "rank-00002.msgpack")
    real = switch.header["config_hash"]
    forged = {**gpu0.header, "config_hash": "0" * 16}
    planted(run, "rank-0000.msgpack", [forged, gpu0.end])      # sorts before every real file
    planted(run, "rank-00005.msgpack", [gpu0.header, gpu0.end])  # GPU 0's header under another name
    traces, warnings = read_run(run)
    assert [t.header["rank"] for t in traces] == [0, 1, 2]
    assert warnings == ["rank-0000.msgpack: left out: header rank: the file's name is not a trace file's "
                        "(rank-NNNNN.msgpack, the rank in 5 digits or more)",
                        "rank-00005.msgpack: left out: header rank: 5 (the file's name), got 0"]
    for name in ("rank-0000.msgpack", "rank-00005.msgpack"):
        (run / name).unlink()
    # GPU 0 rewrites its own file as another run's: the switch's file says which run this is
    planted(run, "rank-00000.msgpack", [forged, *gpu0.events, gpu0.end])
    traces, warnings = read_run(run)
    assert [t.header["rank"] for t in traces] == [1, 2]
    assert warnings == [f"rank-00000.msgpack: left out: from another run (config {'0' * 16}, not {real})"]
    (run / "rank-00002.msgpack").unlink()  # no switch's file: the first GPU's word, and said
    traces, warnings = read_run(run)
    assert [t.header["rank"] for t in traces] == [0] and warnings[0] == (
        "rank-00000.msgpack: no switch's trace here: the run's config and shape are taken from this GPU's file "
        "(its own word)")


@pytest.mark.parametrize("event, why", [
    ({"ev": "tx", "link": "sw0->gpu7"}, "tx link: a link of this fabric"),
    ({"ev": "tx", "payload": -1}, "tx payload: an integer from 0 to"),
    ({"ev": "tx", "m_start": "soon"}, "tx m_start: a finite number, got 'soon'"),
    ({"ev": "coll_end", "dtype": "evil"}, "coll_end dtype: 'evil' is no dtype name"),
    ({"ev": "refused", "message": b"\x00"}, "refused: bytes is not a trace value"),
    ({"ev": "error", "error": 7}, "error error: a string of at most 4096 characters, got int"),
])
def test_a_record_no_rank_writes_cuts_its_file_there_and_the_tools_go_on(tmp_path, event, why):
    write_run(tmp_path / "run")
    trace = read_trace(tmp_path / "run" / "rank-00001.msgpack")
    base = next(e for e in trace.events if e["ev"] == event["ev"]) if event["ev"] in ("tx", "coll_end") else \
        {"error": "RuntimeError", "message": "m", "gpu": 1, "kind": "PUT", "m": 1.0}
    planted(tmp_path / "run", "rank-00001.msgpack", [trace.header, trace.events[0], {"wall": 0.0, **base, **event},
                                                     *trace.events[1:], trace.end])
    traces, warnings = read_run(tmp_path / "run")
    assert len(warnings) == 1 and warnings[0].startswith(f"rank-00001.msgpack: read up to event 1: {why}"), warnings
    assert traces[1].events == trace.events[:1] and traces[1].truncated and traces[1].end is None
    json.dumps(merge(traces))  # and the merged trace is plain JSON
    if event["ev"] == "error":  # the report reads error records (its failed ranks): it goes on without this one
        out = io.StringIO()
        assert print_report(tmp_path / "run", tmp_path / "figures", out, io.StringIO()) == 0
        assert "failed" not in out.getvalue() and "gpu1<->sw0" in out.getvalue()


def test_a_collective_end_without_its_begin_is_no_span_and_no_crash(tmp_path):
    write_run(tmp_path / "run")
    trace = read_trace(tmp_path / "run" / "rank-00001.msgpack")
    planted(tmp_path / "run", "rank-00001.msgpack", [trace.header, *[e for e in trace.events if e["ev"] != "coll_begin"],
                                                     trace.end])
    spans = [e for e in merge(read_run(tmp_path / "run")[0])["traceEvents"] if e["ph"] == "X" and e["pid"] == 1
             and "(" in e["name"]]
    assert spans == []  # GPU 1's collective had no begin on its rank: nothing drawn for it


def test_figures_replace_links_planted_where_they_go_and_never_write_through_them(tmp_path):
    write_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    (tmp_path / "figures").mkdir()
    for name in ("traffic-matrix.png", "bytes-per-algorithm.png"):
        (tmp_path / "figures" / name).symlink_to(victim)
    assert print_report(tmp_path / "run", tmp_path / "figures", io.StringIO(), io.StringIO()) == 0
    assert victim.read_text() == "not yours\n"
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["bytes-per-algorithm.png", "traffic-matrix.png"]
    assert all(p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x89PNG"
               for p in (tmp_path / "figures").iterdir())
    # a run's own subdirectory of OUTDIR planted as a link: refused, nothing written where it points
    write_run(tmp_path / "runs" / "part1")
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "part1").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="part1: is a symbolic link; the figures are not written through it"):
        print_report(tmp_path / "runs", tmp_path / "out", io.StringIO(), io.StringIO())
    assert list((tmp_path / "elsewhere").iterdir()) == []
