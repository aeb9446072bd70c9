"""The way in: `python -m nvlink_emu.launch SCRIPT` under mpiexec, the `nvlink-emu` command, reports and examples."""
