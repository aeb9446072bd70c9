"""Rank bootstrap for `python -m nvlink_emu.launch`: parse, load the fabric and the script, run, print one report."""

import argparse
import atexit
import inspect
import math
import os
import runpy
import sys
import traceback
from pathlib import Path

from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.ranks.output import GPU_LABEL, LineWriter
from nvlink_emu.ranks.session import DEFAULT_TIMEOUT_S, INTERRUPTED_STATUS, fabric_key, report_failure, run_fabric
from nvlink_emu.ranks.transport import abort_job, count_failed_ranks, world_rank, world_size

from .options import (fabric_arguments, fabric_of, mpi4py_argument, prepare_trace_dir,  # noqa: F401 (with_faults:
                      split_script_args, with_faults)                                       # re-exported)
from .report import REFUSED_REPORT_STATUS, check_report_path, checked, run_summary, write_report_json


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
