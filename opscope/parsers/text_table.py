"""Profiler text tables: ``prof.key_averages(group_by_input_shape=True).table()``.

The seeds' operator-extraction workflow prints one such table per step into a log,
so a log may hold several tables (each becomes one step).  Columns are located from
the dashed rule under the header, so CPU-only, CUDA and NPU layouts all parse; names
cut short by the table (``aten::max_pool2d_with_indi...``) keep their ``...`` and
are resolved against the other run by the diff.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from opscope.model import DEVICE, HOST, OpCall, Profile, Step
from opscope.parsers.base import FormatError
from opscope.parsers.rules import rules as load_rules

_RULE = re.compile(r"^-{3,}(?:\s+-{3,})+\s*$")
_UNIT = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_TIME = re.compile(r"^([0-9.]+)\s*(ns|us|ms|s)$")
_TOTAL = re.compile(r"^Self (CPU|CUDA|NPU|XPU|MTIA|PrivateUse1) time total:\s*([0-9.]+\s*(?:ns|us|ms|s))")


MAX_CALLS = 10 ** 12        # '# of Calls' per row: a million steps of a million calls; more is garbage
MAX_TIME_US = 1e18
MAX_TABLE_BYTES = 1 << 30  # a log of printed tables; beyond 1 GiB split it (memory is ~3x the file)
MAX_SHAPES_CHARS = 20_000   # an 'Input Shapes' cell; literal_eval of more would be slow, not useful


class TableFormatError(FormatError):
    """A table that cannot be read; ``where`` names the table and the line."""


def looks_like_table(head: str) -> bool:
    lines = head.splitlines()
    return any(_RULE.match(line) for line in lines) and any("Name" in line and "Calls" in line for line in lines)


def file_has_table(path, limit: int = MAX_TABLE_BYTES) -> bool:
    """``looks_like_table`` over a whole log, read line by line (memory: one line of <= 64 KiB)."""
    rule = header = False
    read = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            line = fh.readline(65536)
            if not line:
                break
            read += len(line)
            rule = rule or bool(_RULE.match(line))
            header = header or ("Name" in line and "Calls" in line)
            if (rule and header) or read > limit:
                break
    return rule and header


def _time_us(text: str) -> float | None:
    """'1.234ms' -> 1234.0 µs; None when the cell is not a time (empty, '--'); ValueError when absurd."""
    match = _TIME.match(text.strip())
    if not match:
        return None
    value = float(match.group(1)) * _UNIT[match.group(2)]   # float('1.2.3') raises ValueError
    if not value <= MAX_TIME_US:
        raise ValueError(f"time {text.strip()[:40]!r} is out of range")
    return value


def _columns(rule: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]


def _cell(line: str, span, last: bool) -> str:
    start, end = span
    return (line[start:] if last else line[start:end]).strip()


def _tables(lines: list[str]):
    """Yield (header, rows, totals) per table: header line between the first two rules."""
    i = 0
    while i < len(lines):
        if _RULE.match(lines[i]) and i + 2 < len(lines) and _RULE.match(lines[i + 2]):
            spans = _columns(lines[i])
            header = [_cell(lines[i + 1], s, k == len(spans) - 1) for k, s in enumerate(spans)]
            rows, j = [], i + 3
            while j < len(lines) and not _RULE.match(lines[j]):
                if lines[j].strip():
                    rows.append((j + 1, [_cell(lines[j], s, k == len(spans) - 1) for k, s in enumerate(spans)]))
                j += 1
            totals = {}
            k = j + 1
            while k < len(lines) and (m := _TOTAL.match(lines[k].strip())):
                try:
                    totals[m.group(1)] = _time_us(m.group(2))
                except ValueError as exc:
                    raise TableFormatError(str(exc), where=f"line {k + 1}") from None
                k += 1
            yield header, rows, totals
            i = k
        else:
            i += 1


def _index(header, *names):
    for name in names:
        if name in header:
            return header.index(name)
    return None


def load_text_table(path) -> Profile:
    """One step per table; one OpCall per row standing for its '# of Calls' (``count``), so
    memory follows the size of the log, never the call counts written in it."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise TableFormatError(f"the log is {size >> 20} MiB, over the {MAX_TABLE_BYTES >> 20} MiB a text table "
                               "may be; keep only the steps to compare (or export a Chrome trace)")
    text = path.read_text(encoding="utf-8", errors="replace")
    calls: list[OpCall] = []
    steps: list[Step] = []
    device = "cpu"
    rules = load_rules()
    for step_no, (header, rows, totals) in enumerate(_tables(text.splitlines()), start=1):
        name_i = _index(header, "Name")
        calls_i = _index(header, "# of Calls")
        if name_i is None or calls_i is None:
            raise TableFormatError("no 'Name' / '# of Calls' columns", where=f"table {step_no}")
        self_i = _index(header, "Self CPU")
        total_i = _index(header, "CPU total")
        dev_i = _index(header, "Self CUDA", "Self NPU", "Self XPU", "Self PrivateUse1", "Self Device")
        if dev_i is not None:
            device = "npu" if "NPU" in header[dev_i] or "PrivateUse1" in header[dev_i] else "cuda"
        shapes_i = _index(header, "Input Shapes")
        op_calls = 0
        for line_no, row in rows:
            try:
                count, call = _row_call(row, name_i, calls_i, self_i, total_i, dev_i, shapes_i, rules)
            except ValueError as exc:
                raise TableFormatError(str(exc), where=f"table {step_no}, line {line_no}") from None
            op_calls += count
            if call is None:
                continue
            call.step = step_no
            if call.device_time_us:
                call.device = DEVICE
            calls.append(call)
        total = totals.get("CPU") or 0.0
        steps.append(Step(index=step_no, duration_us=total, op_calls=op_calls))
    if not steps:
        raise TableFormatError("no profiler table (dashed header rule + 'Name' ... '# of Calls') found")
    prof = Profile(calls=calls, steps=steps, device=device, source_format="text-table", path=str(path))
    prof.metadata.update({"has_phases": False, "has_dtypes": False,
                          "step_time_source": "'Self CPU time total' of each table"})
    return prof


def _row_call(row, name_i, calls_i, self_i, total_i, dev_i, shapes_i, rules) -> tuple[int, OpCall | None]:
    """(count, the row as one OpCall with that count and total times); None for rows not compared."""
    cell = row[calls_i]
    if not cell.isdigit() or len(cell) > 13 or int(cell) > MAX_CALLS:
        raise ValueError(f"'# of Calls' is {cell[:40]!r}, expected a count up to {MAX_CALLS:.0e}")
    count = int(cell)
    if count <= 0 or rules.kind(row[name_i]) != "op":
        return count, None  # annotations and backend-private rows: no parent to fold into in a flat table
    self_us = (_time_us(row[self_i]) or 0.0) if self_i is not None else 0.0
    total_us = (_time_us(row[total_i]) or 0.0) if total_i is not None else self_us
    dev_us = (_time_us(row[dev_i]) or 0.0) if dev_i is not None else 0.0
    shapes = _shapes(row[shapes_i]) if shapes_i is not None and row[shapes_i] else []
    return count, OpCall(name=row[name_i], input_shapes=shapes, self_time_us=self_us, total_time_us=total_us,
                         device_time_us=dev_us, device=HOST, count=count)


def _shapes(cell: str) -> list:
    """'[[4, 3], []]' -> [[4, 3], []]; a cell cut short by the table width gives []."""
    if len(cell) > MAX_SHAPES_CHARS:
        return []
    try:
        shapes = ast.literal_eval(cell)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []  # cut short by the table width
    todo = [(shapes, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, list) and depth < 4:
            todo.extend((v, depth + 1) for v in item)
        elif not (depth > 0 and (item is None or isinstance(item, int) and not isinstance(item, bool)
                                 and abs(item) < 2 ** 63)):
            raise ValueError(f"'Input Shapes' {cell[:40]!r} is not a list of shapes")
    return shapes
