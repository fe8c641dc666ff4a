"""Write ``scan.json`` (the machine-readable source every other report is made from)."""
from __future__ import annotations

import json
from pathlib import Path

from opscope.model import ScanResult


def write_scan_json(result: ScanResult, path: Path) -> Path:
    """Write atomically, so a reader never sees half a file."""
    from opscope.atomic import write_atomic

    return write_atomic(Path(path), scan_json_text(result.to_dict()))


def scan_json_text(data: dict) -> str:
    """scan.json's text: one top-level field per line and one record (operator, step, finding ...)
    per line, each written by the json module's C encoder (``indent=`` would use its pure-Python
    one, which took longer than building the whole result on a ResNet-50 scan)."""
    fields = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            items = ",\n  ".join(json.dumps(item, ensure_ascii=False) for item in value)
            text = f"[\n  {items}\n ]"
        else:
            text = json.dumps(value, ensure_ascii=False)
        fields.append(f" {json.dumps(str(key), ensure_ascii=False)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def read_scan_json(path: Path) -> ScanResult:
    """Load a ScanResult from a run dir or scan.json: the typed loader (``opscope.schema``),
    whose every failure is a one-line ``InputError`` (exit 2)."""
    from opscope.schema import load_scan

    return load_scan(path)
