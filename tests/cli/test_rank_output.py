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
