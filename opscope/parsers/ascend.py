"""Ascend PyTorch profiler output: ``*_ascend_pt/ASCEND_PROFILER_OUTPUT/`` folders.

``trace_view.json`` carries the host operators (with input dims/types and call
stacks), the NPU kernels and the ``async_npu`` launch flows, so it is parsed with the
common Chrome-trace builder; ``step_trace_time.csv`` adds the device-side step
breakdown (computing / communication / free).  A folder holding several
``rankN_ascend_pt`` children is a multi-rank run: one Profile per rank.
"""
from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from opscope.model import Profile
from opscope.parsers.base import FormatError
from opscope.parsers.chrome_trace import valid_rank
from opscope.parsers.events import ProfileBuilder
from opscope.parsers.stream import TraceReader

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE = "trace_view.json"
STEP_CSV = "step_trace_time.csv"
MAX_INFO_BYTES = 16 << 20   # profiler_info_N.json is a few KB
MAX_CSV_ROWS = 1_000_000    # one row per profiled step


def is_ascend_dir(path: Path) -> bool:
    return (path / OUTPUT_DIR).is_dir() or (path.name == OUTPUT_DIR and path.is_dir())


def rank_dirs(path: Path) -> list[Path]:
    """The ``*_ascend_pt`` folders directly under ``path`` (a multi-rank run), rank order."""
    found = [p for p in path.iterdir() if p.is_dir() and is_ascend_dir(p)] if path.is_dir() else []
    return sorted(found, key=lambda p: (rank_of(p) if rank_of(p) is not None else 1 << 30, p.name))


def rank_of(folder: Path) -> int | None:
    for info in folder.glob("profiler_info_*.json"):
        try:
            if info.is_file() and info.stat().st_size < MAX_INFO_BYTES:
                data = json.loads(info.read_text(encoding="utf-8"))
                rank = valid_rank(data.get("rank_id")) if isinstance(data, dict) else None
                if rank is not None:
                    return rank
        except (OSError, ValueError, RecursionError):
            pass
        rank = valid_rank(info.stem.rsplit("_", 1)[-1])
        if rank is not None:
            return rank
    match = re.search(r"rank[_-]?(\d{1,9})", folder.name)
    return int(match.group(1)) if match else None


def _step_breakdown(csv_path: Path) -> tuple[list[dict], list[str]]:
    """Rows of step_trace_time.csv (the step id as text, every other column a finite float)
    and a note per row that was skipped: the file is optional, so one bad row never
    rejects the profile."""
    if not csv_path.is_file():
        return [], []
    rows, skipped = [], []
    with open(csv_path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        for line_no, cells in enumerate(reader, start=2):
            if line_no > MAX_CSV_ROWS:
                skipped.append(f"rows after {MAX_CSV_ROWS} ignored")
                break
            if not any(c.strip() for c in cells):
                continue
            row = _breakdown_row(header, cells)
            if row is None:
                skipped.append(f"row {line_no}")
            else:
                rows.append(row)
    notes = [f"{csv_path.name}: {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''} skipped "
             "(not one step id and numbers)"] if skipped else []
    return rows, notes


def _breakdown_row(header: list[str], cells: list[str]) -> dict | None:
    if len(cells) != len(header) or not header:
        return None
    row: dict = {header[0]: cells[0].strip()[:64]}
    for key, cell in zip(header[1:], cells[1:], strict=False):
        try:
            value = float(cell) if len(cell) < 64 else math.inf
        except ValueError:
            return None
        if not math.isfinite(value) or abs(value) > 1e18:
            return None
        row[key] = value
    return row


def load_ascend(path) -> Profile:
    """One rank's folder (``rank0_ascend_pt`` or its ``ASCEND_PROFILER_OUTPUT``)."""
    path = Path(path)
    folder = path.parent if path.name == OUTPUT_DIR else path
    out = folder / OUTPUT_DIR
    trace = out / TRACE
    if not trace.is_file():
        from opscope.parsers.ascend_db import find_db
        if find_db(folder) is not None:
            return load_ascend_db(folder)
        raise FormatError(f"{TRACE} is missing from {OUTPUT_DIR} and there is no ascend_pytorch_profiler_*.db "
                          f"(export the profiler with the text or db format)", where=OUTPUT_DIR)
    builder = ProfileBuilder("ascend", folder)
    builder.add(TraceReader(trace))
    prof = builder.build()
    prof.rank = rank_of(folder)
    breakdown, notes = _step_breakdown(out / STEP_CSV)
    if breakdown:
        prof.metadata["device_step_breakdown_us"] = breakdown
    if notes:
        prof.metadata.setdefault("notes", []).extend(notes)
    return prof


def load_ascend_db(path) -> Profile:
    """A rank folder of the SQLite export, or one ``ascend_pytorch_profiler_*.db`` file."""
    from opscope.parsers.ascend_db import db_events, find_db, step_breakdown_db

    path = Path(path)
    db = find_db(path)
    if db is None:
        raise FormatError("no ascend_pytorch_profiler_*.db", where=str(path))
    folder = db.parent.parent if db.parent.name == OUTPUT_DIR else db.parent
    builder = ProfileBuilder("ascend-db", folder if path.is_dir() else db)
    try:
        builder.add(db_events(db))
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"unexpected content in the profiler database ({exc})", where=db.name) from None
    prof = builder.build()
    prof.rank = rank_of(folder)
    if prof.rank is None:
        match = re.search(r"profiler_(\d+)\.db$", db.name)
        prof.rank = int(match.group(1)) if match else None
    breakdown = step_breakdown_db(folder)
    if breakdown:
        prof.metadata["device_step_breakdown_us"] = breakdown
    return prof
