"""Parent side of a capture: start the child, watch it, enforce the timeout.

The child (``opscope.scan_child`` -> ``opscope.capture.child``) writes steps as it goes; here we only wait,
show progress, and turn however the child ended into a ``ChildOutcome``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from opscope.capture.outcomes import ChildOutcome
from opscope.capture.processes import EarlyChild, ExitWatch, LineCounter, child_environment, relay_stderr, signal_group
from opscope.capture.protocol import ScanPlan
from opscope.capture.run_folder import CAPTURE, OUTCOME, STOP_REASON, RunFolder, write_error_of_status
from opscope.errors import UserError

GRACE_SECONDS = 10.0


def run_script(plan: ScanPlan, *, progress=None, env: dict | None = None,
               max_memory_mb: float | None = None, early: EarlyChild | None = None) -> ChildOutcome:
    """Run ``plan.script`` for ``plan.steps`` steps in a child process, capturing into ``plan.out_dir``.

    ``plan.device`` may be ``auto`` (resolved in the child, which imports torch anyway).
    With ``plan.analyse`` the child also writes scan.json (``outcome.extra["analysed"]``).
    ``progress(steps_done)`` is called while waiting.  Never raises for problems of the
    script itself: those come back in the outcome; a bad ``device`` raises UserError.
    ``plan.distributed`` is the launch plan of ``distributed.resolve`` (None: one process).
    ``early``: a child already started (``EarlyChild``), used when this plan can run in it.
    """
    plan = plan.started()
    folder = RunFolder(Path(plan.out_dir))
    capture_dir = folder.capture_dir
    config_path = _prepare_folder(folder, plan)
    child_env = child_environment(env)
    if early is not None and (plan.distributed is not None or early.env != child_env):
        early.discard()
        early = None
    if plan.distributed is not None:
        from opscope.capture import distributed as dist_launch
        child_env.update(dist_launch.launch_env(plan.distributed, dist_launch.free_port()))
        if plan.distributed.launcher == "torchrun":
            try:
                return dist_launch.run_ranks(plan, child_env, progress)
            finally:
                folder.release_reserve()
    proc = early.hand_over(config_path) if early is not None else _start_child(config_path, child_env)
    relay = threading.Thread(target=relay_stderr, args=(proc.stderr, capture_dir), daemon=True)
    relay.start()
    started = time.monotonic()
    limit_mb = max_memory_mb if max_memory_mb is not None else default_max_memory_mb()
    steps = LineCounter(folder.steps_log)
    timed_out, interrupted, over_memory = _watch_child(proc, capture_dir, steps, progress, plan.timeout,
                                                       started, limit_mb)
    relay.join(timeout=5)
    folder.release_reserve()
    outcome = _read_outcome(capture_dir, proc.returncode)
    if outcome.kind == "usage":
        raise UserError(outcome.message)
    _stopped_by_parent(outcome, plan, timed_out, interrupted, over_memory, limit_mb)
    if progress is not None:
        progress(steps.count())
    return outcome


def _prepare_folder(folder: RunFolder, plan: ScanPlan) -> Path:
    """Clear an earlier capture, write the plan (its path is what the child gets) and reserve room for the
    outcome and scan.json (released when the script ends)."""
    folder.clear_capture()
    config_path = folder.write_config(plan.to_dict())
    folder.reserve_space()
    return config_path


def _start_child(config_path: Path, child_env: dict) -> subprocess.Popen:
    """A fresh capture child in its own session (so its whole group can be stopped), its stderr piped to us."""
    return subprocess.Popen([sys.executable, "-m", "opscope.scan_child", str(config_path)], cwd=os.getcwd(),
                            env=child_env, start_new_session=True, stderr=subprocess.PIPE)


def _watch_child(proc, capture_dir: Path, steps: LineCounter, progress, timeout: float | None, started: float,
                 limit_mb: float | None) -> tuple[bool, int | None, float | None]:
    """Wait for the child, showing progress, and stop it on --timeout, --max-memory or a signal to opscope;
    its whole process group is killed before this returns.  (timed out, the signal that interrupted us,
    the memory used when over --max-memory)."""
    timed_out = False
    interrupted = None
    over_memory = None
    next_memory_check = 0.0
    exited = ExitWatch(proc)
    restore = _forward_termination(proc)
    try:
        while True:
            if exited.wait(0.25):
                break
            if progress is not None:
                progress(steps.count())
            if timeout and time.monotonic() - started > timeout and not timed_out:
                timed_out = True
                _stop_child(proc, signal.SIGTERM)   # the child ends the step and writes what it has
                break
            if limit_mb and time.monotonic() >= next_memory_check:
                next_memory_check = time.monotonic() + 1.0
                used = group_rss_mb(proc.pid)
                if used > limit_mb:   # enforced here, whatever the child is doing
                    over_memory = used
                    _stop_child(proc, signal.SIGINT, capture_dir, f"the script and its processes used "
                                f"{used:,.0f} MB, more than --max-memory {limit_mb:,.0f} MB")
                    break
    except (KeyboardInterrupt, _Terminated) as exc:
        # Ctrl-C, SIGTERM or SIGHUP to opscope: the script (in its own session) must not outlive
        # us.  SIGINT tells the child to stop and write what it captured; SIGKILL after the grace.
        interrupted = getattr(exc, "signum", signal.SIGINT)
        _stop_child(proc, signal.SIGINT, capture_dir, f"terminated by {signal.Signals(interrupted).name}")
    finally:
        restore()
        exited.close()
        # the script's own children (DataLoader workers, spawned ranks) go with it
        signal_group(proc, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
    return timed_out, interrupted, over_memory


def _stopped_by_parent(outcome: ChildOutcome, plan: ScanPlan, timed_out: bool, interrupted: int | None,
                       over_memory: float | None, limit_mb: float | None) -> None:
    """When this side stopped the child (timeout, a signal to opscope, --max-memory), that is the run's end."""
    if timed_out:
        outcome.kind = "timeout"
        outcome.message = f"the script did not finish {plan.steps} steps within --timeout {plan.timeout or 0:g}s"
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        outcome.kind = "interrupted"
        outcome.code = 128 + int(interrupted)
        outcome.message = f"opscope was stopped by {name}"
    elif over_memory is not None:
        outcome.kind = "memory"
        outcome.code = 1
        outcome.message = (f"the script and its processes used {over_memory:,.0f} MB, more than --max-memory "
                           f"{limit_mb or 0:,.0f} MB")


class _Terminated(Exception):
    """SIGTERM reached opscope while it waited for the script."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _forward_termination(proc):
    """Turn the first SIGINT/SIGTERM/SIGHUP into an exception while waiting, so the child is stopped, not orphaned.

    A second one (Ctrl-C pressed again, a supervisor repeating SIGTERM) arrives while the child is writing what it
    captured: it kills the child's group at once instead of raising inside that wait, so opscope still reports the
    steps already on disk, exits with the first signal's code and prints no traceback."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        if stopping:
            signal_group(proc, signal.SIGKILL)
            return
        stopping = True
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated(signum)

    # a signal the caller ignores (a background job's SIGINT, nohup's SIGHUP) stays ignored
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def default_max_memory_mb() -> float | None:
    """Three quarters of the machine's RAM: a runaway script is stopped before the OOM killer acts."""
    try:
        with open("/proc/meminfo") as fh:
            total_kb = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        return total_kb / 1024 * 0.75
    except (OSError, StopIteration, ValueError):
        return None


def group_rss_mb(pgid: int) -> float:
    """Resident memory (MB) of every process in process group ``pgid`` (Linux /proc)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:      # field 5 (pgrp), counted after "pid (comm)"
                total += int(fields[21]) * page   # field 24 (rss, pages)
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**20


def _stop_child(proc, sig, capture_dir: Path | None = None, reason: str | None = None) -> None:
    """Ask the child to stop with ``sig`` (saying why); kill its whole group after the grace period."""
    if reason and capture_dir is not None:
        try:
            RunFolder(capture_dir.parent).write_capture_text(STOP_REASON, reason)
        except OSError:
            pass
    signal_group(proc, sig)
    try:
        proc.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        proc.wait()


def _read_outcome(capture_dir: Path, returncode: int | None) -> ChildOutcome:
    data = RunFolder(capture_dir.parent).read_outcome()
    failure = write_error_of_status(returncode)
    if data is None and failure:   # the one write whose failure the child reports by its exit status
        return ChildOutcome("write-error", None, f"{failure} writing {CAPTURE}/{OUTCOME}", returncode=returncode,
                            extra={"error_path": str(capture_dir / OUTCOME)})
    if data is None:
        if returncode is not None and returncode < 0:
            name = signal.Signals(-returncode).name
            return ChildOutcome("killed", returncode, f"the script was killed by {name}", returncode=returncode)
        return ChildOutcome("killed", returncode, f"the script process ended abruptly (exit status {returncode})",
                            returncode=returncode)
    return ChildOutcome(kind=data.get("kind", "killed"), code=data.get("code"), message=data.get("message", ""),
                        where=data.get("where"), steps=data.get("steps", 0), returncode=returncode,
                        extra={k: data[k] for k in ("analysed", "device", "error_path") if k in data})
