"""Per-rank trace files: a msgpack stream of records, schema version 1 (see docs/guide/traces.md).

Every record is a map with "ev" naming it. The first is the header (schema, rank, role, fabric, config
hash, clock offset); then events; an "end" record when the rank closed cleanly. Writers take the times
they record from the caller (this module has no clock). A file cut short is read up to its last whole
record and reported as truncated.
"""

import os
import stat
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

from typing import Any

import msgpack

SCHEMA_VERSION = 1
# bytes: the largest record a reader takes (a rank's are a few hundred bytes; its end record's link counters
# a few KiB per GPU), and what it reads at a time: a file of any size is streamed through that much memory
MAX_RECORD_BYTES = 16 << 20
READ_BYTES = 1 << 20
MAX_ITEMS = 1 << 16  # entries of one list or map in a record (an end record's counters: 2 links per GPU)


def trace_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank:05d}.msgpack"


class TraceWriteError(OSError):
    """A rank's trace file could not be written (a full disk, most likely); the message names the file."""


class TraceWriter:
    """Appends records to one rank's trace file; buffered, flushed at close (and every `flush_every`).
    A failed write raises TraceWriteError."""

    def __init__(self, directory: str | Path, rank: int, header: dict[str, Any], flush_every: int = 256):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = trace_path(directory, rank)
        self._file = open(self.path, "wb")
        self._packer = msgpack.Packer(use_bin_type=True)
        self._pending: list[bytes] = []
        self._flush_every = flush_every
        self.enabled = True
        self.write({"ev": "header", "schema": SCHEMA_VERSION, "rank": rank, **header}, force=True)
        self.flush()  # a rank killed early still leaves a file that says whose it is

    def write(self, record: dict[str, Any], force: bool = False) -> None:
        if not (self.enabled or force):
            return
        self._pending.append(self._packer.pack(record))
        if len(self._pending) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            try:
                self._file.write(b"".join(self._pending))
                self._pending = []
                self._file.flush()
            except OSError as exc:
                raise TraceWriteError(exc.errno, f"cannot write trace file {self.path}: "
                                                 f"{exc.strerror or exc}") from None

    def close(self, end: dict[str, Any] | None = None) -> None:
        """Write the end record (a clean close) and close the file."""
        if end is not None:
            self.write({"ev": "end", **end}, force=True)
        self.flush()
        self._file.close()


@dataclass
class RankTrace:
    """One rank's file, read: header, events (header and end excluded), end record, and whether the
    file was cut short (an incomplete last record, or no end record)."""

    path: Path
    header: dict[str, Any]
    events: list[dict[str, Any]]
    end: dict[str, Any] | None
    truncated: bool
    problem: str = ""


def open_regular(path: Path) -> BufferedReader:
    """`path` opened for reading (binary) if it is a regular file, after a symbolic link; OSError
    otherwise, naming what it is. Never blocks: a FIFO or a device is refused from lstat/stat before
    it is opened, and opened with O_NONBLOCK in case it was swapped in between (then refused by fstat)."""
    kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
             stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}

    def check(mode: int, how: str) -> None:
        if not stat.S_ISREG(mode):
            raise OSError(f"{how}{kinds.get(stat.S_IFMT(mode), 'not a regular file')}, not a trace file: not read")

    check(os.lstat(path).st_mode if not path.is_symlink() else os.stat(path).st_mode,
          "a symbolic link to " if path.is_symlink() else "")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        check(os.fstat(fd).st_mode, "")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_trace(path: str | Path) -> RankTrace:
    """Read a rank's trace up to its last whole record, streamed (at most MAX_RECORD_BYTES of it held
    undecoded); never raises on a cut-short file, a record too large, or a file that is no regular
    file (a FIFO, a device, a symbolic link to one: not read at all, never waited on)."""
    path = Path(path)
    try:
        file = open_regular(path)
    except OSError as exc:
        return RankTrace(path, {}, [], None, True, exc.strerror or str(exc))
    records: list[dict[str, Any]] = []
    problem = ""
    with file:
        size = os.fstat(file.fileno()).st_size
        unpacker = msgpack.Unpacker(file, raw=False, strict_map_key=False, read_size=READ_BYTES,
                                    max_buffer_size=MAX_RECORD_BYTES, max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS)
        try:
            for record in unpacker:
                if not isinstance(record, dict) or "ev" not in record:
                    problem = f"record {len(records)} is not a trace record"
                    break
                records.append(record)
        except msgpack.BufferFull:
            problem = f"record {len(records)} is larger than {MAX_RECORD_BYTES} bytes: not a trace record"
        except (msgpack.UnpackException, ValueError, TypeError) as exc:  # TypeError: a map keyed by a list
            problem = f"undecodable data after record {len(records)}: {exc}"
        except OSError as exc:
            problem = f"cannot read it after record {len(records)}: {exc.strerror or exc}"
        leftover = unpacker.tell() < size if not problem else True
    header = records[0] if records and records[0]["ev"] == "header" else {}
    if not header and not problem:
        problem = "no header record"
    end = records[-1] if records and records[-1]["ev"] == "end" else None
    events = [r for r in records if r["ev"] not in ("header", "end")]
    truncated = bool(problem) or leftover or end is None
    if truncated and not problem:
        problem = (f"cut short after {len(records)} whole records" if leftover
                   else f"no end record after {len(records)} records (the rank did not close cleanly)")
    return RankTrace(path, header, events, end, truncated, problem)


def find_runs(directory: str | Path) -> list[Path]:
    """The traced runs under `directory`: itself if it holds trace files, else its subdirectories that
    do, in name order (a demo's part1-FABRIC and part2-FABRIC, a bench --compare's presets).
    FileNotFoundError if there are none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory")
    if any(directory.glob("rank-*.msgpack")):
        return [directory]
    # a symbolic link to a directory is not a run of this one (its figures would go where the link points)
    runs = sorted(d for d in directory.iterdir() if d.is_dir() and not d.is_symlink() and any(d.glob("rank-*.msgpack")))
    if not runs:
        raise FileNotFoundError(f"{directory}: no rank-*.msgpack trace files, in it or in its subdirectories")
    return runs


def read_directory(directory: str | Path) -> tuple[list[RankTrace], list[str]]:
    """The traces of one run in `directory`, in rank order, and warnings about files left out (no
    header, or from another run: another fabric or rank count). FileNotFoundError if none is usable."""
    paths = sorted(Path(directory).glob("rank-*.msgpack"))
    if not paths:
        raise FileNotFoundError(f"{directory}: no rank-*.msgpack trace files")
    traces, warnings = [], []
    for path in paths:
        trace = read_trace(path)
        if not trace.header:
            warnings.append(f"{path.name}: left out: {trace.problem or 'no header'}")
        else:
            traces.append(trace)
    if not traces:
        raise FileNotFoundError(f"{directory}: no trace file with a header ({'; '.join(warnings)})")
    first = traces[0].header
    same = [t for t in traces if (t.header.get("config_hash"), t.header.get("gpus")) ==
            (first.get("config_hash"), first.get("gpus"))]
    for trace in traces:
        if trace not in same:
            warnings.append(f"{trace.path.name}: left out: from another run (config {trace.header.get('config_hash')}, "
                            f"not {first.get('config_hash')})")
    for trace in same:
        if trace.truncated:
            warnings.append(f"{trace.path.name}: truncated: {trace.problem}")
    return same, warnings
