"""opscope run directories (``scan.json`` + ``traces/step_NNNN.json``).

The per-step traces hold every call with its nesting and timing, so they are
preferred; a run kept without traces (``--no-traces``) falls back to the aggregated
``operators[]`` of scan.json: one OpCall per operator and step standing for its share
of the recorded calls (``count``), so ``calls: 1000000000`` costs one object, not a
billion.  scan.json is read by the one typed loader, ``opscope.schema.load_scan``.
"""
from __future__ import annotations

import re
from pathlib import Path

from opscope.errors import InputError
from opscope.model import DEVICE, HOST, IMPORT, OpCall, Profile, ScanResult
from opscope.parsers.base import FormatError
from opscope.parsers.events import ProfileBuilder
from opscope.parsers.stream import TraceReader
from opscope.schema import load_scan

_STEP_FILE = re.compile(r"step_(\d{1,9})\.json(?:\.gz)?$")


def is_run_dir(path: Path) -> bool:
    return (path / "scan.json").is_file() or (path.name == "scan.json" and path.is_file())


def load_run_dir(path) -> Profile:
    path = Path(path)
    run_dir = path.parent if path.name == "scan.json" else path
    try:
        scan = load_scan(run_dir / "scan.json")
    except InputError as exc:       # reported by the parsers' one interface, with the accepted inputs
        raise FormatError(f"scan.json {exc.problem}", where=exc.where) from None
    traces = _trace_files(run_dir, scan.traces)
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


def _trace_files(run_dir: Path, names: list[str]) -> list[Path]:
    """The listed traces that are regular files inside the run folder (never outside it)."""
    root = run_dir.resolve()
    found = []
    for name in names:
        path = run_dir / name
        try:
            inside = path.resolve().is_relative_to(root)
        except (OSError, RuntimeError, ValueError):   # symlink loop, NUL in the name
            continue
        if inside and path.is_file():
            found.append(path)
    return found


def _calls_from_operators(scan: ScanResult) -> list[OpCall]:
    calls = []
    for op in scan.operators:
        n = max(op.calls, 1)
        device = DEVICE if op.on_device else (IMPORT if op.import_time else HOST)
        steps = sorted(set(op.steps)) or [0]
        share, extra = divmod(n, len(steps))
        for k, step in enumerate(steps):
            count = share + (1 if k < extra else 0)
            if not count:
                continue
            calls.append(OpCall(name=op.name, overload=op.overload, input_shapes=op.input_shapes,
                                dtypes=op.dtypes, self_time_us=op.self_time_us * count / n,
                                total_time_us=op.total_time_us * count / n,
                                device_time_us=op.device_time_us * count / n,
                                phase=op.phase, parent=op.parent, source=op.source,
                                step=step, device=device, count=count))
    return calls
