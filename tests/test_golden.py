"""What a scan says about the bundled examples, pinned: operators, shapes, phases, lines, verdicts,
dynamic shapes, root causes and findings (timings left out).

A refactor that changes any of it fails here, not in a user's report (the suite once missed a
regression a before/after comparison of whole scan.json files caught).  When a change is meant,
regenerate and review the diff: ``OPSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``.
The files pin the torch they were made with; under another torch the test skips (other ops).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import load_scan

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
OPERATOR_FIELDS = ("name", "overload", "input_shapes", "dtypes", "scalars", "output_shapes", "calls", "phases",
                   "sources", "library", "parent", "top_level", "children", "steps", "dynamic", "on_device",
                   "import_time", "verdict", "substitute")


def pinned(scan: dict) -> dict:
    """The parts of scan.json that must not change by accident (no times, dates or paths)."""
    operators = []
    for op in scan["operators"]:
        row = {field: op.get(field) for field in OPERATOR_FIELDS}
        row["evidence_rule"] = (op.get("evidence") or {}).get("rule")
        operators.append(row)
    operators.sort(key=lambda row: json.dumps(row, sort_keys=True))
    return {
        "torch": scan["torch_version"].split("+")[0],
        "steps": [[s["index"], s["complete"]] for s in scan["steps"]],
        "operators": operators,
        "dynamic_shapes": sorted(scan["dynamic_shapes"], key=lambda d: json.dumps(d, sort_keys=True)),
        "root_causes": sorted(scan["root_causes"], key=lambda d: json.dumps(d, sort_keys=True)),
        "findings": sorted(({k: f.get(k) for k in ("rule", "file", "line", "api", "origin", "count")}
                            for f in scan["findings"]), key=lambda d: json.dumps(d, sort_keys=True)),
        "verdict_counts": scan["summary"].get("verdict_counts"),
        "readiness_score": scan["summary"].get("readiness_score"),
    }


@pytest.mark.parametrize("fixture", ["cnn_scan", "dynamic_scan", "huber_scan"])
def test_scan_of_bundled_example_is_unchanged(fixture, request):
    got = pinned(load_scan(request.getfixturevalue(fixture)))
    path = GOLDEN / f"{fixture}.json"
    if os.environ.get("OPSCOPE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(path.read_text(encoding="utf-8"))
    if want["torch"] != got["torch"]:
        pytest.skip(f"golden files made with torch {want['torch']}, this is torch {got['torch']}")
    for key in want:
        assert got[key] == want[key], f"{fixture}: {key} changed (if meant: OPSCOPE_UPDATE_GOLDEN=1, review the diff)"
