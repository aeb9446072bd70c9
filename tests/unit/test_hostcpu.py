"""launch/hostcpu.py: the CPU time of a job's processes on this host, from /proc."""

import os
import subprocess
import sys
import time

import pytest

from nvlink_emu.launch import hostcpu

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here (Linux only)")


def test_cpu_time_grows_with_work_and_a_process_that_ended_is_left_out():
    me = os.getpid()
    before = hostcpu.cpu_ns([me])[me]
    start = time.process_time()
    while time.process_time() - start < 0.05:
        pass
    after = hostcpu.cpu_ns([me])[me]
    assert after - before >= 0.04e9
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout
    assert hostcpu.cpu_ns([int(gone)]) == {}


def test_the_job_is_the_processes_of_one_parent_running_one_command():
    """Siblings that run the same command are the job's ranks (as mpiexec's proxy starts them); a sibling
    running another command, and the parent, are not. Every child stays until all have looked (a child
    that exited has no command line left)."""
    code = ("import sys; from nvlink_emu.launch import hostcpu; sys.stdin.readline(); "
            "print(hostcpu.job_pids(), flush=True); sys.stdin.read()")
    ranks = [subprocess.Popen([sys.executable, "-c", code, "rank"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    other = subprocess.Popen([sys.executable, "-c", code, "other"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    children = [*ranks, other]
    try:
        for child in children:  # all four run: now each looks
            child.stdin.write("look\n")
            child.stdin.flush()
        found = [child.stdout.readline().strip() for child in children]
    finally:
        for child in children:
            child.stdin.close()
            child.wait(timeout=60)
    assert found[:3] == [str(sorted(p.pid for p in ranks))] * 3
    assert found[3] == f"[{other.pid}]"


def test_the_process_tree_names_each_parent():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        tree = hostcpu.parents()
        assert tree[child.pid] == os.getpid() and tree[os.getpid()] == os.getppid()
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_bench_per_call_figures_and_their_line():
    """CpuMeter.per_call: CPU and wall per call from two snapshots (ns, s -> us), the switches' apart; and
    the `# cpu per call:` line bench prints from a row."""
    from nvlink_emu.launch.bench import CpuMeter
    from nvlink_emu.launch.sweeps import cpu_text
    meter = object.__new__(CpuMeter)  # its constructor is collective: only the arithmetic here
    meter.switches = [30]
    before, after = {10: 0.0, 20: 1e6, 30: 5e6}, {10: 4e6, 20: 3e6, 30: 9e6, 40: 1e9}  # 40: came later
    assert meter.per_call(before, after, 2, 0.004) == {"cpu_us": 5000.0, "switch_cpu_us": 2000.0, "wall_us": 2000.0}
    assert meter.per_call(None, after, 2) is None  # no /proc
    row = {"cpu_us": 5000.0, "switch_cpu_us": 2000.0, "cpu_wall_us": 2500.0, "sync_cpu_us": 300.0,
           "sync_wall_us": 150.0, "traced_cpu_us": 5250.0, "untraced_cpu_us": 5000.0}
    assert cpu_text(row) == ("cpu per call: 5000 us of all ranks (2000 us the switches), 2.00 cores busy; tracing "
                             "costs +5.0% CPU (bench's barrier and timing exchange taken out: 300 us of CPU and 150 "
                             "us of wall time a call)")
    assert "tracing" not in cpu_text({**row, "untraced_cpu_us": -3.0})  # noise past zero: no ratio
