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

from opscope.model import OpCall, Profile, Step
from opscope.parsers.rules import rules as load_rules

_RULE = re.compile(r"^-{3,}(?:\s+-{3,})+\s*$")
_UNIT = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_TIME = re.compile(r"^([0-9.]+)\s*(ns|us|ms|s)$")
_TOTAL = re.compile(r"^Self (CPU|CUDA|NPU|XPU|MTIA|PrivateUse1) time total:\s*([0-9.]+\s*(?:ns|us|ms|s))")


class TableFormatError(ValueError):
    pass


def looks_like_table(head: str) -> bool:
    lines = head.splitlines()
    return any(_RULE.match(line) for line in lines) and any("Name" in line and "Calls" in line for line in lines)


def _time_us(text: str) -> float | None:
    match = _TIME.match(text.strip())
    return float(match.group(1)) * _UNIT[match.group(2)] if match else None


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
                    rows.append([_cell(lines[j], s, k == len(spans) - 1) for k, s in enumerate(spans)])
                j += 1
            totals = {}
            k = j + 1
            while k < len(lines) and _TOTAL.match(lines[k].strip()):
                m = _TOTAL.match(lines[k].strip())
                totals[m.group(1)] = _time_us(m.group(2))
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
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    calls: list[OpCall] = []
    steps: list[Step] = []
    device = "cpu"
    rules = load_rules()
    for step_no, (header, rows, totals) in enumerate(_tables(text.splitlines()), start=1):
        name_i = _index(header, "Name")
        calls_i = _index(header, "# of Calls")
        if name_i is None or calls_i is None:
            raise TableFormatError(f"table {step_no} has no 'Name' / '# of Calls' columns")
        self_i = _index(header, "Self CPU")
        total_i = _index(header, "CPU total")
        dev_i = _index(header, "Self CUDA", "Self NPU", "Self XPU", "Self PrivateUse1", "Self Device")
        if dev_i is not None:
            device = "npu" if "NPU" in header[dev_i] or "PrivateUse1" in header[dev_i] else "cuda"
        shapes_i = _index(header, "Input Shapes")
        for row in rows:
            try:
                count = int(row[calls_i])
            except ValueError as exc:
                raise TableFormatError(f"table {step_no}: '# of Calls' is {row[calls_i]!r}") from exc
            if count <= 0 or rules.kind(row[name_i]) != "op":
                continue  # annotations and backend-private rows: no parent to fold into in a flat table
            shapes = []
            if shapes_i is not None and row[shapes_i]:
                try:
                    shapes = ast.literal_eval(row[shapes_i])
                except (ValueError, SyntaxError):
                    shapes = []  # cut short by the table width
            per = 1.0 / count
            self_us = (_time_us(row[self_i]) or 0.0) if self_i is not None else 0.0
            total_us = (_time_us(row[total_i]) or 0.0) if total_i is not None else self_us
            dev_us = (_time_us(row[dev_i]) or 0.0) if dev_i is not None else 0.0
            for _ in range(count):
                calls.append(OpCall(name=row[name_i], input_shapes=shapes, self_time_us=self_us * per,
                                    total_time_us=total_us * per, device_time_us=dev_us * per,
                                    step=step_no, device=device if dev_us else "cpu"))
        total = totals.get("CPU") or 0.0
        steps.append(Step(index=step_no, duration_us=total, op_calls=sum(int(r[calls_i]) for r in rows
                                                                          if r[calls_i].isdigit())))
    if not steps:
        raise TableFormatError("no profiler table (dashed header rule + 'Name' ... '# of Calls') found")
    prof = Profile(calls=calls, steps=steps, device=device, source_format="text-table", path=str(path))
    prof.metadata.update({"has_phases": False, "has_dtypes": False,
                          "step_time_source": "'Self CPU time total' of each table"})
    return prof
