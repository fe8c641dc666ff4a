"""Read what a capture wrote (``capture/steps.jsonl``, ``runtime.json``) back as model objects.

Tolerates a truncated last line: a child killed mid-write loses only that step.
"""
from __future__ import annotations

import json
from pathlib import Path

from opscope.capture.run_folder import CALL_FIELDS, RUNTIME, STEPS_LOG, RunFolder
from opscope.model import PHASES, Capture, CaptureMeta, Finding, OpCall, Step


def load_capture(out_dir: Path) -> Capture:
    """The capture in ``out_dir`` read back from its files."""
    folder = RunFolder(out_dir)
    runtime = {}
    try:
        runtime = json.loads(folder.capture_file(RUNTIME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    columns = runtime.get("columns", CALL_FIELDS)
    records: list[dict] = []
    notes: list[str] = []
    path = folder.steps_log
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                try:
                    record = json.loads(line)
                    record["op_calls"] = [OpCall(**dict(zip(columns, row, strict=False))) for row in record.pop("calls")]
                    int(record["step"]), float(record["duration_us"])
                except (ValueError, TypeError, KeyError, AttributeError):
                    # cut by a kill or power loss mid-write: keep the complete steps before it
                    notes.append(f"{STEPS_LOG} line {number} was cut short (the scan was killed while writing "
                                 f"it) and was dropped; the {len(records)} step(s) before it are kept")
                    break
                records.append(record)
    findings = [Finding.from_dict(f) for f in runtime.get("findings", [])]
    capture = records_to_capture(records, findings, runtime.get("dataloaders", {}), runtime.get("precision"))
    capture.meta.notes = notes
    return capture


def records_to_capture(records: list[dict], findings: list, dataloaders: dict,
                       precision: dict | None = None) -> Capture:
    """The capture of the step records (as written to ``steps.jsonl``, calls already ``OpCall``)."""
    calls: list[OpCall] = []
    steps: list[Step] = []
    side: dict[int, dict] = {}
    traces: list[str] = []
    memory: list[dict] = []   # real scans: each step's device-memory peak (capture/device_memory.py)
    for record in records:
        if record.get("memory"):
            memory.append(record["memory"])
        step_calls = record["op_calls"]
        calls.extend(step_calls)
        phase_time = {p: 0.0 for p in PHASES}
        for c in step_calls:
            if c.parent is None:
                phase_time[c.phase] = phase_time.get(c.phase, 0.0) + c.total_time_us
        steps.append(Step(index=record["step"], duration_us=round(record["duration_us"], 1),
                          op_calls=sum(int(c.count or 1) for c in step_calls), complete=record.get("complete", True),
                          phase_time_us={k: round(v, 1) for k, v in phase_time.items()},
                          unrecorded=record.get("unrecorded") or {}))
        side[record["step"]] = record.get("side", {})
        if record.get("trace") and (not traces or traces[-1] != record["trace"]):
            traces.append(record["trace"])   # steps recorded in one profiler session share one trace
    # every step written with its calls' overloads resolved (None: ambiguous): the analysis asks torch for none
    resolved = bool(records) and all(record.get("overloads_resolved") for record in records)
    return Capture(calls, steps, side, list(findings),
                   CaptureMeta(traces=traces, dataloaders=dataloaders, precision=precision,
                               memory={"steps": memory}, overloads_resolved=resolved))
