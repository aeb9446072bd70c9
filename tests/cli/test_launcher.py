"""CLI tier: which mpiexec `nvlink-emu` starts, tested from the outside with stand-in launchers that
say they are of another MPI (Open MPI's) or of none (Slurm's srun)."""

import os
import re
import textwrap
import tomllib

from cli_helpers import ROOT, command, run

PUT_RING = str(ROOT / "launch" / "examples" / "put_ring.py")


def stand_in(tmp_path, name: str, version: str, then: str) -> str:
    """An executable `name` in tmp_path/bin: prints `version` for --version; else writes its arguments
    to tmp_path/launched and runs `then`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --version ]; then
        printf '{version}'
        exit 0
        fi
        printf "%s\\n" "$*" > {tmp_path / "launched"}
        {then}
    """))
    path.chmod(0o755)
    return str(path)


def test_an_mpiexec_of_another_mpi_stops_the_run_before_it_starts(tmp_path):
    fake = stand_in(tmp_path, "mpiexec", r"mpiexec (OpenRTE) 4.1.5\n\nReport bugs to http://www.open-mpi.org/\n",
                    "exit 0")
    done, elapsed = run([command("nvlink-emu"), "run", PUT_RING, "--gpus", "2"],
                        env=dict(os.environ, NVLINK_EMU_MPIEXEC=fake))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line, naming both and how to choose
    assert line.startswith(f"nvlink-emu: error: NVLINK_EMU_MPIEXEC='{fake}' is Open MPI's launcher, {fake} "
                           f"(mpiexec (OpenRTE) 4.1.5), but mpi4py uses MPICH ")
    assert line.endswith("each rank would start alone (world size 1); set NVLINK_EMU_MPIEXEC to a launcher of "
                         "MPICH (its mpiexec, or srun)")
    assert not (tmp_path / "launched").exists()  # asked for its version, never to launch


def test_a_launcher_of_any_mpi_and_a_matching_wrapper_are_used(tmp_path):
    srun = stand_in(tmp_path, "srun", r"slurm 23.02.6\n", f'exec {command("mpiexec")} "$@"')
    done, _ = run([command("nvlink-emu"), "run", PUT_RING, "--gpus", "2"], env=dict(os.environ, NVLINK_EMU_MPIEXEC=srun))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "launched").read_text().startswith("-n 3 ")
    # a command with options, as for `mpiexec --oversubscribe`: the options come before -n
    done, _ = run([command("nvlink-emu"), "run", PUT_RING, "--gpus", "2"],
                  env=dict(os.environ, NVLINK_EMU_MPIEXEC=f"{command('mpiexec')} -bind-to none"))
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_missing_launcher_is_one_line(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", PUT_RING, "--gpus", "2"],
                  env=dict(os.environ, NVLINK_EMU_MPIEXEC=str(tmp_path / "no-such-mpiexec")))
    assert done.returncode == 2
    assert done.stderr == (f"nvlink-emu: error: NVLINK_EMU_MPIEXEC={tmp_path / 'no-such-mpiexec'}: "
                           f"{tmp_path / 'no-such-mpiexec'} is not a command found on PATH\n")


def test_the_cluster_recipe_installs_every_dependency_but_the_mpich_wheel():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {re.split(r"[<>=!~ ]", d)[0] for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    page = (ROOT / "docs" / "guide" / "cluster.md").read_text()
    recipe = page.split("```sh\n", 1)[1].split("```", 1)[0]
    (line,) = [line for line in recipe.splitlines() if line.startswith("pip install --no-deps -e . && pip install ")]
    assert set(line.split("&& pip install ", 1)[1].split()) == wanted - {"mpich", "mpi4py"}
    assert "pip install --no-binary=mpi4py mpi4py" in recipe
    assert any(d.startswith("mpich") for d in project["dependencies"])  # a laptop's install keeps the wheel
