"""Child-process entry: run the user's script as ``__main__`` under a CaptureSession.

``python -m opscope.capture.child CONFIG.json``.  Running in a child keeps opscope
alive when the script crashes, calls ``sys.exit``, hangs or is killed: the parent
always has the steps written so far plus ``capture/outcome.json`` (when the child could
write it) to explain how the run ended.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path


class _Context:
    """What a plugin sees: the device, the output folder, and step callbacks."""

    def __init__(self, session, device: str, out_dir: Path):
        self.session = session
        self.device = device
        self.out_dir = out_dir

    def on_step(self, callback) -> None:
        self.session.on_step(callback)


def _user_frame_summary(exc: BaseException, script: str) -> str:
    """'file:line' of the innermost frame in the user's script tree, for the one-line error."""
    tb = traceback.extract_tb(exc.__traceback__)
    root = os.path.dirname(os.path.abspath(script))
    for frame in reversed(tb):
        if os.path.abspath(frame.filename).startswith(root + os.sep):
            return f"{os.path.relpath(frame.filename, root)}:{frame.lineno}"
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"


def _resolve_device(requested: str) -> str:
    from opscope.capture.runner import resolve_device
    return resolve_device(requested)


def _analyse(config, out_dir: Path, device, kind, code, message, where, session, write_outcome) -> None:
    """Analyse here, where torch is already imported: the parent then only reads scan.json.

    If this fails or is killed, the parent analyses the capture itself (slower, same result).
    """
    import time
    from opscope.analysis.scan_result import build_scan_result
    from opscope.capture.runner import ChildOutcome
    from opscope.report.csv_out import write_operators_csv
    from opscope.report.json_out import write_scan_json
    try:
        outcome = ChildOutcome(kind=kind, code=code, message=message, where=where, steps=session.step_index)
        result = build_scan_result(out_dir, script=config["script"], argv=config.get("argv", []), device=device,
                                   settings=config.get("settings", {}), outcome=outcome,
                                   started_at=config.get("started_at"),
                                   duration_s=time.time() - config.get("started_epoch", time.time()),
                                   static_paths=[] if config.get("static", True) else None,
                                   target=config.get("target"), capture=session.snapshot())
        write_scan_json(result, out_dir / "scan.json")
        write_operators_csv(result, out_dir / "operators.csv")
        write_outcome(kind, code, message, where, analysed=True, device=device)
    except Exception:  # the parent will analyse; keep the reason for a bug report
        (out_dir / "capture" / "analysis_error.txt").write_text(traceback.format_exc(), encoding="utf-8")


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    out_dir = Path(config["out_dir"])
    script = config["script"]
    outcome_path = out_dir / "capture" / "outcome.json"
    (out_dir / "capture").mkdir(parents=True, exist_ok=True)

    def write_outcome(kind: str, code=None, message: str = "", where: str | None = None, **extra):
        data = {"kind": kind, "code": code, "message": message, "where": where,
                "steps": session.step_index if session else 0, **extra}
        tmp = outcome_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(outcome_path)

    session = None
    from opscope.capture.session import CaptureSession, StopScan
    try:
        device = _resolve_device(config.get("device", "auto"))
    except Exception as exc:  # a UserError: the parent prints it as one line
        outcome_path.write_text(json.dumps({"kind": "usage", "code": 2, "message": str(exc), "steps": 0}))
        return 2
    config["device"] = device

    def on_term(signum, frame):
        raise StopScan("timeout")

    signal.signal(signal.SIGTERM, on_term)
    sys.argv = [script] + list(config.get("argv", []))
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    session = CaptureSession(out_dir, steps=config["steps"], step_marker=config.get("step_marker", "auto"),
                             user_root=os.path.dirname(os.path.abspath(script)),
                             remap=device == "cpu",
                             export_traces=config.get("export_traces", True))
    ctx = _Context(session, device, out_dir)
    for spec in config.get("plugins", []):
        module_name, _, func_name = spec.partition(":")
        getattr(importlib.import_module(module_name), func_name or "install")(ctx)
    session.start()
    kind, code, message, where = "finished", 0, "", None
    try:
        runpy.run_path(script, run_name="__main__")
    except StopScan as stop:
        kind = "timeout" if stop.reason == "timeout" else "steps-reached"
        message = stop.reason
        if kind == "timeout":
            limit = (config.get("settings") or {}).get("timeout") or 0
            message = f"the script did not finish {config['steps']} steps within --timeout {limit:g}s"
            where = _user_frame_summary(stop, script)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        kind = "exit"
        message = f"the script called sys.exit({exc.code!r})"
        where = _user_frame_summary(exc, script)
    except KeyboardInterrupt:
        kind, code, message = "killed", 130, "interrupted"
    except BaseException as exc:  # the user's script raised: keep its story, not ours
        kind, code = "exception", 1
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        where = _user_frame_summary(exc, script)
        tb_path = out_dir / "capture" / "script_traceback.txt"
        tb_path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            session.finish(ended_normally=kind == "finished" or (kind == "exit" and code == 0))
        finally:
            write_outcome(kind, code, message, where)
    sys.stdout.flush()
    sys.stderr.flush()
    if config.get("analyse", True):
        _analyse(config, out_dir, device, kind, code, message, where, session, write_outcome)
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader workers and user atexit handlers of a run we
    # stopped early must not hang or fail the scan after everything is written.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
