"""The one "analyse and write" path: a capture -> ``ScanResult`` -> scan.json, operators.csv, reports.

It sits above ``capture``, ``analysis`` and ``report`` so none of those imports another
backwards: the scan child (``opscope.scan_child``, where torch is already imported), the
parent ``opscope scan`` (when the child could not analyse) and the in-process API all call
``analyse_capture``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opscope.model import Capture


def analyse_capture(out_dir: Path, *, capture: Capture | None = None, formats=(), **scan_fields):
    """Build the scan result of the capture in ``out_dir`` and write its files.

    ``capture`` is the capture when the caller has it in memory (a session's snapshot); otherwise
    the capture files are read.  ``scan_fields`` are ``build_scan_result``'s keywords.
    """
    from opscope.analysis.scan_result import build_scan_result
    from opscope.capture.store import load_capture
    out_dir = Path(out_dir)
    if capture is None:
        capture = load_capture(out_dir)
    result = build_scan_result(capture=capture, **scan_fields)
    from opscope.analysis.fake_results import apply_fake
    from opscope.capture.run_folder import RunFolder
    apply_fake(result, RunFolder(out_dir).read_fake())   # --mode fake: timings, data-dependent places, memory
    if result.memory_fit is None:   # a real scan: its steps' allocator peaks
        from opscope.analysis.npu.memory_fit import REAL_BASIS, memory_fit
        result.memory_fit = memory_fit(capture.meta.memory, result.settings.chip, REAL_BASIS)
    write_outputs(result, out_dir, list(formats))
    return result


def write_outputs(result, out: Path, formats: list[str]) -> list[Path]:
    """scan.json and operators.csv always; then the requested reports (html, xlsx, md, sarif)."""
    from opscope.capture.run_folder import OPERATORS_CSV, SCAN_JSON
    from opscope.report.csv_out import write_operators_csv
    from opscope.report.json_out import write_scan_json
    out = Path(out)
    write_scan_json(result, out / SCAN_JSON)
    write_operators_csv(result, out / OPERATORS_CSV)
    written = [out / SCAN_JSON, out / OPERATORS_CSV]
    written.extend(write_reports(result, out, formats))
    return written


def write_reports(result, out: Path, formats: list[str]) -> list[Path]:
    """Only the reports (scan.json/operators.csv already written): every asked-for format of the
    reporter registry (html, xlsx, md, sarif, and any registered one)."""
    report_formats = [f for f in formats if f != "json"]  # scan.json is written already
    if not report_formats:
        return []
    from opscope.report.render import write_reports as render
    return render(result, out, formats=tuple(report_formats))


def recover_capture(run_dir: Path):
    """Rebuild scan.json (and operators.csv) of a scan whose ``opscope scan`` process was killed
    (the OOM killer, a job scheduler, a power loss) from what it left: ``capture/`` and ``traces/``.

    The result is marked incomplete ("recovered: the scan process was killed during step N")
    unless the capture child had already recorded how the script ended.
    """
    import os
    import time

    from opscope.capture.outcomes import ChildOutcome
    from opscope.capture.run_folder import RunFolder, recovery_config
    folder = RunFolder(run_dir)
    config = recovery_config(folder)
    ended = folder.read_outcome()
    if ended and ended.get("kind") not in (None, "usage"):
        outcome = ChildOutcome(kind=str(ended["kind"]), code=ended.get("code"), message=str(ended.get("message") or ""),
                               where=ended.get("where"), steps=int(ended.get("steps") or 0))
    else:
        outcome = ChildOutcome("recovered", None, "recovered: the scan process was killed")
    settings = dict(config.get("settings") or {"steps": config.get("steps", 0)})
    if config.get("rank") is not None:
        settings["rank"] = config["rank"]
    device = (ended or {}).get("device") or config.get("device") or "cpu"
    if device == "auto":
        from opscope.capture.devices import resolve_device
        try:
            device = resolve_device("auto")   # what the child resolved, on this machine
        except Exception:
            device = "cpu"
    try:
        last_write = os.stat(folder.steps_log).st_mtime
    except OSError:
        last_write = time.time()
    result = analyse_capture(run_dir, script=str(config.get("script") or "<unknown script>"),
                             argv=list(config.get("argv") or []), device=device, settings=settings,
                             outcome=outcome, started_at=config.get("started_at"),
                             duration_s=max(0.0, last_write - float(config.get("started_epoch") or last_write)),
                             static_paths=[] if config.get("static", True) and _is_file(config.get("script")) else None,
                             target=config.get("target"), torch_version=(ended or {}).get("torch"))
    return result


def _is_file(path) -> bool:
    return bool(path) and Path(str(path)).is_file()
