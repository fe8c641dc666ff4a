"""Closing the loop: a scan's NPU estimate against a real NPU profile's kernels and steps.

Reads only ``kernel_details.csv`` and ``step_trace_time.csv`` of each rank, so an Ascend
export without ``trace_view.json`` or a ``.db`` (the shared LLM run) works too.  Per
kernel family and per step: estimated, measured, ratio; per rank: computing and step
time with the slowest rank, so a user with a first NPU run sees where the model was wrong.
"""
from __future__ import annotations

import csv
import fnmatch
from pathlib import Path

from opscope.analysis.npu_cost import cost_model, unit_of
from opscope.parsers.ascend_kernels import find_kernel_csvs, read_kernel_details

STEP_COLUMNS = {"computing": "Computing", "communication (not overlapped)": "Communication(Not Overlapped)",
                "free (host/idle)": "Free", "step": "Stage"}


def family_of(kernel_type: str, unit: str = "") -> str:
    """The kernel family of a kernel type (``families`` in npu_cost_model.yaml)."""
    if unit == "aicpu" or kernel_type.endswith("(AI CPU)"):
        return "AI CPU"
    if unit == "comm" or kernel_type.startswith("hcom_"):
        return "communication"
    for family, patterns in (cost_model().get("families") or {}).items():
        if any(fnmatch.fnmatchcase(kernel_type, p) for p in patterns):
            return family
    return "other vector"


def _rank_folders(path: Path) -> list[Path]:
    """Folders holding one rank's ASCEND_PROFILER_OUTPUT files, sorted."""
    return sorted({csv_path.parent for csv_path in find_kernel_csvs(path)} |
                  {p.parent for p in (path.rglob("step_trace_time.csv") if path.is_dir() else [])})


def _steps(folder: Path) -> list[dict]:
    path = folder / "step_trace_time.csv"
    if not path.is_file():
        return []
    out = []
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for row in csv.DictReader(fh):
            try:
                out.append({k: float(row[col]) for k, col in STEP_COLUMNS.items() if row.get(col) not in (None, "")})
            except ValueError:
                continue
    return out


def measured_profile(path) -> dict:
    """Per rank: kernel time per family per step and the mean step breakdown."""
    ranks = []
    for folder in _rank_folders(Path(path)):
        fam: dict[str, float] = {}
        kernels = read_kernel_details(folder / "kernel_details.csv") if (folder / "kernel_details.csv").is_file() else []
        step_ids = {k.step for k in kernels} or {""}
        for k in kernels:
            family = family_of(k.type, unit_of(k.type, k.core))
            fam[family] = fam.get(family, 0.0) + k.duration_us / len(step_ids)
        steps = _steps(folder)
        mean = {key: sum(s.get(key, 0.0) for s in steps) / len(steps) for key in STEP_COLUMNS} if steps else {}
        ranks.append({"folder": str(folder), "families_us": fam, "steps": mean, "kernels": len(kernels)})
    return {"ranks": ranks}


def chip_for(path) -> str | None:
    """The chip whose AI core count matches the profile's largest cube Block Dim (None: unknown)."""
    from opscope.analysis.npu_cost import chips
    dims = []
    for csv_path in find_kernel_csvs(Path(path))[:1]:
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            for row in csv.DictReader(fh):
                if row.get("Accelerator Core") == "AI_CORE" and (row.get("Block Dim") or "").isdigit():
                    dims.append(int(row["Block Dim"]))
    if not dims:
        return None
    cores = max(dims)
    table = chips().get("chips") or {}
    default = chips().get("default")
    matches = [name for name, fig in table.items() if fig.get("ai_cores") == cores]
    return default if default in matches else (matches[0] if matches else None)


def compare(estimate: dict, path, devices: int | None = None) -> dict:
    """Estimated vs measured per kernel family and per step; ``estimate`` is ScanResult.npu_estimate."""
    measured = measured_profile(path)
    ranks = measured["ranks"]
    if not ranks:
        from opscope.errors import InputError
        raise InputError(Path(path), "holds no kernel_details.csv or step_trace_time.csv",
                         fix="pass an Ascend profiler export (*_ascend_pt folder or a folder of ranks)")
    step = estimate.get("step") or {}
    predicted: dict[str, float] = {}
    for ktype, us in (step.get("kernel_types_us") or {}).items():
        fam = family_of(ktype)
        predicted[fam] = predicted.get(fam, 0.0) + us
    with_kernels = [r for r in ranks if r["families_us"]]
    families = sorted(set(predicted) | {f for r in with_kernels for f in r["families_us"]} - {"communication"})
    family_rows: list[dict] = []
    for fam in families:
        real = (sum(r["families_us"].get(fam, 0.0) for r in with_kernels) / len(with_kernels)) if with_kernels else None
        est = predicted.get(fam, 0.0)
        family_rows.append({"family": fam, "estimated_us": round(est, 1),
                            "measured_us": None if real is None else round(real, 1),
                            "ratio": round(est / real, 2) if real else None})
    family_rows.sort(key=lambda r: -(r["measured_us"] or r["estimated_us"] or 0))
    world = devices or max(1, len(ranks))
    per_world = {w["devices"]: w for w in step.get("per_world_size") or []}
    if world not in per_world:
        from opscope.analysis.npu_estimate import price
        repriced = price(estimate["basis"], estimate.get("chip"), world_sizes=[world])
        per_world[world] = repriced["step"]["per_world_size"][0]
    w = per_world[world]
    computing = w.get("device_us", step.get("device_us", 0.0))
    estimated_steps = {"computing": computing, "communication (not overlapped)": w.get("exposed_communication_us"),
                       "free (host/idle)": max(0.0, w["step_us"] - computing - w.get("exposed_communication_us", 0.0)),
                       "step": w["step_us"]}
    stepped = [r for r in ranks if r["steps"]]
    step_rows: list[dict] = []
    for key in STEP_COLUMNS:
        mean = sum(r["steps"].get(key, 0.0) for r in stepped) / len(stepped) if stepped else None
        value = estimated_steps.get(key)
        step_rows.append({"item": key, "estimated_us": None if value is None else round(value, 1),
                          "measured_us": None if mean is None else round(mean, 1),
                          "ratio": round(value / mean, 2) if value is not None and mean else None})
    measured_parts: dict[str, float] = {"compute/memory": step_rows[0]["measured_us"] or 0.0,
                                        "communication": step_rows[1]["measured_us"] or 0.0,
                                        "host": step_rows[2]["measured_us"] or 0.0}
    rank_rows = [{"rank_folder": r["folder"], "computing_us": r["steps"].get("computing"),
                  "step_us": r["steps"].get("step"), "kernels": r["kernels"]} for r in ranks]
    slow = max((r for r in rank_rows if r["step_us"]), key=lambda r: r["step_us"], default=None)
    return {"chip": estimate.get("chip"), "devices": world, "families": family_rows, "steps": step_rows,
            "bound": {"estimated": w["bound"], "measured": max(measured_parts, key=lambda k: measured_parts[k])
                      if stepped else None},
            "ranks": rank_rows, "slowest_rank": slow["rank_folder"] if slow else None,
            "label": "estimate (from the CPU scan) vs measured (NPU profile); ratio = estimated / measured"}
