"""`nvlink-emu model COLLECTIVE`: the cost model's prediction of a bench sweep on a fabric of any shape,
computed in this process (no MPI rank is started), with the shapes emulated runs validated it on
(launch/model.py computes the rows)."""

import argparse
import json
import sys
import time

from nvlink_emu.fabric.config import DEFAULT_PRESET, PRESETS, SOFTWARE, SOFTWARE_HELP, resolve
from nvlink_emu.fabric.tuner import all2all_algorithm, choose

from ..sweeps import BUS_FACTOR_TEXT, plan_of, sizes, sweep_arguments
from ..model import shape_text, predict, predict_plan, shape_of, validation_note

HEADER = (f"{'size':>12}{'count':>12}{'type':>10}{'redop':>7}{'root':>6}{'algorithm':>10}{'modeled_us':>12}"
          f"{'algbw':>9}{'busbw':>9}{'tx_B/gpu':>14}{'rx_B/gpu':>14}")


def add_to(sub) -> None:
    """Add the `model` command to the subparsers `sub`."""
    model = sub.add_parser("model", help="the cost model's prediction of a bench sweep, on any shape (up to 32 "
                           "nodes x 8 GPUs): no rank is started; says which shapes emulation validated",
                           description="Modeled time, algbw and busbw of one collective per size on every GPU of "
                           "a fabric, as bench reports them, from the cost model the emulated runs are checked "
                           "against (fabric.cost_nodes' replay of the call's plan, on one node as on several), computed here.")
    model_arguments(model)
    model.set_defaults(handler=cmd_model)


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """`nvlink-emu model`'s options: bench's collective, algorithm, sizes and type, and the fabric."""
    sweep_arguments(parser, "model")
    parser.add_argument("--preset", metavar="P", help=f"named fabric (default {DEFAULT_PRESET}): "
                        f"{', '.join(sorted(PRESETS))}")
    parser.add_argument("--config", metavar="FILE.toml", help="fabric description in TOML")
    parser.add_argument("--gpus", type=int, help="override the fabric's GPU count (all nodes together)")
    parser.add_argument("--nodes", type=int, metavar="N", help="nodes of the fabric (a leaf switch each)")
    parser.add_argument("--gpus-per-node", type=int, metavar="M", help="GPUs in each node (instead of --gpus)")
    parser.add_argument("--software", choices=SOFTWARE, help=SOFTWARE_HELP)
    parser.add_argument("--json", action="store_true", help="one JSON object per row (the statement of what was "
                        "validated goes to standard error)")


def header(collective: str, config) -> str:
    shape = shape_text(shape_of(config)) + (f" = {config.gpus} GPUs" if config.nodes > 1 else "")
    return (f"# nvlink-emu model {collective} on {config.name} ({shape}, {config.link}): modeled by fabric.cost_nodes (replay), "
            f"not emulated; algbw = size / time, busbw = algbw x {BUS_FACTOR_TEXT[collective]} (GB/s); tx/rx: GPU 0's "
            f"link payload per call\n{HEADER}")


def _cell(value, width: int, spec: str = "") -> str:
    return f"{'n/a' if value is None else format(value, spec):>{width}}"


def format_row(row: dict) -> str:
    root = -1 if row["root"] is None else row["root"]
    return (f"{row['size_bytes']:>12}{row['count']:>12}{row['dtype']:>10}{row['op']:>7}{root:>6}{row['algorithm']:>10}"
            f"{row['modeled_us']:>12.3f}{_cell(row['algbw_gbps'], 9, '.2f')}{_cell(row['busbw_gbps'], 9, '.2f')}"
            f"{_cell(row['tx_bytes_per_gpu'], 14)}{_cell(row['rx_bytes_per_gpu'], 14)}")


def cmd_model(args, script_args=None) -> int:
    """Print the model's rows (as they come: a replay at 256 GPUs takes seconds), then what was validated."""
    config = resolve(args.preset, args.config, args.gpus, args.nodes, args.gpus_per_node, args.software)
    todo = sizes(args)
    start = time.process_time()
    plan = plan_of(args, config, "model")
    if plan is None and args.algorithm != "auto":  # one the fabric does not allow: refused before any row
        if args.collective == "all2all":
            all2all_algorithm(args.algorithm, config, todo[0])
        else:
            choose(args.collective, args.algorithm, config, todo[0])
    if not args.json:
        print(header(args.collective, config), flush=True)
    rows = []
    for size in todo:
        rows.append(predict_plan(plan, config, size, args.dtype) if plan is not None
                    else predict(args.collective, args.algorithm, config, size, args.dtype))
        print(json.dumps(rows[-1]) if args.json else format_row(rows[-1]), flush=True)
    measured = [row["busbw_gbps"] for row in rows if row["busbw_gbps"] is not None]
    closing = (f"# Avg bus bandwidth    : {sum(measured) / len(measured):g}" if measured else
               "# Avg bus bandwidth    : n/a")
    note = (validation_note(config) if plan is None else
            f"# plan {plan.name!r}: replayed by fabric.plans.plan_ns; the ranks' executor of a plan takes exactly this "
            f"modeled time (tests/mpi/test_plans.py); the plan itself was validated, not emulated here")
    cpu = f"# {len(rows)} rows in {time.process_time() - start:.2f} s of CPU here"
    print("\n".join((closing, note, cpu)), file=sys.stderr if args.json else sys.stdout, flush=True)
    return 0
