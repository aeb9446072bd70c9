"""The way in: `python -m launch SCRIPT` under mpiexec, the `nvlink-emu` command, reports and examples."""
