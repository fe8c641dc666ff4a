"""``operators.csv``: one row per operator signature, for spreadsheets and pandas.

Written with the standard ``csv`` module: the scan's child process writes it right after
the run and should not pay for importing pandas.  ``pd.read_csv`` reads it back.  Text that a spreadsheet would run as a formula
(``=...``, ``@...``) is written with a leading apostrophe (``cells.csv_text``).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from opscope.model import ScanResult
from opscope.report.cells import csv_text

COLUMNS = ["name", "overload", "input_shapes", "dtypes", "calls", "self_time_us", "total_time_us",
           "device_time_us", "phase", "source", "library", "parent", "top_level", "on_device", "dynamic", "verdict",
           "evidence_rule", "substitute"]


def operator_rows(result: ScanResult) -> list[dict]:
    rows = []
    for op in result.operators:
        rows.append({
            "name": op.name, "overload": op.overload, "input_shapes": json.dumps(op.input_shapes),
            "dtypes": json.dumps(op.dtypes), "calls": op.calls, "self_time_us": op.self_time_us,
            "total_time_us": op.total_time_us, "device_time_us": op.device_time_us, "phase": op.phase,
            "source": op.source, "library": op.library, "parent": op.parent, "top_level": op.top_level, "on_device": op.on_device,
            "dynamic": op.dynamic, "verdict": op.verdict, "evidence_rule": (op.evidence or {}).get("rule"),
            "substitute": (op.substitute or {}).get("replacement") if op.substitute else None,
        })
    return rows


def write_operators_csv(result: ScanResult, path: Path) -> Path:
    from opscope.atomic import write_via_temp

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({k: csv_text(v) for k, v in row.items()} for row in operator_rows(result))
    return write_via_temp(path, write)
