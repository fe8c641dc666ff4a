"""Ascend PyTorch profiler output: ``*_ascend_pt/ASCEND_PROFILER_OUTPUT/`` folders.

``trace_view.json`` carries the host operators (with input dims/types and call
stacks), the NPU kernels and the ``async_npu`` launch flows, so it is parsed with the
common Chrome-trace builder; ``step_trace_time.csv`` adds the device-side step
breakdown (computing / communication / free).  A folder holding several
``rankN_ascend_pt`` children is a multi-rank run: one Profile per rank.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from opscope.model import Profile
from opscope.parsers.events import ProfileBuilder
from opscope.parsers.stream import TraceReader

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE = "trace_view.json"
STEP_CSV = "step_trace_time.csv"


def is_ascend_dir(path: Path) -> bool:
    return (path / OUTPUT_DIR).is_dir() or (path.name == OUTPUT_DIR and path.is_dir())


def rank_dirs(path: Path) -> list[Path]:
    """The ``*_ascend_pt`` folders directly under ``path`` (a multi-rank run), rank order."""
    found = [p for p in path.iterdir() if p.is_dir() and is_ascend_dir(p)] if path.is_dir() else []
    return sorted(found, key=lambda p: (_rank_of(p) if _rank_of(p) is not None else 1 << 30, p.name))


def _rank_of(folder: Path) -> int | None:
    for info in folder.glob("profiler_info_*.json"):
        try:
            rank = json.loads(info.read_text(encoding="utf-8")).get("rank_id")
            if isinstance(rank, int) and rank >= 0:
                return rank
        except (OSError, ValueError, AttributeError):
            pass
        tail = info.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            return int(tail)
    match = re.search(r"rank[_-]?(\d+)", folder.name)
    return int(match.group(1)) if match else None


def _step_breakdown(csv_path: Path) -> list[dict]:
    import pandas as pd

    if not csv_path.is_file():
        return []
    table = pd.read_csv(csv_path)
    return [{k: (v if isinstance(v, str) else float(v)) for k, v in row.items()} for row in table.to_dict("records")]


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
        raise FileNotFoundError(f"{trace} is missing and there is no ascend_pytorch_profiler_*.db "
                                f"(export the profiler with the text or db format)")
    builder = ProfileBuilder("ascend", folder)
    builder.add(TraceReader(trace))
    prof = builder.build()
    prof.rank = _rank_of(folder)
    breakdown = _step_breakdown(out / STEP_CSV)
    if breakdown:
        prof.metadata["device_step_breakdown_us"] = breakdown
    return prof


def load_ascend_db(path) -> Profile:
    """A rank folder of the SQLite export, or one ``ascend_pytorch_profiler_*.db`` file."""
    from opscope.parsers.ascend_db import db_events, find_db, step_breakdown_db

    path = Path(path)
    db = find_db(path)
    if db is None:
        raise FileNotFoundError(f"{path}: no ascend_pytorch_profiler_*.db")
    folder = db.parent.parent if db.parent.name == OUTPUT_DIR else db.parent
    builder = ProfileBuilder("ascend-db", folder if path.is_dir() else db)
    builder.add(db_events(db))
    prof = builder.build()
    prof.rank = _rank_of(folder)
    if prof.rank is None:
        match = re.search(r"profiler_(\d+)\.db$", db.name)
        prof.rank = int(match.group(1)) if match else None
    breakdown = step_breakdown_db(folder)
    if breakdown:
        prof.metadata["device_step_breakdown_us"] = breakdown
    return prof
