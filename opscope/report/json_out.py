"""Write ``scan.json`` (the machine-readable source every other report is made from)."""
from __future__ import annotations

import json
from pathlib import Path

from opscope.errors import UserError
from opscope.model import ScanResult


def write_scan_json(result: ScanResult, path: Path) -> Path:
    """Write atomically, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def read_scan_json(path: Path) -> ScanResult:
    """Load a ScanResult from a run dir or scan.json, with one-line errors for bad input."""
    from opscope.model import SCAN_SCHEMA

    path = Path(path)
    scan_path = path / "scan.json" if path.is_dir() else path
    if not path.exists():
        raise UserError(f"{path} does not exist; pass the run directory written by `opscope scan`")
    if not scan_path.is_file():
        raise UserError(f"no scan.json in {path}; run `opscope scan SCRIPT` first or pass the run directory")
    try:
        data = json.loads(scan_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{scan_path} is not valid JSON ({exc}); re-run `opscope scan` to rewrite it") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, str) or not schema.startswith(SCAN_SCHEMA.split("/")[0] + "/"):
        raise UserError(f"{scan_path} is not an opscope scan (schema {schema!r}, expected {SCAN_SCHEMA!r})")
    try:
        return ScanResult.from_dict(data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{scan_path} is a corrupt opscope scan ({exc}); re-run `opscope scan`") from None
