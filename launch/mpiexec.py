"""Which MPI launcher `nvlink-emu` starts: one of the MPI implementation that mpi4py is linked against."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nvlink_emu.fabric.errors import ConfigError

ENV = "NVLINK_EMU_MPIEXEC"
VERSION_TIMEOUT_S = 10.0  # s, for `LAUNCHER --version`; one that takes longer cannot say what it is
ANY = "any"  # the family of a launcher that starts ranks of every MPI (srun)

# A library's ranks find each other through its own process manager: MPICH and its derivatives
# (MVAPICH, Intel MPI) through Hydra's PMI, Open MPI through its own runtime (ORTE, PRRTE). Started
# by the other family's launcher, every rank is a job of its own: world size 1. Each family's words,
# as MPI_Get_library_version and `mpiexec --version` print them (lower case):
FAMILIES = {
    "Open MPI": ("open mpi", "openrte", "prrte", "spectrum mpi"),
    "MPICH": ("mpich", "mvapich", "intel(r) mpi", "hydra"),
}
# resource managers' launchers, which start the ranks of either family (PMI, PMIx)
ANY_FAMILY_WORDS = ("slurm", "flux", "aprun", "pals")


def family(text: str) -> str | None:
    """The MPI family ("Open MPI", "MPICH") that a library's or a launcher's version text names, if any."""
    lowered = text.lower()
    return next((name for name, words in FAMILIES.items() if any(w in lowered for w in words)), None)


def library_summary(text: str) -> str:
    """A library's version text in short: its first line up to a comma ("Open MPI v4.1.5", "MPICH 5.0.2")."""
    first = next((line for line in text.splitlines() if line.strip()), "unknown MPI")
    first = re.sub(r"\s*\bversion\b\s*:?\s*", " ", first, flags=re.IGNORECASE)  # "MPICH Version: 5.0.2"
    return re.sub(r"\s+", " ", first).split(",")[0].strip()


@dataclass(frozen=True)
class Launcher:
    """A way to start MPI ranks: its command (argv prefix) and what `command --version` printed
    (None: it could not say)."""

    command: tuple[str, ...]
    version: str | None

    @property
    def family(self) -> str | None:
        """"Open MPI", "MPICH", ANY (a resource manager's launcher), or None (unknown)."""
        if self.version is None:
            return None
        # families first: Hydra's --version lists "slurm" among the launchers it can use
        found = family(self.version)
        if found is None and any(w in self.version.lower() for w in ANY_FAMILY_WORDS):
            return ANY
        return found

    def describe(self) -> str:
        """Its command and, in short, its version: "/usr/bin/mpiexec (mpiexec (OpenRTE) 4.1.5)"."""
        name = shlex.join(self.command)
        if self.version is None:
            return f"{name} (which says nothing of its MPI)"
        hydra = re.search(r"HYDRA build details:\s*Version:\s*(\S+)", self.version)
        first = next((line.strip() for line in self.version.splitlines() if line.strip()), "")
        said = f"MPICH Hydra {hydra.group(1)}" if hydra else re.sub(r"\s+", " ", first)[:60]
        return f"{name} ({said})"


def probe(command: list[str]) -> Launcher:
    """The launcher `command`, asked for its --version."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        version = (done.stdout + done.stderr) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        version = None
    return Launcher(tuple(command), version)


def installed() -> list[list[str]]:
    """The mpiexecs on this machine, in the order they are tried: the one beside this Python (the mpich
    wheel's), then every one on PATH, each once."""
    found, seen = [], set()
    for directory in [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]:
        path = Path(directory or ".") / "mpiexec"
        if path.is_file() and os.access(path, os.X_OK) and path.resolve() not in seen:
            seen.add(path.resolve())
            found.append([str(path)])
    return found


def choose(library: str, candidates, override: str | None = None) -> Launcher:
    """The launcher to start for the MPI `library` (its version text).

    The first of `candidates` (Launchers, probed lazily) of the library's family or of any family
    (srun), else the first that cannot say which it is (any, if the library's family is unknown).
    ConfigError naming the library, the launchers and NVLINK_EMU_MPIEXEC if every one is of the other
    family, or there is none; `override`: the $NVLINK_EMU_MPIEXEC the one candidate came from.
    """
    wanted = family(library)
    seen = []
    for launcher in candidates:
        seen.append(launcher)
        if wanted is None or launcher.family in (wanted, ANY):
            return launcher
    unknown = next((launcher for launcher in seen if launcher.family is None), None)
    if unknown is not None:  # a wrapper script, say: it may well be the right one, and none says it is
        return unknown
    what = f"mpi4py uses {library_summary(library)}"
    if not seen:
        get = "install the mpich wheel (pip install mpich)" if wanted in ("MPICH", None) else f"put {wanted}'s on PATH"
        raise ConfigError(f"no mpiexec found ({what}): {get} or set {ENV} to the command that starts MPI ranks "
                          f"(e.g. srun)")
    alone = f"each rank would start alone (world size 1); set {ENV} to a launcher of {wanted} (its mpiexec, or srun)"
    if override is not None:
        raise ConfigError(f"{ENV}={override!r} is {seen[0].family}'s launcher, {seen[0].describe()}, but {what}: {alone}")
    found = "; ".join(f"{launcher.family}'s {launcher.describe()}" for launcher in seen)
    raise ConfigError(f"{what}, but every mpiexec found is of another MPI: {found}; {alone}")


@cache
def launcher() -> Launcher:
    """The MPI launcher: $NVLINK_EMU_MPIEXEC (e.g. "srun" or "mpiexec --oversubscribe"), else an installed
    mpiexec (see installed) of the MPI library mpi4py is linked against (choose)."""
    from nvlink_emu.ranks.transport import mpi_library_version  # loads the MPI library

    override = os.environ.get(ENV)
    if override:
        command = shlex.split(override)
        if shutil.which(command[0]) is None:
            raise ConfigError(f"{ENV}={override}: {command[0]} is not a command found on PATH")
        return choose(mpi_library_version(), [probe(command)], override)
    return choose(mpi_library_version(), (probe(c) for c in installed()))


def mpiexec_command() -> list[str]:
    """The MPI launcher's command (see launcher)."""
    return list(launcher().command)


@dataclass(frozen=True)
class RankLabels:
    """How a launcher labels each rank's lines itself: the option that asks for it, and the label's
    pattern at the start of a line (group 1: the MPI world rank)."""

    option: tuple[str, ...]
    pattern: re.Pattern


# Hydra (MPICH's mpiexec) puts "[RANK] " before every stretch of a rank's output that starts a line of it,
# whatever the rank wrote, but does not end another rank's partial line first (measured: rank 0's
# "partial" with no newline, then rank 1's line, shows as "[0] partial[1] line"): every line of the merged
# stream starts with the label of a rank that wrote in it, and a line that must stand alone (a failure
# report's mark) is written after a newline of its own (ranks.session.report_failure)
HYDRA_LABELS = RankLabels(("-prepend-rank",), re.compile(r"\[(\d{1,7})\] "))


def rank_labels() -> RankLabels | None:
    """The launcher's own labelling of each rank's output, for the launchers known to have one (Hydra:
    the MPICH family's mpiexec); None for the others, whose ranks' lines are what the ranks wrote."""
    return HYDRA_LABELS if launcher().family == "MPICH" else None
