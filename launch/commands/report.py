"""`nvlink-emu report DIR`: link table, collective summary and figures of a traced run."""

from ..report import print_report


def add_to(sub) -> None:
    """Add the `report` command to the subparsers `sub`."""
    report = sub.add_parser("report", help="link table, collective summary and figures of a traced run")
    report.add_argument("trace_dir", metavar="DIR", help="the --trace-dir of a run")
    report.add_argument("-o", "--output", metavar="OUTDIR", help="where the PNG figures go (default: DIR)")
    report.set_defaults(handler=cmd_report)


def cmd_report(args, script_args) -> int:
    """Per-link table, per-collective summary and figures of each traced run in DIR (warnings on stderr)."""
    return print_report(args.trace_dir, args.output)
