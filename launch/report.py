"""Text reports of a run: the per-link table and its warnings."""

from nvlink_emu.fabric.counters import format_table


def run_summary(report: dict) -> str:
    """The end-of-run table: per-link payload/raw bytes and packets, TLB and violation counts per port."""
    ports = {int(g): row for g, row in report["ports"].items()}
    lines = [f"# fabric {report['fabric']} ({report['mode']} mode, {report['gpus']} GPUs + 1 switch)",
             format_table(report["links"], report["gpus"], extra=ports, elapsed_ns=report["elapsed_ns"])]
    for gpu, problem in sorted(report.get("conservation", {}).items()):
        lines.append(f"warning: GPU {gpu}'s own count disagrees with the switch's: {problem}")
    for gpu, keys in sorted(report.get("unconsumed", {}).items()):
        lines.append(f"warning: GPU {gpu} ended with {len(keys)} message(s) never received: {keys[:4]}")
    return "\n".join(lines)


def trace_report(traces, out_dir) -> tuple[str, list]:
    """The report of a traced run: text (per-link table, per-collective summary) and the paths of
    the PNG figures written to out_dir (traffic matrix, bytes per algorithm)."""
    from pathlib import Path

    from .traces import bytes_by_algorithm, collectives, link_totals, traffic_matrix

    header = traces[0].header
    elapsed = max((t.end or {}).get("m", 0.0) for t in traces)
    totals = link_totals(traces)
    lines = [f"# traced run of {header['fabric']} ({header['mode']} mode, {header['gpus']} GPUs, {header['link']}), "
             f"config {header['config_hash']}",
             format_table(totals, header["gpus"], elapsed_ns=elapsed)]
    counted = {}
    for trace in traces:  # what each GPU end counted, from its end record
        if trace.header["role"] == "gpu" and trace.end:
            counted.update(trace.end["counters"])
    fields = ("payload_bytes", "raw_bytes", "packets")
    if any({f: totals.get(link, {}).get(f, 0) for f in fields} != {f: c[f] for f in fields}
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
    figures = [_matrix_figure(*traffic_matrix(traces), out / "traffic-matrix.png"),
               _algorithm_figure(bytes_by_algorithm(traces), header["gpus"], out / "bytes-per-algorithm.png")]
    return "\n".join(lines), figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _matrix_figure(rows, matrix, path):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(matrix[0]), 1.0 + 0.6 * len(rows)))
    image = ax.imshow(matrix, cmap="viridis")
    ax.set_xticks(range(len(matrix[0])), [f"GPU {g}" for g in range(len(matrix[0]))], rotation=45)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("delivered to")
    ax.set_ylabel("data from")
    ax.set_title("payload bytes the switch delivered", pad=16)
    fig.colorbar(image, ax=ax, label="bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _algorithm_figure(by_algorithm, gpus, path):
    plt = _pyplot()
    links = [f"gpu{g}->sw0" for g in range(gpus)] + [f"sw0->gpu{g}" for g in range(gpus)]
    names = sorted(by_algorithm)
    fig, ax = plt.subplots(figsize=(min(12.0, 3.0 + 0.5 * len(links)), 4.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        ax.bar([x + i * width for x in range(len(links))], [by_algorithm[name].get(link, 0) for link in links],
               width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(links))], links, rotation=60, fontsize=8)
    ax.set_ylabel("payload bytes")
    ax.set_title("per-link payload bytes, by collective/algorithm")
    if names:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
