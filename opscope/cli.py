"""Command-line entry point.

Each sub-command lives in ``opscope/commands/<name>.py`` and exposes
``register(subparsers)`` (adds its parser and sets ``func``).  The CLI finds them
by listing that package, so adding a command never means editing this file.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys

from opscope import commands
from opscope.errors import EXIT_INTERNAL, UserError, one_line
from opscope.version import __version__


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the option, the bad value and the valid ones (exit 2)."""

    def error(self, message: str):
        m = re.match(r"argument (?:\S+/)?(\S+): invalid choice: (.+?) \(choose from (.+)\)$", message)
        if m:
            message = f"unknown {m.group(1)} {m.group(2)}: choose from {m.group(3).replace(chr(39), '')}"
        else:
            m = re.match(r"argument (?:\S+/)?(\S+): unknown \w+ (.+)$", message)
            if m:
                message = f"unknown {m.group(1)} {m.group(2)}"
        self.exit(2, f"opscope: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="opscope",
        description="Find what will break or be slow when porting a PyTorch job to Ascend NPUs.",
    )
    parser.add_argument("--version", action="version", version=f"opscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"opscope.commands.{info.name}")
        module.register(sub)
    from opscope.commands._common import add_common, leaf_parsers
    for child in leaf_parsers(parser):  # -q/--quiet and -v/--verbose on every command
        add_common(child)
    return parser


def _logging(verbose: int) -> None:
    if verbose:
        import logging
        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO, format="opscope: %(message)s",
                            stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early = _early_capture_child(argv)
    try:
        return _run(argv, early)
    finally:
        if early is not None:
            early.discard()   # the scan never began (bad options, --help, Ctrl-C); a no-op once it did


def _early_capture_child(argv: list[str]):
    """``opscope scan``: start the capture child before anything else (``capture.processes.EarlyChild``),
    so that it imports torch while this process imports its own modules and reads the options."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    if not head or head[0] != "scan" or any(a in ("-h", "--help", "--static-only") for a in head):
        return None
    from opscope.capture.processes import EarlyChild
    return EarlyChild.start()


def _run(argv: list[str], early) -> int:
    parser = build_parser()
    rest: list[str] = []
    if "--" in argv:  # everything after `--` belongs to the user's script, untouched
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    try:
        from opscope.config import apply, find_config
        apply(parser, find_config())  # [tool.opscope] / .opscope.toml: defaults, the command line wins
        args = parser.parse_args(argv)
    except UserError as exc:
        print(f"opscope: error: {exc}", file=sys.stderr)
        return exc.exit_code
    _logging(getattr(args, "verbose", 0))
    args.early_child = early
    if rest:
        if not hasattr(args, "script_args"):
            parser.error(f"`{args.command}` takes no script arguments after `--`")
        if getattr(args, "script", "") is None:   # `opscope scan -- accelerate launch train.py ...`
            args.script, rest = rest[0], rest[1:]
        args.script_args = list(args.script_args or []) + rest
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"opscope: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("opscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in opscope: keep the traceback for the bug report
        import traceback
        traceback.print_exc()
        print(f"opscope: internal error: {exc!r} (please report this with the traceback above)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
