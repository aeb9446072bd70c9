"""Rank output: a GPU rank's standard output in whole lines, each labelled with its GPU, so ranks never splice lines."""

import io
import os
import sys
import threading
from contextlib import contextmanager

GPU_LABEL = "[gpu {gpu}] "  # run_fabric's stdout_prefix for labelled lines (mpiexec -l's are "[3] ")


class LineWriter(io.TextIOBase):
    """A GPU rank's sys.stdout: whole lines only, each starting with `prefix` and written to `out` with
    one write, then flushed; a partial line waits for its newline (or finish()). A launcher that merges
    the ranks' output then never splices one rank's line into another's, as print()'s separate writes
    of text and end would (MPICH's hydra forwards up to 4096 bytes of a rank's at a time, measured:
    a longer line can still be cut)."""

    def __init__(self, out, prefix: str = ""):
        super().__init__()
        out.flush()  # what was printed before goes out first
        self._out = out
        self._prefix = prefix
        self._partial = ""
        self._lock = threading.Lock()  # a workload's threads print too
        try:
            self._fd = out.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (io.StringIO, a test's capture)
            self._fd = None

    @property
    def encoding(self) -> str:  # type: ignore[override]  # typeshed: a TextIOBase attribute; read-only in io's own
        return getattr(self._out, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]  # as encoding
        return getattr(self._out, "errors", None) or "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self._emit(f"{self._prefix}{line}\n")
        return len(text)

    def flush(self) -> None:
        """Nothing to do: whole lines went out as they ended, and a partial line must wait for its end."""

    def finish(self) -> None:
        """End a partial last line with a newline and write it (main returned or raised)."""
        with self._lock:
            if self._partial:
                partial, self._partial = self._partial, ""
                self._emit(f"{self._prefix}{partial}\n")

    def _emit(self, line: str) -> None:
        if self._fd is None:
            self._out.write(line)
            self._out.flush()
            return
        data = line.encode(self.encoding, self.errors)
        self._out.flush()  # anything written to `out` itself meanwhile (sys.__stdout__) stays in order
        while data:  # a pipe takes a blocking write whole; the loop is for a signal's short write
            data = data[os.write(self._fd, data):]


@contextmanager
def lines_on_stdout(prefix: str | None):
    """sys.stdout as a LineWriter with `prefix` while the block runs (None: left as it is); a partial
    last line goes out on the way out, before any failure report."""
    if prefix is None:
        yield
        return
    original = sys.stdout
    writer = LineWriter(original, prefix)
    sys.stdout = writer
    try:
        yield
    finally:
        if sys.stdout is writer:  # a workload that replaced sys.stdout for good keeps its own
            sys.stdout = original
        writer.finish()
