"""Write the chosen report formats next to scan.json: the one entry point for scan reporters.

``opscope scan`` calls ``write_reports`` after writing scan.json; ``opscope report``
calls it on a scan.json loaded from disk, so any run can be re-rendered.  The formats
themselves live in the reporter registry (``opscope.report.registry``).
"""
from __future__ import annotations

from pathlib import Path

from opscope.model import ScanResult
from opscope.report import registry

# The format that writes scan.json itself: a command that changed scan.json has written it already,
# so ``rerender`` refreshes every other registered scan format found in the folder.
SOURCE_FORMAT = "json"


def parse_formats(text: str) -> tuple[str, ...]:
    """'html, xlsx' -> ('html', 'xlsx'); raises ValueError naming the unknown ones."""
    return registry.parse_formats(text, "scan")


def write_json(result: ScanResult, path: Path) -> Path:
    from opscope.report.json_out import write_scan_json
    return write_scan_json(result, path)


def write_reports(result: ScanResult, run_dir: Path, formats=("html", "xlsx")) -> list[Path]:
    """Write each format into ``run_dir`` (each atomically) and return the paths written, in order."""
    if isinstance(formats, str):
        formats = parse_formats(formats)
    for fmt in formats:
        registry.get("scan", fmt)  # an unknown format is an error, never silently skipped
    return registry.write("scan", result, Path(run_dir), formats)


def existing_reports(run_dir: Path) -> tuple[str, ...]:
    """The report formats already present in a run folder (what a re-render must refresh)."""
    run_dir = Path(run_dir)
    known = registry.reporters("scan")
    return tuple(name for name, reporter in known.items()
                 if name != SOURCE_FORMAT and (run_dir / reporter.file_name).exists())


def rerender(result: ScanResult, run_dir: Path) -> list[Path]:
    """Re-write the reports found in ``run_dir`` from ``result`` (after scan.json changed)."""
    return write_reports(result, run_dir, existing_reports(run_dir))
