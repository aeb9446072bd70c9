"""Text reports of a run: the per-link table and its warnings."""

from fabric.counters import format_table


def run_summary(report: dict) -> str:
    """The end-of-run table: per-link payload/raw bytes and packets, TLB and violation counts per port."""
    ports = {int(g): row for g, row in report["ports"].items()}
    lines = [f"# fabric {report['fabric']} ({report['mode']} mode, {report['gpus']} GPUs + 1 switch)",
             format_table(report["links"], report["gpus"], extra=ports, elapsed_ns=report["elapsed_ns"])]
    for gpu, keys in sorted(report.get("unconsumed", {}).items()):
        lines.append(f"warning: GPU {gpu} ended with {len(keys)} message(s) never received: {keys[:4]}")
    return "\n".join(lines)
