"""`opscope verify`: prove, operator by operator and loss by loss, that the device computes what the CPU does.

* ``opscope verify RUN_DIR --device npu|cuda|cpu`` replays every captured operator
  signature on the device and on the CPU (float64 oracle), judges it with msprobe's
  standards and writes ``verification`` into RUN_DIR/scan.json.
* ``opscope verify --e2e train.py --device DEV --steps N -- ARGS`` runs the script's first
  N steps on the CPU and on the device from the same seed and compares the loss per step.
"""
from __future__ import annotations

import os
from pathlib import Path

from opscope.commands._args import non_negative_float, positive_float
from opscope.commands._common import add_device, add_out
from opscope.errors import EXIT_VERIFY_FAILED, UserError
from opscope.model import Verification


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "verify", help="replay captured operators on a device vs a CPU float64 oracle; compare e2e losses",
        description="Operator pass: replay every operator signature of a scan (RUN_DIR) on --device and on "
                    "the CPU, judge with msprobe's accuracy standards (support_matrix/verify_standards.yaml) "
                    "and store the results in RUN_DIR/scan.json. End-to-end pass (--e2e SCRIPT): run the "
                    "script's first --steps steps on the CPU and on --device from the same seed and compare "
                    "the loss step by step. Script arguments go after `--`.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="output folder of `opscope scan` (holds scan.json)")
    p.add_argument("script_args", nargs="*", metavar="-- ARGS", help="arguments for the --e2e script")
    add_device(p, help="npu, cuda or cpu (default auto: npu, else cuda, else cpu)")
    p.add_argument("--e2e", metavar="SCRIPT", help="also run SCRIPT on the CPU and on --device and compare losses")
    p.add_argument("--steps", type=int, default=5, help="e2e: steps to run and compare (default 5)")
    p.add_argument("--rtol", type=non_negative_float, default=1e-2, help="e2e: relative loss tolerance per step (default 0.01)")
    p.add_argument("--atol", type=non_negative_float, default=1e-3, help="e2e: absolute loss tolerance per step (default 0.001)")
    p.add_argument("--seed", type=int, default=0, help="seed for inputs and for both e2e runs (default 0)")
    p.add_argument("--timeout", type=positive_float, default=None, help="e2e: stop each run after this many seconds")
    add_out(p, help="e2e: folder for the two runs and e2e.json (default RUN_DIR/e2e, or opscope-e2e/)")
    p.add_argument("--only", action="append", metavar="OP", help="only ops whose name contains OP (repeatable)")
    p.add_argument("--max-elements", type=int, default=50_000_000,
                   help="skip signatures whose inputs exceed this many elements (default 50M)")
    p.add_argument("--top", type=int, default=20, help="rows in the terminal table (default 20)")
    p.add_argument("--show-skipped", action="store_true", help="list skipped signatures in the table too")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal tables")
    p.set_defaults(func=run)


def _device(name: str) -> str:
    name = (name or "auto").lower()  # argparse checked it against auto, cpu, cuda, npu
    if name != "auto":
        return name
    from opscope.capture.devices import resolve_device  # the one auto rule: npu, else cuda, else cpu
    return resolve_device("auto")


def run(args) -> int:
    """Hold RUN_DIR while verify runs: its scan.json and reports are rewritten at the end."""
    folder = Path(args.run_dir) if args.run_dir else None
    folder = folder if folder is None or folder.is_dir() else folder.parent
    if folder is None or not folder.is_dir():
        return _run(args)
    from opscope.capture.run_folder import lock
    with lock(folder, "verify", fix="wait for it to finish"):
        return _run(args)


# above complexity 15: CLI command: option checks, then one branch per verify mode
def _run(args) -> int:  # noqa: C901
    from opscope.report.terminal import make_console
    console = make_console(stderr=True)
    if not args.run_dir and not args.e2e:
        raise UserError("give RUN_DIR (a folder written by `opscope scan`) and/or --e2e SCRIPT")
    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    if args.max_elements is not None and args.max_elements < 1:
        raise UserError("--max-elements must be a positive number")
    if args.script_args and not args.e2e:
        raise UserError("script arguments after `--` need --e2e SCRIPT")
    device = _device(args.device)
    failed = False
    scan, scan_path, verification = None, None, None
    if args.run_dir:
        from opscope.report.json_out import read_scan_json
        scan_path = Path(args.run_dir) / "scan.json" if Path(args.run_dir).is_dir() else Path(args.run_dir)
        scan = read_scan_json(scan_path)
        _check_writable(scan_path)   # before the long replay, not after it
    if args.e2e:
        from opscope.atomic import ensure_out_dir
        from opscope.scanning import check_compiles
        if not Path(args.e2e).is_file():
            raise UserError(f"--e2e script not found: {args.e2e}")
        check_compiles(Path(args.e2e))
        e2e_out = ensure_out_dir(Path(args.out) if args.out else (scan_path.parent / "e2e" if scan_path
                                                                  else Path("opscope-e2e")), "--out")
    if args.run_dir:
        assert scan is not None and scan_path is not None   # read above
        verification = _operator_pass(scan, scan_path.parent, device, args, console)
        counts = verification.counts or {}
        failed |= counts.get("fail", 0) > 0 or counts.get("error", 0) > 0
        subs = verification.substitute_counts or {}
        failed |= subs.get("fail", 0) > 0 or subs.get("error", 0) > 0  # a suggested substitute is not equivalent
        earlier_e2e = scan.verification.e2e if scan.verification else None
        if not args.e2e and earlier_e2e:
            verification.e2e = earlier_e2e  # keep an earlier e2e pass
    if args.e2e:
        from opscope.replay.e2e import run_e2e
        e2e = run_e2e(args.e2e, list(args.script_args or []), e2e_out, device=device, steps=args.steps,
                      seed=args.seed, rtol=args.rtol, atol=args.atol, timeout=args.timeout, console=console)
        if not args.quiet:
            from opscope.report.verify_terminal import print_e2e
            print_e2e(e2e, console)
        failed |= e2e["comparison"]["verdict"] in ("fail", "error")
        if verification is None and scan is not None:
            verification = scan.verification or Verification()
        if verification is not None:
            verification.e2e = e2e
    if scan is not None:
        assert scan_path is not None   # read together with scan
        from opscope.report.json_out import write_scan_json
        from opscope.report.render import rerender
        scan.verification = verification
        try:
            write_scan_json(scan, scan_path)
        except OSError as exc:   # the replay's results are not lost: they go to a temp file instead
            import tempfile
            kept = Path(tempfile.mkdtemp(prefix="opscope-verify-")) / "scan.json"
            write_scan_json(scan, kept)
            raise UserError(f"cannot rewrite {scan_path} ({exc.strerror or exc}); the results were saved to "
                            f"{kept}: copy that file over it") from None
        console.print(f"verification written to {scan_path}")
        refreshed = rerender(scan, scan_path.parent)  # reports next to scan.json must not go stale
        if refreshed:
            console.print("re-rendered " + ", ".join(str(p) for p in refreshed), soft_wrap=True)
    return EXIT_VERIFY_FAILED if failed else 0


def _operator_pass(scan, run_dir: Path, device: str, args, console) -> Verification:
    from opscope.replay.run import verify_operators
    from opscope.report.verify_terminal import print_verification, progress_bar
    if not scan.operators:
        raise UserError(f"{run_dir}/scan.json has no operators (static-only scan?); "
                        "run `opscope scan SCRIPT` to capture some")
    with progress_bar(console, f"verifying on {device}") as update:
        verification = Verification.from_dict(
            verify_operators(scan.operators, device, run_dir=run_dir, seed=args.seed, progress=update,
                             max_elements=args.max_elements, only=args.only), "$.verification")
    if not args.quiet:
        print_verification(verification, console, top=args.top, show_skipped=args.show_skipped)
    from opscope.report.verification_view import skip_reasons
    reasons = skip_reasons(verification)
    if reasons:
        skipped = sum(n for _, n in reasons)
        console.print(f"skipped {skipped} of {len(verification.results or [])} signature(s): "
                      + "; ".join(f"{n} {reason}" for reason, n in reasons)
                      + ("" if args.show_skipped else " (--show-skipped lists them)"), soft_wrap=True)
    return verification


def _check_writable(scan_path: Path) -> None:
    """verify rewrites scan.json (atomically, so its folder must take a new file)."""
    if not os.access(scan_path.parent, os.W_OK | os.X_OK) or not os.access(scan_path, os.W_OK):
        raise UserError(f"{scan_path} cannot be rewritten (no write permission); verify stores its results "
                        "there: copy the run folder somewhere writable")
