"""The processes of a job on this host and their CPU time, from Linux's /proc: what `nvlink-emu bench
--cpu` reports, and what the nvlink-emu command ends after a Ctrl-C (jobs.stop_interrupted).

Wall time on a machine with fewer cores than ranks says how long a user waits, not why: the ranks queue
for the cores. CPU time does: a job whose ranks together use `cores` seconds of CPU per second of wall
time is CPU-bound, and its wall time is its CPU time over the cores. A process's CPU time is the sum over
its threads of /proc/PID/task/TID/schedstat's first field (ns on a CPU); where that is missing, /proc/PID/
stat's utime + stime (clock ticks, 10 ms). Not on Linux (no /proc): nothing is measured (None).
"""

import os
from pathlib import Path

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def parents() -> dict[int, int]:
    """Every process's parent (pid -> ppid), from /proc; {} where there is none (not Linux)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = int(_fields(stat.read_text())[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile, or not ours to read
            continue
    return out


def job_pids() -> list[int] | None:
    """This process and the others of its job on this host: those the MPI launcher started beside it (the
    same parent) with the same command line (every rank of an nvlink-emu job runs the same command); None
    without /proc."""
    try:
        own = _read(os.getpid(), "cmdline", binary=True)
    except OSError:
        return None
    parent, pids = os.getppid(), []
    for pid, ppid in parents().items():
        try:
            if ppid == parent and _read(pid, "cmdline", binary=True) == own:
                pids.append(pid)
        except OSError:
            continue
    return sorted(pids)


def cpu_ns(pids) -> dict[int, float]:
    """CPU time each of `pids` has run so far, all its threads (ns); a process that ended is left out."""
    out = {}
    for pid in pids:
        try:
            out[pid] = float(sum(int(_read_path(task / "schedstat").split()[0])
                                 for task in Path(f"/proc/{pid}/task").iterdir()))
        except (OSError, IndexError, ValueError):
            try:
                fields = _fields(_read(pid, "stat"))
                out[pid] = (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
    return out


def _fields(stat: str) -> list[str]:
    """/proc/PID/stat's fields after "pid (comm)" (the command may hold spaces): state, ppid, ..."""
    return stat.rsplit(")", 1)[1].split()


def _read(pid: int, name: str, binary: bool = False):
    return _read_path(Path(f"/proc/{pid}/{name}"), binary)


def _read_path(path: Path, binary: bool = False):
    with open(path, "rb" if binary else "r") as f:
        return f.read()
