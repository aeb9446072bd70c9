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
    assert writes == [f"[gpu 3] \u00e9\u4e2d\n".encode(writer.encoding)]


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
