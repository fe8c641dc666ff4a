"""`opscope report RUN_DIR`: re-render the reports of a run from its scan.json."""
from __future__ import annotations

import sys
from pathlib import Path

from opscope.capture.run_folder import RunFolder
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
    parser.add_argument("--target", default=None, metavar="VERSION",
                        help="judge the stored scan again for this torch_npu release: verdicts, score and port "
                             "plan, without re-running the script")
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="re-price with factors from `opscope calibrate` (default: ./opscope-calibration.json "
                             "when present)")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the paths written")
    parser.set_defaults(func=run)


def _for_chip(result, chip_name: str) -> None:
    """What depends on the chip besides the estimate, judged again for ``--chip``: the dtype findings (bf16 on a
    910A ...) and the memory fit (the same parts against that chip's HBM)."""
    from opscope.analysis.findings import merge_findings
    from opscope.analysis.npu.cost import resolve_chip
    from opscope.analysis.npu.memory_fit import for_chip
    from opscope.analysis.verdicts.chip_dtypes import chip_dtype_findings, is_chip_dtype_finding
    name = resolve_chip(chip_name)[0]
    kept = [f for f in result.findings if not is_chip_dtype_finding(f)]
    result.findings = merge_findings(kept, chip_dtype_findings(result.operators, name))
    if result.memory_fit:
        result.memory_fit = for_chip(result.memory_fit, name)


def _npu_estimate(result, args) -> None:
    """Re-price the stored NPU estimate for --chip / a calibration file, or estimate a scan.json written
    before the estimate existed.  A stored basis that cannot be priced is a one-line error (exit 2)."""
    from opscope.analysis.npu.cost import calibration_factors, resolve_chip
    from opscope.analysis.npu.estimate import estimate, price
    from opscope.errors import InputError
    from opscope.scanning import calibration_file
    calibration = calibration_file(args.calibration)
    est = result.npu_estimate
    if args.chip:
        resolve_chip(args.chip)   # an unknown chip is a one-line error, estimate or not
    if (args.chip or calibration or args.target) and est and est.basis:
        chip = args.chip or est.chip
        factors, source = calibration_factors(calibration, chip)
        try:
            result.npu_estimate = price(est.basis, chip, factors, calibrated_with=source)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
            raise InputError(Path(args.run_dir), f"npu_estimate.basis cannot be priced ({type(exc).__name__})",
                             fix="re-run `opscope scan` to store a fresh estimate") from None
    elif result.operators and not est and any(s.complete for s in result.steps):   # a scan.json from before the estimate
        factors, source = calibration_factors(calibration, args.chip)
        try:
            result.npu_estimate = estimate(result.operators, result.steps, None, args.chip, factors, source)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError):
            result.notes.append("NPU time estimate not computed: the operators in scan.json could not be priced")


def run(args) -> int:
    from opscope.atomic import ensure_out_dir
    from opscope.capture.run_folder import lock
    from opscope.report.json_out import read_scan_json
    from opscope.report.render import write_reports
    run_dir = Path(args.run_dir)
    recover = run_dir.is_dir() and RunFolder(run_dir).recoverable()   # a killed scan: no scan.json yet
    result = None if recover else read_scan_json(run_dir)
    out_dir = Path(args.out) if args.out else (run_dir if run_dir.is_dir() else run_dir.parent)
    ensure_out_dir(out_dir, "--out" if args.out else "the run folder")
    folders = {p.resolve(): p for p in ([run_dir] if recover else []) + [out_dir]}
    held = []
    try:
        for folder in folders.values():   # never into a folder a scan is writing
            held.append(lock(folder, "report", fix="wait for it to finish or choose another --out"))
            if held[-1].note and not args.quiet:
                print(f"opscope: note: {held[-1].note}", file=sys.stderr)
        if recover:
            result = _recover(run_dir, args.quiet)
        assert result is not None
        if args.target:
            from opscope.analysis.scan_result import retarget
            retarget(result, args.target)
        _npu_estimate(result, args)
        if args.chip:
            _for_chip(result, args.chip)
        if args.chip or args.calibration or args.target:   # re-priced: the score and shares follow the estimate
            from opscope.analysis.npu.weights import weigh_by_npu
            weigh_by_npu(result)
        for path in write_reports(result, out_dir, args.format):  # a write error is a one-line UserError
            if not args.quiet:
                print(path)
    finally:
        for h in held:
            h.release()
    return 0


def _recover(run_dir: Path, quiet: bool):
    """scan.json of a scan whose process was killed, rebuilt from its capture (every captured rank)."""
    from opscope.atomic import write_failed
    from opscope.pipeline import recover_capture
    try:
        result = recover_capture(run_dir)
        for rank_dir in RunFolder(run_dir).rank_folders():
            if RunFolder(rank_dir).recoverable():
                recover_capture(rank_dir)
    except OSError as exc:
        raise write_failed(exc.filename or run_dir / "scan.json", exc) from None
    if not quiet:
        kept = sum(1 for s in result.steps if s.complete)
        print(f"opscope: recovered {run_dir / 'scan.json'} from the capture of a scan that did not finish "
              f"({kept} complete step{'' if kept == 1 else 's'}; {result.incomplete_reason or 'complete'})",
              file=sys.stderr)
    return result
