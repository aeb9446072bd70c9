"""`nvlink-emu demo`: what NVLink Network changes compared with classic NVLink, with real traffic (four parts)."""

import argparse
import sys
from pathlib import Path

from nvlink_emu.fabric.errors import ConfigError

from ..compare import CompareError
from ..jobs import LAUNCHER_HELP, Progress, file_part, launch_script
from ..options import fabric_arguments, fabric_of
from ..plotting import check_plot
from .bench import print_comparison, sweep_presets

EXAMPLES = Path(__file__).parents[1] / "examples"


def add_to(sub) -> None:
    """Add the `demo` command to the subparsers `sub`."""
    demo = sub.add_parser("demo", help="what NVLink Network changes compared with classic NVLink, with real traffic",
                          epilog=LAUNCHER_HELP)
    fabric_arguments(demo)
    demo.add_argument("--plot", metavar="FILE.png", help="draw part 4's modeled step times per SuperPOD preset "
                      "into FILE (PNG; .svg and .pdf also work)")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args, script_args) -> int:
    """The demo on NVLink Network (dgx-h100 unless told otherwise), then the same on classic NVLink."""
    if getattr(args, "report_json", None) is not None:
        raise ConfigError("--report-json: the demo is several runs; write a run's report with nvlink-emu run")
    if args.plot is not None:
        check_plot(args.plot)
    network = fabric_of(args)
    classic_args = argparse.Namespace(**{**vars(args), "preset": "dgx-a100", "config": None})
    classic = fabric_of(args, "dgx-a100")
    demo = str(EXAMPLES / "demo.py")
    if args.trace_dir:  # one trace directory per part
        part1 = str(Path(args.trace_dir) / f"part1-{file_part(network.name)}")
        args = argparse.Namespace(**{**vars(args), "trace_dir": part1})
        classic_args.trace_dir = str(Path(classic_args.trace_dir) / f"part2-{file_part(classic.name)}")
    # GPU 0 tells the story: a [gpu 0] label on every line would say nothing
    args.no_label = classic_args.no_label = True
    from ..superpod_demo import PRESETS, Prediction, part4
    prediction = Prediction()  # part 4's prediction, computed meanwhile
    try:
        print(f"=== part 1: NVLink Network ({network.name}) ===", flush=True)
        status = launch_script(demo, args, script_args, network.world_size)
        if status:
            return status
        print(f"\n=== part 2: classic NVLink ({classic.name}), the same workload ===", flush=True)
        status = launch_script(demo, classic_args, script_args, classic.world_size)
        if status:
            return status
        presets = ["dgx-a100", "dgx-h100", "h100-ib"]
        print(f"\n=== part 3: the same AllReduce (float32 sum, algorithm auto) on {', '.join(presets)} ===", flush=True)
        sweep = argparse.Namespace(**{**vars(args), "collective": "allreduce", "algorithm": "auto",
                                      "min_bytes": 64 << 10, "max_bytes": 16 << 20, "factor": 16, "iters": 1,
                                      "dtype": "float32", "op": None, "trace_dir": None})
        rows, status = sweep_presets(sweep, {name: fabric_of(args, name) for name in presets})
        if status:
            return status
        print_comparison("allreduce", presets, rows, as_json=False)
        print(f"\n=== part 4: the NVLink Network across nodes: {', '.join(PRESETS)} ===", flush=True)
        return part4(args, launch_script, Progress("demo part 4", len(PRESETS)), str(EXAMPLES / "superpod_steps.py"),
                     prediction)
    except CompareError as exc:
        print(f"nvlink-emu: error: {exc}", file=sys.stderr)
        return exc.status
    finally:
        prediction.close()
