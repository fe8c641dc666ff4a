"""Child-process entry: run the user's script as ``__main__`` under a CaptureSession.

``python -m opscope.scan_child CONFIG.json`` runs ``main`` with the analysis step.  Running in a child keeps opscope
alive when the script crashes, calls ``sys.exit``, hangs or is killed: the parent
always has the steps written so far plus ``capture/outcome.json`` (when the child could
write it) to explain how the run ended.
"""
from __future__ import annotations

import importlib
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from opscope.capture.outcomes import ChildOutcome
from opscope.capture.protocol import ScanPlan
from opscope.capture.run_folder import ANALYSIS_ERROR, SCRIPT_TRACEBACK, STOP_REASON, RunFolder, write_error_status
from opscope.capture.where import user_frame_summary


class _Context:
    """What a plugin sees: the device, the output folder, and step callbacks."""

    def __init__(self, session, device: str, out_dir: Path):
        self.session = session
        self.device = device
        self.out_dir = out_dir

    def on_step(self, callback) -> None:
        self.session.on_step(callback)


def _stop_reason(out_dir: Path) -> str | None:
    try:
        return RunFolder(out_dir).capture_file(STOP_REASON).read_text(encoding="utf-8").strip()[:300] or None
    except OSError:
        return None


def _die_with_parent() -> None:
    """If opscope itself dies (SIGKILL, OOM killer), take the script and all it started with us.

    The child runs in its own session so that opscope can stop the whole group; that also
    means nothing stops it when opscope is killed outright.  A watcher thread notices the
    parent is gone and kills this process group (DataLoader workers, spawned ranks).
    """
    import threading
    import time
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="opscope-parent-watch", daemon=True).start()


def _analyse(analyse, plan: ScanPlan, out_dir: Path, outcome: ChildOutcome, session, write_outcome) -> None:
    """Analyse here, where torch is already imported: the parent then only reads scan.json.

    ``analyse`` is ``opscope.pipeline.analyse_capture`` (injected by ``opscope.scan_child``).
    If this fails or is killed, the parent analyses the capture itself (slower, same result).
    """
    try:
        from opscope.capture import ranks
        in_memory = session is not None and not ranks.spawned()  # else: rank 0 captured into out_dir
        analyse(out_dir, script=plan.script, argv=list(plan.argv), device=plan.device,
                settings=plan.settings, outcome=outcome, started_at=plan.started_at,
                duration_s=time.time() - plan.started_epoch,
                static_paths=[] if plan.static else None,
                target=plan.target, capture=session.snapshot() if in_memory else None)
        write_outcome(outcome.kind, outcome.code, outcome.message, outcome.where, analysed=True, device=plan.device)
    except Exception:  # the parent will analyse; keep the reason for a bug report
        try:
            RunFolder(out_dir).write_capture_text(ANALYSIS_ERROR, traceback.format_exc())
        except OSError:
            pass   # a full disk: the parent says so when it writes scan.json


def _fake_mode(plan: ScanPlan, session):
    """``--mode fake``: the hybrid fake-tensor mode of ``fake_mode.py``, ended with the session's steps."""
    if plan.mode not in ("fake", "probe"):
        return None
    from opscope.capture.fake_mode import FakeRun
    from opscope.capture.source import UserCode
    fake_run = FakeRun(getattr(session, "user_code", None) or UserCode(plan.user_root), probe=plan.mode == "probe")
    if hasattr(session, "on_step"):
        session.on_step(fake_run.on_step)
    recording = getattr(session, "recording", None)
    if callable(recording):   # a repeated no-grad forward is skipped only where the profiler is not recording it
        fake_run.may_skip = lambda: not recording()
    return fake_run


def _stopped(stop, plan: ScanPlan) -> tuple[str, str, str | None]:
    """(kind, message, where) of a script that opscope stopped: steps reached, --timeout, a write error."""
    if stop.reason == "write-error":
        return "write-error", stop.reason, None
    if stop.reason == "timeout":
        return ("timeout", f"the script did not finish {plan.steps} steps within --timeout {plan.timeout or 0:g}s",
                user_frame_summary(stop, plan.script))
    return "steps-reached", stop.reason, None


def _install_plugins(plan: ScanPlan, ctx: _Context) -> None:
    """The plan's ``module:function`` plugins (``replay/e2e.py``'s loss recorder), called with the context."""
    for spec in plan.plugins:
        module_name, _, func_name = spec.partition(":")
        getattr(importlib.import_module(module_name), func_name or "install")(ctx)


def _end_fake(fake_run, out_dir: Path) -> None:
    if fake_run is None:
        return
    fake_run.uninstall()
    try:
        fake_run.write(out_dir / "capture")
    except OSError:   # a full disk: the scan's outcome still gets written below
        pass


def _analyse_ranks(analyse, plan: ScanPlan) -> None:
    """scan.json of every other captured rank of a script that spawned its own (each with its own end)."""
    from opscope.capture import ranks
    ranks.analyse_ranks(plan, lambda folder, data, rank_plan: _analyse(
        analyse, rank_plan, folder, ChildOutcome(kind=data.get("kind"), code=data.get("code"),
                                                 message=data.get("message", ""), where=data.get("where")),
        None, lambda *a, **k: None))


def await_plan(fd: int) -> str | None:
    """Import what every capture imports (torch), then read the plan's path from the parent
    (``runner.EarlyChild``); None when the parent closed the pipe without one."""
    import opscope.capture.session  # noqa: F401  # torch and the capture: most of the child's start-up
    with os.fdopen(fd, "rb") as pipe:
        path = pipe.read()   # until the parent closes it: the path's bytes, whatever the name holds
    return os.fsdecode(path) if path else None


class _OutcomeWriter:
    """Writes ``capture/outcome.json``, again each time the outcome is settled further (after the script, after
    the analysis): it reads the steps from the session once there is one and keeps what every rewrite must
    carry (the write error's path)."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self.session = None
        self.extra: dict = {}   # kept across rewrites of the outcome

    def __call__(self, kind: str, code=None, message: str = "", where: str | None = None, **extra) -> None:
        data = {"kind": kind, "code": code, "message": message, "where": where,
                "steps": self.session.step_index if self.session else 0, "ended": time.time(),
                "torch": getattr(sys.modules.get("torch"), "__version__", None), **self.extra, **extra}
        try:
            self.folder.write_outcome(data)
        except OSError as exc:   # not even this fits: the exit status tells the parent
            sys.stderr.flush()
            os._exit(write_error_status(exc))


def _with_device(plan: ScanPlan) -> ScanPlan:
    """The plan with its device resolved (imports torch); on the CPU, checks that the CUDA stand-in fits this
    torch build.  Raises a UserError the parent prints as one line."""
    from opscope.capture.devices import resolve_device  # imports torch
    plan = plan.with_device(resolve_device(plan.device))
    if plan.device == "cpu":   # the CPU stand-in for CUDA will answer the script
        import torch

        from opscope.torch_support import check_stand_in_build
        check_stand_in_build(torch.__version__, getattr(torch.version, "hip", None))
    return plan


def _become_the_script(plan: ScanPlan, out_dir: Path, stop_scan: type[BaseException]) -> None:
    """Make this process the script's: its signals (SIGTERM stops the scan), its death with the parent, its
    ``sys.argv`` and ``sys.path``; opscope's own warnings go to scan.json notes, not stderr."""
    def on_term(signum, frame):
        raise stop_scan("timeout")

    signal.signal(signal.SIGTERM, on_term)
    # opscope forwards Ctrl-C / its own SIGTERM as SIGINT; a shell may have started us with
    # SIGINT ignored (background jobs), so install Python's handler explicitly
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _die_with_parent()
    from opscope.capture.noise import divert_own_warnings
    divert_own_warnings(out_dir / "capture")
    sys.argv = [plan.script] + list(plan.argv)
    sys.path.insert(0, plan.user_root)


def _start_capture(plan: ScanPlan, out_dir: Path):
    """(session, fake run or None): the capture session (or the ranks' stand-in of a distributed launch) with
    its plugins, started, and ``--mode fake``'s fake tensors installed."""
    from opscope.capture import ranks  # distributed launches: spawned ranks, ranks not captured
    session = ranks.make_session(plan.capture, out_dir, **plan.session_options())
    ranks.install_spawn(session, plan)
    _install_plugins(plan, _Context(session, plan.device, out_dir))
    fake_run = _fake_mode(plan, session)   # --mode fake: the model runs as fake tensors
    session.start()
    if fake_run is not None:
        fake_run.install()
    return session, fake_run


def _script_error(exc: BaseException, script: str, folder: RunFolder) -> tuple[str, str | None]:
    """(message, where) of an exception the user's script raised, its traceback kept in the run folder: the
    script's story, not ours."""
    from opscope.text import printable
    message = printable(f"{type(exc).__name__}: {exc}", "").strip().splitlines()[0][:300]
    where = user_frame_summary(exc, script)
    try:
        folder.write_capture_text(SCRIPT_TRACEBACK, "".join(traceback.format_exception(exc)))
    except OSError:
        pass   # the one-line error keeps the story
    return message, where


def _end_capture(session, fake_run, out_dir: Path, write_outcome: _OutcomeWriter,
                 kind: str, code: object, message: str, where: str | None) -> tuple[str, object, str, str | None]:
    """Finish the session and the fake run, take the ranks' end, and write the outcome: a write error of an
    otherwise clean run becomes the outcome (the disk's reserve released for it and for scan.json)."""
    from opscope.capture import ranks
    try:
        session.finish(ended_normally=kind == "finished" or (kind == "exit" and code == 0))
    finally:
        _end_fake(fake_run, out_dir)
        kind, code, message, where, rank0_steps = ranks.after_script(kind, code, message, where)
        if rank0_steps is not None:  # the ranks trained: this process's own session was handed over
            session.step_index = rank0_steps
        clean = kind in ("finished", "steps-reached", "write-error") or (kind == "exit" and code == 0)
        if session.write_error is not None and clean:
            write_outcome.folder.release_reserve()   # room for this outcome and for scan.json of the complete steps
            path, what = session.write_error
            kind, code, where = "write-error", None, None
            message = f"{what} writing {os.path.relpath(path, out_dir)}"
            write_outcome.extra["error_path"] = path
        write_outcome(kind, code, message, where)
    return kind, code, message, where


def main(config_path: str, analyse=None) -> int:
    """Run the plan's script as ``__main__`` under a capture session, write how it ended, then analyse the
    capture here.  Returns 2 on a usage error; otherwise ends the process (``os._exit``) once all is written."""
    plan = ScanPlan.from_json(Path(config_path).read_text(encoding="utf-8"))
    out_dir = Path(plan.out_dir)
    script = plan.script
    folder = RunFolder(out_dir)
    folder.capture_dir.mkdir(parents=True, exist_ok=True)
    write_outcome = _OutcomeWriter(folder)
    from opscope.capture.session import StopScan
    try:
        plan = _with_device(plan)
    except Exception as exc:  # a UserError: the parent prints it as one line
        write_outcome("usage", 2, str(exc))
        return 2
    _become_the_script(plan, out_dir, StopScan)
    session, fake_run = _start_capture(plan, out_dir)
    write_outcome.session = session
    code: object   # an exit status, or what a rank reported
    kind, code, message, where = "finished", 0, "", None
    try:
        runpy.run_path(script, run_name="__main__")
    except StopScan as stop:
        kind, message, where = _stopped(stop, plan)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        kind = "exit"
        message = f"the script called sys.exit({exc.code!r})"
        where = user_frame_summary(exc, script)
    except KeyboardInterrupt as exc:
        kind, code = "interrupted", 130
        message = _stop_reason(out_dir) or "the scan was interrupted"
        where = user_frame_summary(exc, script)
    except BaseException as exc:  # the user's script raised: keep its story, not ours
        kind, code = "exception", 1
        message, where = _script_error(exc, script, folder)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        kind, code, message, where = _end_capture(session, fake_run, out_dir, write_outcome,
                                                  kind, code, message, where)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.analyse and analyse is not None:
        outcome = ChildOutcome(kind=kind, code=code, message=message, where=where,  # type: ignore[arg-type]
                               steps=session.step_index)
        _analyse(analyse, plan, out_dir, outcome, session, write_outcome)
        _analyse_ranks(analyse, plan)
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader workers and user atexit handlers of a run we
    # stopped early must not hang or fail the scan after everything is written.
    os._exit(0)
