"""`nvlink-emu trace DIR`: merge a run's per-rank traces into one Chrome/Perfetto trace JSON file."""

import io
import json
import sys

from nvlink_emu.fabric.errors import ConfigError

from ..traces import merge, read_run, write_replacing


def add_to(sub) -> None:
    """Add the `trace` command to the subparsers `sub`."""
    trace = sub.add_parser("trace", help="merge per-rank trace files into Chrome/Perfetto trace JSON")
    trace.add_argument("trace_dir", metavar="DIR", help="the --trace-dir of a run")
    trace.add_argument("-o", "--output", default="trace.json", help="the JSON file to write (default trace.json)")
    trace.add_argument("--time", choices=("modeled", "wall"), default="modeled",
                       help="time axis: modeled fabric time (default) or this machine's wall time")
    trace.set_defaults(handler=cmd_trace)


def cmd_trace(args, script_args) -> int:
    """Merge a run's per-rank traces into one Chrome Trace Event JSON file."""
    traces, warnings = read_run(args.trace_dir)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    merged = merge(traces, args.time)
    try:  # never through a symbolic link planted where the file goes
        write_replacing(args.output, lambda out: _dump_json(merged, out))
    except OSError as exc:
        raise ConfigError(f"-o {args.output}: cannot write it: {exc.strerror or exc}") from None
    print(f"wrote {args.output}: {len(merged['traceEvents'])} events from {len(traces)} ranks ({args.time} time); "
          f"open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _dump_json(document, binary) -> None:
    """json.dump into a binary file, streamed (a merged trace can be large)."""
    text = io.TextIOWrapper(binary, encoding="utf-8")
    json.dump(document, text)
    text.flush()
    text.detach()  # the caller closes the file
