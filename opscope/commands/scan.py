"""``opscope scan SCRIPT [options] -- [script args]``: run, capture, analyse, report."""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import time
from pathlib import Path

from opscope.commands._args import finite_float, non_empty, positive_float
from opscope.commands._common import add_device, add_out, calibration_file, check_compiles
from opscope.errors import EXIT_FAIL_UNDER, EXIT_SCRIPT_FAILED, EXIT_TIMEOUT, EXIT_WRITE_FAILED, UserError
from opscope.model import ScanSettings
from opscope.report.registry import add_format_option

DEFAULT_STEPS = 5


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
        # a name of this process's own: a second scan started into the same folder at the same moment
        # probes too, and must reach the lock's "being written by another scan", not a missing probe
        probe = out / f".opscope-write-test.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror or exc}; choose a writable folder") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    console = Console(stderr=True)
    if args.script is None:
        raise UserError("give the training script: opscope scan train.py [-- ARGS], or the launch command after "
                        "`--`: opscope scan -- accelerate launch train.py ARGS")
    script = Path(args.script)
    formats = list(args.format)
    if args.static_only:   # (set in a project's config): no capture child
        if getattr(args, "early_child", None) is not None:
            args.early_child.discard()
        return _static_only(script, Path(args.out), formats, args.quiet)
    from opscope.torch_support import check_installed_torch
    check_installed_torch()   # a torch outside the supported range: one line, before the child fails importing it
    from opscope.capture.wrappers import unwrap
    wrapped = unwrap(args.script, list(args.script_args))   # `-- accelerate launch ... train.py ARGS`
    if wrapped is not None:
        script, args.script_args = Path(wrapped.script), wrapped.args
    if not script.exists():
        raise UserError(f"script not found: {script} (check the path; script arguments go after `--`)")
    if script.is_dir() or script.suffix not in (".py", ""):
        raise UserError(f"{script} is not a Python script; give the training script (e.g. train.py), "
                        "or use --static-only to scan a folder")
    check_compiles(script)
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
    # the capture child opscope.cli started (importing torch meanwhile): run_script uses it when the
    # plan can run in it, opscope.cli discards it otherwise
    return _checked_scan(args, console, script, out, formats, wrapped, getattr(args, "early_child", None))


def _checked_scan(args, console, script: Path, out: Path, formats: list[str], wrapped, early) -> int:
    """The checks that need the matrix, the launcher and the run folder, then the scan."""
    from opscope.analysis.verdicts import resolve_target
    target = resolve_target(args.target)  # the one resolution; fails fast on an unknown torch_npu version
    from opscope.analysis.npu_cost import resolve_chip
    chip = resolve_chip(args.chip)[0]  # and on an unknown chip
    calibration = calibration_file(args.calibration)
    from opscope.capture import distributed as dist_launch
    launcher, world_size = args.launcher, args.world_size
    if wrapped is not None and wrapped.wrapper != "python":
        if not args.quiet:
            console.print(f"opscope: {wrapped.describe()}")
        if launcher == "auto" and wrapped.world_size > 1:   # the wrapper starts the ranks (torch.distributed.run)
            launcher, world_size = "torchrun", world_size or wrapped.world_size
        elif launcher == "auto":
            launcher = "none"
    plan = dist_launch.resolve(launcher, script, world_size, args.ranks)
    settings = ScanSettings(steps=args.steps, warmup=args.warmup, step_marker=args.step_marker,
                            timeout=args.timeout, target=args.target, requested_device=args.device,
                            chip=chip, calibration=calibration).writing("chip", "calibration")
    if wrapped is not None and wrapped.wrapper != "python":
        settings.wrapper = {"name": wrapped.wrapper, "world_size": wrapped.world_size,
                            "mixed_precision": wrapped.precision, "dtype": wrapped.dtype, "env": wrapped.env}
    mode = _choose_mode(args, script, console)   # --mode fake|auto: fake_mode.py
    if args.mode == "auto":
        settings.mode_auto = getattr(args, "mode_reason", None)
        settings.writing("mode_auto")
    device = args.device.lower()
    if mode != "real":
        settings.mode = mode
        device = "cpu"   # fake tensors stand for the device's; CUDA calls are remapped as on a CPU scan
    if plan:
        settings.distributed = {"launcher": plan.launcher, "world_size": plan.world_size,
                                "ranks": list(plan.ranks),
                                "rank_dirs": {str(r): "." if r == 0 else f"rank{r}" for r in plan.ranks}}
        settings.rank = 0
        if not args.quiet:
            console.print(f"opscope: {dist_launch.describe(plan)}")
    from opscope.capture import run_folder
    held = run_folder.lock(out, "scan")   # one scan per folder; refused at once (exit 2) when taken
    try:
        if held.note:
            console.print(f"opscope: note: {held.note}", soft_wrap=True, markup=False, highlight=False)
        from opscope.report.registry import reporters
        run_folder.RunFolder(out).clear_previous_scan([r.file_name for r in reporters("scan").values()])
        from opscope.capture.protocol import ScanPlan
        scan_plan = ScanPlan(script=str(script), argv=tuple(args.script_args), out_dir=str(out), steps=args.steps,
                             device=device, step_marker=args.step_marker, export_traces=not args.no_traces,
                             analyse=True, settings=settings.to_dict(), target=target, timeout=args.timeout,
                             keep_compile=args.keep_compile, max_step_calls=args.max_step_calls,
                             max_capture_mb=args.max_capture_mb, mode=mode, distributed=plan)
        return _scan(args, console, scan_plan, formats, env=wrapped.env if wrapped is not None else None,
                     early=early)
    finally:
        held.release()


# above complexity 15: CLI command: one branch per scan mode and outcome
def _scan(args, console, plan, formats: list[str], env: dict | None = None, early=None) -> int:  # noqa: C901
    """Run ``plan`` (a ``capture.protocol.ScanPlan``), then write its reports; the exit status."""
    from opscope.capture.run_folder import space_warning
    from opscope.capture.runner import run_script
    script, out = Path(plan.script), Path(plan.out_dir)
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    status = console.status(f"running {script.name} under the profiler: step 0/{args.steps}")
    if not args.quiet:
        status.start()

    space_checked: list[int] = []

    def progress(done: int) -> None:
        if done and not space_checked:   # after the first step: will the rest fit on the disk?
            space_checked.append(done)
            warning = space_warning(out, done, args.steps)
            if warning:
                console.print(f"opscope: warning: {warning}", soft_wrap=True, markup=False, highlight=False)
        if not args.quiet:
            if done >= args.steps:  # the script is stopped; verdicts, dynamic shapes and reports follow
                status.update(f"captured {args.steps}/{args.steps} steps of {script.name}; analysing "
                              "(verdicts, dynamic shapes, reports)")
            else:
                status.update(f"running {script.name} under the profiler: step {done}/{args.steps}")

    try:
        outcome = run_script(plan, progress=progress, max_memory_mb=args.max_memory, env=env, early=early)
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
    try:
        if result is None:  # the child could not analyse (killed, crashed): do it here
            result = analyse_capture(out, script=str(script), argv=args.script_args,
                                     device=outcome.extra.get("device", args.device), settings=plan.settings,
                                     outcome=outcome, started_at=started_at, duration_s=time.perf_counter() - t0,
                                     static_paths=[], target=plan.target)
        _note_kept_noise(result, out)
        import contextlib
        with (console.status("writing " + ", ".join(formats)) if formats and not args.quiet
              else contextlib.nullcontext()):
            written = [out / "scan.json", out / "operators.csv"] + write_reports(result, out, formats)
    except (OSError, UserError) as exc:
        failure = getattr(exc, "os_error", exc)
        if not isinstance(failure, OSError):
            raise
        path = getattr(exc, "path", None) or failure.filename
        if outcome.kind == "write-error":   # the capture's failure is the story; this one followed from it
            raise _write_failed(out, outcome, args.steps, None, outcome.extra.get("error_path"), result,
                                also=Path(path).name if path else None) from None
        raise _write_failed(out, outcome, args.steps, failure, path, result) from None
    if outcome.kind == "write-error":
        raise _write_failed(out, outcome, args.steps, None, outcome.extra.get("error_path"), result)
    if not args.quiet:
        from opscope.report.terminal import make_console, print_summary
        summary_console = make_console()
        print_summary(result, summary_console, run_dir=str(out))
        summary_console.print("wrote " + ", ".join(str(p) for p in written), soft_wrap=True)
    if not result.complete:
        code = {"timeout": EXIT_TIMEOUT, "interrupted": outcome.code or 130}.get(outcome.kind, EXIT_SCRIPT_FAILED)
        kept = sum(1 for s in result.steps if s.complete)
        raise UserError(f"{result.incomplete_reason}; wrote the {kept} complete step(s) captured before it "
                        f"to {out / 'scan.json'}", code)
    score = result.summary.readiness_score
    if args.fail_under is not None and (score is None or score < args.fail_under):
        shown = "n/a (nothing was measured)" if score is None else score
        raise UserError(f"readiness score {shown} is below --fail-under {args.fail_under:g}", EXIT_FAIL_UNDER)
    return 0


def _write_failed(out: Path, outcome, steps: int, exc: OSError | None, path, result,
                  also: str | None = None) -> UserError:
    """The one line for a run folder that filled up (or failed) mid-scan: what failed, what was kept."""
    import errno
    import os

    from opscope.capture.run_folder import RunFolder, folder_bytes, free_bytes, write_error_text
    prefix, _, written = (outcome.message or "").rpartition(" writing ")
    path = path or (written if exc is None and prefix else None)
    if path:   # shown as the user named --out: runs/x/traces/step_0004.json
        full_path = Path(path) if os.path.isabs(path) else out.resolve() / path
        rel = os.path.relpath(full_path, out.resolve())
        path = out / rel if not rel.startswith("..") else full_path
    if exc is not None:
        what = write_error_text(exc, path or out)
    elif path and prefix:
        what = f"{prefix} writing {path}"
    elif path:
        what = f"could not write {path}"
    else:
        what = outcome.message or f"a file of {out} could not be written"
    folder = RunFolder(out)
    if result is None and folder.scan_json.is_file():   # written before a later file failed
        from opscope.report.json_out import read_scan_json
        try:
            result = read_scan_json(folder.scan_json)
        except UserError:
            result = None
    if result is not None and folder.scan_json.is_file():
        kept = sum(1 for s in result.steps if s.complete)
        where = (f"{_steps(kept)} kept in {folder.scan_json}" if kept else
                 f"no step was complete before it; {folder.scan_json} holds what was captured")
    else:
        from opscope.capture.store import load_capture
        try:
            kept = sum(1 for s in load_capture(out)[1] if s.complete)
        except Exception:   # nothing readable: nothing was kept
            kept = 0
        where = (f"{_steps(kept)} kept in {folder.steps_log}; `opscope report {out}` rebuilds scan.json from "
                 "them once there is room" if kept else "no complete step was kept")
    if also:
        where += f", {also} not written"
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT) if exc is not None else \
        any(text in what for text in ("no space left", "disk quota"))
    if full:   # a re-scan clears this folder first, so what it holds counts as free
        used = folder_bytes(out)
        need = used / max(kept, 1) * steps * 1.2 - used - (free_bytes(out) or 0)
        fix = f"free ~{max(need, 2**20) / 2**20:,.0f} MB or choose another --out"
    else:
        fix = "check that file system or choose another --out"
    return UserError(f"{what} ({where}; {fix})", EXIT_WRITE_FAILED)


def _steps(n: int) -> str:
    return f"{n} complete step{'' if n == 1 else 's'}"


def _note_kept_noise(result, out: Path) -> None:
    """What was kept off the terminal (profiler lines, opscope's own warnings) goes into scan.json's notes."""
    from opscope.capture.noise import notes
    kept = [n for n in notes(out / "capture") if n not in result.notes]
    if kept:
        from opscope.report.json_out import write_scan_json
        result.notes.extend(kept)
        write_scan_json(result, out / "scan.json")


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
