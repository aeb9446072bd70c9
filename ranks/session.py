"""One emulated run on an MPI communicator: G GPUs running main(gpu), one leaf switch per node and the
spines, laid out node by node as fabric.topology says (one node: GPU ranks 0..G-1, the switch G)."""

import dataclasses
import hashlib
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from nvlink_emu.fabric.addressing import assign_network_addresses
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.errors import ConfigError
from nvlink_emu.fabric.trace import TraceWriter, TraceWriteError

from .comm import close_communicators
from .gpu import Gpu
from .output import lines_on_stdout
from .status import (DEFAULT_TIMEOUT_S, FAILURE_DIR_ENV, FAILURE_MARK, INTERRUPTED_STATUS,  # noqa: F401 (re-exported)
                     fabric_key, rank_name, role_of)
from .switch import SwitchRank
from .transport import Transport, abort_job, split_roles
from .transport.packets import DELAY_ENV



@dataclass
class RunResult:
    """What a run left on this rank: role ("gpu" or "switch"), rank, main's return value (GPU ranks)
    and the switch's report (links, ports, network addresses), identical on every rank."""

    role: str
    rank: int
    value: object
    report: dict


def open_trace(trace_dir: str, transport: Transport, config: FabricConfig, role: str, addresses,
               timeout_s: float) -> TraceWriter:
    """This rank's trace file, its header's clock offset taken right after a barrier of every rank."""
    transport.barrier(timeout_s)
    synced = time.time()
    rank = transport.rank
    if rank == 0:  # files of ranks this run does not have are another run's: they would be merged with ours
        for stale in Path(trace_dir).glob("rank-*.msgpack"):
            if stale.stem[5:].isdigit() and int(stale.stem[5:]) >= transport.size:
                stale.unlink()
    return TraceWriter(trace_dir, rank, {
        "role": role, "gpu": rank if role == "gpu" else None,
        "switch": rank - config.gpus if role == "switch" else None, "fabric": config.name, "mode": config.mode,
        "link": config.link, "gpus": config.gpus, "nodes": config.nodes, "spines": config.spines,
        "uplink_gbytes_per_s_per_gpu": config.uplink_gbytes_per_s_per_gpu, "uplink_latency_ns": config.uplink_latency_ns,
        "config_hash": config.digest(), "clock_offset_s": synced,
        "network_address": addresses[rank] if role == "gpu" and addresses else None,
        "timing": dataclasses.asdict(config.timing), "mtu_bytes": config.mtu_bytes,
        "header_bytes": config.header_bytes})


def send_delay(text: str | None) -> tuple[int, float] | None:
    """(seed, most seconds) of $NVLINK_EMU_TEST_SEND_DELAY="SEED:MAX_MS", the test hook that delays
    every send at random on the host (Transport.delay_sends); None if unset. ConfigError if malformed."""
    if not text:
        return None
    try:
        seed_text, most_ms = text.split(":")
        seed, most = int(seed_text), float(most_ms) / 1e3
        if not (math.isfinite(most) and most >= 0):
            raise ValueError
    except ValueError:
        raise ConfigError(f"{DELAY_ENV}={text!r}: must be SEED:MAX_MS (an integer, and a number of ms >= 0)") from None
    return seed, most


def check_run(config: FabricConfig, timeout_s: float, size: int) -> None:
    """ConfigError, the same on every rank and before any traffic, if a run of `config` with a deadline
    of `timeout_s` seconds cannot start on `size` ranks."""
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ConfigError(f"timeout: must be a finite number of seconds > 0, got {timeout_s}")
    if size != config.world_size:
        if config.nodes > 1:
            raise ConfigError(f"world size {size} does not match fabric {config.name!r}: {config.nodes} nodes x "
                              f"{config.gpus_per_node} GPUs + {config.nodes} leaf switches + {config.spines} spines = "
                              f"{config.world_size} ranks; run with mpiexec -n {config.world_size} (or size the fabric "
                              f"with --nodes and --gpus-per-node)")
        raise ConfigError(f"world size {size} does not match fabric {config.name!r}: {config.gpus} GPUs + "
                          f"{config.switches} switch = {config.world_size} ranks; run with mpiexec -n "
                          f"{config.world_size}" + (f" (or pass --gpus {size - config.switches})"
                                                     if size > config.switches else
                                                     " (with a world size of 1, this mpiexec may belong to "
                                                     "another MPI than mpi4py's: see NVLINK_EMU_MPIEXEC)"))


def run_fabric(config: FabricConfig, main, timeout_s: float = DEFAULT_TIMEOUT_S, comm=None,
               abort_on_error: bool = True, trace_dir: str | None = None,
               stdout_prefix: str | None = None) -> RunResult:
    """Run `main(gpu)` on every GPU rank while the switch rank serves; collective over `comm`.

    A world size that does not match the fabric (check_run) is a ConfigError on every rank before
    any traffic. Any exception after that prints this rank's report, labelled (its traceback; one line
    for sys.exit(N) and for a trace file that cannot be written; nothing for Ctrl-C), and aborts the
    whole job with exit_status(exc); with abort_on_error=False it propagates instead, for a caller that
    ends the job itself (the pytest plugin, nvlink_emu.launch.pytest_plugin, does, after pytest
    reports the failure). With trace_dir, every rank writes its trace file there (fabric.trace). With
    stdout_prefix, main's standard output on a GPU rank goes out in whole lines, each starting with
    stdout_prefix.format(gpu=GPU index) (output.GPU_LABEL, or "" for none; see output.LineWriter);
    None leaves sys.stdout as it is.
    """
    transport = Transport(comm)
    try:
        check_run(config, timeout_s, transport.size)
        delay = send_delay(os.environ.get(DELAY_ENV))
    except ConfigError:
        transport.close()
        raise
    if delay is not None:
        transport.delay_sends(*delay)
    world_rank = transport.rank
    trace = None
    try:
        if config.nodes > 1:
            transport.reorder(fabric_key(world_rank, config))
        role = role_of(transport.rank, config)
        control, switches = split_roles(transport, role == "gpu")
        addresses = assign_network_addresses(config.gpus) if config.mode == "network" else ()
        if trace_dir is not None:
            trace = open_trace(trace_dir, transport, config, role, addresses, timeout_s)
        if role == "gpu":
            leaf = config.gpus + transport.rank // config.gpus_per_node
            assert control is not None  # a GPU's (split_roles)
            gpu = Gpu(config, transport, control, leaf, addresses, timeout_s, trace)
            with lines_on_stdout(None if stdout_prefix is None else stdout_prefix.format(gpu=transport.rank)):
                value = call_main(main, gpu)
            report = gpu.finish()
            close_communicators(gpu)  # the GPU ranks' MPI communicators too
            end = {"m": gpu.now_ns, "counters": gpu.link_snapshot()}
        else:
            switch = SwitchRank(config, transport, timeout_s, trace, switches)
            value, report = None, switch.serve()
            if switches is not None:
                switches.close()
            end = {"m": report["elapsed_ns"], "counters": switch.logic.counters.snapshot()}
        if trace is not None:
            trace.close({**end, "wall": time.time()})
        swept = transport.sweep_outer_at_end(timeout_s)
        if swept:  # the run completed: said, not failed (left there, they would fail MPI_Finalize)
            print(f"nvlink-emu: rank {world_rank} ({role} {transport.rank}): dropped {swept} message(s) sent to it "
                  f"point to point on the run's MPI communicator, around the fabric, at the end of the run",
                  file=sys.stderr, flush=True)
        transport.close()
        return RunResult(role, transport.rank, value, report)
    except BaseException as exc:
        if trace is not None:  # the error is part of the record; no end record: the rank did not close cleanly
            now = getattr(locals().get("gpu"), "now_ns", None)
            try:
                trace.write({"ev": "error", "error": type(exc).__name__, "message": str(exc), "wall": time.time(),
                             **({"m": now} if now is not None else {})}, force=True)
                trace.flush()
            except TraceWriteError:
                pass  # the trace may be what failed (a full disk): the report and the abort must still happen
        if not abort_on_error:
            raise
        name = rank_name(transport.rank, config, world_rank)
        status = exit_status(exc)
        if isinstance(exc, SystemExit):
            report_failure(transport.rank, name, headline=f"sys.exit({exc.code!r}) in the workload; ending the job "
                           f"with status {status}")
        elif isinstance(exc, TraceWriteError):  # where in the run the disk filled up does not matter
            report_failure(transport.rank, name, headline=f"{exc.strerror}; ending the job")
        elif not isinstance(exc, KeyboardInterrupt):  # Ctrl-C reached every rank; the launcher says it once
            report_failure(transport.rank, name, traceback.format_exc())
        abort_job(status)
        raise


def call_main(main, gpu):
    """The workload's main(gpu). sys.exit() and sys.exit(0) in it are a normal return on this GPU, as
    they are in a plain script; any other exit status ends the job with it (exit_status)."""
    __tracebackhide__ = True  # pytest: this frame says nothing the workload's own frames below do not
    try:
        return main(gpu)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        return None


def exit_status(exc: BaseException) -> int:
    """The job's exit status when `exc` ends it: sys.exit(N)'s N (as Python would, but never 0: the job
    is aborted), INTERRUPTED_STATUS for Ctrl-C, 1 otherwise."""
    if isinstance(exc, SystemExit) and isinstance(exc.code, int) and not isinstance(exc.code, bool):
        return exc.code & 0xFF or 1
    return INTERRUPTED_STATUS if isinstance(exc, KeyboardInterrupt) else 1




def report_failure(rank: int, name: str, text: str = "", headline: str = "failed; ending the job") -> None:
    """Print a failing rank's report: a headline and then `text` (its traceback), each line labelled
    with the rank.

    With $NVLINK_EMU_FAILURE_DIR set (`nvlink-emu run` sets it), the report goes to a file there,
    which the launcher prints once the job has ended: a rank's stderr still in the MPI launcher's
    pipe when MPI_Abort kills the job can be lost, a file cannot. Any rank can write a file there, so
    this rank also writes FAILURE_MARK and the file's SHA-256 to its own stderr, which the MPI launcher
    labels with the rank: the launcher prints a file only if the rank it names vouched for it so."""
    prefix = f"[nvlink-emu {name}] "
    lines = text.rstrip().split("\n") if text.strip() else []
    report = f"{prefix}{headline}\n" + "".join(prefix + line + "\n" for line in lines)
    directory = os.environ.get(FAILURE_DIR_ENV)
    if directory:
        try:
            data = report.encode("utf-8", "replace")
            # a new file of its own (O_EXCL): never one another rank planted, nor through a link it planted
            fd, _ = tempfile.mkstemp(dir=directory, prefix=f"rank-{rank:05d}-", suffix=".txt")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            # a new line first: the MPI launcher labels each stretch of a rank's output but does not end
            # another rank's partial line, so the mark starts a line of its own only after one
            mark = f"\n{FAILURE_MARK}{hashlib.sha256(data).hexdigest()}\n".encode()
            os.write(2, mark)  # fd 2 itself: a workload's replacement of sys.stderr cannot hold it back
            return
        except OSError:
            pass  # an unwritable directory must not hide the report: fall back to stderr
    sys.stderr.write(report)
