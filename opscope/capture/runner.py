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

from opscope.capture.processes import ChildOutcome, count_lines, relay_stderr, signal_group
from opscope.capture.run_folder import CAPTURE, OUTCOME, STOP_REASON, RunFolder, write_error_of_status
from opscope.errors import UserError

GRACE_SECONDS = 10.0


def resolve_device(requested: str) -> str:
    """auto -> npu if torch_npu and a device are present, else cuda if available, else cpu."""
    requested = (requested or "auto").lower()
    if requested not in ("auto", "cpu", "cuda", "npu"):
        raise UserError(f"unknown --device {requested!r}: use auto, cpu, cuda or npu")
    npu_ok = _npu_available()
    import torch
    cuda_ok = torch.cuda.is_available()
    if requested == "auto":
        return "npu" if npu_ok else ("cuda" if cuda_ok else "cpu")
    if requested == "cuda" and not cuda_ok:
        raise UserError("--device cuda: no CUDA device is available here; use --device cpu "
                        "(CUDA calls are then remapped to the CPU) or run on a GPU machine")
    if requested == "npu" and not npu_ok:
        raise UserError("--device npu: torch_npu is not importable or no NPU is present; "
                        "install torch_npu with CANN on an Ascend machine, or use --device cpu")
    return requested


def _npu_available() -> bool:
    import importlib.util
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:  # pragma: no cover - needs Ascend hardware
        import torch
        import torch_npu  # noqa: F401
        return bool(torch.npu.is_available())   # type: ignore[attr-defined]
    except Exception:
        return False


# above complexity 15: the parent side of the scan (shrinks with the ScanPlan contract: issue 21)
def run_script(script: str, argv: list[str], out_dir: Path, steps: int, device: str = "cpu",  # noqa: C901
               timeout: float | None = None, plugins: list[str] | None = None, env: dict | None = None,
               step_marker: str = "auto", export_traces: bool = True, progress=None,
               analyse: bool = False, settings: dict | None = None, target: str | None = None,
               static: bool = True, capture_options: dict | None = None,
               distributed: dict | None = None, max_memory_mb: float | None = None) -> ChildOutcome:
    """Run ``script`` for ``steps`` steps in a child process, capturing into ``out_dir``.

    ``device`` may be ``auto`` (resolved in the child, which imports torch anyway).
    With ``analyse`` the child also writes scan.json (``outcome.extra["analysed"]``).
    ``progress(steps_done)`` is called while waiting.  Never raises for problems of the
    script itself: those come back in the outcome; a bad ``device`` raises UserError.
    ``distributed`` is the launch plan of ``distributed.resolve`` (None: one process).
    """
    out_dir = Path(out_dir)
    folder = RunFolder(out_dir)
    capture_dir = folder.capture_dir
    folder.clear_capture()
    config = {
        "script": str(Path(script).resolve()), "argv": list(argv), "out_dir": str(out_dir.resolve()),
        "steps": steps, "device": device, "remap": device == "cpu", "plugins": plugins or [],
        "step_marker": step_marker, "export_traces": export_traces, "analyse": analyse,
        "settings": settings or {"steps": steps}, "target": target, "static": static,
        **(capture_options or {}),
        "distributed": distributed, "started_epoch": time.time(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
    }
    config_path = folder.write_config(config)
    folder.reserve_space()   # released when the script ends: room for the outcome and scan.json
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    if distributed:
        from opscope.capture import distributed as dist_launch
        child_env.update(dist_launch.launch_env(distributed, dist_launch.free_port()))
        if distributed["launcher"] == "torchrun":
            try:
                return dist_launch.run_ranks(config, child_env, timeout, progress)
            finally:
                folder.release_reserve()
    cmd = [sys.executable, "-m", "opscope.scan_child", str(config_path)]
    proc = subprocess.Popen(cmd, cwd=os.getcwd(), env=child_env, start_new_session=True,
                            stderr=subprocess.PIPE)
    relay = threading.Thread(target=relay_stderr, args=(proc.stderr, capture_dir), daemon=True)
    relay.start()
    started = time.monotonic()
    timed_out = False
    interrupted = None
    over_memory = None
    limit_mb = max_memory_mb if max_memory_mb is not None else default_max_memory_mb()
    next_memory_check = 0.0
    steps_file = folder.steps_log
    restore = _forward_termination()
    try:
        while True:
            try:
                proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            if progress is not None:
                progress(count_lines(steps_file))
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
        # the script's own children (DataLoader workers, spawned ranks) go with it
        signal_group(proc, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
    relay.join(timeout=5)
    folder.release_reserve()
    outcome = _read_outcome(capture_dir, proc.returncode)
    if outcome.kind == "usage":
        raise UserError(outcome.message)
    if timed_out:
        outcome.kind = "timeout"
        outcome.message = f"the script did not finish {steps} steps within --timeout {timeout:g}s"
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        outcome.kind = "interrupted"
        outcome.code = 128 + int(interrupted)
        outcome.message = f"opscope was stopped by {name}"
    elif over_memory is not None:
        outcome.kind = "memory"
        outcome.code = 1
        outcome.message = (f"the script and its processes used {over_memory:,.0f} MB, more than --max-memory "
                           f"{limit_mb:,.0f} MB")
    if progress is not None:
        progress(count_lines(steps_file))
    return outcome


class _Terminated(Exception):
    """SIGTERM reached opscope while it waited for the script."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _forward_termination():
    """Turn SIGTERM/SIGHUP into an exception while waiting, so the child is stopped, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):
        raise _Terminated(signum)

    previous = {sig: signal.signal(sig, on_term) for sig in (signal.SIGTERM, signal.SIGHUP)}
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
