"""Distributed training inside the capture child: spawned ranks (process groups: ``remap_dist.py``).

* ``install_spawn``: ``torch.multiprocessing.spawn``/``start_processes`` start every
  rank through ``_RankTarget``, which runs the rank under its own session: a
  ``CaptureSession`` into the rank's folder for captured ranks, an ``UncapturedSession``
  (remapped, counting steps so it stops with the others, no profiler) for the rest.
* ``after_script``: once the script is over, no rank is left running and the run's
  outcome is the first failing rank's (named), else rank 0's.

The ranks' folders are ``protocol.rank_dir``'s; how the run ended is read with ``outcomes``;
the torchrun-style launch is the parent's (``distributed.py``).
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from opscope.capture import outcomes
from opscope.capture.protocol import PEER_EXIT_SECONDS, ScanPlan, rank_dir
from opscope.capture.run_folder import CAPTURE, SCRIPT_TRACEBACK, STEPS_LOG, TRACES, RunFolder
from opscope.capture.session import CaptureSession, StopScan
from opscope.capture.where import user_frame_summary

RANK_GRACE_SECONDS = 5.0


# -- ranks that are run but not profiled -------------------------------------------------------
class _NoProfiler:
    kineto_results = None

    def __exit__(self, *exc):
        return False


class UncapturedSession(CaptureSession):
    """A rank that is remapped and stops after ``steps`` like the captured ones, without the profiler.

    Its folder keeps only ``capture/runtime.json`` (its remap findings) and ``outcome.json``.
    """

    def __init__(self, out_dir, steps, **kwargs):
        kwargs["export_traces"] = False
        kwargs["track_memory"] = False   # nothing is profiled here
        super().__init__(out_dir, steps, **kwargs)
        self.keep_in_memory = False
        self._unrecorded = {"after_calls": 0}   # "recording already paused": never toggle a profiler

    def _start_profiler(self) -> None:
        self.prof = _NoProfiler()
        self.step_started = time.perf_counter()

    def _watch_memory(self) -> None:
        pass                                     # nothing is recorded, so nothing to bound

    def _write_step(self, prof, duration_us: float, complete: bool, memory_state: dict | None = None) -> None:
        self.tracker.reset_step()                # per-step shape-origin state does not pile up
        self.tracker.calls_in_step = 0


def make_session(capture: bool, out_dir, **options):
    """A rank's session: ``options`` are ``ScanPlan.session_options()``."""
    return (CaptureSession if capture else UncapturedSession)(out_dir, **options)


# -- torch.multiprocessing.spawn ----------------------------------------------------------------
class _State:
    def __init__(self):
        self.session: Any = None   # the launching process's own session (a CaptureSession)
        self.plan: ScanPlan | None = None   # its plan (device resolved), from install_spawn
        self.spawns = 0            # launches so far (only the first is captured)
        self.launches: list[dict] = []   # per launch: rank -> multiprocessing process
        self.process_launch: dict | None = None   # the open launch of Process(target=fn, args=(rank, ...))


_state = _State()


@dataclass(frozen=True)
class RankLaunch:
    """What the ranks of one spawn launch share (pickled into each rank process)."""

    plan: ScanPlan
    out_dir: str                 # the run folder (first launch) or capture/spawnN/
    captured: tuple[int, ...]    # the ranks profiled
    findings: tuple = ()         # the launcher's runtime findings so far, as dicts


def install_spawn(session, plan: ScanPlan) -> None:
    """In the capture child: rank processes of ``torch.multiprocessing.spawn`` run through ``_RankTarget``."""
    import torch.multiprocessing as tmp
    spawn_mod = sys.modules["torch.multiprocessing.spawn"]
    _state.session, _state.plan = session, plan
    orig_start = spawn_mod.start_processes

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return _start(orig_start, fn, args, nprocs, join, daemon)

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return _start(orig_start, fn, args, nprocs, join, daemon)

    for owner in (tmp, spawn_mod):
        owner.start_processes = start_processes   # type: ignore[attr-defined]
        owner.spawn = spawn   # type: ignore[attr-defined]
    import multiprocessing.process as mp_process
    orig_process_start = mp_process.BaseProcess.start

    def process_start(this):
        _wrap_rank_process(this)
        return orig_process_start(this)

    mp_process.BaseProcess.start = process_start   # type: ignore[method-assign]


def spawned() -> bool:
    return _state.spawns > 0


def _plan() -> ScanPlan:
    assert _state.plan is not None, "install_spawn was not called"
    return _state.plan


def _new_launch(what: str, nprocs: int | None) -> RankLaunch:
    """Start a launch: the first one takes over the run folder; returns what its ranks share."""
    plan = _plan()
    first = _state.spawns == 0
    _state.spawns += 1
    out_dir = Path(plan.out_dir)
    captured = tuple(r for r in plan.captured_ranks if nprocs is None or r < nprocs) if first else ()
    count = f"{nprocs} rank process(es)" if nprocs else "rank processes"
    print(f"opscope: {what} starts {count}; "
          + (f"capturing rank(s) {','.join(map(str, captured))}" if captured else
             "running them uncaptured (only the first launch is captured)"), file=sys.stderr, flush=True)
    findings = _detach(_state.session, out_dir) if first else []
    return RankLaunch(plan, str(out_dir if first else out_dir / CAPTURE / f"spawn{_state.spawns}"), captured,
                      tuple(findings))


def _start(orig_start, fn, args, nprocs, join, daemon):
    first = _state.spawns == 0
    out_dir = Path(_plan().out_dir)
    target = _RankTarget(fn, _new_launch("torch.multiprocessing.spawn", nprocs))
    ctx = orig_start(target, args, nprocs, False, daemon, start_method="spawn")
    _state.launches.append(dict(enumerate(ctx.processes)))
    _state.process_launch = None
    if not join:
        return ctx
    rank0_done = None
    while not ctx.join(timeout=1.0, grace_period=RANK_GRACE_SECONDS):
        if ctx.processes[0].exitcode == 0:   # rank 0 is done: a peer stuck past it is not worth waiting for
            rank0_done = rank0_done or time.monotonic()
            if time.monotonic() - rank0_done > PEER_EXIT_SECONDS:
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.terminate()
    if first:
        main = outcomes.read_rank_outcome(out_dir, 0, True, ctx.processes[0].exitcode)
        if main.get("kind") == "steps-reached":
            raise StopScan(main.get("message") or "steps reached")   # the launcher ends with its ranks
    return None


def _wrap_rank_process(proc) -> None:
    """``Process(target=fn, args=(rank, ...))`` of the script (spawn start method): run it as a rank."""
    import multiprocessing
    if _state.plan is None or isinstance(proc._target, _RankTarget):
        return
    if _state.plan.distributed is None or _state.plan.distributed.launcher != "spawn":
        return        # a helper process of a script that is not launched as ranks (see distributed.detect_launcher)
    args = tuple(proc._args or ())
    code = getattr(proc._target, "__code__", None)
    if not args or type(args[0]) is not int or code is None or _state.session is None:
        return
    if _state.session.user_code.display(code.co_filename) is None:
        return        # a library's worker (DataLoader, ...), not a rank of the script
    method = proc._start_method or multiprocessing.get_start_method(allow_none=True) or "fork"
    if method == "fork":
        return        # a forked process inherits this one's capture; only spawn/forkserver are ranks
    launch = _state.process_launch
    if launch is None or args[0] in launch["procs"]:
        launch = _state.process_launch = {"launch": _new_launch("multiprocessing.Process", None), "procs": {}}
        _state.launches.append(launch["procs"])
    proc._target = _RankTarget(proc._target, launch["launch"])
    launch["procs"][args[0]] = proc


def _detach(session, out_dir: Path) -> list:
    """The launching process hands its run folder over to rank 0; returns its findings so far."""
    if session is None:
        return []
    if session.prof is not None:
        session._stop_profiler()      # what the launcher did before spawning is not a training step
    session.done = True
    session.tracker.boundary_pending = False
    scratch = out_dir / CAPTURE / "launcher"
    (scratch / CAPTURE).mkdir(parents=True, exist_ok=True)
    steps = session.capture_dir / STEPS_LOG
    if not session._steps_file.closed:
        session._steps_file.close()
    if steps.exists():
        steps.replace(scratch / CAPTURE / STEPS_LOG)
    session.out_dir, session.capture_dir, session.trace_dir = scratch, scratch / CAPTURE, scratch / TRACES
    session.keep_in_memory = False
    return [f.to_dict() for f in session.findings.list()] if session.findings else []


class _RankTarget:
    """Picklable rank entry: ``fn(rank, *args)`` under the rank's own session."""

    def __init__(self, fn, launch: RankLaunch):
        self.fn, self.launch = fn, launch

    def __call__(self, rank, *args):
        launch = self.launch
        script = launch.plan.script
        from opscope.capture.noise import divert_own_warnings
        divert_own_warnings(Path(launch.out_dir) / "capture")   # opscope's warnings: the run's notes, not stderr
        captured = rank in launch.captured
        folder = rank_dir(Path(launch.out_dir), rank, captured)
        RunFolder(folder).clear_capture()
        session = make_session(captured, folder, **launch.plan.session_options())
        if session.findings is not None and captured:
            from opscope.model import Finding
            for data in launch.findings:
                f = Finding.from_dict(data)
                session.findings.items[(f.rule, f.file, f.line)] = f

        def on_term(signum, frame):
            raise StopScan("terminated")

        signal.signal(signal.SIGTERM, on_term)
        error: BaseException | None
        kind, code, message, where, error = "finished", 0, "", None, None
        session.start()
        try:
            self.fn(rank, *args)
        except StopScan as stop:
            if stop.reason == "terminated":
                kind, message = "killed", "stopped by opscope (another rank failed, or the scan was stopped)"
            elif stop.reason == "write-error":
                kind = "write-error"
            else:
                kind, message = "steps-reached", stop.reason
        except KeyboardInterrupt:
            kind, code, message = "killed", 130, "interrupted (the launching process ended)"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            kind, message, where = "exit", f"the script called sys.exit({exc.code!r})", _where(exc, script)
            error = exc if code else None
        except BaseException as exc:
            kind, code, error = "exception", 1, exc
            message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
            where = _where(exc, script)
            try:
                RunFolder(folder).write_capture_text(SCRIPT_TRACEBACK, "".join(traceback.format_exception(exc)))
            except OSError:
                pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                session.finish(ended_normally=kind == "finished")
            finally:
                extra = {}
                if session.write_error is not None and kind in ("finished", "steps-reached", "write-error"):
                    path, what = session.write_error
                    kind, message, extra["error_path"] = "write-error", f"{what} writing {path}", path
                _write_outcome(folder, kind, code, message, where, session.step_index, **extra)
        sys.stdout.flush()
        sys.stderr.flush()
        if error is not None:
            raise error      # torch's spawn reports it to the launcher, which stops the other ranks
        os._exit(0)          # skip teardown (DataLoader workers, atexit) of a rank stopped early


def _where(exc, script: str) -> str:
    return user_frame_summary(exc, script)


def _write_outcome(folder: Path, kind, code, message, where, steps, **extra) -> None:
    try:
        RunFolder(folder).write_outcome({"kind": kind, "code": code, "message": message, "where": where,
                                         "steps": steps, "ended": time.time(), **extra})
    except OSError:
        pass   # the launcher reads a missing outcome as a rank that ended abruptly


# -- once the script is over --------------------------------------------------------------------
def after_script(kind, code, message, where) -> tuple[str, object, str, str | None, int | None]:
    """Stop leftover ranks; return the run's (kind, code, message, where, rank-0 steps) after a spawn."""
    if not spawned():
        return kind, code, message, where, None
    for launch in _state.launches:
        for proc in launch.values():
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
        for proc in launch.values():
            if proc.pid is None:
                continue
            proc.join(RANK_GRACE_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()
    procs = _state.launches[0]
    out_dir = Path(_plan().out_dir)
    captured = set(_plan().captured_ranks)
    ended = {r: outcomes.read_rank_outcome(out_dir, r, r in captured, p.exitcode) for r, p in procs.items()}
    if 0 not in ended:
        return kind, code, message, where, None
    steps = ended[0].get("steps", 0)
    if kind == "timeout":
        return kind, code, message, where, steps
    found = outcomes.culprit(ended)
    rank0_ok = ended[0].get("kind") in ("steps-reached", "finished")
    if found is not None and (outcomes.failed(found[1]) or not rank0_ok):   # not: a peer stopped after rank 0
        data = outcomes.rank_failure(*found)
        return data.get("kind", "killed"), data.get("code"), data.get("message", ""), data.get("where"), steps
    if outcomes.failed({"kind": kind, "code": code}) or kind == "killed":
        return kind, code, message, where, steps    # the ranks were fine; the script failed after them
    main = ended[0]
    return main.get("kind", kind), main.get("code", code), main.get("message", message), main.get("where"), steps


def analyse_ranks(plan: ScanPlan, build) -> None:
    """Write scan.json/operators.csv of every captured rank other than 0 (its own outcome):
    ``build(folder, outcome dict, the rank's plan)``."""
    if not spawned():
        return
    procs = _state.launches[0]
    out_dir = Path(plan.out_dir)
    captured = [r for r in plan.captured_ranks if r in procs and r > 0]
    for rank in captured:
        folder = rank_dir(out_dir, rank, True)
        data = outcomes.read_rank_outcome(out_dir, rank, True, procs[rank].exitcode)
        build(folder, data, replace(plan, settings=plan.rank_settings(rank)))
