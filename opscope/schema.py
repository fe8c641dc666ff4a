"""The one typed loader of ``scan.json``: validate every field as the model declares it.

``report``, ``verify`` and ``diff`` (run folders) all read scan.json through
``load_scan``, so a file with a wrong type, an absurd number, hostile nesting or a
newer schema is rejected with one line naming the JSON path and the fix (exit 2)
instead of failing somewhere later.  The model's type hints are the schema: a field
``calls: int`` must hold an integer, ``steps: list[int]`` a list of integers (checked by
``opscope.typed``, which the model's section records also use).  Fields this version does
not know are kept on the records and written back unchanged.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from opscope.errors import InputError, excerpt
from opscope.model import SCAN_SCHEMA, ScanResult

# the checker's names stay importable from here (``schema.build``, ``schema.SchemaError``, the bounds)
from opscope.typed import MAX_DEPTH, MAX_FLOAT, MAX_INT, SchemaError, build, plain, value_of  # noqa: F401

MAX_SCAN_BYTES = 1 << 30     # 1 GiB: a 5,000-signature scan is ~5 MB
SCHEMA_PREFIX, _, _MAJOR = SCAN_SCHEMA.partition("/")
READS_MAJOR = int(_MAJOR)
REFIX = "re-run `opscope scan` to rewrite it"


def regular_file(path: Path, what: str = "input") -> Path:
    """``path`` if it is a readable regular file; FIFOs, devices and sockets would block or never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror})", fix=f"pass an existing {what} file") from None
    if not stat.S_ISREG(mode):
        kind = "folder" if stat.S_ISDIR(mode) else "special file (FIFO, device or socket)"
        raise InputError(path, f"is a {kind}, not a regular file", fix=f"pass the {what} file itself")
    return path


def load_scan(path) -> ScanResult:
    """A ScanResult from a run folder or its scan.json; any problem is an ``InputError``."""
    path = Path(path)
    scan_path = path / "scan.json" if path.is_dir() else path
    if not path.exists():
        raise InputError(path, "does not exist", fix="pass the run directory written by `opscope scan`")
    if path.is_dir() and not scan_path.exists():
        raise InputError(path, "has no scan.json", fix="run `opscope scan SCRIPT` first or pass the run directory")
    regular_file(scan_path, "scan.json")
    if scan_path.stat().st_size > MAX_SCAN_BYTES:
        raise InputError(scan_path, f"is larger than {MAX_SCAN_BYTES >> 20} MiB, far beyond any scan",
                         fix="pass the scan.json written by `opscope scan`")
    try:
        data = json.loads(scan_path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise InputError(scan_path, "is nested too deeply to be a scan", fix=REFIX) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(scan_path, f"is not valid JSON ({excerpt(str(exc), 120)})", fix=REFIX) from None
    except OSError as exc:
        raise InputError(scan_path, f"cannot be read ({exc.strerror})", fix="check its permissions") from None
    check_schema_version(data, scan_path)
    try:
        return build(ScanResult, data, "$")
    except SchemaError as exc:
        raise InputError(scan_path, f"corrupt scan: {exc.problem}", where=exc.where,
                         fix=f"correct that value or {REFIX}") from None


def check_schema_version(data, path) -> None:
    """Accept ``opscope.scan/N`` for every N this version reads; a newer major is refused."""
    schema = data.get("schema") if isinstance(data, dict) else None
    prefix, _, major = schema.partition("/") if isinstance(schema, str) else ("", "", "")
    if prefix != SCHEMA_PREFIX or not major.split(".")[0].isdigit():
        raise InputError(path, f"is not an opscope scan (schema {excerpt(schema)}, expected {SCAN_SCHEMA!r})",
                         fix="pass the scan.json written by `opscope scan`")
    if int(major.split(".")[0][:6]) > READS_MAJOR:
        raise InputError(path, f"was written by a newer opscope (schema {excerpt(schema)}); this opscope reads "
                               f"{SCAN_SCHEMA}", fix="upgrade opscope (pip install -U opscope) to read it")


