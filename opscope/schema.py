"""The one typed loader of ``scan.json``: validate every field as the model declares it.

``report``, ``verify`` and ``diff`` (run folders) all read scan.json through
``load_scan``, so a file with a wrong type, an absurd number, hostile nesting or a
newer schema is rejected with one line naming the JSON path and the fix (exit 2)
instead of failing somewhere later.  The model's type hints are the schema: a field
``calls: int`` must hold an integer, ``steps: list[int]`` a list of integers.  Fields
this version does not know are kept on the records and written back unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import types
import typing
from functools import cache
from pathlib import Path

from opscope.errors import InputError, excerpt
from opscope.model import SCAN_SCHEMA, ScanResult, _Record

MAX_DEPTH = 32               # JSON nesting anywhere in scan.json (real files stay under 8)
MAX_INT = 2 ** 63            # integers beyond a 64-bit counter are not counts, they are garbage
MAX_FLOAT = 1e300            # finite and far from overflow when summed or formatted
MAX_SCAN_BYTES = 1 << 30     # 1 GiB: a 5,000-signature scan is ~5 MB
SCHEMA_PREFIX, _, _MAJOR = SCAN_SCHEMA.partition("/")
READS_MAJOR = int(_MAJOR)
REFIX = "re-run `opscope scan` to rewrite it"


class SchemaError(ValueError):
    """A value of the wrong type or range; ``where`` is its JSON path."""

    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where, self.problem = where, problem


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
        check_sections(data)
        return build(ScanResult, data, "$")
    except SchemaError as exc:
        raise InputError(scan_path, f"corrupt scan: {exc.problem}", where=exc.where,
                         fix=f"correct that value or {REFIX}") from None


@dataclasses.dataclass
class _VerificationResultShape(_Record):
    """The fields of one ``verification.results[]`` row that the reports read (written by ``opscope verify``)."""
    op: str | None = None
    overload: str | None = None
    outcome: str | None = None
    message: str | None = None
    standard: str | None = None
    predicted_verdict: str | None = None
    disagreement: str | None = None
    metrics: dict | None = None
    input_shapes: list | None = None
    dtypes: list | None = None


@dataclasses.dataclass
class _VerificationShape(_Record):
    """``scan.json`` ``verification``: a free-form block in the model, checked here so that a malformed one
    is a one-line error at load time instead of a crash while rendering."""
    device: str | None = None
    inputs: str | None = None
    reference: str | None = None
    standards: str | None = None
    started_at: str | None = None
    seed: int | None = None
    duration_s: float | None = None
    counts: dict | None = None
    substitute_counts: dict | None = None
    results: list[_VerificationResultShape] | None = None
    substitutes: list[_VerificationResultShape] | None = None
    e2e: dict | None = None


# scan.json sections the model keeps as plain dicts, with the shape their readers rely on
SECTION_SHAPES: dict[str, type] = {"verification": _VerificationShape}


def check_sections(data: dict) -> None:
    """Validate the free-form sections of ``data`` against ``SECTION_SHAPES`` (the dicts stay as they are)."""
    for name, shape in SECTION_SHAPES.items():
        value = data.get(name)
        if value is not None:
            build(shape, value, f"$.{name}")
            for key in ("counts", "substitute_counts"):
                for k, n in (value.get(key) or {}).items():
                    if isinstance(n, bool) or not isinstance(n, int):
                        raise SchemaError(f"$.{name}.{key}.{k}", f"expected an integer, found {_kind(n)}")


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


@cache
def _hints(cls) -> tuple[dict, frozenset]:
    fields = dataclasses.fields(cls)
    required = frozenset(f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return typing.get_type_hints(cls), required


def build(cls, data, where: str):
    """An instance of the dataclass ``cls`` from ``data``, every field checked against its hint."""
    if not isinstance(data, dict):
        raise SchemaError(where, f"expected an object, found {_kind(data)}")
    hints, required = _hints(cls)
    missing = sorted(required - data.keys())
    if missing:
        raise SchemaError(where, f"missing field {missing[0]!r}")
    known, unknown = {}, {}
    for key, value in data.items():
        if key in hints:
            if value is None and hints[key] is float and key not in required:
                continue   # scan.json stores NaN as null (model._clean): the field's default stands in
            known[key] = value_of(value, hints[key], f"{where}.{key}")
        else:
            unknown[key] = plain(value, f"{where}.{key}")
    record = cls(**known)
    record.keep_unknown(unknown)
    return record


# above complexity 15: one branch per kind of type hint the schema accepts
def value_of(value, hint, where: str):  # noqa: C901
    """``value`` checked against one type hint (``str | None``, ``list[int]``, a record, ...)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options: typing.Sequence[typing.Any] = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        options = [o for o in options if o is not type(None)]
        return value_of(value, options[0], where) if len(options) == 1 else plain(value, where)
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, found {_kind(value)}")
        (item,) = typing.get_args(hint)
        return [value_of(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint is str:
        if not isinstance(value, str):
            raise SchemaError(where, f"expected a string, found {_kind(value)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise SchemaError(where, f"expected true or false, found {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(where, f"expected an integer, found {_kind(value)}")
        if abs(value) >= MAX_INT:
            raise SchemaError(where, f"integer {excerpt(value)} is out of range")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(where, f"expected a number, found {_kind(value)}")
        if not (isinstance(value, float) and math.isfinite(value) or isinstance(value, int)) \
                or abs(value) > MAX_FLOAT:
            raise SchemaError(where, f"number {excerpt(value)} is out of range")
        return value
    if hint in (list, dict):
        if not isinstance(value, hint):
            raise SchemaError(where, f"expected {'a list' if hint is list else 'an object'}, found {_kind(value)}")
        return plain(value, where)
    return plain(value, where)


def plain(value, where: str):
    """Any JSON value, checked without recursion: nesting at most MAX_DEPTH, integers in range."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(where, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= MAX_INT:
            raise SchemaError(where, f"integer {excerpt(item)} is out of range")
    return value


def _kind(value) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object"}
    return f"{names.get(type(value), type(value).__name__)} {excerpt(value, 40)}"
