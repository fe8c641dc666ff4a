"""In-process capture for users who prefer to edit their script (seed 000's ``use_prof``)::

    import opscope
    with opscope.capture(out="runs/x", steps=5) as cap:
        for batch in loader:
            train_step(batch)
            cap.step()

Produces the same ``scan.json``/``operators.csv``/traces/reports as ``opscope scan``.
Nothing is remapped: the code runs on whatever device it asks for.
"""
from __future__ import annotations

import datetime as _dt
import sys
import time
from pathlib import Path
from typing import Literal

from opscope.capture.outcomes import ChildOutcome
from opscope.capture.run_folder import RunFolder
from opscope.capture.session import CaptureSession
from opscope.scanning import ScanOptions


class capture:
    """Capture the steps of a training loop in this process; ``step()`` marks the end of each step.

    ``out``: the run folder (scan.json, operators.csv, traces, reports); ``steps``: how many steps to
    record; ``target``: the torch_npu release to judge against (default the newest); ``formats``: the
    reports to write on exit; ``warmup``: steps left out of the steady-state times; ``export_traces``:
    write each step's Chrome trace; ``static_scan``: also read the script's source for CUDA-only APIs.
    On exit the run is analysed and written as ``opscope scan`` writes it; ``result`` holds the
    ``ScanResult``.
    """

    def __init__(self, out: str | Path = "opscope-out", steps: int = 5, step_marker: str = "manual",
                 target: str | None = None, formats: tuple = ("html", "xlsx"), warmup: int = 0,
                 export_traces: bool = True, static_scan: bool = True):
        self.out = Path(out)
        self.steps = steps
        self.target = target
        self.formats = formats
        # the one construction of a scan's settings (``scanning.ScanOptions``); nothing is remapped here
        self.settings = ScanOptions(steps=steps, warmup=warmup, step_marker=step_marker, target=target,
                                    device="in-process").settings(remap=False)
        self.static_scan = static_scan
        script = sys.modules["__main__"].__dict__.get("__file__") or sys.argv[0] or "<interactive>"
        self.script = str(Path(script).resolve()) if script != "<interactive>" else script
        root = str(Path(self.script).parent) if self.script != "<interactive>" else None
        self.out.mkdir(parents=True, exist_ok=True)
        self.session = CaptureSession(self.out, steps=steps, step_marker=step_marker, user_root=root,
                                      remap=False, export_traces=export_traces, raise_when_done=False)
        self.result = None

    def __enter__(self) -> capture:
        self._t0 = time.perf_counter()
        self._started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        RunFolder(self.out).clear_capture()
        self.session.start()
        return self

    def step(self) -> None:
        """End the current step (no-op once ``steps`` steps are captured)."""
        self.session.step()

    @property
    def done(self) -> bool:
        """True once ``steps`` steps are captured: the loop may stop."""
        return self.session.done

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.session.finish()
        if exc is None:
            outcome = ChildOutcome("steps-reached" if self.session.step_index >= self.steps else "finished", 0)
        else:
            outcome = ChildOutcome("exception", 1, f"{exc_type.__name__}: {exc}".splitlines()[0][:300])
        if self.session.write_error is not None and exc is None:   # the folder filled up: recording stopped there
            path, what = self.session.write_error
            outcome = ChildOutcome("write-error", None, f"{what} writing {path}")
        from opscope.capture.devices import resolve_device
        from opscope.pipeline import analyse_capture
        device = "cpu"
        try:
            device = resolve_device("auto")
        except Exception:
            pass
        self.result = analyse_capture(
            self.out, formats=list(self.formats), script=self.script, argv=sys.argv[1:], device=device,
            settings=self.settings, outcome=outcome, started_at=self._started,
            duration_s=time.perf_counter() - self._t0,
            static_paths=[] if self.static_scan and self.script != "<interactive>" else None, target=self.target)
        return False
