"""The one registry of report formats, and the one ``--format`` option built from it.

A reporter (like coverage.py's ``Reporter`` protocol) has a ``name`` (what ``--format``
takes), a ``file_name`` (what it writes into the output folder), the ``kind`` of result
it renders (``"scan"``: a ScanResult; ``"diff"``: a DiffResult) and ``write(result, path)``.
Every module in ``opscope/report/formats/`` lists its reporters in ``REPORTERS``; they are
found by listing that package, so adding a format is one new module there (or one
``register(...)`` call from your own code).  ``opscope scan``, ``report`` and ``diff`` all
take ``--format`` from here, so their lists can never disagree.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Reporter(Protocol):
    name: str
    file_name: str
    kind: str

    def write(self, result, path: Path) -> Path:  # pragma: no cover - protocol
        ...


@dataclass(frozen=True)
class FunctionReporter:
    """A reporter made of a write function (most formats are one)."""
    name: str
    file_name: str
    kind: str
    writer: Callable
    help: str = ""

    def write(self, result, path: Path) -> Path:
        written = self.writer(result, Path(path))
        return Path(written) if written else Path(path)


_REGISTRY: dict[tuple[str, str], Reporter] = {}
_DISCOVERED = False


def register(reporter: Reporter) -> Reporter:
    """Add (or replace) a reporter; returns it, so it can decorate a class instance."""
    if not isinstance(reporter, Reporter):
        raise TypeError(f"{reporter!r} is not a Reporter (needs name, file_name, kind and write(result, path))")
    _REGISTRY[(reporter.kind, reporter.name)] = reporter
    return reporter


def unregister(kind: str, name: str) -> None:
    _REGISTRY.pop((kind, name), None)


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    from opscope.report import formats
    for info in sorted(pkgutil.iter_modules(formats.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"opscope.report.formats.{info.name}")
        for reporter in getattr(module, "REPORTERS", ()):
            _REGISTRY.setdefault((reporter.kind, reporter.name), reporter)


def reporters(kind: str) -> dict[str, Reporter]:
    """Reporters for a kind of result, by format name, in a stable order."""
    _discover()
    found = {name: r for (k, name), r in _REGISTRY.items() if k == kind}
    return dict(sorted(found.items()))


def get(kind: str, name: str) -> Reporter:
    try:
        return reporters(kind)[name]
    except KeyError:
        raise ValueError(f"unknown report format {name!r}; choose from {', '.join(reporters(kind))}") from None


def parse_formats(text, kind: str = "scan", allow_empty: bool = False) -> tuple[str, ...]:
    """'html, xlsx' (or a list) -> ('html', 'xlsx'); ValueError naming the unknown ones and the valid list."""
    items = text if isinstance(text, (list, tuple)) else str(text or "").split(",")
    formats = tuple(dict.fromkeys(str(f).strip().lower() for f in items if str(f).strip()))
    known = reporters(kind)
    unknown = [f for f in formats if f not in known]
    if unknown or (not formats and not allow_empty):
        raise ValueError(f"unknown report format {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(known)}")
    return formats


def add_format_option(parser: argparse.ArgumentParser, kind: str, default: str, allow_empty: bool = False,
                      extra: tuple[str, ...] = ()) -> None:
    """``--format`` for a command: a comma-separated list checked against the registry at parse time
    (an unknown format is a usage error listing the valid ones).  ``extra`` are names the command
    handles itself (scan's ``sarif`` for --static-only runs)."""

    def convert(text: str) -> tuple[str, ...]:
        items = [f.strip().lower() for f in str(text).split(",") if f.strip()]
        own = [f for f in items if f in extra]
        try:
            rest = parse_formats([f for f in items if f not in extra], kind, allow_empty=allow_empty or bool(own))
        except ValueError:
            valid = ", ".join(sorted(set(reporters(kind)) | set(extra)))
            bad = ", ".join(f for f in items if f not in reporters(kind) and f not in extra) or "(none)"
            raise argparse.ArgumentTypeError(f"unknown format {bad}: choose from {valid}") from None
        return tuple(dict.fromkeys(own + list(rest)))

    convert.__name__ = "format list"
    choices = ",".join(sorted(set(reporters(kind)) | set(extra)))
    parser.add_argument("--format", type=convert, default=default, metavar="FORMATS",
                        help=f"comma-separated reports to write, from {{{choices}}} (default: {default or 'none'})")


def write(kind: str, result, out_dir: Path, formats) -> list[Path]:
    """Write each format into ``out_dir`` (each atomically); returns the paths written, in order."""
    import logging
    import time
    log = logging.getLogger("opscope.report")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    known = reporters(kind)
    written = []
    from opscope.atomic import write_failed, write_via_temp
    for name in formats:
        if name in known:
            started = time.perf_counter()
            reporter, path = known[name], out_dir / known[name].file_name
            try:  # atomically: a reader never sees half a report, a link at the path is replaced
                write_via_temp(path, lambda tmp, reporter=reporter: reporter.write(result, tmp))
            except OSError as exc:
                raise write_failed(path, exc) from None
            written.append(path)
            log.info("wrote %s (%s reporter, %.2f s)", path, name, time.perf_counter() - started)
    return written
