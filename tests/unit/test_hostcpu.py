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
    running another command, and the parent, are not."""
    code = "import sys, time; time.sleep(1); from nvlink_emu.launch import hostcpu; print(hostcpu.job_pids())"
    ranks = [subprocess.Popen([sys.executable, "-c", code, "rank"], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    other = subprocess.Popen([sys.executable, "-c", code, "other"], stdout=subprocess.PIPE, text=True)
    found = [p.communicate(timeout=60)[0].strip() for p in ranks]
    assert found == [str(sorted(p.pid for p in ranks))] * 3
    assert other.communicate(timeout=60)[0].strip() == f"[{other.pid}]"
