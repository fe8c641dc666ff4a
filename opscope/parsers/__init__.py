"""Load profiles of a run from any format opscope understands, auto-detected.

``load_profile(path)`` returns one Profile; ``load_profiles(path)`` returns one per
rank when ``path`` holds several Ascend ``rankN_ascend_pt`` folders.  This is the one
interface: each format has one loader (``LOADERS``) that validates as it reads and
raises ``FormatError`` with the place (event index, table line, JSON path); here that
becomes an ``InputError`` naming the file and the accepted formats: exit 2, one line.
Special files (FIFOs, devices) are refused before anything opens them.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from opscope.errors import InputError
from opscope.parsers.base import FormatError

ACCEPTED = ("profiler text log (key_averages().table()), Chrome trace .json/.json.gz, "
            "Ascend *_ascend_pt folder, text or db export (or a folder of ranks), Ascend profiler .db, "
            "opscope run directory (scan.json)")
FIX = f"accepted inputs: {ACCEPTED}"


def _fail(path, problem: str, where: str | None = None) -> InputError:
    return InputError(path, problem, where=where, fix=FIX)


def detect_format(path) -> str:
    """'opscope-run' | 'ascend' | 'ascend-ranks' | 'ascend-db' | 'chrome-trace' | 'text-table'."""
    from opscope.parsers.ascend import is_ascend_dir, rank_dirs
    from opscope.parsers.scan_dir import is_run_dir
    from opscope.parsers.text_table import file_has_table, looks_like_table
    from opscope.schema import regular_file

    path = Path(path)
    try:
        if not path.exists():
            raise _fail(path, "does not exist")
        if is_run_dir(path):
            return "opscope-run"
        if path.is_dir():
            if is_ascend_dir(path):
                return "ascend"
            if rank_dirs(path):
                return "ascend-ranks"
            raise _fail(path, "is a folder with neither scan.json nor ASCEND_PROFILER_OUTPUT")
        regular_file(path, "profile")
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if head[:16] == b"SQLite format 3\x00":
        return "ascend-db"
    if head[:2] == b"\x1f\x8b":
        return "chrome-trace"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if text.lstrip()[:1] in ("{", "["):
        return "chrome-trace"
    if looks_like_table(text) or file_has_table(path):
        return "text-table"
    raise _fail(path, "is not a format opscope can read")


def load_profiles(path) -> list:
    """Every rank's Profile (one element unless ``path`` is a multi-rank Ascend folder)."""
    from opscope.parsers.ascend import rank_dirs

    path = Path(path)
    if detect_format(path) == "ascend-ranks":
        return [load_profile(p) for p in rank_dirs(path)]
    return [load_profile(path)]


def _chrome_trace(path):
    from opscope.parsers.chrome_trace import load_chrome_trace

    prof = load_chrome_trace(path)
    if not prof.calls:
        raise FormatError("no operator events (cat cpu_op) in the trace")
    return prof


def _loaders() -> dict:
    from opscope.parsers.ascend import load_ascend, load_ascend_db
    from opscope.parsers.scan_dir import load_run_dir
    from opscope.parsers.text_table import load_text_table

    return {"opscope-run": load_run_dir, "ascend": load_ascend, "chrome-trace": _chrome_trace,
            "text-table": load_text_table, "ascend-ranks": lambda p: load_profiles(p)[0],
            "ascend-db": load_ascend_db}


def load_profile(path):
    """One Profile from any accepted input; a multi-rank folder gives its lowest rank."""
    path = Path(path)
    fmt = detect_format(path)
    try:
        return _loaders()[fmt](path)
    except FormatError as exc:
        raise _fail(path, f"cannot be read as {fmt} ({exc.problem})", where=exc.where) from None
    except UnicodeDecodeError as exc:
        raise _fail(path, f"cannot be read as {fmt} (not UTF-8 text: {exc.reason})") from None
    except OSError as exc:
        raise _fail(path, f"cannot be read as {fmt} ({exc.strerror or exc})") from None
    except sqlite3.Error as exc:
        raise _fail(path, f"cannot be read as {fmt} (SQLite: {exc})") from None
