"""Closing the loop: a scan's NPU estimate against a real NPU profile's kernels and steps.

Reads only ``kernel_details.csv`` and ``step_trace_time.csv`` of each rank (and, for the
job's world size, ``communication_matrix.json`` / ``communication.json`` and
``profiler_info_*.json``), so an Ascend export without ``trace_view.json`` or a ``.db``
(the shared LLM run) works too.  Per kernel family and per step: estimated, measured,
ratio; per rank: computing and step time with the slowest rank, so a user with a first
NPU run sees where the model was wrong.  The estimate is priced for the profile's own
world size and chip, whichever part of the export (one rank folder or all) is given.
"""
from __future__ import annotations

import csv
import fnmatch
import json
import re
from pathlib import Path

from opscope.analysis.npu.cost import cost_model, unit_of
from opscope.model import NpuEstimate
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


MAX_COMM_JSON_BYTES = 256 << 20   # communication(_matrix).json: KBs to a few MB per rank; bigger ones are not read
_LINK = re.compile(r"^\s*(\d{1,9})\s*-\s*(\d{1,9})\s*$")   # "src-dst" rank pair of communication_matrix.json


def _rank_folder(folder: Path) -> Path:
    """The ``*_ascend_pt`` folder of a folder holding the ASCEND_PROFILER_OUTPUT files."""
    return folder.parent if folder.name == "ASCEND_PROFILER_OUTPUT" else folder


def _read_json(path: Path):
    try:
        if not path.is_file() or path.stat().st_size > MAX_COMM_JSON_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None


def hccl_group_size(folder: Path) -> int:
    """The most ranks one collective of this rank spans: the distinct ranks of the ``src-dst`` links
    in ``communication_matrix.json`` (HCCL records one link per peer of each collective); 0 when the
    export has none.  For data parallelism that is the world size, whatever number of rank folders
    was exported."""
    data = _read_json(folder / "communication_matrix.json")
    best = 0
    if not isinstance(data, dict):
        return 0
    for step in data.values():
        for kind, ops in (step.items() if isinstance(step, dict) else []):
            if kind != "collective" or not isinstance(ops, dict):
                continue
            for links in ops.values():
                ranks: set[str] = set()
                for key in (links if isinstance(links, dict) else {}):
                    match = _LINK.match(str(key))
                    if match:
                        ranks.update(match.groups())
                best = max(best, len(ranks))
    return best


def _exported_ranks(folders: list[Path]) -> tuple[int, int | None]:
    """(rank folders of this export, highest rank id): the folders found plus the ``*_ascend_pt``
    folders next to each one (one rank folder given of a multi-rank export), counted once per rank id."""
    from opscope.parsers.ascend import is_ascend_dir, rank_of
    seen: dict[Path, int | None] = {}
    for folder in folders:
        pt = _rank_folder(folder)
        around = [pt]
        if pt.parent != pt:
            try:
                around += [p for p in pt.parent.iterdir() if p.is_dir() and p.name.endswith("_ascend_pt")
                           and is_ascend_dir(p)]
            except OSError:
                pass
        for p in around:
            if p not in seen:
                seen[p] = rank_of(p)
    ids = {r for r in seen.values() if r is not None}
    count = len(ids) + sum(1 for r in seen.values() if r is None)
    return count, (max(ids) if ids else None)


def world_size(path) -> tuple[int, str]:
    """(world size, where it came from) of the job an Ascend export profiled: the largest of the
    HCCL group its collectives span (``communication_matrix.json``), the rank folders exported (also
    those next to a single rank folder given) and the highest rank id + 1 (``profiler_info_N.json``)."""
    folders = _rank_folders(Path(path))
    if not folders:
        return 1, "no rank folder found"
    group = max((hccl_group_size(f) for f in folders), default=0)
    exported, top = _exported_ranks(folders)
    world = max(group, exported, (top + 1) if top is not None else 0, 1)
    parts = []
    if group:
        parts.append(f"HCCL group of {group} ranks in communication_matrix.json")
    parts.append(f"{exported} rank folder(s) exported" + (f" (highest rank id {top})" if top is not None else ""))
    if group and group > exported:
        parts.append(f"the profiles of {group - exported} rank(s) were not exported")
    return world, "; ".join(parts)


def chip_and_source(path) -> tuple[str | None, str]:
    """(chip, why) whose AI core count matches the profile's largest cube Block Dim (None: unknown)."""
    from opscope.analysis.npu.cost import chips
    dims: list[int] = []
    for csv_path in find_kernel_csvs(Path(path)):   # the first with Block Dims (a level-0 export has none)
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            for row in csv.DictReader(fh):
                if row.get("Accelerator Core") == "AI_CORE" and (row.get("Block Dim") or "").isdigit():
                    dims.append(int(row["Block Dim"]))
        if dims:
            break
    if not dims:
        return None, "no AI_CORE kernel with a Block Dim in kernel_details.csv"
    cores = max(dims)
    table = chips().get("chips") or {}
    default = chips().get("default")
    matches = [name for name, fig in table.items() if fig.get("ai_cores") == cores]
    if not matches:
        return None, f"{cores} AI cores in kernel_details.csv's Block Dim: no known chip has that many"
    chip = default if default in matches else matches[0]
    others = [m for m in matches if m != chip]
    return chip, (f"{cores} AI cores in kernel_details.csv's Block Dim"
                  + (f" (also {', '.join(others)}; --chip to choose)" if others else ""))


def _transit_ms(folder: Path) -> float | None:
    """HCCL transfer time per step (communication.json ``Transit Time``, all collectives and p2p): the
    time data moved, without the waits for other ranks; None when the export has no transport data."""
    data = _read_json(folder / "communication.json")
    if not isinstance(data, dict) or not data:
        return None
    total, found = 0.0, False
    for step in data.values():
        for ops in (step.values() if isinstance(step, dict) else []):
            info = ((ops.get("Total Op Info") or {}) if isinstance(ops, dict) else {}).get("Communication Time Info")
            value = info.get("Transit Time(ms)") if isinstance(info, dict) else None
            if isinstance(value, (int, float)) and value > 0:
                total, found = total + float(value), True
    return total / len(data) if found else None


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
        transit = _transit_ms(folder)
        ranks.append({"folder": str(folder), "families_us": fam, "steps": mean, "kernels": len(kernels),
                      "transit_us": None if transit is None else transit * 1000.0})
    return {"ranks": ranks}


def chip_for(path) -> str | None:
    """The chip whose AI core count matches the profile's largest cube Block Dim (None: unknown)."""
    return chip_and_source(path)[0]


def compare(estimate: NpuEstimate, path, devices: int | None = None) -> dict:
    """Estimated vs measured per kernel family and per step; ``estimate`` is ScanResult.npu_estimate.

    The step is priced for ``devices``, else for the world size of the job the profile recorded
    (``world_size``: its HCCL group, the rank folders next to the one given), whichever it is."""
    measured = measured_profile(path)
    ranks = measured["ranks"]
    if not ranks:
        from opscope.errors import InputError
        raise InputError(Path(path), "holds no kernel_details.csv or step_trace_time.csv",
                         fix="pass an Ascend profiler export (*_ascend_pt folder or a folder of ranks)")
    step = estimate.step
    predicted: dict[str, float] = {}
    for ktype, us in step.kernel_types_us.items():
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
    if devices:
        world, world_source = devices, "given with --devices"
    else:
        world, world_source = world_size(path)
    per_world = {w.devices: w for w in step.per_world_size}
    if world not in per_world:   # any world size: priced from the stored basis
        from opscope.analysis.npu.estimate import price
        if estimate.basis is None:
            raise ValueError("the estimate has no basis to price another device count")
        repriced = price(estimate.basis, estimate.chip, estimate.factors, world_sizes=[world])
        per_world[world] = repriced.step.per_world_size[0]
    w = per_world[world]
    computing = w.device_us if w.device_us is not None else step.device_us
    estimated_steps = {"computing": computing, "communication (not overlapped)": w.exposed_communication_us,
                       "free (host/idle)": max(0.0, w.step_us - computing - w.exposed_communication_us),
                       "step": w.step_us}
    stepped = [r for r in ranks if r["steps"]]
    step_rows: list[dict] = []
    for key in STEP_COLUMNS:
        mean = sum(r["steps"].get(key, 0.0) for r in stepped) / len(stepped) if stepped else None
        step_rows.append(_row(key, estimated_steps.get(key), mean))
    measured_parts: dict[str, float] = {"compute/memory": step_rows[0]["measured_us"] or 0.0,
                                        "communication": step_rows[1]["measured_us"] or 0.0,
                                        "host": step_rows[2]["measured_us"] or 0.0}
    transits = [r["transit_us"] for r in ranks if r.get("transit_us") is not None]
    if transits and world > 1:   # the data movement alone, without the waits for other ranks
        step_rows.append(_row("communication transfers (HCCL transit, incl. overlapped)", w.communication_us,
                              sum(transits) / len(transits)))
    rank_rows = [{"rank_folder": r["folder"], "computing_us": r["steps"].get("computing"),
                  "step_us": r["steps"].get("step"), "kernels": r["kernels"]} for r in ranks]
    slow = max((r for r in rank_rows if r["step_us"]), key=lambda r: r["step_us"], default=None)
    return {"chip": estimate.chip, "devices": world, "devices_source": world_source,
            "families": family_rows, "steps": step_rows,
            "bound": {"estimated": w.bound, "measured": max(measured_parts, key=lambda k: measured_parts[k])
                      if stepped else None},
            "ranks": rank_rows, "slowest_rank": slow["rank_folder"] if slow else None,
            "calibration": calibration_note([r["folder"] for r in ranks]),
            "label": "estimate (from the CPU scan) vs measured (NPU profile); ratio = estimated / measured"}


def _row(item: str, estimated: float | None, measured: float | None) -> dict:
    return {"item": item, "estimated_us": None if estimated is None else round(estimated, 1),
            "measured_us": None if measured is None else round(measured, 1),
            "ratio": round(estimated / measured, 2) if estimated is not None and measured else None}


def calibration_note(folders: list[str]) -> dict:
    """What the estimate's figures were fitted on, and whether the compared profile is one of them."""
    from opscope.analysis.npu.cost import FITTED_PROFILES, fitted_on
    posix = [Path(f).as_posix() for f in folders]
    in_sample = sorted({key for key, fig in FITTED_PROFILES.items() for f in posix
                        if f.endswith(fig["path"]) or f.endswith(fig["path"] + "/ASCEND_PROFILER_OUTPUT")})
    same_job = sorted({key for key, fig in FITTED_PROFILES.items() for f in posix
                       if f"/{fig['job']}/" in f + "/"} - set(in_sample))
    note = {"fitted_on": fitted_on(), "in_sample": in_sample}
    if in_sample:
        note["note"] = ("in-sample: the figures were fitted on " + ", ".join(FITTED_PROFILES[k]["what"] for k in in_sample)
                        + "; bench/npu_estimate_accuracy.py reports the leave-one-out check")
    elif same_job:
        note["note"] = ("another rank or level of a job the figures were fitted on ("
                        + ", ".join(FITTED_PROFILES[k]["what"] for k in same_job) + "): not an independent check")
    return note
