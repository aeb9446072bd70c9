"""Rank bootstrap for `python -m nvlink_emu.launch`: parse, load the fabric and the script, run, print one report."""

import argparse
import dataclasses
import atexit
import inspect
import math
import os
import runpy
import sys
import traceback
from pathlib import Path

from nvlink_emu.fabric.config import DEFAULT_PRESET, PRESETS, SOFTWARE, SOFTWARE_HELP, resolve
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.faults import load_entries
from nvlink_emu.ranks.output import GPU_LABEL, LineWriter
from nvlink_emu.ranks.session import DEFAULT_TIMEOUT_S, INTERRUPTED_STATUS, fabric_key, report_failure, run_fabric
from nvlink_emu.ranks.transport import abort_job, count_failed_ranks, world_rank, world_size

from .report import REFUSED_REPORT_STATUS, check_report_path, checked, run_summary, write_report_json


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


def script_path_first(script: str) -> None:
    """sys.path as `python SCRIPT` has it: the script's directory first, in place of the current directory
    `python -m nvlink_emu.launch` put there (the repo's root, run from a checkout: its `fabric`, `ranks`
    and `launch` folders would shadow the user's own modules of those names)."""
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    sys.path.insert(0, str(Path(script).resolve().parent))


def load_main(script: str):
    """The main(gpu) function of a workload script; ConfigError naming the script if it has none, or
    if its main cannot be called with the one argument (checked here, before any traffic)."""
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"{script}: no such script")
    namespace = runpy.run_path(str(path), run_name="__nvlink_emu_script__")
    main = namespace.get("main")
    if not callable(main):
        raise ConfigError(f"{script}: defines no main(gpu) function")
    try:
        signature = inspect.signature(main)
    except (TypeError, ValueError):  # no signature to inspect (a builtin, say): the call will tell
        return main
    try:
        signature.bind(None)
    except TypeError:
        raise ConfigError(f"{script}: main must take one argument, the GPU (def main(gpu)); "
                          f"it is def main{signature}") from None
    return main


def mpi4py_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mpi4py", action="store_true", help="SCRIPT is an unmodified mpi4py program (no main(gpu)): "
                        "its `from mpi4py import MPI` gets the emulator's layer, COMM_WORLD the GPUs")


def load_mpi4py_program(script: str, script_args: list[str]):
    """A main(gpu) running the mpi4py program `script` as __main__ (ranks.mpi4py_layer); ConfigError if
    it is not a file, or if NVLINK_EMU_MPI4PY_ALGORITHM names no algorithm (before any traffic)."""
    from nvlink_emu.fabric.errors import UnsupportedOperation
    from nvlink_emu.ranks.mpi4py_layer import MPI, program

    if not Path(script).is_file():
        raise ConfigError(f"{script}: no such program")
    try:
        MPI.check_algorithm(os.environ.get(MPI.ALGORITHM_ENV, "auto").strip() or "auto")
    except UnsupportedOperation as exc:
        raise ConfigError(str(exc)) from None
    return program(script, script_args)


def workload_traceback(exc: BaseException, script: str) -> str:
    """`exc`'s traceback from its first frame in the workload script on: the launcher's frames (run,
    load_main, runpy) say nothing to the script's author. A SyntaxError has no frame in the script,
    only its file, line and caret; an error elsewhere keeps the whole traceback."""
    tb, path = exc.__traceback__, Path(script).resolve()
    while tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve() != path:
        tb = tb.tb_next
    if tb is None and not (isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == path):
        return traceback.format_exc()
    return "".join(traceback.format_exception(type(exc), exc, tb))


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


def whole_lines() -> None:
    """This rank's stdout and stderr in whole lines, each one write (ranks.output.LineWriter): an MPI
    launcher that labels its ranks' output (Hydra's -prepend-rank) labels each write, so print()'s
    separate writes of one line would otherwise carry labels in mid-line. A partial last line goes out
    at exit."""
    for name in ("stdout", "stderr"):
        writer = LineWriter(getattr(sys, name), "")
        setattr(sys, name, writer)
        atexit.register(writer.finish)


def main(argv: list[str] | None = None) -> int:
    whole_lines()
    try:
        return run(argv)
    except KeyboardInterrupt:  # Ctrl-C: mpiexec passes it to every rank; end them all, with no traceback
        abort_job(INTERRUPTED_STATUS)


def run(argv: list[str] | None) -> int:
    """One rank of `python -m nvlink_emu.launch`: its exit status (a failure after setup aborts the job instead)."""
    ours, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m nvlink_emu.launch", description="Run SCRIPT's main(gpu) on every "
                                     "GPU rank of an emulated fabric (under mpiexec).")
    parser.add_argument("script", help="Python file defining main(gpu)")
    fabric_arguments(parser)
    mpi4py_argument(parser)
    args = parser.parse_args(ours)
    rank = world_rank()
    problem, workload = None, None
    loaders, loads = world_size(), True  # how many ranks load the script; whether this one does
    try:
        config = fabric_of(args)
        if args.trace_dir is not None:
            prepare_trace_dir(args.trace_dir)
        if args.report_json is not None:
            check_report_path(args.report_json)
        # A switch rank never runs the workload's code, not even its top level (which could rewrite the
        # switch's checks in this process): only GPU ranks load the script. On a world of the wrong size
        # no fabric starts (run_fabric says why), and every rank loads it as before.
        if world_size() == config.world_size:
            loaders = config.gpus
        loads = loaders == world_size() or fabric_key(rank, config) < config.gpus
        if loads:
            script_path_first(args.script)
            if args.mpi4py:
                workload = load_mpi4py_program(args.script, script_args)
            else:
                sys.argv = [args.script, *script_args]
                workload = load_main(args.script)
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank must learn of it
        problem, text = exc, workload_traceback(exc, args.script)
    # The ranks agree on whether all got ready: one that failed alone (a script that raises on import
    # on one node, a config file missing there) must end the job, not leave the others waiting.
    setup_timeout = args.timeout if math.isfinite(args.timeout) and args.timeout > 0 else DEFAULT_TIMEOUT_S
    failed = count_failed_ranks(problem is not None, setup_timeout)
    if failed == world_size() or (failed == loaders and (problem is not None) == loads):
        # every rank, or every rank that loaded the script (the GPUs, none of which runs on), failed: the
        # same error, most likely; rank 0 (GPU 0) reports it once, and its exit status is the job's
        if rank == 0:
            print(f"nvlink-emu: error: {problem}" if isinstance(problem, ConfigError) else text.rstrip(),
                  file=sys.stderr)
        if problem is None:
            return 0
        return 2 if isinstance(problem, ConfigError) else 1
    if failed:
        if problem is not None:
            report_failure(rank, f"rank {rank}", text)
            abort_job(1)
        return 1  # the failed ranks end the job
    try:
        result = run_fabric(config, workload, timeout_s=args.timeout, trace_dir=args.trace_dir,
                            stdout_prefix="" if args.no_label else GPU_LABEL)
    except ConfigError as exc:
        # every rank finds the same error before any traffic: report once, exit without aborting
        if rank == 0:
            print(f"nvlink-emu: error: {exc}", file=sys.stderr)
        return 2
    if result.role == "switch" and result.rank == config.gpus:  # switch 0 (the leaf of node 0) speaks for all
        report, refused = checked(result.report)  # a GPU's bad word is its line in the table, not a crash
        print(run_summary(report), file=sys.stderr, flush=True)  # stdout is the workload's
        if args.report_json is not None:
            try:
                write_report_json(report, args.report_json)
            except OSError as exc:
                print(f"nvlink-emu: error: --report-json {args.report_json}: cannot write it: {exc.strerror or exc}",
                      file=sys.stderr)
                return 1
        if refused:
            return REFUSED_REPORT_STATUS
    return 0
