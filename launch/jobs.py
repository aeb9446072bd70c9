"""Running a job: a script under mpiexec on a fabric's world size, its lines labelled and its failing ranks'
tracebacks shown, and ended cleanly on Ctrl-C; progress lines for the commands that run several."""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from nvlink_emu.ranks.status import FAILURE_DIR_ENV

from . import hostcpu
from .labels import JobOutput
from .mpiexec import ENV as MPIEXEC_ENV
from .mpiexec import mpiexec_command, rank_labels
from .options import fabric_of, prepare_trace_dir

INTERRUPT_GRACE_S = 10.0  # s, for mpiexec to end its ranks after Ctrl-C before it is killed
LAUNCHER_HELP = (f"The MPI launcher: ${MPIEXEC_ENV} if set (e.g. srun, or \"mpiexec --oversubscribe\" for Open "
                 f"MPI), else the first mpiexec of the MPI library mpi4py uses, beside this Python (the mpich "
                 f"wheel's) or on PATH; with none, nvlink-emu stops before launching and says so.")


def launch_script(script: str, args: argparse.Namespace, script_args: list[str], world_size: int,
                  on_line=None, quiet: bool = False) -> int:
    """Run `python -m nvlink_emu.launch SCRIPT` on `world_size` ranks; returns mpiexec's exit status.
    With `on_line`, every line of the job's standard output goes to on_line(line) as it comes, instead
    of to ours; with `quiet`, its standard error (the link table) is shown only if the job fails.
    Each line is labelled here from the MPI launcher's label of the rank that wrote it (labels.JobOutput),
    and a failing rank's report printed only if that rank vouched for it."""
    labels = rank_labels()
    no_label = getattr(args, "no_label", False)
    output = JobOutput(labels, fabric_of(args), no_label)
    cmd = [*mpiexec_command(), *(labels.option if labels else ()), "-n", str(world_size), sys.executable, "-m",
           "nvlink_emu.launch", script, "--timeout", str(args.timeout)]
    for flag in ("preset", "config", "faults", "software", "gpus", "nodes", "gpus_per_node", "trace_dir", "report_json"):
        value = getattr(args, flag, None)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if no_label or labels is not None:  # with the launcher's labels, the ranks' lines come bare and are labelled here
        cmd.append("--no-label")
    if getattr(args, "mpi4py", False):
        cmd.append("--mpi4py")
    if script_args:
        cmd += ["--", *script_args]
    # the environment as it is: the ranks import the installed nvlink_emu, and nothing else of ours (the
    # repo's folders on PYTHONPATH would shadow a user's own `fabric`, `ranks` or `launch`)
    env = dict(os.environ)
    if getattr(args, "trace_dir", None) is not None:
        prepare_trace_dir(args.trace_dir)  # a bad one is one line here, not a traceback from every rank
    with tempfile.TemporaryDirectory(prefix="nvlink-emu-failures-") as failures:
        env[FAILURE_DIR_ENV] = failures  # failing ranks leave their tracebacks here (ranks.session)
        held, job = [], None  # held: the quiet job's standard error

        def errors():  # drained beside stdout, or a full pipe would stop the job
            def lines():
                for raw in job.stderr:
                    yield output.show(decoded(raw), "err")
                yield from output.held()  # after the job's last line: an empty line held back is shown

            for line in lines():
                if line is None:
                    continue
                if quiet:
                    held.append(line + "\n")
                else:
                    sys.stderr.write(line + "\n")
                    sys.stderr.flush()

        try:
            # bytes, split at b"\n" alone: text mode's universal newlines would split at a rank's bare "\r",
            # and what follows it would pass for a line of its own, the launcher's label of another rank and all
            with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as job:
                drain = threading.Thread(target=errors, daemon=True)
                drain.start()
                try:
                    assert job.stdout is not None  # stdout=PIPE
                    for raw in job.stdout:
                        line = output.show(decoded(raw), "out")
                        if on_line is not None:
                            on_line(line)
                        else:
                            print(line, flush=True)
                    job.wait()
                    drain.join()
                except KeyboardInterrupt:
                    stop_interrupted(job)
                    # the job has ended: its stderr ends too; leaving the `with` first would close the pipe
                    # under the draining thread (a traceback of that thread on a Ctrl-C sent to the process group)
                    drain.join(timeout=INTERRUPT_GRACE_S)
                    raise
        finally:  # even when interrupted: a rank's traceback is the one thing worth keeping
            if quiet and job is not None and job.returncode != 0:  # None: interrupted
                sys.stderr.write("".join(held))
            reports, left_out = output.reports(failures)
            for report in reports:
                sys.stderr.write(report)
            if left_out:
                print(f"nvlink-emu: warning: {left_out} failure report(s) in the ranks' directory not printed: no "
                      f"rank vouched for them on its own output (any rank can write a file there)", file=sys.stderr)
    return job.returncode


def decoded(raw: bytes) -> str:
    """A line of the job's output as text: UTF-8 (a byte that is none shown as U+FFFD), its b"\n" cut."""
    return raw.decode("utf-8", "replace").removesuffix("\n")


def stop_interrupted(job: subprocess.Popen) -> None:
    """End mpiexec after Ctrl-C. A terminal's Ctrl-C reached it too, and it passes SIGINT on to every
    rank, which then ends at once; a SIGINT sent to this command alone did not, so pass it on. Kill
    mpiexec if the job has not ended within INTERRUPT_GRACE_S, or at a second Ctrl-C."""
    try:
        try:
            job.wait(timeout=1.0)  # a second SIGINT would make mpiexec kill the ranks mid-report
            return
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGINT)
        job.wait(timeout=INTERRUPT_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        ranks = _descendants(job.pid)  # before mpiexec dies: then its ranks are reparented out of reach
        job.kill()
        job.wait()
        for pid in ranks:  # ranks that outlive mpiexec hold this command's output open: a caller waits for ever
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already, or not ours
                pass


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (mpiexec's proxies and ranks on this host), from /proc; [] where there
    is none (not Linux)."""
    children: dict[int, list[int]] = {}
    for child, parent in hostcpu.parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def file_part(name: str) -> str:
    """A fabric's name as part of a file name: its letters, digits, '.', '-' and '_', each other
    character '_', at most 64, never "." or ".." (a name comes from a TOML file: it is never joined into a
    path as it is)."""
    part = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64]
    return part if part.strip(".") else "_" + part


class Progress:
    """Progress of work that prints nothing for a while: a line per step on stderr (whole lines, as
    the ranks' own lines - a link table after each job - share that stream)."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done = what, total, 0
        self.start = time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        print(f"nvlink-emu: {self.what}: {self.done}/{self.total} {text} ({time.monotonic() - self.start:.0f} s)",
              file=sys.stderr, flush=True)
