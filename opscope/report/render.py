"""Write the chosen report formats next to scan.json: the one entry point for reporters.

``opscope scan`` calls ``write_reports`` after writing scan.json; ``opscope report``
calls it on a scan.json loaded from disk, so any run can be re-rendered.
"""
from __future__ import annotations

from pathlib import Path

from opscope.model import ScanResult

FORMATS = ("html", "xlsx", "json", "md")
FILE_NAMES = {"html": "report.html", "xlsx": "report.xlsx", "json": "scan.json", "md": "report.md"}


def parse_formats(text: str) -> tuple[str, ...]:
    """'html, xlsx' -> ('html', 'xlsx'); raises ValueError naming the unknown ones."""
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"unknown report format {', '.join(unknown) or '(none)'}; choose from {','.join(FORMATS)}")
    return formats


def _write_json(result: ScanResult, path: Path) -> Path:
    from opscope.report.json_out import write_scan_json
    return write_scan_json(result, path)


def _writer(fmt: str):
    if fmt == "html":
        from opscope.report.html import write_html
        return write_html
    if fmt == "xlsx":
        from opscope.report.xlsx import write_xlsx
        return write_xlsx
    if fmt == "md":
        from opscope.report.markdown import write_markdown
        return write_markdown
    if fmt == "json":
        return _write_json
    raise ValueError(f"unknown report format {fmt!r}; choose from {','.join(FORMATS)}")


def write_reports(result: ScanResult, run_dir: Path, formats=("html", "xlsx")) -> list[Path]:
    """Write each format into ``run_dir`` (each atomically) and return the paths written, in order."""
    from opscope.atomic import write_via_temp

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(formats, str):
        formats = parse_formats(formats)
    written = []
    for fmt in formats:
        path = run_dir / FILE_NAMES[fmt]
        writer = _writer(fmt)
        write_via_temp(path, lambda tmp, writer=writer: writer(result, tmp))
        written.append(path)
    return written
