"""One capture: profiler on, step boundaries, per-step records written as they happen.

Each finished step is appended to ``capture/steps.jsonl`` (and its Chrome trace to
``traces/step_NNNN.json``) as soon as its profiler session stops, so a script that later
crashes, exits, hangs or is killed loses nothing that was already written.  The first
``MEMORY_STEPS`` steps have a session each; after them one session records steps until
it holds ``BATCH_SECONDS`` or the call cap (see there), and their trace is one file.
Used by the child process of ``opscope scan`` and by the in-process ``opscope.capture()`` API alike.
"""
from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from opscope.atomic import write_atomic
from opscope.capture.extension_calls import install_extension_recording
from opscope.capture.library_stand_ins import install_library_stand_ins, watch_missing_libraries
from opscope.capture.loaders import install_dataloader_tagging
from opscope.capture.patches import Restore
from opscope.capture.ranges import install_range_tracking
from opscope.capture.run_folder import CALL_FIELDS, RUNTIME, STEPS_LOG, RunFolder, disk_error_text, trace_name
from opscope.capture.source import SourceTable, SourceTracker, UserCode
from opscope.capture.step_writer import KEPT, STEP_END, StepJob, StepWriter, private_rss_mb
from opscope.capture.user_profiler import install_script_profiler_stand_in

DEFAULT_MAX_STEP_CALLS = 20000   # torch calls recorded per step; the rest runs unprofiled
EVAL_FORWARDS_RECORDED = 4       # evaluation/sampling forwards recorded per step
CLOSURE_FORWARDS_RECORDED = 1    # forwards inside optimizer.step(closure) recorded per step
MEMORY_STEPS = 3                 # steps whose device memory a real scan measures (capture/device_memory.py)
# After the first MEMORY_STEPS steps, one profiler session records several steps (a "batch", each step's end
# marked by a STEP_END annotation) and is stopped when the batch holds this many seconds or the step call cap's
# worth of calls, or the scan ends: stopping Kineto and reading its events cost about as much per event in
# one session as in many, but a step then runs at the bare profiler's pace instead of paying 4x a short
# step's time at its end (docs/measured/scan-overhead.md).
BATCH_SECONDS = 5.0
DEFAULT_MAX_CAPTURE_MB = 1536    # capture memory (RSS growth) after which a step stops recording


_RecordFunction = getattr(torch._C._profiler, "_RecordFunctionFast", None)   # cheap profiler annotations
_TORCH_PROFILE = torch.autograd.profiler.profile   # opscope's own profiler, before the script's is stood in


def _collect_cpu(enable: bool) -> None:
    """Pause or resume recording of CPU operators in the running profiler."""
    from torch._C._profiler import ProfilerActivity
    toggle = getattr(torch._C._autograd, "_toggle_collection_dynamic", None)
    if toggle is not None:
        toggle(enable, {ProfilerActivity.CPU})


def _optimizer_wrapper_code():
    """The code object of ``Optimizer.step``'s profiling wrapper (the one of every optimizer)."""
    try:
        from torch.optim.optimizer import Optimizer
        return Optimizer.profile_hook_step(lambda *a, **k: None).__code__
    except Exception:   # another torch: no wrapper to look for
        return None


_OPTIMIZER_WRAPPER = _optimizer_wrapper_code()


def _inside_optimizer_step(frame) -> bool:
    """Is ``Optimizer.step``'s wrapper on the stack, i.e. its ``record_function`` range still open?

    Its post-hooks (and a closure's forward) run inside that range; a step boundary there stops
    the profiler under an open range, whose exit then writes into the freed session (a SIGSEGV in
    the next step).  Walked only when a training forward would force a pending step.
    """
    if _OPTIMIZER_WRAPPER is None:
        return False
    while frame is not None:
        if frame.f_code is _OPTIMIZER_WRAPPER:
            return True
        frame = frame.f_back
    return False


class StopScan(BaseException):
    """Raised inside the user's script to end it once enough steps are captured.

    A BaseException so that the script's ``except Exception`` blocks do not swallow it.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CaptureSession:
    def __init__(self, out_dir: Path, steps: int, step_marker: str = "auto", user_root: str | None = None,
                 remap: bool = False, export_traces: bool = True, raise_when_done: bool = True,
                 keep_compile: bool = False, max_step_calls: int = DEFAULT_MAX_STEP_CALLS,
                 max_capture_mb: int = DEFAULT_MAX_CAPTURE_MB, track_memory: bool = True):
        self.out_dir = Path(out_dir)
        self.capture_dir = RunFolder(self.out_dir).capture_dir
        self.trace_dir = RunFolder(self.out_dir).trace_dir
        self.max_steps = steps
        self.step_marker = step_marker
        self.export_traces = export_traces
        self.raise_when_done = raise_when_done
        self.user_code = UserCode(user_root)
        self.table = SourceTable()
        from opscope.capture.compile_guard import CompileGuard
        from opscope.capture.remap import CudaRemapper, RuntimeFindings
        self.findings = RuntimeFindings(self.user_code)
        self.remapper = CudaRemapper(self.findings) if remap else None
        self.compile_guard = CompileGuard(self.findings) if not keep_compile else None
        self.tracker = SourceTracker(self.user_code, self.table, self.remapper)
        self.tracker.on_safe_point = self.safe_point
        self.tracker.call_cap = max_step_calls
        self.max_step_calls = max_step_calls
        self.tracker.on_call_cap = self._call_cap_reached
        self._unrecorded: dict = {}       # this step: what ran unprofiled (bounded memory)
        self._eval_forwards = 0
        self._eval_paused = False
        self._in_optimizer = False
        self._closure_forwards = 0
        self._closure_paused = False
        self.max_capture_mb = max_capture_mb
        self._watcher: threading.Thread | None = None
        self.prof: Any = None   # torch.autograd.profiler.profile while a step is recorded
        self.step_index = 0
        self.step_started = 0.0
        self.done = False
        self.main_thread = threading.get_native_id()
        self._setup_rf: Any = None   # annotation "opscope.setup": from start to the first module forward
        self.optimizer_seen = False
        self.backward_seen = False      # a backward ran in this run: it trains
        self.backward_in_step = False   # ... and in the current step
        self._anchor = None             # first top-level module: inference loops step at its next call
        self._anchor_done = False
        self._eval_rf: Any = None            # annotation "opscope.eval" around no-grad/eval forwards
        self._update_rf: Any = None          # "opscope.optimizer" from a backward to the step's end (manual updates)
        self._phase_rfs: list = []           # open phase ranges around a closure, a backward, GradScaler calls
        self.open_ranges: dict[int, Any] = {}   # the script's record_function ranges opened while recording
        self.module_depth = 0
        self._hooks: list = []
        self._opt_rf: Any = None
        self._step_callbacks: list = []
        self._lock = threading.Lock()
        self.dataloaders: dict[str, dict] = {}   # "file:line" -> drop_last, batch_size, length, batches seen...
        self.keep_in_memory = True                # the child analyses from memory, not from disk
        self.step_records: list = []
        self.writer = StepWriter(self.step_records)   # converts and writes each finished step
        self._write_error: tuple[str, str] | None = None   # a write of the session's own (runtime.json)
        # device memory for the memory fit (real scans; --mode fake tracks its fake storages instead)
        self.device_memory: Any = None
        self._measuring_memory = False            # this step's device memory is measured
        self.track_memory = track_memory
        # steps recorded by the running profiler session and not yet written (see BATCH_SECONDS)
        self._batch_open = False                  # the running session may record more than one step
        self._batch: list[StepJob] = []           # its finished steps, in order
        self._batch_calls = 0                     # their torch calls
        self._batch_started = 0.0

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        if self.export_traces:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._steps_file = RunFolder(self.out_dir).open_steps_log()
        if self.remapper is not None:
            self.remapper.install()
        if self.compile_guard is not None:
            self.compile_guard.install()
        self._install_step_hooks()
        self._hooks += install_dataloader_tagging(self)
        self._hooks += install_range_tracking(self)
        self._hooks += install_script_profiler_stand_in(self.findings)
        self._hooks += install_extension_recording()   # pybind extension calls (mmcv._ext, amp_C) as ops
        if self.remapper is not None:   # standing in for the GPU machine: its GPU-only libraries too
            self._hooks += install_library_stand_ins(self.findings)
        else:   # a real device: a GPU-only library that is missing takes the script's fallback path, said so
            self._hooks += watch_missing_libraries(self.findings)
        self.tracker.__enter__()
        if self.track_memory:
            from opscope.capture.device_memory import DeviceMemory, quiet_allocator_notice
            if not self._real_gpu():
                quiet_allocator_notice(_TORCH_PROFILE)
            self.device_memory = DeviceMemory(self.mark, cuda=self._real_gpu())
        self._start_profiler()
        self._watch_memory()

    def on_step(self, callback) -> None:
        self._step_callbacks.append(callback)

    def _start_profiler(self) -> None:
        # torch.autograd.profiler directly: torch.profiler.profile's start probes
        # `torch._inductor`, which imports dynamo/inductor (~1.5 s) on first use.  The class taken when this
        # module was imported: the script's gets a stand-in (user_profiler.py).
        use_device = "cuda" if self._real_gpu() else None
        # the memory fit reads the first MEMORY_STEPS steps (the optimizer's lazy state and two steady steps):
        # a step's peak repeats after that, and its allocator events cost every later step time
        measure = self.device_memory is not None and self.step_index < MEMORY_STEPS
        self._measuring_memory = measure
        if measure:
            self.device_memory.step_started()
        profile_memory = measure and self.device_memory.profile_memory
        self.prof = _TORCH_PROFILE(use_device=use_device, record_shapes=True, use_kineto=True,
                                   profile_memory=profile_memory)
        self.prof.__enter__()
        if self.step_index == 0 and self.module_depth == 0:
            self._open_range("_setup_rf", "opscope.setup")
        self.step_started = time.perf_counter()
        self._batch_open = not measure and self.step_index >= MEMORY_STEPS
        self._batch_calls, self._batch_started = 0, self.step_started

    def _close_step_ranges(self) -> None:
        """Close the phase annotations a step leaves open: they never span a step boundary."""
        while self._phase_rfs:   # innermost first
            self._phase_rfs.pop().__exit__(None, None, None)
        self._end_setup()
        self._end_eval()
        self._end_update()

    def _stop_profiler(self):
        self._close_step_ranges()
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return prof

    def request_step(self) -> None:
        """A step ended inside an open profiler range: finish it at the next safe point.

        Stopping the profiler while a ``record_function`` range that it saw open is still
        running (``Optimizer.step#...``) crashes Kineto when the range closes later.
        """
        if not self.done and self.prof is not None:
            self.tracker.boundary_pending = True

    def safe_point(self, force: bool = False) -> None:
        """End a step that is due, unless a profiler range is open (see ``capture/ranges.py``).

        ``force``: a training forward begins; a range still open then spans iterations (a range
        around the whole loop), and waiting for it would never end a step.
        """
        if self._phase_rfs:
            # inside a phase range (GradScaler.update after the optimizer's step): the step ends
            # at the first torch call after it, so the range is never cut by a step boundary
            return
        if self.tracker.boundary_pending:
            # a range opened while recording is still open (the optimizer's ``Optimizer.step#...``,
            # inside which its post-hooks run; the script's own): the step ends when the last closes.
            # A training forward forces it through a range around the whole loop, never through the
            # optimizer's own (a closure's forward, a forward in a post-hook)
            if self.open_ranges and (not force or _inside_optimizer_step(sys._getframe(1))):
                return
            self.tracker.boundary_pending = False
            self.step()

    def step(self, partial: bool = False, last: bool = False) -> None:
        """End the current step: record it, start the next one (or stop when done).

        ``partial``: the step was cut short (not a whole iteration).  ``last``: the
        script ended; record the step without starting another.
        """
        with self._lock:
            if self.done or self.prof is None:
                return
            duration_us = (time.perf_counter() - self.step_started) * 1e6
            self.backward_in_step = False
            self._anchor_done = False
            if self._batch_open and not (partial or last or self.step_index + 1 >= self.max_steps
                                         or self._batch_full()):
                self._end_step_in_batch(duration_us)   # the profiler records on: the step is written later
            else:
                partial = self._end_session(duration_us, partial, last)
        for callback in self._step_callbacks:
            callback(self.step_index)
        if self.done and not partial and not last and self.raise_when_done:
            raise StopScan(f"captured {self.step_index} steps")
        if self.write_error is not None and not last and self.raise_when_done:
            raise StopScan("write-error")   # as --timeout does: never an OSError in the user's code

    def _end_session(self, duration_us: float, partial: bool, last: bool) -> bool:
        """Stop the profiler, write the steps it recorded, start the next session unless done.

        Returns ``partial``, set when the run folder could not take the steps (recording stops)."""
        prof = self._stop_profiler()
        memory_state = self.device_memory.step_ended() if self._measuring_memory else None
        if memory_state is not None and self.step_index + 1 >= MEMORY_STEPS:
            self.device_memory.remove()   # measured: its gradient hooks go
        self.step_index += 1
        if self._batch:
            self._write_batch(prof, duration_us, complete=not partial)
        else:
            self._write_step(prof, duration_us, complete=not partial, memory_state=memory_state)
        del prof
        if self.write_error is not None:   # the folder cannot take more: stop recording, end the script
            partial = True
        if self.step_index < self.max_steps and not partial and not last:
            self._start_profiler()
        else:
            self.done = True
        return partial

    def _step_job(self, prof, duration_us: float, complete: bool, memory_state: dict | None = None) -> StepJob:
        """The step just ended (``self.step_index``), with the tracker's and the session's per-step data taken."""
        return StepJob(prof, self.step_index, duration_us, complete, self.tracker.reset_step(),
                       self._take_unrecorded(), self.table.entries, self._steps_file,
                       self.trace_dir / trace_name(self.step_index) if self.export_traces else None,
                       self.out_dir, self.capture_dir / STEPS_LOG, self.keep_in_memory, memory_state)

    def _write_step(self, prof, duration_us: float, complete: bool, memory_state: dict | None = None) -> None:
        """Record the step just stopped (its profiler results are read and freed here, between sessions)."""
        if self.writer.write(self._step_job(prof, duration_us, complete, memory_state)) != KEPT:
            self.step_index -= 1

    def _batch_full(self) -> bool:
        """The running session has recorded enough: the step that ends now stops it (bounded memory and loss)."""
        return (self._batch_calls + self.tracker.calls_in_step >= self.max_step_calls
                or "after_calls" in self._unrecorded
                or time.perf_counter() - self._batch_started >= BATCH_SECONDS)

    def _end_step_in_batch(self, duration_us: float) -> None:
        """End a step without stopping the profiler: close its phase ranges, keep its per-step data and
        mark its end in the recording (``StepWriter.write_batch`` splits the session's events there)."""
        self._close_step_ranges()
        paused = self._eval_paused or self._closure_paused or "after_calls" in self._unrecorded
        self._batch_calls += self.tracker.calls_in_step
        self.step_index += 1
        self._batch.append(self._step_job(None, duration_us, True))
        if paused:
            _collect_cpu(True)   # as a new session would: the next step records from its start
        self.mark(STEP_END)
        self.step_started = time.perf_counter()

    def _write_batch(self, prof, duration_us: float, complete: bool) -> None:
        """Write the steps of the session just stopped: those ended in it and the one ending now."""
        jobs, self._batch = self._batch + [self._step_job(prof, duration_us, complete)], []
        kept = 0
        for status in self.writer.write_batch(jobs):
            if status != KEPT:
                break
            kept += 1
        self.step_index = jobs[0].step - 1 + kept

    @property
    def write_error(self) -> tuple[str, str] | None:
        """(path, what failed) once the run folder could not be written."""
        return self.writer.write_error or self._write_error

    def finish(self, ended_normally: bool = False) -> None:
        """Record whatever the current (partial) step has, and write run-time findings.

        When the script ended normally right after a whole iteration (its last one, in a
        script without ``optimizer.step()``), that iteration counts as complete.
        """
        if self.tracker.boundary_pending:
            self.tracker.boundary_pending = False
            try:
                self.step()
            except StopScan:
                pass
        if not self.done and self.prof is not None:
            whole = (ended_normally and self._marker() == "iteration" and self.module_depth == 0
                     and (self.backward_in_step if self.backward_seen else self._anchor_done))
            self.step(partial=not whole, last=True)
        self.done = True
        self._stop_profiler()
        try:
            self.tracker.__exit__(None, None, None)
        except Exception:
            pass
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self.device_memory is not None:
            self.device_memory.remove()
        if self.remapper is not None:
            self.remapper.uninstall()
        if self.compile_guard is not None:
            self.compile_guard.uninstall()
        self.write_findings()
        if not self._steps_file.closed:
            self._steps_file.close()

    def snapshot(self):
        """What ``store.load_capture`` would read back, straight from memory."""
        from opscope.capture.store import records_to_capture
        findings = self.findings.list() if self.findings else []
        return records_to_capture(self.step_records, findings, self.dataloaders,
                                  self.findings.precision if self.findings else None)

    def write_findings(self) -> None:
        findings = [f.to_dict() for f in self.findings.list()] if self.findings else []
        data = {"columns": CALL_FIELDS, "findings": findings, "sources": len(self.table.entries),
                "dataloaders": self.dataloaders, "precision": self.findings.precision if self.findings else None}
        try:
            write_atomic(self.capture_dir / RUNTIME, json.dumps(data))
        except OSError as exc:
            self._write_failed(exc, self.capture_dir / RUNTIME)

    def _write_failed(self, exc: OSError, path) -> None:
        """A write into the run folder failed (disk full, quota, I/O error): record no more."""
        if self.write_error is None:
            self._write_error = (str(path), disk_error_text(exc))

    # -- step markers ----------------------------------------------------------------
    def _install_step_hooks(self) -> None:
        """Hooks that mark steps and phases: the optimizer's step, top-level modules' forward, autograd's
        backward, and the AMP grad scaler."""
        self._install_optimizer_hooks()
        self._install_module_hooks()
        self._install_backward_hook()
        self._install_scaler_phases()

    def _install_optimizer_hooks(self) -> None:
        """Every optimizer: seen (device memory of its state), its step a phase and possibly the step's end."""
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        session = self
        orig_opt_init = Optimizer.__init__

        def opt_init(this, *args, **kwargs):
            session.optimizer_seen = True
            out = orig_opt_init(this, *args, **kwargs)
            if session.device_memory is not None:
                session.device_memory.see_optimizer(this)
            return out

        Optimizer.__init__ = opt_init   # type: ignore[method-assign,assignment]
        self._hooks.append(Restore(Optimizer, "__init__", orig_opt_init))

        def pre(opt, args, kwargs):
            session._in_optimizer = True
            if session.device_memory is not None:
                session.device_memory.see_optimizer(opt)
            if session.prof is not None:
                session._open_range("_opt_rf", "opscope.optimizer")
            # optimizer.step(closure) (Lightning's automatic optimisation, LBFGS): the closure's
            # forward and backward are forward and backward work, not the optimizer's
            # (args[0] is the optimizer itself: the hook sees step's full argument list)
            if len(args) > 1 and callable(args[1]):
                return (args[0], session._closure(args[1]), *args[2:]), kwargs
            if callable(kwargs.get("closure")):
                return args, {**kwargs, "closure": session._closure(kwargs["closure"])}
            return None

        def post(opt, args, kwargs):
            session._in_optimizer = False
            session._resume_closures()
            session._close_range("_opt_rf")
            if session._marker() == "optimizer" and threading.get_native_id() == session.main_thread:
                session.request_step()

        self._hooks.append(register_optimizer_step_pre_hook(pre))
        self._hooks.append(register_optimizer_step_post_hook(post))

    def _install_module_hooks(self) -> None:
        """Top-level modules' forward: the end of set-up and of the update, iteration boundaries."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        session = self

        def fwd_pre(module, args):
            if session.module_depth == 0:
                if session.optimizer_seen and session._is_training_forward(module):
                    session._end_update()   # the next micro-batch's forward: the update work is over
                if session._iteration_boundary(module):
                    session.tracker.boundary_pending = True
                session.safe_point(force=session._is_training_forward(module))
                session._enter_top_level(module)
                if session._measuring_memory and session.prof is not None:
                    session.device_memory.see_module(module)
                    session.device_memory.forward_started()
            session.module_depth += 1
            session._end_setup()

        def fwd_post(module, args, output):
            session.module_depth -= 1
            if session.module_depth == 0:
                session._leave_top_level(module)
                if session._marker() == "module":
                    session.request_step()

        self._hooks.append(register_module_forward_pre_hook(fwd_pre))
        self._hooks.append(register_module_forward_hook(fwd_post))

    def _install_backward_hook(self) -> None:
        """``torch.autograd.backward``: the backward phase, and update work after it."""
        session = self
        orig_autograd_backward = torch.autograd.backward

        def autograd_backward(*args, **kwargs):
            with session.phase("backward"):
                out = orig_autograd_backward(*args, **kwargs)
            if threading.get_native_id() == session.main_thread:
                session.backward_seen = True
                session.backward_in_step = True
                if session.step_marker == "backward":
                    session.request_step()
                elif session._marker() in ("iteration", "optimizer") and not session._in_optimizer:
                    # what follows a backward up to the next forward is update work: gradient
                    # clipping, GradScaler.unscale_, a hand-written SGD update
                    session._begin_manual_update()
            return out

        torch.autograd.backward = autograd_backward
        self._hooks.append(Restore(torch.autograd, "backward", orig_autograd_backward))

    # -- phases by what runs -------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str):
        """Label the operators run inside as phase ``name`` (innermost range wins)."""
        rf = None
        if _RecordFunction is not None and self.prof is not None \
                and threading.get_native_id() == self.main_thread:
            rf = _RecordFunction(f"opscope.{name}")
            rf.__enter__()
            self._phase_rfs.append(rf)
        try:
            yield
        finally:
            if rf is not None and self._phase_rfs and self._phase_rfs[-1] is rf:
                self._phase_rfs.pop()
                rf.__exit__(None, None, None)

    def _in_phase(self, fn, name: str):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        return run

    def _install_scaler_phases(self) -> None:
        """GradScaler's unscale_/step/update prepare and apply the parameter update: optimizer work."""
        try:
            from torch.amp import grad_scaler
        except ImportError:  # pragma: no cover - torch < 2.3
            from torch.cuda.amp import grad_scaler  # type: ignore[no-redef]
        GradScaler = grad_scaler.GradScaler
        for name in ("unscale_", "step", "update"):
            original = GradScaler.__dict__.get(name)
            if original is None:
                continue
            setattr(GradScaler, name, self._in_phase(original, "optimizer"))
            self._hooks.append(Restore(GradScaler, name, original))

    # -- iterations without optimizer.step() ---------------------------------------------
    # A training iteration is forward + backward + parameter update.  Scripts that update
    # parameters by hand (``p.data.add_(p.grad, alpha=-lr)``) have no optimizer hook, and a
    # loss module is a top-level module call of its own, so neither marks the end of one.
    # The next *training* forward (grad enabled, module in train mode) after a backward
    # does: it begins the next iteration.  Scripts that never run a backward (inference
    # loops) step at each new call of the first top-level module.  Top-level forwards under
    # ``no_grad``/``eval()`` of a training script (evaluation, sampling callbacks) are
    # labelled ``eval`` and never end or split a step.
    def _is_training_forward(self, module) -> bool:
        return torch.is_grad_enabled() and bool(getattr(module, "training", False))

    def _iteration_boundary(self, module) -> bool:
        if self.step_marker != "auto" or self.optimizer_seen or self.prof is None:
            return False
        if self.backward_seen:
            return self.backward_in_step and self._is_training_forward(module)
        return self._anchor is not None and module is self._anchor and self._anchor_done

    def _enter_top_level(self, module) -> None:
        if self._anchor is None:
            self._anchor = module
        training_script = self.backward_seen or self.optimizer_seen
        if training_script and not self._is_training_forward(module) and self.prof is not None:
            self._eval_forwards += 1
            if self._eval_forwards > EVAL_FORWARDS_RECORDED and "after_calls" not in self._unrecorded:
                # a sampling/evaluation loop: its forwards repeat the recorded ones
                self._unrecorded["eval_forwards"] = self._unrecorded.get("eval_forwards", 0) + 1
                self._eval_paused = True
                _collect_cpu(False)
            else:
                self._open_range("_eval_rf", "opscope.eval")

    def _leave_top_level(self, module) -> None:
        if module is self._anchor:
            self._anchor_done = True
        self._end_eval()
        if self._eval_paused:
            self._eval_paused = False
            if self.prof is not None and "after_calls" not in self._unrecorded:
                _collect_cpu(True)

    def _closure(self, closure):
        """optimizer.step(closure): the closure's forward and backward are forward and backward
        work, not the optimizer's.  LBFGS evaluates it many times per step, each repeating the
        same operators: after the first whole evaluation, further evaluations run unprofiled
        (the optimizer's own work between them is still recorded)."""
        @functools.wraps(closure)
        def run(*args, **kwargs):
            pause = (self.prof is not None and self._closure_forwards >= CLOSURE_FORWARDS_RECORDED
                     and not self._closure_paused and "after_calls" not in self._unrecorded)
            if self._closure_forwards >= CLOSURE_FORWARDS_RECORDED and self.prof is not None:
                self._unrecorded["closure_forwards"] = self._unrecorded.get("closure_forwards", 0) + 1
            if pause:
                self._closure_paused = True
                _collect_cpu(False)
            try:
                with self.phase("forward"):
                    return closure(*args, **kwargs)
            finally:
                self._closure_forwards += 1
                if pause:
                    self._resume_closures()
        return run

    def _resume_closures(self) -> None:
        if self._closure_paused:
            self._closure_paused = False
            if self.prof is not None and "after_calls" not in self._unrecorded:
                _collect_cpu(True)

    def _call_cap_reached(self) -> None:
        """The step made more torch calls than memory allows: record no more of it."""
        if self.prof is not None and "after_calls" not in self._unrecorded:
            self._unrecorded["after_calls"] = self.tracker.calls_in_step
            if self.tracker.call_cap < self.max_step_calls:
                self._unrecorded["reason"] = f"capture memory above --max-capture-mb {self.max_capture_mb}"
            self._unrecorded["where"] = self.tracker._where()[0]
            if not (self._eval_paused or self._closure_paused):
                _collect_cpu(False)

    def recording(self) -> bool:
        """Whether the torch calls made now are recorded: a step is captured and its recording is not paused
        (a repeated evaluation or closure forward, the step's call cap).  ``--mode fake`` skips a repeated
        no-grad forward only when it is not."""
        return (self.prof is not None and not (self._eval_paused or self._closure_paused)
                and "after_calls" not in self._unrecorded)

    def _take_unrecorded(self) -> dict:
        data, self._unrecorded = self._unrecorded, {}
        if "after_calls" in data:   # the step's torch calls in all: how much of it was recorded
            data["calls"] = self.tracker.calls_in_step
        self.tracker.calls_in_step = 0
        self.tracker.call_cap = self.max_step_calls
        self._eval_forwards = 0
        self._eval_paused = False
        self._closure_forwards = 0
        self._closure_paused = False
        return data

    def _watch_memory(self) -> None:
        """Bound capture memory: once what opscope holds grows past the budget, the next torch call stops
        the step's recording.

        What opscope holds (profiler events, folded calls, source frames, allocator events) is the RSS
        growth beyond the script's own tensors: on the CPU stand-in they are the GPU's memory, the user's,
        and the memory fit measures them.  They are the most the CPU allocator held live (its live bytes
        while a step records memory, ``CpuAllocatorBytes``): a plain run's RSS grows to about that
        high-water mark, so the scan's peak stays within the budget of the plain run's.  Runs in a thread;
        it only lowers the tracker's call cap, so the profiler itself is paused on the main thread.
        """
        import threading as _t

        from opscope.capture.step_writer import CpuAllocatorBytes
        budget = self.max_capture_mb
        live = CpuAllocatorBytes(torch.__file__)
        most = [float(live.read() or 0) / 2**20]   # the script's tensors at their most so far, MB

        def script_mb() -> float:
            now = live.read() if self._measuring_memory else None   # the counter stands still between
            if now is not None:
                most[0] = max(most[0], now / 2**20)
            return most[0]

        base = private_rss_mb() - script_mb()

        def loop():
            while not self.done:
                if self.prof is not None and "after_calls" not in self._unrecorded \
                        and private_rss_mb() - script_mb() - base > budget:
                    self.tracker.call_cap = self.tracker.calls_in_step + 1
                time.sleep(0.05)

        if budget and budget > 0:
            self._watcher = _t.Thread(target=loop, name="opscope-memory", daemon=True)
            self._watcher.start()

    def _begin_manual_update(self) -> None:
        """After a backward: what follows in the step (up to the next training forward or batch)
        is the parameter update."""
        if self.prof is not None and self.module_depth == 0:
            self._open_range("_update_rf", "opscope.optimizer")

    def _real_gpu(self) -> bool:
        """The script runs on a real GPU (not the CPU stand-in): the profiler records its kernels, and its
        allocator keeps statistics."""
        return self.remapper is None and torch.cuda.is_available()

    def mark(self, name: str) -> None:
        """A zero-length profiler annotation ``name`` in the step being recorded."""
        if _RecordFunction is not None and self.prof is not None:
            rf = _RecordFunction(name)
            rf.__enter__()
            rf.__exit__(None, None, None)

    def _open_range(self, attr: str, name: str) -> None:
        """Open the profiler annotation ``name`` (its phase label) and keep it in ``attr``."""
        if _RecordFunction is not None and getattr(self, attr) is None:
            rf = _RecordFunction(name)
            rf.__enter__()
            setattr(self, attr, rf)

    def _close_range(self, attr: str) -> None:
        rf = getattr(self, attr)
        if rf is not None:
            setattr(self, attr, None)
            rf.__exit__(None, None, None)

    def _end_update(self) -> None:
        self._close_range("_update_rf")

    def _end_eval(self) -> None:
        self._close_range("_eval_rf")

    def _end_setup(self) -> None:
        self._close_range("_setup_rf")

    def _marker(self) -> str:
        if self.step_marker != "auto":
            return self.step_marker
        return "optimizer" if self.optimizer_seen else "iteration"
