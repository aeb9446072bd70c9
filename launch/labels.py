"""Who wrote each line of a job's output, as `nvlink-emu` tells it: from the MPI launcher's own label of
each rank's stream (Hydra's -prepend-rank), never from what a rank printed; and which failure reports a
rank vouched for on that stream."""

import hashlib
import re
from pathlib import Path

from nvlink_emu.fabric.trace import open_regular
from nvlink_emu.ranks.output import GPU_LABEL
from nvlink_emu.ranks.status import FAILURE_MARK, fabric_key, rank_name

from .mpiexec import RankLabels

MAX_REPORT_BYTES = 4 << 20  # a failure report (a traceback) longer than this is not printed
_MARK = re.compile(re.escape(FAILURE_MARK) + r"([0-9a-f]{64})")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but the tab, DEL, C1: a terminal acts on them


def escaped(text: str) -> str:
    """`text` with every control character but the tab shown as \\xNN: a rank's "\\r" (or a cursor
    movement) cannot make what it wrote next look like a line of its own, another rank's label and all."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class JobOutput:
    """The lines of one job's standard output and error, each shown with the label of the rank the MPI
    launcher says wrote it: `[gpu 3] ` for a GPU's (on stdout not with `no_label`), nothing for a
    switch's (the run's table and errors: no workload runs there). With `labels` None (a launcher
    without its own labels) the lines are shown as the ranks wrote them, the ranks labelling their own."""

    def __init__(self, labels: RankLabels | None, config, no_label: bool = False):
        self.labels, self.no_label = labels, no_label
        self.gpu_of: dict[int, int] = {}   # world rank -> GPU index, for the GPU ranks
        self.names: dict[int, set] = {}    # world rank -> the names its failure reports may give it
        for world in range(config.world_size):
            rank = fabric_key(world, config)
            if rank < config.gpus:
                self.gpu_of[world] = rank
            self.names[world] = {rank_name(rank, config, world), f"rank {world}"}
        self.vouched: dict[str, int] = {}  # SHA-256 of a failure report -> the world rank that vouched for it
        self.blank: dict[int, bool] = {}   # world rank -> its last stderr line was empty, not shown yet

    def show(self, line: str, stream: str) -> str | None:
        """The line(s) to print for `line` as it came on the job's `stream` ("out" or "err"), or None for a
        failure report's mark (kept for reports). A rank's text is shown escaped (escaped); an empty
        line of a rank's stderr is held back until its next line, and dropped if that is a mark."""
        if self.labels is None:
            return None if stream == "err" and _MARK.fullmatch(line) else line
        label = self.labels.pattern.match(line)
        if label is None or int(label.group(1)) not in self.names:
            return line  # the MPI launcher's own line (Hydra's messages): no rank wrote it
        world, text = int(label.group(1)), line[label.end():]
        held = stream == "err" and self.blank.pop(world, False)
        mark = _MARK.fullmatch(text) if stream == "err" else None
        if mark is not None:
            self.vouched.setdefault(mark.group(1), world)
            return None
        if stream == "err" and text == "":  # perhaps the new line before a mark (ranks.session.report_failure)
            self.blank[world] = True
            return self._labelled(world, "", stream) if held else None
        shown = self._labelled(world, text, stream)
        return self._labelled(world, "", stream) + "\n" + shown if held else shown

    def held(self) -> list[str]:
        """The empty stderr lines still held back (show), at the job's end: shown after all."""
        lines = [self._labelled(world, "", "err") for world in sorted(self.blank)]
        self.blank.clear()
        return lines

    def _labelled(self, world: int, text: str, stream: str) -> str:
        text = escaped(text)
        if world not in self.gpu_of or (stream == "out" and self.no_label):
            return text
        return GPU_LABEL.format(gpu=self.gpu_of[world]) + text

    def reports(self, directory) -> tuple[list[str], int]:
        """(the failure reports in `directory` to print, in rank order; how many were left out). With the
        MPI launcher's labels, a report is printed only if a rank vouched for it (its SHA-256 after
        FAILURE_MARK on its own stderr) and every line of it names that rank: a rank can write a file
        in another's name, not on another's stream. Files that are no regular file are never opened."""
        shown, left_out = [], 0
        for path in sorted(Path(directory).glob("rank-*.txt")):
            try:
                with open_regular(path) as file:
                    data = file.read(MAX_REPORT_BYTES + 1)
            except OSError:
                left_out += 1
                continue
            text = data.decode("utf-8", "replace")
            if self.labels is None:
                shown.append(text)
                continue
            world = self.vouched.get(hashlib.sha256(data).hexdigest())
            prefixes = tuple(f"[nvlink-emu {name}] " for name in self.names.get(world, ()))  # type: ignore[arg-type]  # None: no names
            # lines split at "\n" alone (as a terminal ends them), each shown escaped (escaped)
            lines = text.removesuffix("\n").split("\n")
            if len(data) <= MAX_REPORT_BYTES and prefixes and text.endswith("\n") and all(
                    line.startswith(prefixes) for line in lines):
                shown.append("".join(escaped(line) + "\n" for line in lines))
            else:
                left_out += 1
        return shown, left_out
