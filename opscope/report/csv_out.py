"""``operators.csv``: one row per operator signature, for spreadsheets and pandas."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from opscope.model import ScanResult

COLUMNS = ["name", "overload", "input_shapes", "dtypes", "calls", "self_time_us", "total_time_us",
           "device_time_us", "phase", "source", "parent", "top_level", "dynamic", "verdict", "evidence_rule",
           "substitute"]


def operators_frame(result: ScanResult) -> pd.DataFrame:
    rows = []
    for op in result.operators:
        rows.append({
            "name": op.name, "overload": op.overload, "input_shapes": json.dumps(op.input_shapes),
            "dtypes": json.dumps(op.dtypes), "calls": op.calls, "self_time_us": op.self_time_us,
            "total_time_us": op.total_time_us, "device_time_us": op.device_time_us, "phase": op.phase,
            "source": op.source, "parent": op.parent, "top_level": op.top_level, "dynamic": op.dynamic,
            "verdict": op.verdict, "evidence_rule": (op.evidence or {}).get("rule"),
            "substitute": (op.substitute or {}).get("replacement") if op.substitute else None,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def write_operators_csv(result: ScanResult, path: Path) -> Path:
    operators_frame(result).to_csv(path, index=False)
    return Path(path)
