"""`nvlink-emu run SCRIPT`: a workload script on every GPU of a fabric, or once per preset with --compare."""

import sys

from nvlink_emu.fabric.errors import ConfigError

from ..compare import CompareError, compare_presets, run_compare
from ..jobs import LAUNCHER_HELP, Progress, launch_script
from ..options import fabric_arguments, fabric_of, mpi4py_argument


def add_to(sub) -> None:
    """Add the `run` command to the subparsers `sub`."""
    run = sub.add_parser("run", help="run SCRIPT's main(gpu) on every GPU of a fabric",
                         usage="nvlink-emu run SCRIPT.py [options] [-- ARGS ...]",
                         epilog=f"ARGS: what follows -- reaches the script as sys.argv[1:]. {LAUNCHER_HELP}")
    run.add_argument("script", help="Python file defining main(gpu), or with --mpi4py an mpi4py program")
    fabric_arguments(run)
    mpi4py_argument(run)
    run.add_argument("--compare", metavar="P1,P2,...", help="run SCRIPT once per preset and print its modeled "
                     "step time (GPU 0's step_ns= lines), link bytes and time relative to the first preset")
    run.add_argument("--plot", metavar="FILE.png", help="with --compare: the bar chart of the step times (default "
                     "SCRIPT-compare.png in the current directory; .svg and .pdf also work)")
    run.add_argument("--project-nodes", type=int, metavar="N", help="with --compare: also each step "
                     "projected by the cost model to N nodes of the same GPUs per node (compute kept, GPU 0's "
                     "collective calls re-timed) with its communication share")
    run.set_defaults(handler=cmd_run)


def cmd_run(args, script_args) -> int:
    """SCRIPT on one fabric, or with --compare once per preset and their step times side by side."""
    if args.compare:
        progress = Progress("run --compare", len(compare_presets(args.compare)))
        try:
            return run_compare(args, script_args, launch_script, progress)
        except CompareError as exc:
            print(f"nvlink-emu: error: {exc}", file=sys.stderr)
            return exc.status
    if args.plot is not None:
        raise ConfigError("--plot: draws the step times of --compare; give --compare P1,P2,... too")
    if args.project_nodes is not None:
        raise ConfigError("--project-nodes: projects the step times of --compare; give --compare P1,P2,... too")
    config = fabric_of(args)
    return launch_script(args.script, args, script_args, config.world_size)
