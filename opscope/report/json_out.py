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
    """Load a scan.json, with one-line errors for the usual ways it can be wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / "scan.json"
    if not path.exists():
        raise UserError(f"{path}: no such file; give a run directory written by `opscope scan` (it holds scan.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]}); "
                        "re-run `opscope scan` to regenerate it") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("opscope.scan/"):
        raise UserError(f"{path}: not an opscope scan.json (no 'schema: opscope.scan/N'); "
                        "give a file written by `opscope scan`")
    return ScanResult.from_dict(data)
