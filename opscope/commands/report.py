"""`opscope report RUN_DIR`: re-render the reports of a run from its scan.json."""
from __future__ import annotations

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


def run(args) -> int:
    from opscope.report.render import parse_formats, write_reports

    try:
        formats = parse_formats(args.format)
    except ValueError as exc:
        raise UserError(f"--format: {exc}", EXIT_USAGE) from None
    from opscope.atomic import ensure_out_dir, write_failed
    from opscope.report.json_out import read_scan_json
    result = read_scan_json(Path(args.run_dir))
    run_dir = Path(args.run_dir)
    out_dir = Path(args.output_dir) if args.output_dir else (run_dir if run_dir.is_dir() else run_dir.parent)
    ensure_out_dir(out_dir, "--output-dir" if args.output_dir else "the run folder")
    try:
        written = write_reports(result, out_dir, formats)
    except OSError as exc:
        raise write_failed(out_dir, exc) from None
    for path in written:
        print(path)
    return 0
