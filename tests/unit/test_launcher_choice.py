"""launch.mpiexec without MPI: which launcher nvlink-emu starts for which MPI library, from the
version texts the real ones print."""

import pytest

from nvlink_emu.fabric import ConfigError
from nvlink_emu.launch.mpiexec import ANY, Launcher, choose, family, library_summary

MPICH = "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\nMPICH ABI:          16:0:4\n"
OPEN_MPI = "Open MPI v4.1.5, package: Open MPI builder@host Distribution, ident: 4.1.5, repo rev: v4.1.5, Feb 23, 2023"
INTEL = "Intel(R) MPI Library 2021.10 for Linux* OS\n"
HYDRA = Launcher(("/venv/bin/mpiexec",), "HYDRA build details:\n    Version:                                 4.2.0\n"
                 "    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist\n")
ORTE = Launcher(("/usr/bin/mpiexec",), "mpiexec (OpenRTE) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/\n")
PRRTE = Launcher(("/opt/ompi5/bin/mpiexec",), "mpiexec (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n")
SRUN = Launcher(("srun",), "slurm 23.02.6\n")
WRAPPER = Launcher(("/site/bin/mpiexec",), None)  # says nothing of itself


def test_families_from_what_libraries_and_launchers_print():
    assert [family(t) for t in (MPICH, OPEN_MPI, INTEL)] == ["MPICH", "Open MPI", "MPICH"]
    assert [l.family for l in (HYDRA, ORTE, PRRTE, SRUN, WRAPPER)] == ["MPICH", "Open MPI", "Open MPI", ANY, None]
    assert (library_summary(MPICH), library_summary(OPEN_MPI)) == ("MPICH 4.2.0", "Open MPI v4.1.5")
    assert ORTE.describe() == "/usr/bin/mpiexec (mpiexec (OpenRTE) 4.1.5)"
    assert HYDRA.describe() == "/venv/bin/mpiexec (MPICH Hydra 4.2.0)"


def test_the_mpich_wheels_mpiexec_is_passed_over_for_a_site_open_mpi():
    # the cluster case: mpi4py built against Open MPI, the wheel's Hydra first in line
    assert choose(OPEN_MPI, [HYDRA, ORTE]) == ORTE
    assert choose(MPICH, [HYDRA, ORTE]) == HYDRA
    assert choose(INTEL, [ORTE, HYDRA]) == HYDRA
    assert choose(OPEN_MPI, [HYDRA, SRUN]) == SRUN  # a resource manager's launcher starts either


def test_a_launcher_that_cannot_say_is_used_only_when_none_matches():
    assert choose(OPEN_MPI, [HYDRA, WRAPPER]) == WRAPPER
    assert choose(OPEN_MPI, [WRAPPER, ORTE]) == ORTE
    assert choose("ExaMPI 1.0", [HYDRA, ORTE]) == HYDRA  # a library of no known family: the first


def test_only_launchers_of_the_other_mpi_stop_before_launching_naming_both():
    with pytest.raises(ConfigError) as error:
        choose(OPEN_MPI, [HYDRA])
    text = str(error.value)
    assert "mpi4py uses Open MPI v4.1.5" in text and "MPICH's /venv/bin/mpiexec (MPICH Hydra 4.2.0)" in text
    assert "NVLINK_EMU_MPIEXEC" in text and "\n" not in text


def test_an_override_of_the_other_mpi_is_refused():
    with pytest.raises(ConfigError, match=r"NVLINK_EMU_MPIEXEC='mpiexec' is Open MPI's launcher, .*OpenRTE.*"
                                          r"but mpi4py uses MPICH 4.2.0"):
        choose(MPICH, [Launcher(("mpiexec",), ORTE.version)], override="mpiexec")
    assert choose(MPICH, [SRUN], override="srun") == SRUN


def test_no_launcher_at_all():
    with pytest.raises(ConfigError, match=r"no mpiexec found .*pip install mpich"):
        choose(MPICH, [])
    with pytest.raises(ConfigError, match=r"no mpiexec found .*Open MPI's on PATH"):
        choose(OPEN_MPI, [])
