"""Reports of a run: the per-link table and its warnings, the JSON run report, and traced-run reports with figures."""

import json
import math
import os
import sys
from pathlib import Path

from nvlink_emu.fabric.counters import FIELDS, format_table
from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.reduction import dtype_itemsize
from nvlink_emu.fabric.trace import find_runs

from .traces import rank_label, read_run, write_replacing

REPORT_SCHEMA_VERSION = 1  # of --report-json's file (docs/guide/report-json.md)
PORT_KEYS = ("tlb_hits", "tlb_misses", "tlb_faults", "violations", "refused", "malformed")


# -- each GPU's own word in the run's report, checked ---------------------------------------------------
CALL_KEYS = ("comm", "seq", "collective", "algorithm", "count", "dtype", "op", "root", "members", "m_start_ns",
             "m_end_ns", "tx_bytes", "rx_bytes")
GPU_FIELDS = ("collectives", "collectives_unrecorded", "unconsumed")  # the report's maps of each GPU's own word
REFUSED_REPORT_STATUS = 3  # the run's exit status when every rank finished but a GPU's report was refused
MAX_NAME = 4096  # characters of a name in a call record, as of a header's text fields (fabric.packets.MAX_TEXT)


class BadField(ValueError):
    """A GPU's report field that does not check out; the message names the field and what is wrong."""


def _count(value, what: str) -> int:
    if type(value) is not int or value < 0:
        raise BadField(f"{what}: a count (an integer >= 0), got {value!r:.60}")
    return value


def _time(value, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise BadField(f"{what}: a modeled time (a finite number of ns >= 0), got {value!r:.60}")
    return float(value)


def _name(value, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_NAME:
        raise BadField(f"{what}: a name (a string of 1 to {MAX_NAME} characters), got {value!r:.60}")
    return value


def check_call(call, gpus: int, what: str) -> None:
    """BadField unless `call` is a collective call record as ranks.comm writes it: its keys, the types
    and ranges of its values, a dtype name dtype_itemsize reads."""
    if type(call) is not dict or set(call) != set(CALL_KEYS):
        keys = sorted(map(str, call))[:8] if type(call) is dict else type(call).__name__
        raise BadField(f"{what}: a call record with the keys {', '.join(CALL_KEYS)}, got {keys}")
    for key in ("comm", "collective", "algorithm", "dtype"):
        _name(call[key], f"{what} {key}")
    if type(call["op"]) is not str or len(call["op"]) > MAX_NAME:
        raise BadField(f"{what} op: a string, got {call['op']!r:.60}")
    for key in ("seq", "count", "tx_bytes", "rx_bytes"):
        _count(call[key], f"{what} {key}")
    members = call["members"]
    if type(members) is not int or not 1 <= members <= gpus:
        raise BadField(f"{what} members: 1 to {gpus} (the fabric's GPUs), got {members!r:.60}")
    root = call["root"]
    if root is not None and (type(root) is not int or not 0 <= root < members):
        raise BadField(f"{what} root: null or a member, 0 to {members - 1}, got {root!r:.60}")
    start, end = _time(call["m_start_ns"], f"{what} m_start_ns"), _time(call["m_end_ns"], f"{what} m_end_ns")
    if end < start:
        raise BadField(f"{what}: m_end_ns {end} before m_start_ns {start}")
    try:
        dtype_itemsize(call["dtype"])
    except FabricError:
        raise BadField(f"{what} dtype: {call['dtype']!r:.60} is no dtype name") from None


def check_unconsumed(keys, what: str) -> None:
    """BadField unless `keys` is a list of message keys (flat lists of integers and strings, each ending
    with its sender's GPU index, so never empty), the last one perhaps ["...", n] (n >= 1 more, not
    listed; a GPU shows a key's own first part "..." as "'...'", so only the mark starts so)."""
    if type(keys) is not list:
        raise BadField(f"{what}: a list of message keys, got {type(keys).__name__}")
    for i, key in enumerate(keys):
        if type(key) is not list or not all(type(x) is int or (type(x) is str and len(x) <= MAX_NAME) for x in key):
            raise BadField(f"{what} entry {i}: a message key (a flat list of integers and strings), got {key!r:.60}")
        if key[:1] == ["..."] and (i != len(keys) - 1 or len(key) != 2 or type(key[1]) is not int or key[1] < 1):
            raise BadField(f"{what} entry {i}: ['...', n] comes last, n >= 1 the keys not listed, got {key!r:.60}")
        if not key or type(key[-1]) is not int:
            raise BadField(f"{what} entry {i}: a message key ends with its sender (a GPU index), got {key!r:.60}")


def check_gpu_field(field: str, value, gpus: int) -> None:
    """BadField unless a GPU's `value` of report field `field` (one of GPU_FIELDS) checks out."""
    if field == "collectives":
        if type(value) not in (list, tuple):
            raise BadField(f"collectives: a list of call records, got {type(value).__name__}")
        for i, call in enumerate(value):
            check_call(call, gpus, f"collectives record {i}")
    elif field == "collectives_unrecorded":
        _count(value, "collectives_unrecorded")
    else:
        check_unconsumed(value, "unconsumed")


def checked(report: dict) -> tuple[dict, dict[int, list[str]]]:
    """(the run's report without what a GPU said that does not check out, {GPU: why each of its fields
    was left out}). The switch's counts are its own; a GPU's collective records, calls past them,
    unconsumed messages and its links' busy times are the GPU's word (Trust model), checked field by
    field here so that one GPU's bad report is that GPU's line in the summary, never the run's crash.
    A report already checked comes back as it is."""
    if "refused_reports" in report:
        return report, report["refused_reports"]
    gpus = report["gpus"]
    refused: dict[int, list[str]] = {}
    clean = dict(report)
    for field in GPU_FIELDS:
        kept = {}
        for gpu, value in report.get(field, {}).items():
            try:
                if type(gpu) is not int or not 0 <= gpu < gpus:
                    raise BadField(f"{field}: GPU {gpu!r:.20} is none of the fabric's 0 to {gpus - 1}")
                check_gpu_field(field, value, gpus)
            except BadField as exc:
                refused.setdefault(gpu, []).append(str(exc))
            else:
                kept[gpu] = value
        clean[field] = kept
    links = {}
    for name, row in report["links"].items():
        busy = row.get("busy_ns", 0.0)
        if type(busy) not in (int, float) or not math.isfinite(busy) or busy < 0:  # the GPU end's measure
            gpu = next((int(end[3:]) for end in name.split("->") if end.startswith("gpu") and end[3:].isdigit()), -1)
            refused.setdefault(gpu, []).append(f"links {name} busy_ns: a finite number of ns >= 0, got {busy!r:.60}")
            row = {**row, "busy_ns": 0.0}
        links[name] = row
    clean["links"] = links
    clean["refused_reports"] = dict(sorted(refused.items(), key=lambda item: (type(item[0]) is not int, str(item[0])
                                                                               if type(item[0]) is not int else item[0])))
    return clean, clean["refused_reports"]


def refused_lines(refused: dict) -> list[str]:
    """One line per GPU whose report was (partly) refused, naming the fields and what was wrong."""
    return [f"error: GPU {gpu}'s end-of-run report refused (its fault, not the run's; its other figures and "
            f"every other GPU's stand): {'; '.join(why)}" for gpu, why in refused.items()]


def run_summary(report: dict) -> str:
    """The end-of-run table: per-link payload/raw bytes and packets, TLB and violation counts per port;
    what a GPU reported that does not check out (checked) is left out, and said."""
    report, refused = checked(report)
    ports = {int(g): row for g, row in report["ports"].items()}
    nodes, gpus = report.get("nodes", 1), report["gpus"]
    shape = (f"{gpus} GPUs + 1 switch" if nodes == 1 else
             f"{nodes} nodes x {gpus // nodes} GPUs, {nodes} leaf switches + {report['spines']} spines")
    lines = [f"# fabric {report['fabric']} ({report['mode']} mode, {shape})",
             format_table(report["links"], gpus, extra=ports, elapsed_ns=report["elapsed_ns"],
                          gpus_per_node=gpus // nodes)]
    lines += fault_lines(report["links"])
    for who, problem in sorted(report.get("conservation", {}).items(), key=lambda item: str(item[0])):
        if isinstance(who, str):  # a link between two switches
            lines.append(f"warning: the two ends of {who} disagree: {problem}")
        else:
            lines.append(f"warning: GPU {who}'s own count disagrees with the switch's: {problem}")
    for gpu, keys in sorted(report.get("unconsumed", {}).items()):
        more = keys[-1][1] - 1 if keys and keys[-1][:1] == ["..."] else 0  # ["...", n]: n more not listed
        lines.append(f"warning: GPU {gpu} ended with {len(keys) + more} message(s) never received: {keys[:4]}")
    return "\n".join(lines + refused_lines(refused))


def fault_lines(links: dict) -> list[str]:
    """The fault plan's links (those with a state): crc_errors, replays and state at the end of the run."""
    faulted = {name: row for name, row in links.items() if "state" in row}
    if not faulted:
        return []
    lines = ["# faulted links (fabric.faults; crc_errors and replays counted at the GPU end of a GPU's link, "
             "state at the end of the run)", f"{'link':<14}{'crc_errors':>12}{'replays':>10}  state"]
    for name, row in sorted(faulted.items()):
        lines.append(f"{name:<14}{int(row.get('crc_errors', 0)):>12}{int(row.get('replays', 0)):>10}  {row['state']}")
    return lines


# -- the JSON run report (--report-json) ---------------------------------------------------------------
def report_json(report: dict) -> dict:
    """The run's report (RunResult.report) as the JSON document of schema REPORT_SCHEMA_VERSION: links by
    name, ports and the per-GPU maps keyed by GPU index as a string, every collective call a record;
    what a GPU reported that does not check out is left out, and why under refused_reports."""
    report, refused = checked(report)
    elapsed = report["elapsed_ns"]
    links = {name: {**{f: int(row.get(f, 0)) for f in FIELDS}, "busy_ns": float(row.get("busy_ns", 0.0)),
                    "utilization": row.get("busy_ns", 0.0) / elapsed if elapsed else 0.0,
                    **{k: row[k] for k in ("crc_errors", "replays", "state") if k in row}}
             for name, row in sorted(report["links"].items())}
    # classic mode has no Link TLB: its TLB counts are null, not 0
    ports = {str(g): {k: row.get(k) if k.startswith("tlb_") else row.get(k, 0) for k in PORT_KEYS}
             for g, row in sorted((int(g), row) for g, row in report["ports"].items())}
    calls = []
    by_gpu = {int(g): records for g, records in report.get("collectives", {}).items()}
    for gpu in sorted(by_gpu):
        for call in by_gpu[gpu]:
            calls.append({"gpu": gpu, **{k: call[k] for k in ("comm", "seq", "collective", "algorithm", "count",
                                                               "dtype", "op", "root", "members")},
                          "size_bytes": call["count"] * dtype_itemsize(call["dtype"]),
                          "m_start_ns": call["m_start_ns"], "m_end_ns": call["m_end_ns"],
                          "modeled_ns": call["m_end_ns"] - call["m_start_ns"],
                          "tx_bytes": call["tx_bytes"], "rx_bytes": call["rx_bytes"]})

    def by_gpu_index(table: dict) -> dict:
        return {str(g): value for g, value in sorted((int(g), v) for g, v in table.items())}

    return {"schema": "nvlink-emu-run-report", "version": REPORT_SCHEMA_VERSION,
            "fabric": report["fabric"], "mode": report["mode"], "gpus": report["gpus"], "elapsed_ns": elapsed,
            "links": links, "ports": ports, "collectives": calls,
            "collectives_unrecorded": by_gpu_index(report.get("collectives_unrecorded", {})),
            "network_addresses": list(report.get("network_addresses", [])), "switch": dict(report.get("switch", {})),
            "conservation": by_gpu_index(report.get("conservation", {})),
            "unconsumed": by_gpu_index(report.get("unconsumed", {})),
            "refused_reports": {str(g): why for g, why in refused.items()}}


def check_report_path(path: str) -> None:
    """Before the run: ConfigError naming --report-json FILE if FILE is a directory or its directory
    cannot hold it (missing, or a file); the file itself is written at the end."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--report-json {path}: is a directory, not a file")
    parent = target.parent
    if not parent.is_dir():
        raise ConfigError(f"--report-json {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--report-json {path}: cannot write in {parent}")


def write_report_json(report: dict, path: str) -> None:
    """Write report_json(report) to `path`, whole or not at all (a new temporary file beside it, renamed:
    never through a link planted at either name); OSError if it cannot be written."""
    document = report_json(report)

    def dump(out) -> None:
        out.write(json.dumps(document, indent=2).encode() + b"\n")

    write_replacing(path, dump)


# -- traced runs (nvlink-emu report) --------------------------------------------------------------------
def print_report(directory, out_dir=None, out=None, err=None) -> int:
    """`nvlink-emu report DIR [-o OUTDIR]`: the report of every traced run in DIR (DIR itself, or each
    subdirectory holding one, as a demo's part1-/part2-), text to `out`, warnings to `err`, figures
    into OUTDIR (default DIR; one subdirectory per run found below DIR). Returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    directory = Path(directory)
    runs = find_runs(directory)
    base = Path(out_dir) if out_dir is not None else directory
    for i, run_dir in enumerate(runs):
        several = run_dir != directory
        traces, warnings = read_run(run_dir)
        if several:
            if i:
                print(file=out)
            print(f"=== {run_dir.name} ({run_dir}) ===", file=out)
        text, figures = trace_report(traces, base / run_dir.name if several else base)
        print(text, file=out)
        for warning in warnings:
            print(f"warning: {run_dir.name + '/' if several else ''}{warning}", file=err)
        for path in figures:
            print(f"wrote {path}", file=out)
    return 0


def failures(traces) -> list[str]:
    """One line per rank whose trace holds an error record: who, when (modeled) and the error."""
    lines = []
    for trace in traces:
        for event in trace.events:
            if event["ev"] == "error":
                header = trace.header
                who = (f"GPU {header['gpu']} (rank {header['rank']})" if header["role"] == "gpu"
                       else rank_label(header))
                when = f" at modeled {event['m'] / 1e3:.3f} us" if event.get("m") is not None else ""
                lines.append(f"{who} failed{when}: {event['error']}: {event['message']}")
    return lines


def trace_report(traces, out_dir) -> tuple[str, list]:
    """The report of a traced run: text (failed ranks, per-link table, per-collective summary) and the
    paths of the PNG figures written to out_dir (traffic matrix, bytes per algorithm)."""
    from .traces import bytes_by_algorithm, collectives, leaf_of, link_totals, traffic_matrix

    header = traces[0].header
    if all(t.end for t in traces):
        elapsed = max(t.end["m"] for t in traces)
    else:  # a rank did not close (it failed): the latest modeled time any record holds
        elapsed = max((e.get("m_end", e.get("m")) or 0.0 for t in traces for e in t.events), default=0.0)
    totals = link_totals(traces)
    lines = [f"# traced run of {header['fabric']} ({header['mode']} mode, {header['gpus']} GPUs, {header['link']}), "
             f"config {header['config_hash']}"]
    failed = failures(traces)
    if failed:
        lines += ["# failed ranks (the error each recorded)", *failed]
    lines.append(format_table(totals, header["gpus"], elapsed_ns=elapsed,
                              gpus_per_node=header["gpus"] // header.get("nodes", 1)))
    counted = {}
    for trace in traces:  # what each GPU end counted, from its end record
        if trace.header["role"] == "gpu" and trace.end:
            counted.update(trace.end["counters"])
    if any({f: totals.get(link, {}).get(f, 0) for f in FIELDS} != {f: c[f] for f in FIELDS}
           for link, c in counted.items()):
        lines.append("warning: tracing was off for part of the run (bench turns it off to measure its cost): the "
                     "table sums the traced packets only; the run's own counters are in the end records")
    lines += ["",
              "# collectives (modeled time: slowest member's end - earliest member's begin, summed over calls)",
              f"{'collective':<16}{'algorithm':>10}{'calls':>7}{'bytes':>14}{'modeled us':>13}{'algbw GB/s':>12}"]
    for row in collectives(traces):
        algbw = row["bytes"] / row["modeled_ns"] if row["modeled_ns"] else 0.0
        lines.append(f"{row['collective']:<16}{row['algorithm']:>10}{row['calls']:>7}{row['bytes']:>14}"
                     f"{row['modeled_ns'] / 1e3:>13.3f}{algbw:>12.2f}")
    out = Path(out_dir)
    if out.is_symlink():  # a run's own subdirectory of OUTDIR: one planted as a link would send figures anywhere
        raise ConfigError(f"{out}: is a symbolic link; the figures are not written through it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create it for the figures: {exc.strerror or exc}") from None
    fabric = f"{header['fabric']}, {header['gpus']} GPUs"
    figures = [_save(matrix_figure(*traffic_matrix(traces), fabric), out / "traffic-matrix.png"),
               _save(algorithm_figure(bytes_by_algorithm(traces), header["gpus"], fabric,
                                      leaf=lambda g: leaf_of(header, g)),
                     out / "bytes-per-algorithm.png")]
    return "\n".join(lines), figures


# -- figures --------------------------------------------------------------------------------------------
def byte_unit(largest: float) -> tuple[float, str]:
    """(divisor, name) of the binary unit in which `largest` bytes reads as a number below 1024."""
    for power, name in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024 ** power:
            return float(1024 ** power), name
    return 1.0, "B"


def _short(value: float) -> str:
    """A cell's value in three significant digits at most, never in e-notation."""
    if value == 0:
        return "0"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _plain(axis) -> None:
    """Tick labels as plain numbers: no offset or 1eN multiplier above the axis."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


def _save(fig, path) -> Path:
    """Write the figure as PNG to `path` through a new file renamed onto it (never through a symbolic
    link planted there); ConfigError naming it if it cannot be written."""
    try:
        write_replacing(path, lambda out: fig.savefig(out, dpi=110, format="png"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the figure: {exc.strerror or exc}") from None
    return path


def matrix_figure(rows: list[str], matrix: list[list[int]], fabric: str = ""):
    """The traffic matrix (traces.traffic_matrix) as a matplotlib Figure: a heat map with its value,
    in the unit that reads best, written in every cell."""
    from matplotlib.figure import Figure

    columns = len(matrix[0])
    scale, unit = byte_unit(max(max(row) for row in matrix))
    values = [[v / scale for v in row] for row in matrix]
    # up to 16 GPUs every cell shows its value; beyond, the colours alone (64 GPUs: 4,160 cells) on a
    # figure that stays a readable size, with every GPU's tick up to 32 and every 8th beyond
    cell = 0.75 if columns <= 16 else max(0.15, 12.0 / columns)
    fig = Figure(figsize=(max(5.5, 2.4 + cell * columns), 2.2 + cell * 0.75 * len(rows)), layout="tight")
    ax = fig.subplots()
    top = max(max(row) for row in values) or 1.0
    image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0, vmax=top)  # from 0: an empty run reads 0
    if columns <= 16:
        for r, row in enumerate(values):
            for c, value in enumerate(row):
                # dark text on viridis' light (high) end, light text on its dark end
                ax.text(c, r, _short(value), ha="center", va="center", fontsize=8,
                        color="black" if value / top > 0.6 else "white")
    step = 1 if columns <= 32 else 8
    ax.set_xticks(range(0, columns, step), [f"GPU {g}" for g in range(0, columns, step)], rotation=45)
    ax.set_yticks([r for r in range(len(rows)) if r % step == 0 or r == len(rows) - 1],
                  [name for r, name in enumerate(rows) if r % step == 0 or r == len(rows) - 1])
    ax.set_xlabel("delivered to\n(row 'switch': in-switch results, loads and refusals)")
    ax.set_ylabel("data from")
    ax.set_title(f"payload the switch delivered ({unit})" + (f"\n{fabric}" if fabric else ""), fontsize=11)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"payload ({unit})")
    _plain(bar.ax.yaxis)
    return fig


def algorithm_figure(by_algorithm: dict[str, dict[str, int]], gpus: int, fabric: str = "", leaf=lambda gpu: 0):
    """Each link's payload during each collective/algorithm (traces.bytes_by_algorithm) as a Figure:
    grouped bars per GPU, uplinks and downlinks side by side, in the unit that reads best; leaf(g):
    the switch GPU g is attached to."""
    from matplotlib.figure import Figure

    names = sorted(by_algorithm)
    largest = max((v for links in by_algorithm.values() for v in links.values()), default=0)
    scale, unit = byte_unit(largest)
    fig = Figure(figsize=(min(14.0, 4.0 + 1.1 * gpus), 4.2), layout="tight")
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.8 / max(1, len(names))
    for ax, (title, link) in zip(axes, (("GPU -> switch (tx)", "gpu{0}->sw{1}"), ("switch -> GPU (rx)", "sw{1}->gpu{0}"))):
        for i, name in enumerate(names):
            ax.bar([g - 0.4 + (i + 0.5) * width for g in range(gpus)],
                   [by_algorithm[name].get(link.format(g, leaf(g)), 0) / scale for g in range(gpus)], width, label=name)
        step = 1 if gpus <= 32 else 8
        ax.set_xticks(range(0, gpus, step), [str(g) for g in range(0, gpus, step)])
        ax.set_xlabel("GPU")
        ax.set_ylabel(f"payload per link ({unit})")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        _plain(ax.yaxis)
    fig.suptitle(f"link payload during each collective, by collective/algorithm{' (' + fabric + ')' if fabric else ''}",
                 fontsize=11)
    if names:
        axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="collective/algorithm",
                       title_fontsize=8)
    return fig
