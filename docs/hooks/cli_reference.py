"""MkDocs hook: the CLI reference page (guide/cli-reference.md), generated from `nvlink-emu`'s own argparse
parser at build time, so the options are written once (launch/cli.py and launch/commands/) and the page cannot drift from them."""

import argparse

from mkdocs.structure.files import File

PAGE = "guide/cli-reference.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| option | meaning | default |", "| --- | --- | --- |"]
    for action in parser._actions:  # argparse has no public listing of its actions
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            name = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            name += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
        default = "" if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0 \
            else f"`{action.default}`"
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog} \
            if action.help and "%(" in action.help else (action.help or "")
        rows.append(f"| {name} | {_cell(help_text)} | {default} |")
    return rows


def reference() -> str:
    """The page's Markdown: the command's usage, then each subcommand's usage, description and options."""
    from nvlink_emu.launch.cli import build_parser
    parser = build_parser()
    lines = ["# CLI reference", "",
             "Generated from `nvlink-emu`'s argparse parser (`launch/cli.py`, one module per command in `launch/commands/`) when this site is built; "
             "`nvlink-emu COMMAND --help` prints the same.", "",
             "```text", parser.format_usage().strip(), "```", "", _cell(parser.description), "",
             *_option_rows(parser), ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        lines += [f"## nvlink-emu {name}", "", _cell(helps.get(name, "")), "",
                  "```text", command.format_usage().strip(), "```", ""]
        if command.description:
            lines += [_cell(command.description), ""]
        lines += [*_option_rows(command), ""]
        if command.epilog:
            lines += [_cell(command.epilog), ""]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    files.append(File.generated(config, PAGE, content=reference()))
    return files
