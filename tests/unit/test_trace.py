"""Trace files: schema round trip, cut-short files read up to their last whole record."""

import errno
import os

import msgpack
import pytest

from nvlink_emu.fabric.trace import MAX_RECORD_BYTES, SCHEMA_VERSION, TraceWriteError, TraceWriter, read_directory, read_trace, trace_path


def write_run(tmp_path, events, end=True, rank=3):
    writer = TraceWriter(tmp_path, rank, {"role": "gpu", "clock_offset_s": 12.5}, flush_every=2)
    for event in events:
        writer.write(event)
    writer.close({"m": 42.0} if end else None)
    return trace_path(tmp_path, rank)


EVENTS = [{"ev": "tx", "link": "gpu3->sw0", "seq": i, "payload": 100 * i, "raw": 100 * i + 16, "wall": 1.0 + i,
           "m_start": 0.5 * i, "m_end": 0.5 * i + 0.25, "kind": "PUT"} for i in range(10)]


def test_round_trip_keeps_every_record_and_the_schema(tmp_path):
    path = write_run(tmp_path, EVENTS)
    assert path.name == "rank-00003.msgpack"
    trace = read_trace(path)
    assert trace.header == {"ev": "header", "schema": SCHEMA_VERSION, "rank": 3, "role": "gpu", "clock_offset_s": 12.5}
    assert trace.events == EVENTS
    assert trace.end == {"ev": "end", "m": 42.0}
    assert not trace.truncated and trace.problem == ""


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_file_cut_mid_record_is_read_to_its_last_whole_record(tmp_path, cut):
    path = write_run(tmp_path, EVENTS)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    trace = read_trace(path)
    assert trace.truncated and "cut short" in trace.problem
    assert trace.end is None
    assert trace.events == EVENTS[:len(trace.events)] and len(trace.events) >= 8


def test_a_rank_that_did_not_close_is_reported(tmp_path):
    trace = read_trace(write_run(tmp_path, EVENTS[:3], end=False))
    assert trace.truncated and "no end record" in trace.problem and trace.events == EVENTS[:3]


def test_garbage_is_a_problem_not_a_crash(tmp_path):
    path = tmp_path / "rank-00000.msgpack"
    path.write_bytes(msgpack.packb([1, 2, 3]) + b"\xc1\xc1\xc1")
    trace = read_trace(path)
    assert trace.truncated and trace.problem and trace.events == []


@pytest.mark.parametrize("data", [b"\x81\x91\x01\x02",  # a map keyed by a list: msgpack raises TypeError
                                  b"\xa2\xff\xfe"])  # a string that is no UTF-8
def test_undecodable_data_is_the_files_problem_not_a_crash(tmp_path, data):
    path = write_run(tmp_path, EVENTS[:2], end=False)
    path.write_bytes(path.read_bytes() + data)
    trace = read_trace(path)
    assert trace.truncated and trace.problem.startswith("undecodable data after record 3")
    assert trace.events == EVENTS[:2]


def test_a_disabled_writer_keeps_header_and_end_only(tmp_path):
    writer = TraceWriter(tmp_path, 0, {"role": "switch"})
    writer.enabled = False
    writer.write({"ev": "tx"})
    writer.close({"m": 1.0})
    trace = read_trace(trace_path(tmp_path, 0))
    assert trace.events == [] and trace.end is not None and not trace.truncated


def test_read_directory_orders_ranks_and_needs_files(tmp_path):
    for rank in (2, 0, 1):
        write_run(tmp_path, [], rank=rank)
    traces, warnings = read_directory(tmp_path)
    assert [t.header["rank"] for t in traces] == [0, 1, 2] and warnings == []
    with pytest.raises(FileNotFoundError, match="no rank"):
        read_directory(tmp_path / "empty")


def test_read_directory_leaves_out_headerless_files_and_other_runs(tmp_path):
    for rank in (0, 1):
        writer = TraceWriter(tmp_path, rank, {"role": "gpu", "config_hash": "aaa", "gpus": 2})
        writer.close({"m": 1.0})
    (tmp_path / "rank-00002.msgpack").write_bytes(b"")              # a rank killed before its header
    other = TraceWriter(tmp_path, 3, {"role": "gpu", "config_hash": "bbb", "gpus": 3})
    other.close({"m": 1.0})                                         # left over from another run
    traces, warnings = read_directory(tmp_path)
    assert [t.header["rank"] for t in traces] == [0, 1]
    assert any("rank-00002.msgpack: left out" in w for w in warnings)
    assert any("rank-00003.msgpack: left out: from another run" in w for w in warnings)
    (tmp_path / "rank-00000.msgpack").write_bytes(b"")
    (tmp_path / "rank-00001.msgpack").write_bytes(b"")
    (tmp_path / "rank-00003.msgpack").write_bytes(b"\xc1")
    with pytest.raises(FileNotFoundError, match="no trace file with a header"):
        read_directory(tmp_path)


def test_the_header_is_on_disk_before_any_event(tmp_path):
    writer = TraceWriter(tmp_path, 5, {"role": "switch"})
    writer.write({"ev": "tx"})
    assert read_trace(trace_path(tmp_path, 5)).header["rank"] == 5  # not closed yet, header already written


class FullDisk:
    """A file on a disk that has just filled up."""

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass


def test_a_failed_write_is_a_trace_write_error_naming_the_file(tmp_path):
    writer = TraceWriter(tmp_path, 2, {"role": "gpu"}, flush_every=2)
    writer._file = FullDisk()
    writer.write({"ev": "tx"})
    with pytest.raises(TraceWriteError) as info:
        writer.write({"ev": "rx"})  # the second record fills the buffer: the flush fails
    assert str(info.value) == f"[Errno 28] cannot write trace file {tmp_path / 'rank-00002.msgpack'}: No space left on device"
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC


def test_a_valid_trace_over_100_mib_is_read_streamed(tmp_path):
    # msgpack's Unpacker fed a whole file holds at most 100 MiB: a longer run's trace raised BufferFull
    writer = TraceWriter(tmp_path, 0, {"role": "gpu"}, flush_every=1)
    note = "n" * (1 << 20)
    for i in range(101):
        writer.write({"ev": "note", "i": i, "text": note})
    writer.close({"m": 1.0})
    assert trace_path(tmp_path, 0).stat().st_size > 101 << 20
    trace = read_trace(trace_path(tmp_path, 0))
    assert not trace.truncated and [e["i"] for e in trace.events] == list(range(101)) and trace.end["m"] == 1.0


def test_a_record_larger_than_any_rank_writes_ends_the_read_there(tmp_path):
    writer = TraceWriter(tmp_path, 0, {"role": "gpu"}, flush_every=1)
    writer.write({"ev": "tx", "seq": 0})
    writer.write({"ev": "note", "text": b"x" * (MAX_RECORD_BYTES + 1)})
    writer.close({"m": 1.0})
    trace = read_trace(trace_path(tmp_path, 0))
    assert trace.truncated and trace.events == [{"ev": "tx", "seq": 0}]
    assert trace.problem == f"record 2 is larger than {MAX_RECORD_BYTES} bytes: not a trace record"


def test_a_fifo_a_device_or_a_directory_named_like_a_trace_is_not_read_nor_waited_on(tmp_path):
    os.mkfifo(tmp_path / "rank-00000.msgpack")          # open() of it would wait for a writer for ever
    (tmp_path / "rank-00001.msgpack").symlink_to("/dev/zero")  # reading it would never end
    (tmp_path / "rank-00002.msgpack").mkdir()
    (tmp_path / "rank-00003.msgpack").symlink_to(tmp_path / "missing")
    problems = [read_trace(tmp_path / f"rank-0000{r}.msgpack").problem for r in range(4)]
    assert problems == ["a FIFO, not a trace file: not read",
                        "a symbolic link to a character device, not a trace file: not read",
                        "a directory, not a trace file: not read", "No such file or directory"]
    write_run(tmp_path, [], rank=4)  # a symbolic link to a trace file is read as the file
    (tmp_path / "rank-00005.msgpack").symlink_to(tmp_path / "rank-00004.msgpack")
    assert read_trace(tmp_path / "rank-00005.msgpack").header["rank"] == 4
