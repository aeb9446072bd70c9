"""Reports of a run: the per-link table and its warnings, the JSON run report, and traced-run reports with figures."""

import json
import os
import sys
from pathlib import Path

from nvlink_emu.fabric.counters import FIELDS, format_table
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.reduction import dtype_itemsize
from nvlink_emu.fabric.trace import find_runs, read_directory

from .traces import rank_label

REPORT_SCHEMA_VERSION = 1  # of --report-json's file (README, "Run report JSON")
PORT_KEYS = ("tlb_hits", "tlb_misses", "tlb_faults", "violations", "refused", "malformed")


def run_summary(report: dict) -> str:
    """The end-of-run table: per-link payload/raw bytes and packets, TLB and violation counts per port."""
    ports = {int(g): row for g, row in report["ports"].items()}
    nodes, gpus = report.get("nodes", 1), report["gpus"]
    shape = (f"{gpus} GPUs + 1 switch" if nodes == 1 else
             f"{nodes} nodes x {gpus // nodes} GPUs, {nodes} leaf switches + {report['spines']} spines")
    lines = [f"# fabric {report['fabric']} ({report['mode']} mode, {shape})",
             format_table(report["links"], gpus, extra=ports, elapsed_ns=report["elapsed_ns"],
                          gpus_per_node=gpus // nodes)]
    for who, problem in sorted(report.get("conservation", {}).items(), key=lambda item: str(item[0])):
        if isinstance(who, str):  # a link between two switches
            lines.append(f"warning: the two ends of {who} disagree: {problem}")
        else:
            lines.append(f"warning: GPU {who}'s own count disagrees with the switch's: {problem}")
    for gpu, keys in sorted(report.get("unconsumed", {}).items()):
        more = keys[-1][1] - 1 if keys and keys[-1][0] == "..." else 0  # ["...", n]: n more not listed
        lines.append(f"warning: GPU {gpu} ended with {len(keys) + more} message(s) never received: {keys[:4]}")
    return "\n".join(lines)


# -- the JSON run report (--report-json) ---------------------------------------------------------------
def report_json(report: dict) -> dict:
    """The run's report (RunResult.report) as the JSON document of schema REPORT_SCHEMA_VERSION: links by
    name, ports and the per-GPU maps keyed by GPU index as a string, every collective call a record."""
    elapsed = report["elapsed_ns"]
    links = {name: {**{f: int(row.get(f, 0)) for f in FIELDS}, "busy_ns": float(row.get("busy_ns", 0.0)),
                    "utilization": row.get("busy_ns", 0.0) / elapsed if elapsed else 0.0}
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
            "unconsumed": by_gpu_index(report.get("unconsumed", {}))}


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
    """Write report_json(report) to `path`, whole or not at all (a temporary file beside it, renamed);
    OSError if it cannot be written."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    try:
        with open(partial, "w") as out:
            json.dump(report_json(report), out, indent=2)
            out.write("\n")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


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
        traces, warnings = read_directory(run_dir)
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
    out.mkdir(parents=True, exist_ok=True)
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
    fig.savefig(path, dpi=110)
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
