"""Was the precision the script asked for the precision that ran?

On a machine without a GPU, CUDA autocast/GradScaler run as their CPU counterparts in the
requested dtype (``capture/remap.py``).  A scan is only a scan of the real program if the
operators really ran in that dtype: a framework that took a CPU-only code path (no GPU seen,
16-mixed silently turned into bf16, a GradScaler disabled) measures a different program.
``summary["precision"]`` says what was requested, what the operators ran in, and, when
the two differ, a note the headline shows.
"""
from __future__ import annotations

_MIXED = ("float16", "bfloat16")


def recorded_dtypes(operators) -> dict[str, int]:
    """Low-precision float dtype -> operator calls that took an input in it (training phases only)."""
    from opscope.knowledge import load
    names = load("dtype_tests.yaml").get("profiler_dtypes") or {}
    counts: dict[str, int] = {}
    for op in operators:
        if op.phase == "other" and not set(op.phases or []) - {"other"}:
            continue   # set-up (weight init, data preparation) says nothing about training precision
        for dtype in {str(names.get(d)) for d in op.dtypes or []} & set(_MIXED):
            counts[dtype] = counts.get(dtype, 0) + int(op.calls or 0)
    return counts


def _scaler_ran(operators) -> bool:
    """GradScaler's own kernels ran (unscale with the inf check, scale update)."""
    return any(op.name in ("aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_")
               for op in operators)


def precision_summary(requested: dict | None, operators, device: str, launch_dtype: str | None = None) -> dict:
    """``{requested, recorded, grad_scaler, note}`` for scan.json's summary (note None when consistent).

    ``launch_dtype``: the dtype a launch wrapper asked for (``accelerate launch --mixed_precision fp16``).
    """
    requested = requested or {}
    asked = [d for d in requested.get("autocast") or [] if d in _MIXED]
    if launch_dtype in _MIXED and launch_dtype not in asked:
        asked.append(launch_dtype)
    scaler = requested.get("grad_scaler") or []
    recorded = recorded_dtypes(operators)
    scaler_ran = _scaler_ran(operators)
    notes = []
    trained = any(op.phase != "other" or set(op.phases or []) - {"other"} for op in operators)
    missing = [d for d in asked if not recorded.get(d)]
    if missing:
        got = ", ".join(sorted(recorded)) or "float32 only"
        notes.append(f"the script asked for {' and '.join(missing)} autocast but the recorded operators ran in "
                     f"{got}: this scan did not measure the mixed-precision program")
    if "enabled" in scaler and not scaler_ran and any(recorded.values()):
        notes.append("a GradScaler was enabled but none of its work (unscale, inf check, scale update) was "
                     "recorded")
    libraries = requested.get("libraries") or []
    cpu_paths = requested.get("cpu_autocast") or []
    if cpu_paths:
        notes.append(f"CPU autocast was entered by {', '.join(cpu_paths)}: the framework took its CPU-only "
                     "mixed-precision path, not the one it takes on the GPU")
    return {
        "requested": asked or (["float32"] if device == "cpu" else []),
        "recorded": sorted(recorded) or ["float32"],
        "recorded_calls": recorded,
        "grad_scaler": {"requested": "enabled" in scaler, "recorded": scaler_ran},
        "frameworks": libraries,
        "note": ("; ".join(notes) or None) if trained else None,   # nothing trained: said elsewhere
    }
