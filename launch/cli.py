"""The `nvlink-emu` command: its parser (one module per command, launch/commands) and its errors."""

import argparse
import sys
from importlib import metadata

from nvlink_emu.fabric.errors import ConfigError, UnsupportedOperation
from nvlink_emu.ranks.status import INTERRUPTED_STATUS

from .commands import COMMANDS
from .jobs import LAUNCHER_HELP
from .options import split_script_args


def package_version() -> str:
    try:
        return metadata.version("nvlink-emu")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvlink-emu", description="Emulated NVLink / NVLink Network fabric "
                                     "on MPI: every rank a GPU or a switch, real bytes, counted per link.",
                                     epilog=LAUNCHER_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    ours, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(ours)
    try:
        if script_args and args.command != "run":  # only a workload script has a use for them
            raise ConfigError(f"{args.command} takes no arguments after --, got {' '.join(script_args)!r} "
                              f"(only run passes them on, to its script)")
        if getattr(args, "no_label", False) and args.command in ("demo", "bench"):
            raise ConfigError(f"--no-label: {args.command}'s lines are never labelled (GPU 0 prints them all); "
                              f"it is an option of run")
        return args.handler(args, script_args)
    except KeyboardInterrupt:
        print("nvlink-emu: error: interrupted (Ctrl-C); the job was stopped", file=sys.stderr)
        return INTERRUPTED_STATUS
    except (ConfigError, FileNotFoundError) as exc:
        print(f"nvlink-emu: error: {exc}", file=sys.stderr)
        return 2
    except UnsupportedOperation as exc:
        print(f"nvlink-emu: error: UnsupportedOperation: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
