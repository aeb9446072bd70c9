"""The options the entry points share, and what they build: which fabric (fabric_of), script arguments
after `--`, the trace directory. Pure (no MPI): `nvlink-emu --help`, `model` and `report` load none."""

import argparse
import dataclasses
from pathlib import Path

from nvlink_emu.fabric.config import DEFAULT_PRESET, PRESETS, SOFTWARE, SOFTWARE_HELP, resolve
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.faults import load_entries
from nvlink_emu.ranks.status import DEFAULT_TIMEOUT_S


def fabric_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every entry point shares: which fabric, how many GPUs, the deadline."""
    parser.add_argument("--preset", choices=sorted(PRESETS), help=f"named fabric (default {DEFAULT_PRESET})")
    parser.add_argument("--config", metavar="FILE.toml", help="fabric description in TOML")
    parser.add_argument("--faults", metavar="FILE.toml", help="fault plan: [[faults]] tables (link, kind = ber | "
                        "degraded | down | flap, at_ns, until_ns, ber, seed, lanes, period_ns), added to the "
                        "fabric's own")
    parser.add_argument("--gpus", type=int, help="override the fabric's GPU count (all nodes together)")
    parser.add_argument("--nodes", type=int, metavar="N", help="nodes of the fabric (a leaf switch each; the "
                        "superpod presets have 2)")
    parser.add_argument("--gpus-per-node", type=int, metavar="M", help="GPUs in each node (instead of --gpus)")
    parser.add_argument("--software", choices=SOFTWARE, help=SOFTWARE_HELP)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"deadline of every blocking wait, seconds (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--trace-dir", metavar="DIR", help="write one trace file per rank into DIR")
    parser.add_argument("--no-label", action="store_true", help="print the workload's lines without the "
                        "[gpu N] label (still whole lines, never spliced)")
    parser.add_argument("--report-json", metavar="FILE", help="write the end-of-run report (link counters, "
                        "port counts, every collective call) as JSON to FILE")


def fabric_of(args: argparse.Namespace, preset_name: str | None = None):
    """The fabric the options ask for: --preset/--config (or the preset `preset_name` instead), sized
    by --gpus, --nodes and --gpus-per-node, with --software's choice."""
    if preset_name is not None:
        config = resolve(preset_name, None, args.gpus, getattr(args, "nodes", None), getattr(args, "gpus_per_node", None),
                         getattr(args, "software", None))
    else:
        config = resolve(args.preset, args.config, args.gpus, getattr(args, "nodes", None),
                         getattr(args, "gpus_per_node", None), getattr(args, "software", None))
    return with_faults(config, getattr(args, "faults", None))


def with_faults(config, path: str | None):
    """`config` with the fault plan in the file at `path` (--faults) added to its own; validated against
    its link names (ConfigError naming the file, the entry, the key and the value)."""
    if path is None:
        return config
    entries = load_entries(path)
    try:
        return dataclasses.replace(config, faults=(*config.faults, *entries))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our arguments, the script's arguments after `--`)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def mpi4py_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mpi4py", action="store_true", help="SCRIPT is an unmodified mpi4py program (no main(gpu)): "
                        "its `from mpi4py import MPI` gets the emulator's layer, COMM_WORLD the GPUs")


def prepare_trace_dir(trace_dir: str) -> None:
    """Create --trace-dir (and its parents) unless it exists; ConfigError naming it if it is a file,
    lies under one, or cannot be created."""
    directory = Path(trace_dir)
    blocker = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
    if blocker == directory:
        raise ConfigError(f"--trace-dir {trace_dir}: is a file, not a directory")
    if blocker is not None:
        raise ConfigError(f"--trace-dir {trace_dir}: lies under {blocker}, which is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--trace-dir {trace_dir}: cannot create it: {exc.strerror or exc}") from None
