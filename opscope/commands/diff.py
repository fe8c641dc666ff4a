"""`opscope diff A B`: what changed between two profiles of the same job."""
from __future__ import annotations

from pathlib import Path

from opscope.commands._args import non_empty
from opscope.commands._common import add_out
from opscope.errors import EXIT_USAGE, UserError
from opscope.report.registry import add_format_option


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diff", help="compare two profiles of the same job (CPU vs NPU, GPU vs NPU, before vs after)",
        description="Compare two profiles operator by operator: operators only in one run, call-count, "
                    "shape and dtype changes, NPU-inserted casts/format conversions, CPU fallbacks, "
                    "per-operator time and step time / FPS. Inputs are auto-detected: profiler text logs, "
                    "Chrome traces (.json/.json.gz), Ascend *_ascend_pt folders (or a folder of ranks), "
                    "opscope run directories.")
    parser.add_argument("a", metavar="A", help="the reference run (e.g. the CPU or GPU profile)")
    parser.add_argument("b", metavar="B", help="the run to compare (e.g. the NPU profile)")
    parser.add_argument("--batch-size", metavar="N|A,B",
                        help="per-device batch size for FPS: one value for both runs, or 'A,B' per run "
                             "(e.g. 8,32); default: read from each run's scan argv (-b/--batch-size) or "
                             "guessed from its first 4-D input (the report says which)")
    parser.add_argument("--devices", type=int, help="devices of run B for FPS (default: an Ascend export's HCCL group, else the ranks found)")
    parser.add_argument("--devices-a", type=int, help="devices of run A for FPS (default: an Ascend export's HCCL group, else the ranks found)")
    parser.add_argument("--warmup", type=int, help="first K captured steps are warm-up and left out of the "
                                                   "average (default: 1 when the capture starts at step 1)")
    parser.add_argument("--log-a", metavar="FILE", help="run A's console log (for CPU-fallback warnings)")
    parser.add_argument("--log-b", metavar="FILE", help="run B's console log (for CPU-fallback warnings)")
    parser.add_argument("--label-a", type=non_empty, default=None, help="name of run A in the reports (default: its device)")
    parser.add_argument("--label-b", type=non_empty, default=None, help="name of run B in the reports (default: its device)")
    add_out(parser, default="opscope-diff", help="folder for diff.html/xlsx/json (default %(default)s)")
    add_format_option(parser, "diff", default="html,xlsx,json")
    parser.add_argument("--chip", default=None,
                        help="when A is an opscope scan and B an Ascend profile: the chip to price A's NPU estimate "
                             "for (default: the chip whose AI core count B's kernels show)")
    parser.add_argument("--top", type=int, default=15, help="rows per terminal table (default %(default)s)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no terminal tables")
    parser.set_defaults(func=run)


MAX_LOG_BYTES = 256 << 20   # the fallback warnings of a console log; the rest of a bigger log is not read


def _read_log(path):
    if not path:
        return None
    from opscope.schema import regular_file
    regular_file(Path(path), "log")   # a FIFO would block forever
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(MAX_LOG_BYTES)
    except OSError as exc:
        raise UserError(f"cannot read log {path} ({exc.strerror}); pass an existing file", EXIT_USAGE) from None


def _positive(name, value):
    if value is not None and value <= 0:
        raise UserError(f"{name} must be a positive integer, got {value}", EXIT_USAGE)


def _batch_sizes(text):
    """'32' -> (32, 32); '8,32' -> (8, 32); '8,' / ',32' leave a side to auto-detection."""
    if text is None:
        return None, None
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) > 2 or not all(p == "" or p.isdigit() for p in parts) or not any(parts):
        raise UserError(f"--batch-size: expected N or A,B (positive integers), got {text!r}", EXIT_USAGE)
    values = [int(p) if p else None for p in parts]
    if any(v is not None and v <= 0 for v in values):
        raise UserError(f"--batch-size must be positive, got {text!r}", EXIT_USAGE)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _estimate_vs_profile(args, out: Path):
    """A = an opscope scan, B = an Ascend profile: estimated vs measured NPU time per kernel family and
    per step (written to estimate_vs_npu.json); None when the inputs are not that pair."""
    import json

    from opscope.parsers.ascend_kernels import find_kernel_csvs
    a, b = Path(args.a), Path(args.b)
    scan_json = a / "scan.json" if a.is_dir() else a
    if scan_json.name != "scan.json" or not scan_json.is_file() or not b.exists() or not find_kernel_csvs(b):
        return None
    from opscope.analysis.npu.compare import chip_and_source, compare
    from opscope.analysis.npu.estimate import estimate, price
    from opscope.report.json_out import read_scan_json
    result = read_scan_json(scan_json)
    est = result.npu_estimate
    if args.chip:
        chip, chip_source = args.chip, "given with --chip"
    else:
        chip, chip_source = chip_and_source(b)
        if chip is None:   # the profile does not say: the chip the scan was estimated for
            chip = est.chip if est else None
            chip_source += f"; the scan's chip ({chip or 'the default'})"
    try:
        est = price(est.basis, chip) if est and est.basis else estimate(result.operators, result.steps, None, chip)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        from opscope.errors import InputError
        raise InputError(scan_json, f"npu_estimate cannot be priced ({type(exc).__name__})",
                         fix="re-run `opscope scan` to store a fresh estimate") from None
    comparison = compare(est, b, devices=args.devices)
    comparison["chip_source"] = chip_source
    from opscope.atomic import write_atomic
    path = out / "estimate_vs_npu.json"
    write_atomic(path, json.dumps(comparison, indent=1))
    if not args.quiet:
        from opscope.report.npu_section import print_comparison
        from opscope.report.terminal import make_console
        print_comparison(comparison, make_console())
        calibration = comparison.get("calibration") or {}
        print(f"estimate priced for {comparison['chip']} ({chip_source}) x{comparison['devices']} "
              f"({comparison['devices_source']})")
        print("calibration: " + "; ".join(str(v) for v in (calibration.get("fitted_on"), calibration.get("note")) if v))
    print(path)
    return comparison


def _job_devices(path) -> int | None:
    """The devices an Ascend export's job ran on (its HCCL group can span ranks that were not exported), for its
    FPS; None elsewhere (the ranks found)."""
    from opscope.analysis.npu.compare import world_size
    from opscope.parsers.ascend import is_ascend_dir, rank_dirs
    p = Path(path)
    if not p.is_dir() or not (is_ascend_dir(p) or rank_dirs(p)):
        return None
    world, _ = world_size(p)
    return world if world > 1 else None


def run(args) -> int:
    from opscope.analysis.diff.profiles import diff_profiles
    from opscope.parsers import load_profiles

    formats = args.format
    batch_a, batch_b = _batch_sizes(args.batch_size)
    for name in ("devices", "devices_a"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.warmup is not None and args.warmup < 0:
        raise UserError(f"--warmup must be 0 or more, got {args.warmup}", EXIT_USAGE)
    from opscope.atomic import ensure_out_dir
    out = ensure_out_dir(Path(args.out), "--out")   # before the (long) loading
    log_a, log_b = _read_log(args.log_a), _read_log(args.log_b)
    estimate = _estimate_vs_profile(args, out)
    try:
        ranks_a, ranks_b = load_profiles(args.a), load_profiles(args.b)
    except UserError:
        if estimate is None:
            raise
        # B holds kernels and steps only (no trace_view.json / .db): the estimate comparison is the diff
        print(f"opscope: {args.b} has no operator trace (kernel_details/step_trace only): compared with the "
              "estimate, no operator diff")
        return 0
    label_a = args.label_a or ranks_a[0].device
    label_b = args.label_b or ranks_b[0].device
    if label_a == label_b and not (args.label_a or args.label_b):
        label_a, label_b = f"A ({label_a})", f"B ({label_b})"
    result = diff_profiles(ranks_a, ranks_b, label_a=label_a, label_b=label_b, warmup=args.warmup,
                           batch_size_a=batch_a, batch_size_b=batch_b,
                           devices_a=args.devices_a or _job_devices(args.a), devices_b=args.devices or _job_devices(args.b),
                           log_a=log_a, log_b=log_b)
    if not args.quiet:
        from opscope.report.diff_terminal import print_diff
        print_diff(result, top=args.top)
    from opscope.report import registry
    for path in registry.write("diff", result, out, formats):
        print(path)
    return 0
