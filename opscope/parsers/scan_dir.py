"""opscope run directories (``scan.json`` + ``traces/step_NNNN.json``).

The per-step traces hold every call with its nesting and timing, so they are
preferred; a run kept without traces (``--no-traces``) falls back to the aggregated
``operators[]`` of scan.json (one OpCall per recorded call, times averaged).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from opscope.model import OpCall, Profile, ScanResult
from opscope.parsers.events import ProfileBuilder
from opscope.parsers.stream import TraceReader

_STEP_FILE = re.compile(r"step_(\d+)\.json(?:\.gz)?$")


def is_run_dir(path: Path) -> bool:
    return (path / "scan.json").is_file() or (path.name == "scan.json" and path.is_file())


def load_run_dir(path) -> Profile:
    path = Path(path)
    run_dir = path.parent if path.name == "scan.json" else path
    data = json.loads((run_dir / "scan.json").read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("opscope.scan/"):
        raise ValueError(f"schema {data.get('schema') if isinstance(data, dict) else None!r} is not opscope.scan/1")
    scan = ScanResult.from_dict(data)
    traces = [run_dir / t for t in scan.traces if (run_dir / t).is_file()]
    if traces:
        builder = ProfileBuilder("opscope-run", run_dir)
        for i, trace in enumerate(traces, start=1):
            match = _STEP_FILE.search(trace.name)
            builder.add(TraceReader(trace), file_step=int(match.group(1)) if match else i)
        prof = builder.build()
    else:
        prof = Profile(calls=_calls_from_operators(scan), device=scan.device, source_format="opscope-run",
                       path=str(run_dir))
        prof.metadata["has_phases"] = True
    prof.steps = list(scan.steps)        # the scan's own step boundaries are authoritative
    prof.device = scan.device
    prof.metadata.update({"script": scan.script, "argv": scan.argv, "torch_version": scan.torch_version,
                          "step_time_source": "opscope scan step markers"})
    return prof


def _calls_from_operators(scan: ScanResult) -> list[OpCall]:
    calls = []
    for op in scan.operators:
        n = max(int(op.calls), 1)
        steps = op.steps or [0]
        for k in range(n):
            calls.append(OpCall(name=op.name, overload=op.overload, input_shapes=op.input_shapes,
                                dtypes=op.dtypes, self_time_us=op.self_time_us / n,
                                total_time_us=op.total_time_us / n, device_time_us=op.device_time_us / n,
                                phase=op.phase, parent=op.parent, source=op.source,
                                step=steps[k % len(steps)], device=scan.device))
    return calls
