"""MkDocs hook: pages made from the code and data, so they cannot drift from them.

* ``<!-- opscope:cli -->`` becomes the reference of every command and option, read from the argparse
  parser that ``opscope`` itself builds (``opscope.cli.build_parser``);
* ``<!-- opscope:glossary -->`` becomes the glossary, read from ``support_matrix/glossary.yaml``, the
  file whose terms the HTML report's glossary shows too;
* ``<!-- opscope:api -->`` becomes the Python API reference, read from the docstrings and signatures of
  ``API`` (what ``import opscope`` offers).

The same functions are used by ``tests/test_docs.py``.
"""
from __future__ import annotations

import argparse
import re

CLI_MARKER = "<!-- opscope:cli -->"
GLOSSARY_MARKER = "<!-- opscope:glossary -->"
API_MARKER = "<!-- opscope:api -->"
# the public Python API, in the order the reference shows it: (name shown, "module:attribute")
API = [("opscope.scan", "opscope:scan"), ("opscope.capture", "opscope.api:capture"),
       ("opscope.load", "opscope.dataframes:load"),
       ("opscope.dataframes.Run", "opscope.dataframes:Run"), ("opscope.load_diff", "opscope.dataframes:load_diff"),
       ("opscope.dataframes.Diff", "opscope.dataframes:Diff")]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
        return None
    if action.option_strings:
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        takes_value = action.nargs != 0
        if takes_value:
            metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                         else action.dest.upper())
            names += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    else:
        names = f"`{action.metavar or action.dest}`"
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
    choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices and not isinstance(action.choices, dict) else ""
    text = parser._get_formatter()._expand_help(action) if action.help else ""   # %(default)s as --help shows it
    return f"| {names} | {_cell(text)} | {shown} | {choices} |"


def _section(path: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    anchor = path.replace(" ", "-")
    lines = [f"{'#' * level} `{path}` {{ #{anchor} }}", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    usage = parser.format_usage().strip()
    usage = re.sub(r"^usage:\s*", "", usage)
    lines += ["```text", " ".join(usage.split()), "```", ""]
    rows = [row for row in (_option_row(parser, a) for a in parser._actions) if row]
    if rows:
        lines += ["| option | what it does | default | choices |", "|---|---|---|---|", *rows, ""]
    for name, child in _subcommands(parser):
        lines += _section(f"{path} {name}", child, level + 1)
    return lines


def cli_reference() -> str:
    """Markdown of every command, its usage and options, from opscope's own parser."""
    from opscope.cli import build_parser
    parser = build_parser()
    parser.prog = "opscope"
    lines: list[str] = []
    for name, child in _subcommands(parser):
        lines += _section(f"opscope {name}", child, 2)
    return "\n".join(lines)


def glossary() -> str:
    """Markdown of support_matrix/glossary.yaml: one heading a term, under its kind, with its page."""
    from opscope.report.glossary import terms
    lines: list[str] = []
    kinds = {"verdict": "Verdicts", "root-cause": "Root-cause kinds", "concept": "Concepts"}
    every = terms()
    for kind, title in kinds.items():
        lines += [f"## {title}", ""]
        for entry in (t for t in every if t["kind"] == kind):
            lines += [f"### {entry['term']} {{ #{entry['anchor']} }}", "", entry["says"]]
            if entry.get("page"):
                lines += ["", f"More: [{entry['page']}](../{entry['page']})"]
            lines.append("")
    return "\n".join(lines)


def _resolve(target: str):
    import importlib
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _doc(obj) -> str:
    import inspect
    return inspect.cleandoc(getattr(obj, "__doc__", None) or "")


def _members(cls) -> list[tuple[str, object]]:
    """A class's public methods and properties (cached ones included), in source order."""
    return [(name, value) for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or hasattr(value, "__get__"))]


def api_reference() -> str:
    """Markdown of the public Python API, from its signatures and docstrings (``API``)."""
    import inspect
    lines: list[str] = []
    for shown, target in API:
        obj = _resolve(target)
        init = obj.__init__ if inspect.isclass(obj) else obj
        try:
            signature = str(inspect.signature(init)).replace("(self, ", "(").replace("(self)", "()")
        except (TypeError, ValueError):
            signature = "(...)"
        kind = "class" if inspect.isclass(obj) else "function"
        lines += [f"## `{shown}` {{ #{shown.replace('.', '-').lower()} }}", "", f"*{kind}*", "",
                  "```python", f"{shown}{signature}", "```", "", _doc(obj), ""]
        if inspect.isclass(obj):
            rows = []
            for name, member in _members(obj):
                what = "method" if inspect.isfunction(member) else "property"
                rows.append(f"| `{name}` | {what} | {_cell(_doc(member))} |")
            if rows:
                lines += ["| member | kind | what it is |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:   # noqa: ARG001 - mkdocs' hook signature
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if GLOSSARY_MARKER in markdown:
        markdown = markdown.replace(GLOSSARY_MARKER, glossary())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_reference())
    return markdown
