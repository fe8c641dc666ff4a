"""``opscope scan SCRIPT [options] -- [script args]``: run, capture, analyse, report."""
from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path

from opscope.commands._common import add_device, add_out
from opscope.commands._args import finite_float, non_empty, positive_float
from opscope.errors import EXIT_FAIL_UNDER, EXIT_SCRIPT_FAILED, EXIT_TIMEOUT, UserError
from opscope.report.registry import add_format_option

DEFAULT_STEPS = 5


def register(sub) -> None:
    p = sub.add_parser("scan", help="run a training script for a few steps and report NPU readiness",
                       description="Run an unmodified training script for a few steps under the PyTorch "
                                   "profiler, then report every operator, dynamic shapes, CUDA-only APIs and "
                                   "torch_npu support verdicts.  Script arguments go after `--`.")
    p.add_argument("script", help="the training script (run as __main__), or a file/folder with --static-only")
    p.add_argument("script_args", nargs="*", metavar="-- ARGS", help="arguments passed to the script")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps to capture (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=0,
                   help="first K steps are warm-up: shape changes are judged against step K+1 (default 0)")
    add_out(p, default="opscope-out", help="output folder (default opscope-out/)")
    add_device(p, help="where the script runs: auto (default: npu, else cuda, else cpu), cpu, cuda or npu")
    p.add_argument("--timeout", type=positive_float, default=None, help="stop the script after this many seconds")
    p.add_argument("--step-marker", default="auto", choices=["auto", "optimizer", "backward", "module"],
                   help="what ends a step: optimizer.step() (default when the script builds an optimizer), "
                        "loss.backward(), or a top-level module forward call (inference loops)")
    p.add_argument("--launcher", default="auto", choices=["auto", "spawn", "torchrun", "none"],
                   help="how the script is launched: torch.multiprocessing.spawn inside the script, torchrun-style "
                        "(opscope starts --world-size ranks with RANK/WORLD_SIZE/MASTER_PORT), or one process; "
                        "auto (default) reads the script")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks of a distributed script (default 2); also what torch.cuda.device_count() returns")
    p.add_argument("--ranks", default="0",
                   help="ranks to capture: 0 (default; into --out), all, or a list such as 0,1 (rank N into OUT/rankN)")
    p.add_argument("--target", type=non_empty, default=None, help="torch_npu version to judge against, e.g. 2.8.0 (default newest)")
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
    p.add_argument("--mode", default="real", choices=["real", "fake", "auto"],
                   help="real (default): run every operator; fake: model, optimizer state and activations are fake "
                        "tensors (shapes and dtypes, no data; data loading stays real) so a model too big for this "
                        "machine scans in seconds, without CPU timings; auto: fake when parameters + gradients + "
                        "optimizer state would not fit in free memory")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary or progress")
    p.set_defaults(func=run)


def _check_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".opscope-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror or exc}; choose a writable folder") from None


def _check_compiles(script: Path) -> None:
    """Fail in well under a second, naming the line, instead of starting a child that cannot run it."""
    from opscope.schema import regular_file
    regular_file(script, "training script")
    try:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UserError(f"{script}:{exc.lineno or '?'}: {exc.msg}: the script does not compile; fix it "
                        "(python -m py_compile shows the same error)") from None
    except ValueError as exc:   # NUL bytes: a binary file
        raise UserError(f"{script} is not Python source ({exc}); give the training script") from None
    except OSError as exc:
        raise UserError(f"cannot read {script} ({exc.strerror or exc})") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    console = Console(stderr=True)
    script = Path(args.script)
    formats = list(args.format)
    if args.static_only:
        return _static_only(script, Path(args.out), formats, args.quiet)
    if not script.exists():
        raise UserError(f"script not found: {script} (check the path; script arguments go after `--`)")
    if script.is_dir() or script.suffix not in (".py", ""):
        raise UserError(f"{script} is not a Python script; give the training script (e.g. train.py), "
                        "or use --static-only to scan a folder")
    _check_compiles(script)
    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    if args.warmup < 0 or args.warmup >= args.steps:
        raise UserError("--warmup must be between 0 and --steps - 1")
    for flag in ("max_step_calls", "max_capture_mb"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be a positive number")
    if args.timeout is not None and args.timeout <= 0:
        raise UserError("--timeout must be a positive number of seconds")
    out = Path(args.out)
    _check_out(out)
    from opscope.analysis.verdicts import resolve_target
    resolve_target(args.target)  # fail fast on an unknown torch_npu version, before running anything
    from opscope.capture.runner import run_script
    from opscope.capture import distributed as dist_launch
    plan = dist_launch.resolve(args.launcher, script, args.world_size, args.ranks)
    settings = {"steps": args.steps, "warmup": args.warmup, "step_marker": args.step_marker,
                "timeout": args.timeout, "target": args.target, "requested_device": args.device}
    mode = _choose_mode(args, script, console)   # --mode fake|auto: fake_mode.py
    if args.mode == "auto":
        settings["mode_auto"] = getattr(args, "mode_reason", None)
    device = args.device.lower()
    if mode != "real":
        settings["mode"] = mode
        device = "cpu"   # fake tensors stand for the device's; CUDA calls are remapped as on a CPU scan
    if plan:
        settings["distributed"] = {"launcher": plan["launcher"], "world_size": plan["world_size"],
                                   "ranks": plan["ranks"],
                                   "rank_dirs": {str(r): "." if r == 0 else f"rank{r}" for r in plan["ranks"]}}
        settings["rank"] = 0
        if not args.quiet:
            console.print(f"opscope: {dist_launch.describe(plan)}")
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    status = console.status(f"running {script.name} under the profiler: step 0/{args.steps}")
    if not args.quiet:
        status.start()

    def progress(done: int) -> None:
        if not args.quiet:
            if done >= args.steps:  # the script is stopped; verdicts, dynamic shapes and reports follow
                status.update(f"captured {args.steps}/{args.steps} steps of {script.name}; analysing "
                              "(verdicts, dynamic shapes, reports)")
            else:
                status.update(f"running {script.name} under the profiler: step {done}/{args.steps}")

    try:
        outcome = run_script(str(script), args.script_args, out, args.steps, device=device,
                             timeout=args.timeout, step_marker=args.step_marker, export_traces=not args.no_traces,
                             progress=progress, analyse=True, settings=settings, target=args.target,
                             capture_options={"keep_compile": args.keep_compile,
                                              "max_step_calls": args.max_step_calls,
                                              "max_capture_mb": args.max_capture_mb, "mode": mode},
                             distributed=plan, max_memory_mb=args.max_memory)
    finally:
        status.stop()
    result = None
    if outcome.extra.get("analysed"):
        from opscope.report.json_out import read_scan_json
        try:
            result = read_scan_json(out / "scan.json")
        except UserError:
            result = None
    from opscope.pipeline import analyse_capture, write_reports
    if result is None:  # the child could not analyse (killed, crashed): do it here
        result = analyse_capture(out, script=str(script), argv=args.script_args,
                                 device=outcome.extra.get("device", args.device), settings=settings,
                                 outcome=outcome, started_at=started_at, duration_s=time.perf_counter() - t0,
                                 static_paths=[], target=args.target)
    import contextlib
    with (console.status("writing " + ", ".join(formats)) if formats and not args.quiet else contextlib.nullcontext()):
        written = [out / "scan.json", out / "operators.csv"] + write_reports(result, out, formats)
    if not args.quiet:
        from opscope.report.terminal import make_console, print_summary
        summary_console = make_console()
        print_summary(result, summary_console)
        summary_console.print("wrote " + ", ".join(str(p) for p in written), soft_wrap=True)
    if not result.complete:
        code = {"timeout": EXIT_TIMEOUT, "interrupted": outcome.code or 130}.get(outcome.kind, EXIT_SCRIPT_FAILED)
        kept = sum(1 for s in result.steps if s.complete)
        raise UserError(f"{result.incomplete_reason}; wrote the {kept} complete step(s) captured before it "
                        f"to {out / 'scan.json'}", code)
    score = (result.summary or {}).get("readiness_score")
    if args.fail_under is not None and (score is None or score < args.fail_under):
        shown = "n/a (nothing was measured)" if score is None else score
        raise UserError(f"readiness score {shown} is below --fail-under {args.fail_under:g}", EXIT_FAIL_UNDER)
    return 0


def _choose_mode(args: argparse.Namespace, script: Path, console) -> str:
    """real or fake; ``auto`` asks ``_fake_probe.choose_mode`` (a fake probe of the model's construction)."""
    if args.mode != "auto":
        return args.mode
    from opscope.commands._fake_probe import choose_mode
    mode, why = choose_mode(script, args.script_args, args.timeout)
    if not args.quiet:
        console.print(f"opscope: --mode auto chose {mode}: {why}", soft_wrap=True)
    args.mode_reason = why
    return mode


def _static_only(path: Path, out: Path, formats: list[str], quiet: bool) -> int:
    """Scan files without running anything: findings to the terminal, findings.json (+ SARIF)."""
    import json
    if not path.exists():
        raise UserError(f"path not found: {path} (give a Python file or a project folder)")
    from opscope.analysis.static_scan import scan_paths
    t0 = time.perf_counter()
    from opscope.report.terminal import progress_bar
    with progress_bar("scanning source files", quiet) as update:
        findings = scan_paths([path], progress=update)
    elapsed = time.perf_counter() - t0
    _check_out(out)
    (out / "findings.json").write_text(json.dumps([f.to_dict() for f in findings], indent=1), encoding="utf-8")
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
