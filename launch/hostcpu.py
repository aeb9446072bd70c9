"""CPU time of a job's ranks on this host, from Linux's /proc: what `nvlink-emu bench --cpu` reports.

Wall time on a machine with fewer cores than ranks says how long a user waits, not why: the ranks queue
for the cores. CPU time does: a job whose ranks together use `cores` seconds of CPU per second of wall
time is CPU-bound, and its wall time is its CPU time over the cores. /proc/PID/schedstat gives each
process's time on a CPU in ns (its first field); where it is missing, /proc/PID/stat's utime + stime, in
clock ticks (10 ms). Not on Linux (no /proc): nothing is measured (None).
"""

import os

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def job_pids() -> list[int] | None:
    """This process and the others of its job on this host: those the MPI launcher started beside it (the
    same parent) with the same command line (every rank of an nvlink-emu job runs the same command); None
    without /proc."""
    try:
        own = _read(os.getpid(), "cmdline", binary=True)
    except OSError:
        return None
    parent, pids = os.getppid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if _parent(pid) == parent and _read(pid, "cmdline", binary=True) == own:
                pids.append(pid)
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return sorted(pids)


def cpu_ns(pids) -> dict[int, float]:
    """CPU time each of `pids` has run so far (ns); a process that ended is left out."""
    out = {}
    for pid in pids:
        try:
            out[pid] = float(_read(pid, "schedstat").split()[0])
        except (OSError, IndexError, ValueError):
            try:
                fields = _stat(pid)
                out[pid] = (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
    return out


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces): state, ppid, ..."""
    return _read(pid, "stat").rsplit(")", 1)[1].split()


def _read(pid: int, name: str, binary: bool = False):
    with open(f"/proc/{pid}/{name}", "rb" if binary else "r") as f:
        return f.read()
