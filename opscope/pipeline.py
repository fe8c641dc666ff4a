"""The one "analyse and write" path: a capture -> ``ScanResult`` -> scan.json, operators.csv, reports.

It sits above ``capture``, ``analysis`` and ``report`` so none of those imports another
backwards: the scan child (``opscope.scan_child``, where torch is already imported), the
parent ``opscope scan`` (when the child could not analyse) and the in-process API all call
``analyse_capture``.
"""
from __future__ import annotations

from pathlib import Path


def analyse_capture(out_dir: Path, *, capture: tuple | None = None, formats=(), **scan_fields):
    """Build the scan result of the capture in ``out_dir`` and write its files.

    ``capture`` is ``load_capture``'s tuple when the caller has it in memory; otherwise
    the capture files are read.  ``scan_fields`` are ``build_scan_result``'s keywords.
    """
    from opscope.analysis.scan_result import build_scan_result
    from opscope.capture.store import load_capture
    out_dir = Path(out_dir)
    if capture is None:
        capture = load_capture(out_dir)
    result = build_scan_result(out_dir, capture=capture, **scan_fields)
    from opscope.analysis.fake_results import apply_fake
    from opscope.capture.fake_mode import read as read_fake
    apply_fake(result, read_fake(out_dir / "capture"))   # --mode fake: timings, data-dependent places, memory
    write_outputs(result, out_dir, list(formats))
    return result


def write_outputs(result, out: Path, formats: list[str]) -> list[Path]:
    """scan.json and operators.csv always; then the requested reports (html, xlsx, md, sarif)."""
    from opscope.report.csv_out import write_operators_csv
    from opscope.report.json_out import write_scan_json
    out = Path(out)
    write_scan_json(result, out / "scan.json")
    write_operators_csv(result, out / "operators.csv")
    written = [out / "scan.json", out / "operators.csv"]
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
