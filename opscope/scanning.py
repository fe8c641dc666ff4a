"""The scan use-case as a library: ``ScanOptions`` (every option of ``opscope scan``, checked) and
``Scan`` (runs the script in a capture child, analyses, writes the run folder).

``opscope scan`` only parses its command line into a ``ScanOptions``, runs a ``Scan`` with a
``ScanListener`` that prints on the terminal, and maps the ``ScanRun`` it gets back to an exit
code; ``opscope.scan(...)`` runs the same ``Scan`` silently and returns its ``ScanResult``;
the in-process ``opscope.capture(...)`` (``api.py``) builds its ``ScanSettings`` with
``ScanOptions.settings``.  Like ``pipeline.py``, this module sits above the layers.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.errors import EXIT_WRITE_FAILED, UserError
from opscope.model import ScanResult, ScanSettings

DEFAULT_STEPS = 5
DEFAULT_FORMATS = ("html", "xlsx")
STEP_MARKERS = ("auto", "optimizer", "backward", "module")
LAUNCHERS = ("auto", "spawn", "torchrun", "none")
MODES = ("real", "fake", "auto")
NO_SCRIPT = ("give the training script: opscope scan train.py [-- ARGS], or the launch command after "
             "`--`: opscope scan -- accelerate launch train.py ARGS")


@dataclass(frozen=True)
class ScanOptions:
    """Every option of ``opscope scan``, as the command line gives them (``--out`` is ``out``,
    ``--no-traces`` is ``traces=False``, ``--format`` is ``formats``); ``check()`` refuses a bad one."""
    script: str | None = None
    script_args: tuple[str, ...] = ()
    out: str = "opscope-out"
    steps: int = DEFAULT_STEPS
    warmup: int = 0
    device: str = "auto"
    timeout: float | None = None
    step_marker: str = "auto"
    launcher: str = "auto"
    world_size: int | None = None
    ranks: str = "0"
    target: str | None = None
    chip: str | None = None
    calibration: str | None = None
    formats: tuple[str, ...] = DEFAULT_FORMATS
    traces: bool = True
    keep_compile: bool = False
    max_step_calls: int | None = None
    max_capture_mb: int | None = None
    max_memory: float | None = None
    mode: str = "real"

    def require_script(self) -> None:
        """A usage error (exit 2) when no script is given."""
        if self.script is None:
            raise UserError(NO_SCRIPT)

    def check(self, listener: ScanListener | None = None) -> CheckedScan:
        """Refuse a bad option with a one-line ``UserError`` (exit 2), as ``opscope scan`` does, and resolve
        what the options name: the script inside a launch command, the torch_npu release, the chip, the
        calibration file and the launch of a distributed script.  Creates ``out`` (it must be writable).
        ``listener`` hears the launch command's description (``accelerate launch: scanning ...``)."""
        self.require_script()
        from opscope.torch_support import check_installed_torch
        check_installed_torch()   # a torch outside the supported range: one line, before the child fails importing it
        from opscope.capture.wrappers import unwrap
        script, script_args = Path(str(self.script)), tuple(self.script_args)
        wrapped = unwrap(str(self.script), list(self.script_args))   # `-- accelerate launch ... train.py ARGS`
        if wrapped is not None:
            script, script_args = Path(wrapped.script), tuple(wrapped.args)
        if not script.exists():
            raise UserError(f"script not found: {script} (check the path; script arguments go after `--`)")
        if script.is_dir() or script.suffix not in (".py", ""):
            raise UserError(f"{script} is not a Python script; give the training script (e.g. train.py), "
                            "or use --static-only to scan a folder")
        check_compiles(script)
        formats = self._check_values()
        out = Path(self.out)
        check_out(out)
        from opscope.analysis.verdicts.support import resolve_target
        target = resolve_target(self.target)  # the one resolution; fails fast on an unknown torch_npu version
        from opscope.analysis.npu.cost import resolve_chip
        chip = resolve_chip(self.chip)[0]  # and on an unknown chip
        calibration = calibration_file(self.calibration)
        launcher, world_size = self.launcher, self.world_size
        if wrapped is not None and wrapped.wrapper != "python":
            if listener is not None:
                listener.launch(wrapped.describe())
            if launcher == "auto" and wrapped.world_size > 1:   # the wrapper starts the ranks (torch.distributed.run)
                launcher, world_size = "torchrun", world_size or wrapped.world_size
            elif launcher == "auto":
                launcher = "none"
        from opscope.capture import distributed as dist_launch
        distributed = dist_launch.resolve(launcher, script, world_size, self.ranks)
        return CheckedScan(options=self, script=script, script_args=script_args, out=out, formats=formats,
                           wrapped=wrapped, target=target, chip=chip, calibration=calibration, distributed=distributed)

    def _check_values(self) -> tuple[str, ...]:
        """The checks of the options' values alone; the report formats, normalised."""
        for option, value, valid in (("--step-marker", self.step_marker, STEP_MARKERS), ("--mode", self.mode, MODES)):
            if value not in valid:   # the command line's parser refused it already
                raise UserError(f"unknown {option} {value!r}: choose from {', '.join(valid)}")
        if self.steps < 1:
            raise UserError("--steps must be at least 1")
        if self.warmup < 0 or self.warmup >= self.steps:
            raise UserError("--warmup must be between 0 and --steps - 1")
        for flag in ("max_step_calls", "max_capture_mb"):
            if getattr(self, flag) is not None and getattr(self, flag) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be a positive number")
        if self.timeout is not None and self.timeout <= 0:
            raise UserError("--timeout must be a positive number of seconds")
        from opscope.report.registry import parse_formats
        try:   # the command line's --format is parsed already
            formats = parse_formats(list(self.formats), "scan", allow_empty=True)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return formats

    def settings(self, checked: CheckedScan | None = None, *, mode: str = "real", mode_reason: str | None = None,
                 remap: bool | None = None) -> ScanSettings:
        """The ``ScanSettings`` scan.json records for these options: the one place they are built.

        ``checked`` (``check()``'s answer) adds what was resolved (chip, calibration, launch wrapper,
        distributed launch); ``mode``/``mode_reason`` are what ``--mode`` chose; without ``checked``
        (the in-process ``opscope.capture``) only the options themselves are recorded."""
        settings = ScanSettings(steps=self.steps, warmup=self.warmup, step_marker=self.step_marker,
                                timeout=self.timeout, target=self.target, requested_device=self.device, remap=remap)
        if checked is None:
            return settings
        settings.chip, settings.calibration = checked.chip, checked.calibration
        settings.writing("chip", "calibration")
        wrapped = checked.wrapped
        if wrapped is not None and wrapped.wrapper != "python":
            settings.wrapper = {"name": wrapped.wrapper, "world_size": wrapped.world_size,
                                "mixed_precision": wrapped.precision, "dtype": wrapped.dtype, "env": wrapped.env}
        if self.mode == "auto":
            settings.mode_auto = mode_reason
            settings.writing("mode_auto")
        if mode != "real":
            settings.mode = mode
        plan = checked.distributed
        if plan:
            settings.distributed = {"launcher": plan.launcher, "world_size": plan.world_size,
                                    "ranks": list(plan.ranks),
                                    "rank_dirs": {str(r): "." if r == 0 else f"rank{r}" for r in plan.ranks}}
            settings.rank = 0
        return settings


@dataclass(frozen=True)
class CheckedScan:
    """``ScanOptions.check()``'s answer: the options with what they name resolved."""
    options: ScanOptions
    script: Path          # the script itself (inside a launch command: its script)
    script_args: tuple[str, ...]
    out: Path
    formats: tuple[str, ...]   # the reports to write, checked against the registry
    wrapped: Any          # capture.wrappers.Wrapped of a launch command, else None
    target: Any           # the torch_npu release judged against (analysis.verdicts.resolve_target)
    chip: str
    calibration: str | None
    distributed: Any      # capture.distributed.DistributedPlan, or None for one process


class ScanListener:
    """What a running scan tells; every method does nothing here.  ``opscope scan`` prints each one."""

    def launch(self, text: str) -> None:
        """How the script is launched: a launch command's or a distributed launch's description."""

    def mode(self, mode: str, why: str) -> None:
        """What ``mode="auto"`` chose and why."""

    def note(self, text: str) -> None:
        """A note or a warning (``note: ...``, ``warning: ...``) that is shown even when quiet."""

    def status(self, text: str | None) -> None:
        """The step being captured, the analysis, the reports being written; None: nothing is running."""


@dataclass
class ScanRun:
    """What a ``Scan`` did: its ``result``, how the script ended (``outcome``, a ``ChildOutcome``),
    the files ``written`` and the run folder ``out``."""
    result: ScanResult
    outcome: Any
    written: list[Path]
    out: Path


class Scan:
    """One scan, as ``opscope scan`` runs it: ``Scan(options).run()`` checks the options, runs the script
    for ``options.steps`` steps in a capture child, analyses and writes the run folder.

    ``listener`` hears progress and notes; ``early`` is a capture child started ahead of its plan
    (``capture.processes.EarlyChild``), used when the plan can run in it.  Problems of the options,
    the run folder or the disk are ``UserError``s with the command's exit codes; a script that failed
    or timed out is a ``ScanRun`` whose ``result.complete`` is False."""

    def __init__(self, options: ScanOptions, listener: ScanListener | None = None, early: Any = None):
        self.options = options
        self.listener = listener or ScanListener()
        self.early = early

    def run(self) -> ScanRun:
        """Check, capture, analyse and write; the ``ScanRun``."""
        checked = self.options.check(self.listener)
        return self.run_checked(checked)

    def run_checked(self, checked: CheckedScan) -> ScanRun:
        """The scan of options ``check()`` already passed (holding the run folder while it runs)."""
        options, listener = self.options, self.listener
        mode, why = _choose_mode(options, checked)   # --mode fake|auto: fake_mode.py
        if why is not None:
            listener.mode(mode, why)
        settings = options.settings(checked, mode=mode, mode_reason=why)
        device = options.device.lower()
        if mode != "real":
            device = "cpu"   # fake tensors stand for the device's; CUDA calls are remapped as on a CPU scan
        if checked.distributed:
            from opscope.capture import distributed as dist_launch
            listener.launch(dist_launch.describe(checked.distributed))
        from opscope.capture import run_folder
        out = checked.out
        held = run_folder.lock(out, "scan")   # one scan per folder; refused at once (exit 2) when taken
        try:
            if held.note:
                listener.note(f"note: {held.note}")
            from opscope.report.registry import reporters
            run_folder.RunFolder(out).clear_previous_scan([r.file_name for r in reporters("scan").values()])
            from opscope.capture.protocol import ScanPlan
            plan = ScanPlan(script=str(checked.script), argv=checked.script_args, out_dir=str(out),
                            steps=options.steps, device=device, step_marker=options.step_marker,
                            export_traces=options.traces, analyse=True, settings=settings.to_dict(),
                            target=checked.target, timeout=options.timeout, keep_compile=options.keep_compile,
                            max_step_calls=options.max_step_calls, max_capture_mb=options.max_capture_mb,
                            mode=mode, distributed=checked.distributed)
            env = checked.wrapped.env if checked.wrapped is not None else None
            return self._capture(plan, env, checked.formats)
        finally:
            held.release()

    def _capture(self, plan, env: dict | None, formats: tuple[str, ...]) -> ScanRun:
        """Run ``plan`` (a ``capture.protocol.ScanPlan``), then write its reports."""
        from opscope.capture.run_folder import space_warning
        from opscope.capture.runner import run_script
        options, listener = self.options, self.listener
        script, out, steps = Path(plan.script), Path(plan.out_dir), options.steps
        started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        listener.status(f"running {script.name} under the profiler: step 0/{steps}")
        space_checked: list[int] = []

        def progress(done: int) -> None:
            if done and not space_checked:   # after the first step: will the rest fit on the disk?
                space_checked.append(done)
                warning = space_warning(out, done, steps)
                if warning:
                    listener.note(f"warning: {warning}")
            if done >= steps:  # the script is stopped; verdicts, dynamic shapes and reports follow
                listener.status(f"captured {steps}/{steps} steps of {script.name}; analysing "
                                "(verdicts, dynamic shapes, reports)")
            else:
                listener.status(f"running {script.name} under the profiler: step {done}/{steps}")

        try:
            outcome = run_script(plan, progress=progress, max_memory_mb=options.max_memory, env=env,
                                 early=self.early)
        finally:
            listener.status(None)
        result = None
        if outcome.extra.get("analysed"):
            from opscope.report.json_out import read_scan_json
            try:
                result = read_scan_json(out / "scan.json")
            except UserError:
                result = None
        try:
            if result is None:  # the child could not analyse (killed, crashed): do it here
                from opscope.pipeline import analyse_capture
                result = analyse_capture(out, script=str(script), argv=list(plan.argv),
                                         device=outcome.extra.get("device", options.device), settings=plan.settings,
                                         outcome=outcome, started_at=started_at,
                                         duration_s=time.perf_counter() - t0, static_paths=[], target=plan.target)
            written = self._write(result, out, list(formats))
        except (OSError, UserError) as exc:
            failure = getattr(exc, "os_error", exc)
            if not isinstance(failure, OSError):
                raise
            path = getattr(exc, "path", None) or failure.filename
            if outcome.kind == "write-error":   # the capture's failure is the story; this one followed from it
                raise _write_failed(out, outcome, steps, None, outcome.extra.get("error_path"), result,
                                   also=Path(path).name if path else None) from None
            raise _write_failed(out, outcome, steps, failure, path, result) from None
        if outcome.kind == "write-error":
            raise _write_failed(out, outcome, steps, None, outcome.extra.get("error_path"), result)
        return ScanRun(result=result, outcome=outcome, written=written, out=out)

    def _write(self, result: ScanResult, out: Path, formats: list[str]) -> list[Path]:
        """The notes kept off the terminal into scan.json, then the reports; every file written."""
        from opscope.pipeline import write_reports
        _note_kept_noise(result, out)
        if formats:
            self.listener.status("writing " + ", ".join(formats))
        try:
            return [out / "scan.json", out / "operators.csv"] + write_reports(result, out, formats)
        finally:
            if formats:
                self.listener.status(None)


def scan(script: str | os.PathLike, *script_args: str, listener: ScanListener | None = None,
         **options: Any) -> ScanResult:
    """``opscope scan`` from Python: run ``script`` with ``script_args`` for a few steps in a capture child,
    analyse it and write the run folder; the ``ScanResult``.  ``options`` are ``ScanOptions``' fields."""
    known = {f.name for f in dataclasses.fields(ScanOptions)} - {"script", "script_args"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"scan() got an unexpected keyword argument {unknown[0]!r}")
    if "formats" in options:   # "html,xlsx" as --format takes it, or a sequence
        given = options["formats"]
        options["formats"] = tuple(given.split(",") if isinstance(given, str) else given)
    if "out" in options:
        options["out"] = os.fspath(options["out"])
    scan_options = ScanOptions(script=os.fspath(script), script_args=tuple(str(a) for a in script_args), **options)
    return Scan(scan_options, listener).run().result


def check_out(out: Path) -> None:
    """``out`` exists and a file can be written in it, else a one-line ``UserError``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a name of this process's own: a second scan started into the same folder at the same moment
        # probes too, and must reach the lock's "being written by another scan", not a missing probe
        probe = out / f".opscope-write-test.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror or exc}; choose a writable folder") from None


def check_compiles(script: Path) -> None:
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


def calibration_file(given: str | None) -> str | None:
    """The `opscope calibrate` file the estimate uses: --calibration, else ./opscope-calibration.json."""
    from opscope.analysis.npu.cost import CALIBRATION_FILE, load_calibration
    path = Path(given) if given else Path.cwd() / CALIBRATION_FILE
    if given and not path.is_file():
        raise UserError(f"--calibration {given}: no such file; run `opscope calibrate NPU_PROFILE -o {given}` first")
    if load_calibration(path) is None:   # checks the file: a broken one is a one-line error (exit 2)
        return None
    return str(path.resolve())


def _choose_mode(options: ScanOptions, checked: CheckedScan) -> tuple[str, str | None]:
    """(real or fake, why ``auto`` chose it: None unless asked); ``auto`` runs a fake probe of the model's
    construction (``mode_probe.choose_mode``)."""
    if options.mode != "auto":
        return options.mode, None
    from opscope.mode_probe import choose_mode
    return choose_mode(checked.script, list(checked.script_args), options.timeout)


def _write_failed(out: Path, outcome, steps: int, exc: OSError | None, path, result,
                 also: str | None = None) -> UserError:
    """The one line for a run folder that filled up (or failed) mid-scan: what failed, what was kept."""
    import errno

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
            kept = sum(1 for s in load_capture(out).steps if s.complete)
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


def _note_kept_noise(result: ScanResult, out: Path) -> None:
    """What was kept off the terminal (profiler lines, opscope's own warnings) goes into scan.json's notes."""
    from opscope.capture.noise import notes
    kept = [n for n in notes(out / "capture") if n not in result.notes]
    if kept:
        from opscope.report.json_out import write_scan_json
        result.notes.extend(kept)
        write_scan_json(result, out / "scan.json")
