"""Rank output: each line a GPU's workload prints comes out whole, labelled with its GPU; the table goes to stderr."""

import re
import sys
import textwrap

import pytest

from cli_helpers import command, run, script

LINES = 150
# print() with several arguments makes several writes (PYTHONUNBUFFERED, as cli_helpers.run sets it):
# unwrapped, 8 ranks printing this at once spliced 2 to 19 of its 1216 lines in each of six runs here
CHATTY = textwrap.dedent(f"""
    import sys

    def main(gpu):
        for i in range({LINES}):
            print("gpu", gpu.rank, "line", i, "of", {LINES})
        print("partial", end="", flush=True)
        sys.stdout.write(" and its rest\\nno newline at the end")
""")


def entry_point(how: str, gpus: int) -> list[str]:
    if how == "nvlink-emu run":
        return [command("nvlink-emu"), "run"]
    return [command("mpiexec"), "-n", str(gpus + 1), sys.executable, "-m", "nvlink_emu.launch"]


@pytest.mark.parametrize("label", [True, False], ids=["labelled", "--no-label"])
@pytest.mark.parametrize("how", ["nvlink-emu run", "mpiexec"])
def test_every_gpu_line_comes_out_whole_and_labelled_and_the_table_goes_to_stderr(tmp_path, how, label):
    gpus = 8
    done, _ = run([*entry_point(how, gpus), script(tmp_path, CHATTY), "--gpus", str(gpus),
                   *([] if label else ["--no-label"])])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    ends = ["partial and its rest", "no newline at the end"]  # a partial last line is ended when main returns

    def expected(gpu):
        return [f"gpu {gpu} line {i} of {LINES}" for i in range(LINES)]

    if label:
        labelled = [re.fullmatch(r"\[gpu (\d)\] (.*)", line) for line in lines]
        assert all(labelled), [line for line, m in zip(lines, labelled) if not m][:5]
        for gpu in range(gpus):  # each GPU's lines whole and in order
            assert [m.group(2) for m in labelled if m.group(1) == str(gpu)] == expected(gpu) + ends
    else:
        for gpu in range(gpus):
            assert [line for line in lines if line.startswith(f"gpu {gpu} ")] == expected(gpu)
        others = sorted(line for line in lines if not line.startswith("gpu "))
        assert others == sorted(ends * gpus), others[:5]  # no line spliced into another
    assert len(lines) == gpus * (LINES + 2)
    assert "# per-link counters" in done.stderr and "# per-link counters" not in done.stdout


def test_the_label_is_a_launcher_independent_prefix(tmp_path):
    # mpiexec's own -l adds its rank tag in front: both are there, the tool's after the launcher's
    done, _ = run([command("mpiexec"), "-l", "-n", "3", sys.executable, "-m", "nvlink_emu.launch",
                   script(tmp_path, "def main(gpu):\n    print('hello')\n"), "--gpus", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["[0] [gpu 0] hello", "[1] [gpu 1] hello"]


FORGER = textwrap.dedent("""
    import hashlib, os, sys
    from nvlink_emu.ranks.transport import world_rank

    open(os.path.join({tmp!r}, f"loaded-{{world_rank()}}"), "w").close()  # which ranks run the script at all

    def main(gpu):
        print("hello")
        if gpu.rank == 0:                       # GPU 0 speaks as GPU 1 every way it can
            print("[gpu 1] forged by print")
            sys.__stdout__.write("[gpu 1] forged past the line writer\\n")
            sys.__stdout__.flush()
            os.write(1, b"a line\\n[gpu 1] forged after a newline in the same write\\n")
            os.write(2, b"[nvlink-emu gpu 1] failed; ending the job\\n")
            failures = os.environ["NVLINK_EMU_FAILURE_DIR"]
            report = "[nvlink-emu gpu 1] failed; ending the job\\n[nvlink-emu gpu 1] RuntimeError: forged\\n"
            with open(os.path.join(failures, "rank-00001.txt"), "w") as out:
                out.write(report)
            with open(os.path.join(failures, "rank-00001-vouched.txt"), "w") as out:
                out.write(report.replace("forged", "forged and vouched for"))
            digest = hashlib.sha256(report.replace("forged", "forged and vouched for").encode()).hexdigest()
            os.write(2, f"nvlink-emu failure report sha256:{{digest}}\\n".encode())  # GPU 0's word, not GPU 1's
            os.mkfifo(os.path.join(failures, "rank-00003.txt"))  # a launcher that opens it waits for ever
            # a bare carriage return: what follows must not pass for a line of GPU 1's, nor for its mark
            print("\\r[gpu 1] forged after a carriage return")
            os.write(2, f"\\r[1] nvlink-emu failure report sha256:{{digest}}\\n".encode())
            os.write(2, b"a partial line, never ended")  # GPU 2's mark below must still stand on a line of its own
        gpu.world.barrier()
        if gpu.rank == 2:
            raise RuntimeError("a real failure")
        gpu.world.barrier()
""")


def test_a_gpu_cannot_write_another_gpus_label_or_failure_report_nor_run_code_on_the_switch(tmp_path):
    gpus = 3
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, FORGER.format(tmp=str(tmp_path))), "--gpus",
                   str(gpus), "--timeout", "30"], timeout_s=90)
    assert done.returncode == 1, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert sorted(line for line in out if line.startswith("[gpu 1] ")) == ["[gpu 1] hello"]
    assert sorted(out) == sorted(["[gpu 0] hello", "[gpu 1] hello", "[gpu 2] hello",
                                  "[gpu 0] [gpu 1] forged by print", "[gpu 0] [gpu 1] forged past the line writer",
                                  "[gpu 0] a line", "[gpu 0] [gpu 1] forged after a newline in the same write",
                                  "[gpu 0] \\x0d[gpu 1] forged after a carriage return"])
    err = done.stderr.splitlines()
    assert [line for line in err if "[nvlink-emu gpu 1]" in line] == \
        ["[gpu 0] [nvlink-emu gpu 1] failed; ending the job"]  # GPU 0's line, labelled as GPU 0's
    assert err.count("[nvlink-emu gpu 2] failed; ending the job") == 1
    assert err[-2] == "[nvlink-emu gpu 2] RuntimeError: a real failure"
    assert err[-1] == ("nvlink-emu: warning: 3 failure report(s) in the ranks' directory not printed: no rank "
                       "vouched for them on its own output (any rank can write a file there)")
    # the marks are the launcher's, never shown; GPU 0's attempt at GPU 1's is GPU 0's line, its "\r" escaped
    assert [line.split("sha256")[0] for line in err if "sha256" in line] == [
        "[gpu 0] \\x0d[1] nvlink-emu failure report "]
    assert "[gpu 0] a partial line, never ended" in done.stderr
    # the script ran on the GPU ranks only: no workload code in the switch's process (world rank 3)
    assert sorted(p.name for p in tmp_path.glob("loaded-*")) == ["loaded-0", "loaded-1", "loaded-2"]
