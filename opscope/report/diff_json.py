"""diff.json: the DiffResult as JSON (schema ``opscope.diff/1``)."""
from __future__ import annotations

import json
from pathlib import Path


def write_diff_json(result, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    return path
