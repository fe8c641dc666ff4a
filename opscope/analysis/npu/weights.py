"""Each operator's weight in the readiness score and the "time affected" shares: its estimated NPU time.

The score means the NPU, and must not move between identical runs.  This machine's CPU time does both wrong:
it measures the CPU, and on a loaded machine it moves (three identical scans once scored 78, 83 and 78).  The
NPU estimate follows from shapes and dtypes, so it is the same every time.  Each operator signature gets the
estimate's figure for it (``Operator.npu_time_us``, per step; the row's ``weight_us``): its kernels' device
time, or for a CPU fallback its kernel as the NPU would run it plus the copies each way and the sync (never the
CPU time measured here); an operator the estimate does not price (set-up, host-only work, the inside of a
kernel) weighs nothing.  This machine's CPU time stays on each operator, labelled so.
"""
from __future__ import annotations

import json

from opscope.model import NpuEstimate


def _key(name: str, input_shapes, dtypes, phase, source) -> tuple:
    return (name, json.dumps(input_shapes, sort_keys=True), json.dumps(dtypes), phase or "", source or "")


def assign_npu_times(operators, estimate: NpuEstimate | None) -> bool:
    """Set ``op.npu_time_us`` from the estimate's operator rows; False (nothing set) without an estimate."""
    if not estimate or not estimate.rows:
        for op in operators:
            op.npu_time_us = None
        return False
    weights: dict[tuple, float] = {}
    for r in estimate.operator_rows():
        weight = float(r.weight_us if r.weight_us is not None else r.npu_time_us or 0.0)
        key = _key(r.operator, r.input_shapes, r.dtypes, r.phase, r.source)
        weights[key] = weights.get(key, 0.0) + weight
    for op in operators:
        name = op.name + (f".{op.overload}" if op.overload else "")
        key = _key(name, op.input_shapes, op.dtypes, op.phase, op.source)
        # the estimate priced each signature once: a not-applicable twin (host-only data work) weighs nothing
        op.npu_time_us = 0.0 if op.verdict == "not-applicable" else round(weights.pop(key, 0.0), 3)
    return True


def weigh_by_npu(result) -> None:
    """Set each operator's NPU weight from ``result.npu_estimate`` and recompute the readiness summary on it
    (after the estimate exists, and again when ``opscope report --chip`` re-prices it for another chip).
    What the summary holds besides the score and shares (precision, why no score) is kept."""
    from opscope.analysis.verdicts.support import refreshed_summary
    if not assign_npu_times(result.operators, result.npu_estimate) or result.summary.is_empty():
        return
    result.summary = refreshed_summary(result, result.summary.to_dict())
