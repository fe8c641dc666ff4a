"""Merge run-time remap findings with static-scan findings into one de-duplicated list.

The same CUDA call is usually seen twice: by the static scan (it is in the source) and
by the run-time remapper (it was executed).  Both use the rule ids of
``support_matrix/cuda_api_rules.yaml`` and the user's file:line, so (rule, file, line)
identifies one place to fix.
"""
from __future__ import annotations

import dataclasses
import os

from opscope.model import Finding


def _norm_file(file: str | None) -> str:
    return os.path.normpath(file).replace("\\", "/") if file else ""


def finding_key(finding: Finding) -> tuple:
    return (finding.rule, _norm_file(finding.file), finding.line or 0)


def _origins(finding: Finding) -> set[str]:
    return set(filter(None, (finding.origin or "").split("+")))


def _combine(kept: Finding, other: Finding) -> Finding:
    """One finding for one place: the static wording and severity (rule file), counts summed."""
    static, runtime = (kept, other) if "static" in _origins(kept) or "runtime" in _origins(other) else (other, kept)
    merged = dataclasses.replace(static)
    for name in ("column", "snippet", "replacement", "remapped_to"):
        if getattr(merged, name) in (None, ""):
            setattr(merged, name, getattr(runtime, name))
    origins = _origins(kept) | _origins(other)
    merged.origin = "+".join(o for o in ("static", "runtime") if o in origins) or kept.origin
    merged.count = int(kept.count or 1) + int(other.count or 1)
    return merged


def merge_findings(*groups) -> list[Finding]:
    """De-duplicate findings from any number of lists by (rule, file, line).

    Static + run-time findings of one place become one finding with origin
    ``"static+runtime"`` and the counts summed.  The result is sorted by file, line,
    column and rule so reports and diffs are stable.
    """
    merged: dict[tuple, Finding] = {}
    for group in groups:
        for finding in group or []:
            if isinstance(finding, dict):
                finding = Finding.from_dict(finding)
            key = finding_key(finding)
            merged[key] = _combine(merged[key], finding) if key in merged else dataclasses.replace(finding)
    return sorted(merged.values(), key=lambda f: (_norm_file(f.file), f.line or 0, f.column or 0, f.rule))
