"""`opscope report RUN_DIR`: re-render the reports of a run from its scan.json."""
from __future__ import annotations

from pathlib import Path

from opscope.commands._common import add_out
from opscope.report.registry import add_format_option

DEFAULT_FORMATS = "html,xlsx"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render report.html / report.xlsx / report.md from a run's scan.json",
        description="Render the readiness reports of a run directory written by `opscope scan`.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="directory holding scan.json (or the scan.json itself)")
    add_format_option(parser, "scan", default=DEFAULT_FORMATS)
    add_out(parser, help="write the reports here instead of next to scan.json", old=("--output-dir",))
    parser.add_argument("--chip", default=None,
                        help="re-price the NPU time estimate for this Ascend chip (910B1..910B4, 910A)")
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="re-price with factors from `opscope calibrate` (default: ./opscope-calibration.json "
                             "when present)")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the paths written")
    parser.set_defaults(func=run)


def _npu_estimate(result, args) -> None:
    """Re-price the stored NPU estimate for --chip / a calibration file, or estimate a scan.json written
    before the estimate existed.  A stored basis that cannot be priced is a one-line error (exit 2)."""
    from opscope.analysis.npu_cost import calibration_factors, resolve_chip
    from opscope.analysis.npu_estimate import estimate, price
    from opscope.commands.scan import _calibration_file
    from opscope.errors import InputError
    calibration = _calibration_file(args.calibration)
    est = result.npu_estimate if isinstance(result.npu_estimate, dict) else None
    if args.chip:
        resolve_chip(args.chip)   # an unknown chip is a one-line error, estimate or not
    if (args.chip or calibration) and est and est.get("basis"):
        chip = args.chip or est.get("chip")
        factors, source = calibration_factors(calibration, chip if isinstance(chip, str) else None)
        try:
            result.npu_estimate = price(est["basis"], chip, factors, calibrated_with=source)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
            raise InputError(Path(args.run_dir), f"npu_estimate.basis cannot be priced ({type(exc).__name__})",
                             fix="re-run `opscope scan` to store a fresh estimate") from None
    elif result.operators and not est:   # a scan.json from before the estimate existed
        factors, source = calibration_factors(calibration, args.chip)
        try:
            result.npu_estimate = estimate(result.operators, result.steps, None, args.chip, factors, source)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError):
            result.notes.append("NPU time estimate not computed: the operators in scan.json could not be priced")


def run(args) -> int:
    from opscope.atomic import ensure_out_dir
    from opscope.report.json_out import read_scan_json
    from opscope.report.render import write_reports
    result = read_scan_json(Path(args.run_dir))
    _npu_estimate(result, args)
    run_dir = Path(args.run_dir)
    out_dir = Path(args.out) if args.out else (run_dir if run_dir.is_dir() else run_dir.parent)
    ensure_out_dir(out_dir, "--out" if args.out else "the run folder")
    for path in write_reports(result, out_dir, args.format):  # a write error is a one-line UserError
        if not args.quiet:
            print(path)
    return 0
