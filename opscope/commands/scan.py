"""``opscope scan SCRIPT [options] -- [script args]``: parse, run the scan (``opscope.scanning.Scan``), print,
map the outcome to an exit code."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from opscope.commands._args import finite_float, non_empty, positive_float
from opscope.commands._common import add_device, add_out
from opscope.errors import EXIT_FAIL_UNDER, EXIT_SCRIPT_FAILED, EXIT_TIMEOUT, UserError
from opscope.report.registry import add_format_option
from opscope.scanning import (
    DEFAULT_STEPS,
    LAUNCHERS,
    MODES,
    STEP_MARKERS,
    Scan,
    ScanListener,
    ScanOptions,
    check_out,
)


def register(sub) -> None:
    p = sub.add_parser("scan", help="run a training script for a few steps and report NPU readiness",
                       description="Run an unmodified training script for a few steps under the PyTorch "
                                   "profiler, then report every operator, dynamic shapes, CUDA-only APIs and "
                                   "torch_npu support verdicts.  Script arguments go after `--`.")
    p.add_argument("script", nargs="?", default=None,
                   help="the training script (run as __main__), or a file/folder with --static-only; or, after "
                        "`--`, the launch command as typed (`-- accelerate launch|torchrun|deepspeed|lightning run "
                        "model [opts] train.py ARGS`)")
    p.add_argument("script_args", nargs="*", metavar="-- ARGS", help="arguments passed to the script")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps to capture (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=0,
                   help="first K steps are warm-up: shape changes are judged against step K+1 (default 0)")
    add_out(p, default="opscope-out", help="output folder (default opscope-out/)")
    add_device(p, help="where the script runs: auto (default: npu, else cuda, else cpu), cpu, cuda or npu")
    p.add_argument("--timeout", type=positive_float, default=None, help="stop the script after this many seconds")
    p.add_argument("--step-marker", default="auto", choices=STEP_MARKERS,
                   help="what ends a step: optimizer.step() (default when the script builds an optimizer), "
                        "loss.backward(), or a top-level module forward call (inference loops)")
    p.add_argument("--launcher", default="auto", choices=LAUNCHERS,
                   help="how the script is launched: torch.multiprocessing.spawn inside the script, torchrun-style "
                        "(opscope starts --world-size ranks with RANK/WORLD_SIZE/MASTER_PORT), or one process; "
                        "auto (default) reads the script")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks of a distributed script (default 2); also what torch.cuda.device_count() returns")
    p.add_argument("--ranks", default="0",
                   help="ranks to capture: 0 (default; into --out), all, or a list such as 0,1 (rank N into OUT/rankN)")
    p.add_argument("--target", type=non_empty, default=None, help="torch_npu version to judge against, e.g. 2.8.0 (default newest)")
    p.add_argument("--chip", type=non_empty, default=None,
                   help="Ascend chip to estimate NPU time for: 910B1..910B4, 910A (default Ascend910B2)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="factors from `opscope calibrate` (default: ./opscope-calibration.json when present)")
    p.add_argument("--fail-under", type=finite_float, default=None, help="exit 5 if the readiness score is below this")
    add_format_option(p, "scan", default="html,xlsx", allow_empty=True)
    p.add_argument("--static-only", action="store_true", help="only scan source files for CUDA APIs; run nothing")
    p.add_argument("--no-traces", action="store_true", help="do not keep the per-step Chrome traces")
    p.add_argument("--keep-compile", action="store_true",
                   help="let torch.compile compile (default: it is a no-op and the eager program is measured)")
    p.add_argument("--max-step-calls", type=int, default=None,
                   help="torch calls recorded per step before the rest of it runs unprofiled (default 20000)")
    p.add_argument("--max-capture-mb", type=int, default=None,
                   help="capture memory growth (MB) after which a step stops recording (default 1536)")
    p.add_argument("--max-memory", type=positive_float, default=None, metavar="MB",
                   help="stop the script (keeping what was captured) when it and its processes use more than "
                        "this much memory (default: 3/4 of the machine's RAM)")
    p.add_argument("--mode", default="real", choices=MODES,
                   help="real (default): run every operator; fake: model, optimizer state and activations are fake "
                        "tensors (shapes and dtypes, no data; data loading stays real) so a model too big for this "
                        "machine scans in seconds, without CPU timings; auto: fake when parameters + gradients + "
                        "optimizer state would not fit in free memory")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary or progress")
    p.set_defaults(func=run)


def options_of(args: argparse.Namespace) -> ScanOptions:
    """The command line as ``ScanOptions`` (``--no-traces`` is ``traces=False``, ``--format`` is ``formats``)."""
    return ScanOptions(script=args.script, script_args=tuple(args.script_args or ()), out=str(args.out),
                       steps=args.steps, warmup=args.warmup, device=args.device, timeout=args.timeout,
                       step_marker=args.step_marker, launcher=args.launcher, world_size=args.world_size,
                       ranks=args.ranks, target=args.target, chip=args.chip, calibration=args.calibration,
                       formats=tuple(args.format), traces=not args.no_traces, keep_compile=args.keep_compile,
                       max_step_calls=args.max_step_calls, max_capture_mb=args.max_capture_mb,
                       max_memory=args.max_memory, mode=args.mode)


class _Terminal(ScanListener):
    """A scan's progress and notes on stderr: the spinner, ``opscope: note: ...``; -q keeps only the notes."""

    def __init__(self, console, quiet: bool):
        self.console, self.quiet = console, quiet
        self._status: Any = None   # rich's Status while something runs

    def launch(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"opscope: {text}")

    def mode(self, mode: str, why: str) -> None:
        if not self.quiet:
            self.console.print(f"opscope: --mode auto chose {mode}: {why}", soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(f"opscope: {text}", soft_wrap=True, markup=False, highlight=False)

    def status(self, text: str | None) -> None:
        if self.quiet:
            return
        if text is None:
            if self._status is not None:
                self._status.stop()
                self._status = None
        elif self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    console = Console(stderr=True)
    options = options_of(args)
    options.require_script()
    if args.static_only:   # (set in a project's config): no capture child
        if getattr(args, "early_child", None) is not None:
            args.early_child.discard()
        return _static_only(Path(args.script), Path(args.out), list(args.format), args.quiet)
    # the capture child opscope.cli started (importing torch meanwhile): the scan uses it when the
    # plan can run in it, opscope.cli discards it otherwise
    done = Scan(options, _Terminal(console, args.quiet), early=getattr(args, "early_child", None)).run()
    result, out = done.result, done.out
    if not args.quiet:
        from opscope.report.terminal import make_console, print_summary
        summary_console = make_console()
        print_summary(result, summary_console, run_dir=str(out))
        summary_console.print("wrote " + ", ".join(str(p) for p in done.written), soft_wrap=True)
    if not result.complete:
        outcome = done.outcome
        code = {"timeout": EXIT_TIMEOUT, "interrupted": outcome.code or 130}.get(outcome.kind, EXIT_SCRIPT_FAILED)
        kept = sum(1 for s in result.steps if s.complete)
        raise UserError(f"{result.incomplete_reason}; wrote the {kept} complete step(s) captured before it "
                        f"to {out / 'scan.json'}", code)
    score = result.summary.readiness_score
    if args.fail_under is not None and (score is None or score < args.fail_under):
        shown = "n/a (nothing was measured)" if score is None else score
        raise UserError(f"readiness score {shown} is below --fail-under {args.fail_under:g}", EXIT_FAIL_UNDER)
    return 0


def _static_only(path: Path, out: Path, formats: list[str], quiet: bool) -> int:
    """Scan files without running anything: findings to the terminal, findings.json (+ SARIF)."""
    import json
    if not path.exists():
        raise UserError(f"path not found: {path} (give a Python file or a project folder)")
    from opscope.analysis.static.scan import scan_paths
    t0 = time.perf_counter()
    from opscope.report.terminal import progress_bar
    with progress_bar("scanning source files", quiet) as update:
        findings = scan_paths([path], progress=update)
    elapsed = time.perf_counter() - t0
    check_out(out)
    from opscope.atomic import write_atomic, write_failed
    try:
        write_atomic(out / "findings.json", json.dumps([f.to_dict() for f in findings], indent=1))
    except OSError as exc:
        raise write_failed(out / "findings.json", exc) from None
    if "sarif" in formats:
        from opscope.report.sarif import write_sarif
        write_sarif(findings, out / "findings.sarif")
    if not quiet:
        from rich.console import Console

        from opscope.report.findings_table import print_findings
        console = Console()
        print_findings(findings, console)
        console.print(f"{len(findings)} finding(s) in {elapsed:.2f}s; wrote {out / 'findings.json'}")
    return 0
