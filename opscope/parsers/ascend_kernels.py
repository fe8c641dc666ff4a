"""``kernel_details.csv`` of an Ascend profiler export: every NPU kernel with its shapes.

A text export always has this file, also when ``trace_view.json`` and the ``.db`` were
not exported (the shared LLM run); it is what the NPU estimate is calibrated and checked
against, and what ``opscope diff`` compares the estimate with.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_CSV = "kernel_details.csv"


@dataclass
class KernelRow:
    """One kernel of kernel_details.csv; shapes are lists of int lists (a scalar is [])."""
    name: str
    type: str
    core: str
    duration_us: float
    step: str = ""
    input_shapes: list = field(default_factory=list)
    input_dtypes: list = field(default_factory=list)
    input_formats: list = field(default_factory=list)
    output_shapes: list = field(default_factory=list)
    output_dtypes: list = field(default_factory=list)
    output_formats: list = field(default_factory=list)


def _shapes(text: str) -> list:
    text = (text or "").strip().strip('"')
    if not text or text == "N/A":
        return []
    out = []
    for part in text.split(";"):
        dims = [d for d in part.split(",") if d.strip()]
        try:
            out.append([int(d) for d in dims])
        except ValueError:
            out.append([])
    return out


def _names(text: str) -> list:
    text = (text or "").strip()
    return [] if not text or text == "N/A" else [t.strip() for t in text.split(";")]


def find_kernel_csvs(path) -> list[Path]:
    """Every kernel_details.csv under ``path`` (a file, a rank folder or a folder of ranks), sorted."""
    path = Path(path)
    if path.is_file():
        return [path] if path.name == KERNEL_CSV else []
    return sorted(path.rglob(KERNEL_CSV))


def read_kernel_details(path) -> list[KernelRow]:
    """The kernels of one kernel_details.csv; rows without a duration are skipped."""
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for rec in csv.DictReader(fh):
            try:
                duration = float((rec.get("Duration(us)") or "").strip())
            except ValueError:
                continue
            rows.append(KernelRow(
                name=rec.get("Name") or "", type=(rec.get("Type") or "").strip(),
                core=(rec.get("Accelerator Core") or "").strip(), duration_us=duration,
                step=(rec.get("Step Id") or "").strip(),
                input_shapes=_shapes(rec.get("Input Shapes", "")),
                input_dtypes=_names(rec.get("Input Data Types", "")),
                input_formats=_names(rec.get("Input Formats", "")),
                output_shapes=_shapes(rec.get("Output Shapes", "")),
                output_dtypes=_names(rec.get("Output Data Types", "")),
                output_formats=_names(rec.get("Output Formats", ""))))
    return rows
