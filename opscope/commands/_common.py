"""One grammar for every sub-command: ``-o/--out``, ``-q/--quiet``, ``-v/--verbose``, ``--device``,
``--format`` (from the reporter registry, see ``opscope.report.registry``)."""
from __future__ import annotations

import argparse

DEVICES = ("auto", "cpu", "cuda", "npu")


def add_out(parser: argparse.ArgumentParser, help: str, default=None, required: bool = False,
            old: tuple[str, ...] = (), metavar: str = "DIR") -> None:
    """``-o/--out``; earlier spellings in ``old`` keep working but are not shown in --help."""
    parser.add_argument("-o", "--out", default=default, required=required, metavar=metavar, help=help)
    for spelling in old:
        parser.add_argument(spelling, dest="out", metavar=metavar, help=argparse.SUPPRESS)


def add_device(parser: argparse.ArgumentParser, help: str, default: str = "auto",
               choices: tuple[str, ...] = DEVICES) -> None:
    parser.add_argument("--device", default=default, type=str.lower, choices=choices, help=help)


def add_common(parser: argparse.ArgumentParser) -> None:
    """``-q/--quiet`` and ``-v/--verbose`` on a parser that lacks them."""
    known = {s for action in parser._actions for s in action.option_strings}
    if "-q" not in known and "--quiet" not in known:
        parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors and the paths written")
    if "-v" not in known and "--verbose" not in known:
        parser.add_argument("-v", "--verbose", action="count", default=0,
                            help="log what opscope does (-vv: debug)")


def leaf_parsers(parser: argparse.ArgumentParser):
    """Every parser that takes options: sub-commands and their own sub-commands (matrix build/show)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                has_children = any(isinstance(a, argparse._SubParsersAction) for a in child._actions)
                if has_children:
                    yield from leaf_parsers(child)
                yield child
