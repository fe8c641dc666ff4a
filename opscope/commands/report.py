"""`opscope report RUN_DIR`: re-render the reports of a run from its scan.json."""
from __future__ import annotations

import json
from pathlib import Path

from opscope.errors import EXIT_USAGE, UserError

DEFAULT_FORMATS = "html,xlsx"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render report.html / report.xlsx / report.md from a run's scan.json",
        description="Render the readiness reports of a run directory written by `opscope scan`.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="directory holding scan.json (or the scan.json itself)")
    parser.add_argument("--format", default=DEFAULT_FORMATS, metavar="FORMATS",
                        help="comma-separated: html,xlsx,json,md (default: %(default)s)")
    parser.add_argument("-o", "--output-dir", metavar="DIR",
                        help="write the reports here instead of next to scan.json")
    parser.set_defaults(func=run)


def load_scan(path: Path):
    """Load a ScanResult from a run dir or scan.json, with one-line errors for bad input."""
    from opscope.model import SCAN_SCHEMA, ScanResult

    path = Path(path)
    scan_path = path / "scan.json" if path.is_dir() else path
    if not path.exists():
        raise UserError(f"{path} does not exist; pass the run directory written by `opscope scan`", EXIT_USAGE)
    if not scan_path.is_file():
        raise UserError(f"no scan.json in {path}; run `opscope scan SCRIPT` first or pass the run directory",
                        EXIT_USAGE)
    try:
        data = json.loads(scan_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{scan_path} is not valid JSON ({exc}); re-run `opscope scan` to rewrite it",
                        EXIT_USAGE) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, str) or not schema.startswith(SCAN_SCHEMA.split("/")[0] + "/"):
        raise UserError(f"{scan_path} is not an opscope scan (schema {schema!r}, expected {SCAN_SCHEMA!r})",
                        EXIT_USAGE)
    try:
        return ScanResult.from_dict(data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{scan_path} is a corrupt opscope scan ({exc}); re-run `opscope scan`",
                        EXIT_USAGE) from None


def run(args) -> int:
    from opscope.report.render import parse_formats, write_reports

    try:
        formats = parse_formats(args.format)
    except ValueError as exc:
        raise UserError(f"--format: {exc}", EXIT_USAGE) from None
    result = load_scan(Path(args.run_dir))
    run_dir = Path(args.run_dir)
    out_dir = Path(args.output_dir) if args.output_dir else (run_dir if run_dir.is_dir() else run_dir.parent)
    for path in write_reports(result, out_dir, formats):
        print(path)
    return 0
