"""The commands of `nvlink-emu`, one module each: its options (add_to) and what it does."""

from . import bench, demo, model, plan, report, run, trace

COMMANDS = (run, demo, bench, model, trace, report, plan)  # in the order --help lists them
