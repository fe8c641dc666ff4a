"""Load profiles of a run from any format opscope understands, auto-detected.

``load_profile(path)`` returns one Profile; ``load_profiles(path)`` returns one per
rank when ``path`` holds several Ascend ``rankN_ascend_pt`` folders.  Unreadable,
truncated or unknown input raises ``UserError`` (exit 2) naming the file and the
accepted formats.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from opscope.errors import EXIT_USAGE, UserError

ACCEPTED = ("profiler text log (key_averages().table()), Chrome trace .json/.json.gz, "
            "Ascend *_ascend_pt folder, text or db export (or a folder of ranks), Ascend profiler .db, "
            "opscope run directory (scan.json)")


def _fail(path, problem: str) -> UserError:
    return UserError(f"{path}: {problem}; accepted inputs: {ACCEPTED}", EXIT_USAGE)


def detect_format(path) -> str:
    """'opscope-run' | 'ascend' | 'ascend-ranks' | 'ascend-db' | 'chrome-trace' | 'text-table'."""
    from opscope.parsers.ascend import is_ascend_dir, rank_dirs
    from opscope.parsers.scan_dir import is_run_dir
    from opscope.parsers.text_table import looks_like_table

    path = Path(path)
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
    with open(path, "rb") as fh:
        head = fh.read(65536)
    if head[:16] == b"SQLite format 3\x00":
        return "ascend-db"
    if head[:2] == b"\x1f\x8b":
        return "chrome-trace"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if text.lstrip()[:1] in ("{", "["):
        return "chrome-trace"
    if looks_like_table(text) or looks_like_table(path.read_text(encoding="utf-8", errors="replace")):
        return "text-table"
    raise _fail(path, "is not a format opscope can read")


def load_profiles(path) -> list:
    """Every rank's Profile (one element unless ``path`` is a multi-rank Ascend folder)."""
    from opscope.parsers.ascend import rank_dirs

    path = Path(path)
    if detect_format(path) == "ascend-ranks":
        return [load_profile(p) for p in rank_dirs(path)]
    return [load_profile(path)]


def load_profile(path):
    """One Profile from any accepted input; a multi-rank folder gives its lowest rank."""
    from opscope.parsers.stream import TraceFormatError
    from opscope.parsers.text_table import TableFormatError

    path = Path(path)
    fmt = detect_format(path)
    try:
        if fmt == "opscope-run":
            from opscope.parsers.scan_dir import load_run_dir
            return load_run_dir(path)
        if fmt == "ascend":
            from opscope.parsers.ascend import load_ascend
            return load_ascend(path)
        if fmt == "ascend-ranks":
            return load_profiles(path)[0]
        if fmt == "ascend-db":
            from opscope.parsers.ascend import load_ascend_db
            return load_ascend_db(path)
        if fmt == "chrome-trace":
            from opscope.parsers.chrome_trace import load_chrome_trace
            prof = load_chrome_trace(path)
            if not prof.calls:
                raise TraceFormatError("no operator events (cat cpu_op) in the trace")
            return prof
        from opscope.parsers.text_table import load_text_table
        return load_text_table(path)
    except (TraceFormatError, TableFormatError, FileNotFoundError, json.JSONDecodeError, sqlite3.Error,
            UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise _fail(path, f"cannot be read as {fmt} ({exc})") from None
