"""ranks.output: a GPU rank's standard output in whole, labelled lines, one write each."""

import io
import os
import sys

import pytest

from nvlink_emu.ranks.output import GPU_LABEL, LineWriter, lines_on_stdout


@pytest.fixture
def pipe_writes(monkeypatch):
    """(a LineWriter onto a pipe labelled as GPU 3, the list of bytes each os.write call wrote)."""
    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w")
    writes = []
    real_write = os.write

    def recording_write(fd, data):
        if fd == write_end:
            writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    yield LineWriter(out, GPU_LABEL.format(gpu=3)), writes
    out.close()
    os.close(read_end)


def test_pieces_of_a_line_go_out_as_one_write(pipe_writes):
    writer, writes = pipe_writes
    print("gpu", 3, "line", 0, file=writer)  # five writes to the stream: four pieces and the end
    assert writes == [b"[gpu 3] gpu 3 line 0\n"]


def test_several_lines_in_one_write_are_one_write_each(pipe_writes):
    writer, writes = pipe_writes
    writer.write("a\nb\n\nc")
    assert writes == [b"[gpu 3] a\n", b"[gpu 3] b\n", b"[gpu 3] \n"]


def test_a_partial_line_waits_for_its_end_even_when_flushed(pipe_writes):
    writer, writes = pipe_writes
    print("progress: 10%", end="", flush=True, file=writer)
    writer.flush()
    assert writes == []
    writer.write(" 20%\n")
    assert writes == [b"[gpu 3] progress: 10% 20%\n"]


def test_finish_ends_a_partial_line_and_nothing_else(pipe_writes):
    writer, writes = pipe_writes
    writer.finish()
    assert writes == []
    writer.write("no newline")
    writer.finish()
    writer.finish()
    assert writes == [b"[gpu 3] no newline\n"]


def test_text_is_encoded_as_the_stream_encodes_it(pipe_writes):
    writer, writes = pipe_writes
    writer.write("\u00e9\u4e2d\n")
    assert writes == ["[gpu 3] \u00e9\u4e2d\n".encode(writer.encoding)]


def test_a_stream_without_a_file_gets_whole_lines_too():
    out = io.StringIO()
    writer = LineWriter(out, "")
    writer.write("one ")
    assert out.getvalue() == ""
    writer.write("line\ntwo")
    writer.finish()
    assert out.getvalue() == "one line\ntwo\n"


def test_only_text_is_written():
    with pytest.raises(TypeError, match="must be str, not bytes"):
        LineWriter(io.StringIO()).write(b"bytes")


def test_lines_on_stdout_wraps_for_the_block_and_ends_a_partial_line_when_it_raises(capsys):
    original = sys.stdout
    with pytest.raises(RuntimeError):
        with lines_on_stdout("[gpu 0] "):
            assert isinstance(sys.stdout, LineWriter)
            print("whole")
            print("partial", end="")
            raise RuntimeError("the workload failed")
    assert sys.stdout is original
    assert capsys.readouterr().out == "[gpu 0] whole\n[gpu 0] partial\n"


def test_lines_on_stdout_with_no_prefix_leaves_stdout_alone():
    original = sys.stdout
    with lines_on_stdout(None):
        assert sys.stdout is original
    assert sys.stdout is original


# -- the launcher's side: labels from the MPI launcher's own, failure reports a rank vouched for ----------
def test_each_line_is_labelled_by_the_rank_the_mpi_launcher_names_not_by_its_text():
    from nvlink_emu.fabric.config import resolve
    from nvlink_emu.launch.labels import JobOutput
    from nvlink_emu.launch.mpiexec import HYDRA_LABELS

    output = JobOutput(HYDRA_LABELS, resolve("superpod-h100-ib", None, None, 2, 2))  # world: g0 g1 leaf0 g2 g3 ...
    assert output.show("[0] hello", "out") == "[gpu 0] hello"
    assert output.show("[3] hello", "out") == "[gpu 2] hello"              # world rank 3 is GPU 2 (node 1)
    assert output.show("[2] # per-link counters", "err") == "# per-link counters"  # a switch's: no label
    assert output.show("[0] [gpu 1] forged", "out") == "[gpu 0] [gpu 1] forged"
    assert output.show("[0] [nvlink-emu gpu 1] failed", "err") == "[gpu 0] [nvlink-emu gpu 1] failed"
    assert output.show("[0] x[1] y", "out") == "[gpu 0] x[1] y"              # a label mid-line is text
    assert output.show("=== BAD TERMINATION", "out") == "=== BAD TERMINATION"  # mpiexec's own line
    assert output.show("[99] x", "out") == "[99] x"                          # no rank of this job
    assert output.show("[0] " + "nvlink-emu failure report sha256:" + "a" * 64, "out").startswith("[gpu 0] ")
    assert output.show("[3] " + "nvlink-emu failure report sha256:" + "b" * 64, "err") is None
    assert output.vouched == {"b" * 64: 3}
    # a rank's control characters are shown escaped: a "\r" cannot start what looks like another line
    assert output.show("[0] \r[gpu 1] forged\x1b[2K\x85\tend", "out") == "[gpu 0] \\x0d[gpu 1] forged\\x1b[2K\\x85\tend"
    # the empty line before a rank's mark (ranks.session.report_failure) is dropped; any other is shown
    assert output.show("[3] ", "err") is None and output.show("[3] " + "nvlink-emu failure report sha256:"
                                                               + "c" * 64, "err") is None
    assert output.show("[0] ", "err") is None and output.show("[0] ", "err") == "[gpu 0] "
    assert output.show("[0] next", "err") == "[gpu 0] \n[gpu 0] next"
    assert output.show("[1] ", "err") is None and output.held() == ["[gpu 1] "] and output.held() == []
    bare = JobOutput(HYDRA_LABELS, resolve("dgx-h100", None, 2), no_label=True)
    assert (bare.show("[1] hi", "out"), bare.show("[1] hi", "err")) == ("hi", "[gpu 1] hi")  # stderr: always


def test_a_failure_report_is_printed_only_if_the_rank_it_names_vouched_for_it(tmp_path):
    import hashlib

    from nvlink_emu.fabric.config import resolve
    from nvlink_emu.launch.labels import JobOutput
    from nvlink_emu.launch.mpiexec import HYDRA_LABELS

    def report(name, what):
        return f"[nvlink-emu {name}] failed; ending the job\n[nvlink-emu {name}] {what}\n"

    files = {"rank-00001-a.txt": report("gpu 1", "RuntimeError: real"),        # vouched for by world rank 1
             "rank-00001-b.txt": report("gpu 1", "RuntimeError: forged"),      # vouched for by rank 0, names gpu 1
             "rank-00002-c.txt": report("switch (rank 2)", "RuntimeError: unvouched"),
             "rank-00000-d.txt": report("rank 0", "SyntaxError: setup"),       # rank 0's setup failure, vouched
             # vouched, every line of it its own, but a "\r" in it would make a line look another GPU's
             "rank-00001-e.txt": report("gpu 1", "x\r[nvlink-emu gpu 0] forged").replace("\n[", "\x0b[")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    os.mkfifo(tmp_path / "rank-00003.txt")  # never opened (the launcher would wait for a writer)
    output = JobOutput(HYDRA_LABELS, resolve("dgx-h100", None, 2))
    for world, name in ((1, "rank-00001-a.txt"), (0, "rank-00001-b.txt"), (0, "rank-00000-d.txt"),
                        (1, "rank-00001-e.txt")):
        digest = hashlib.sha256(files[name].encode()).hexdigest()
        assert output.show(f"[{world}] nvlink-emu failure report sha256:{digest}", "err") is None
    shown, left_out = output.reports(tmp_path)
    assert shown == [files["rank-00000-d.txt"], files["rank-00001-a.txt"],
                     "[nvlink-emu gpu 1] failed; ending the job\\x0b[nvlink-emu gpu 1] x\\x0d[nvlink-emu gpu 0] "
                     "forged\n"] and left_out == 3
    # with a launcher that labels nothing, every regular file is printed, as the ranks wrote it
    assert JobOutput(None, resolve("dgx-h100", None, 2)).reports(tmp_path) == (
        [files[n] for n in sorted(files)], 1)
