"""Write ``scan.json`` (the machine-readable source every other report is made from)."""
from __future__ import annotations

import json
from pathlib import Path

from opscope.model import ScanResult


def write_scan_json(result: ScanResult, path: Path) -> Path:
    """Write atomically, so a reader never sees half a file."""
    from opscope.atomic import write_atomic

    return write_atomic(Path(path), json.dumps(result.to_dict(), indent=1, ensure_ascii=False))


def read_scan_json(path: Path) -> ScanResult:
    """Load a ScanResult from a run dir or scan.json: the typed loader (``opscope.schema``),
    whose every failure is a one-line ``InputError`` (exit 2)."""
    from opscope.schema import load_scan

    return load_scan(path)
