"""`opscope diff A B`: what changed between two profiles of the same job."""
from __future__ import annotations

from pathlib import Path

from opscope.commands._args import non_empty
from opscope.errors import EXIT_USAGE, UserError

FORMATS = ("html", "xlsx", "json")


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
    parser.add_argument("--devices", type=int, help="devices of run B for FPS (default: ranks found)")
    parser.add_argument("--devices-a", type=int, help="devices of run A for FPS (default: ranks found)")
    parser.add_argument("--warmup", type=int, help="first K captured steps are warm-up and left out of the "
                                                   "average (default: 1 when the capture starts at step 1)")
    parser.add_argument("--log-a", metavar="FILE", help="run A's console log (for CPU-fallback warnings)")
    parser.add_argument("--log-b", metavar="FILE", help="run B's console log (for CPU-fallback warnings)")
    parser.add_argument("--label-a", type=non_empty, default=None, help="name of run A in the reports (default: its device)")
    parser.add_argument("--label-b", type=non_empty, default=None, help="name of run B in the reports (default: its device)")
    parser.add_argument("--out", default="opscope-diff", help="folder for diff.html/xlsx/json (default %(default)s)")
    parser.add_argument("--format", default="html,xlsx,json", help="reports to write (default %(default)s)")
    parser.add_argument("--top", type=int, default=15, help="rows per terminal table (default %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no terminal tables")
    parser.set_defaults(func=run)


def _formats(text: str) -> list[str]:
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise UserError(f"--format: unknown {', '.join(unknown)}; choose from {','.join(FORMATS)}", EXIT_USAGE)
    return formats


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


def run(args) -> int:
    from opscope.analysis.diff import diff_profiles
    from opscope.parsers import load_profiles

    formats = _formats(args.format)
    batch_a, batch_b = _batch_sizes(args.batch_size)
    for name in ("devices", "devices_a"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.warmup is not None and args.warmup < 0:
        raise UserError(f"--warmup must be 0 or more, got {args.warmup}", EXIT_USAGE)
    from opscope.atomic import ensure_out_dir, write_failed, write_via_temp
    out = ensure_out_dir(Path(args.out), "--out")   # before the (long) loading
    log_a, log_b = _read_log(args.log_a), _read_log(args.log_b)
    ranks_a, ranks_b = load_profiles(args.a), load_profiles(args.b)
    label_a = args.label_a or ranks_a[0].device
    label_b = args.label_b or ranks_b[0].device
    if label_a == label_b and not (args.label_a or args.label_b):
        label_a, label_b = f"A ({label_a})", f"B ({label_b})"
    result = diff_profiles(ranks_a, ranks_b, label_a=label_a, label_b=label_b, warmup=args.warmup,
                           batch_size_a=batch_a, batch_size_b=batch_b, devices_a=args.devices_a, devices_b=args.devices,
                           log_a=log_a, log_b=log_b)
    if not args.quiet:
        from opscope.report.diff_terminal import print_diff
        print_diff(result, top=args.top)
    for fmt in formats:
        if fmt == "html":
            from opscope.report.diff_html import write_diff_html as writer
        elif fmt == "xlsx":
            from opscope.report.diff_xlsx import write_diff_xlsx as writer
        else:
            from opscope.report.diff_json import write_diff_json as writer
        path = out / f"diff.{fmt}"
        try:
            write_via_temp(path, lambda tmp, writer=writer: writer(result, tmp))
        except OSError as exc:
            raise write_failed(path, exc) from None
        print(path)
    return 0
