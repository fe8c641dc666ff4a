"""The files of one run folder (``--out``): their names, who may write them, and what is stale.

A run folder holds ``scan.json``, ``operators.csv``, the reports, ``traces/step_NNNN.json``,
the capture's bookkeeping under ``capture/`` and, for a distributed scan, ``rankN/`` folders
of the same shape.  Every name lives here, so a re-scan clears exactly what an earlier scan
wrote (never a file of the user's), a killed scan can be recovered from what is on disk, and
one scan at a time holds the folder (``lock``).  Every write goes through ``opscope.atomic``.

Torch-free: the parent (``runner``, ``distributed``, the commands) and the child both use it.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import socket
import time
from pathlib import Path

from opscope.atomic import AppendLog, write_atomic
from opscope.errors import UserError
from opscope.model import OpCall

CAPTURE = "capture"
TRACES = "traces"
STEPS_LOG = "steps.jsonl"
OUTCOME = "outcome.json"
RUNTIME = "runtime.json"
CONFIG = "config.json"
SCRIPT_TRACEBACK = "script_traceback.txt"
ANALYSIS_ERROR = "analysis_error.txt"
STOP_REASON = "stop-reason.txt"          # written by the parent before it interrupts the child: why
RESERVE = "space-reserve"                # room kept for outcome.json and scan.json when the disk fills
SCAN_JSON = "scan.json"
OPERATORS_CSV = "operators.csv"
LOCK = ".opscope.lock"
# the columns of each OpCall row in steps.jsonl (written by the session, read by the store)
CALL_FIELDS = [f.name for f in dataclasses.fields(OpCall)]

# what one capture writes under capture/ (cleared before a capture starts, by every launcher)
NOISE = "noise.json"           # profiler lines and opscope warnings kept off the terminal (capture/noise.py)
FAKE = "fake.json"             # --mode fake: places and memory, for the analysis (capture/fake_mode.py)
BOOKKEEPING = (STEPS_LOG, OUTCOME, RUNTIME, SCRIPT_TRACEBACK, ANALYSIS_ERROR, STOP_REASON, NOISE, FAKE)
_TRACE_NAME = re.compile(r"step_\d{4,}\.json\Z")
_RANK_NAME = re.compile(r"rank\d+\Z")
_SUB_CAPTURES = re.compile(r"(launcher|spawn\d+)\Z")     # capture/launcher, capture/spawnN
_TEMP_NAME = re.compile(r"\.(.+)\.[^.]+\.tmp\Z")          # atomic.write_via_temp's temp files
RESERVE_BYTES = 2 * 2**20
_ERRNO_TEXT = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EIO: "input/output error",
               errno.EFBIG: "file too large"}


def trace_name(step: int) -> str:
    return f"step_{step:04d}.json"


class RunFolder:
    """One run folder; ``RunFolder(out).trace(3)`` is ``out/traces/step_0003.json``."""

    def __init__(self, root):
        self.root = Path(root)
        self.capture_dir = self.root / CAPTURE
        self.trace_dir = self.root / TRACES

    def capture_file(self, name: str) -> Path:
        return self.capture_dir / name

    @property
    def steps_log(self) -> Path:
        return self.capture_dir / STEPS_LOG

    @property
    def outcome_path(self) -> Path:
        return self.capture_dir / OUTCOME

    @property
    def config_path(self) -> Path:
        return self.capture_dir / CONFIG

    @property
    def scan_json(self) -> Path:
        return self.root / SCAN_JSON

    def trace(self, step: int) -> Path:
        return self.trace_dir / trace_name(step)

    # -- writing -------------------------------------------------------------------------
    def write_capture_json(self, name: str, data, indent: int | None = None) -> Path:
        return write_atomic(self.capture_dir / name, json.dumps(data, indent=indent))

    def write_capture_text(self, name: str, text: str) -> Path:
        return write_atomic(self.capture_dir / name, text)

    def open_steps_log(self) -> AppendLog:
        return AppendLog(self.steps_log)

    def write_outcome(self, data: dict) -> Path:
        return self.write_capture_json(OUTCOME, data)

    def read_outcome(self) -> dict | None:
        return _read_json(self.outcome_path)

    def write_config(self, config: dict) -> Path:
        return self.write_capture_json(CONFIG, config, indent=1)

    def read_config(self) -> dict | None:
        return _read_json(self.config_path)

    def read_fake(self) -> dict | None:
        """The fake-mode record of the capture (None for a real scan); read without importing torch."""
        return _read_json(self.capture_dir / FAKE)

    def reserve_space(self, nbytes: int = RESERVE_BYTES) -> None:
        """Keep ``nbytes`` (at most a quarter of what is free) so that, when the disk fills, the
        outcome and scan.json of the complete steps still fit once this is released."""
        path = self.capture_dir / RESERVE
        try:
            free = free_bytes(self.root)
            size = min(nbytes, free // 4) if free is not None else nbytes
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if size > 0:
                    os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            self.release_reserve()

    def release_reserve(self) -> None:
        try:
            (self.capture_dir / RESERVE).unlink(missing_ok=True)
        except OSError:
            pass

    # -- what an earlier run left ------------------------------------------------------------
    def clear_capture(self) -> None:
        """Before a capture starts here: the bookkeeping of an earlier one must not be read as ours."""
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        for name in BOOKKEEPING:
            (self.capture_dir / name).unlink(missing_ok=True)

    def clear_previous_scan(self, report_files=()) -> list[Path]:
        """Before a new scan: remove every file an earlier scan wrote here (scan.json, operators.csv,
        the reports named in ``report_files``, traces, rank folders, capture bookkeeping, stale
        temp files), so the folder never mixes two runs.  Files opscope did not write stay."""
        removed: list[Path] = []
        names = {SCAN_JSON, OPERATORS_CSV, *report_files}
        for name in names:
            _unlink(self.root / name, removed)
        _clear_temps(self.root, names, removed)
        if _is_dir(self.trace_dir):
            for path in self.trace_dir.iterdir():
                temp = _TEMP_NAME.match(path.name)
                if _TRACE_NAME.match(temp[1] if temp else path.name):
                    _unlink(path, removed)
            _rmdir_if_empty(self.trace_dir)
        if _is_dir(self.capture_dir):
            capture_names = {*BOOKKEEPING, CONFIG, RESERVE}
            for name in capture_names:
                _unlink(self.capture_dir / name, removed)
            _clear_temps(self.capture_dir, capture_names, removed)
            for name in ("outcome.tmp", "runtime.json.tmp"):   # the temp names older versions used
                _unlink(self.capture_dir / name, removed)
            subs = [p for p in self.capture_dir.iterdir() if _SUB_CAPTURES.match(p.name)]
            ranks = self.capture_dir / "ranks"
            if _is_dir(ranks):
                subs += [p for p in ranks.iterdir() if _RANK_NAME.match(p.name)]
            for sub in subs:
                if _is_dir(sub):
                    removed += RunFolder(sub).clear_previous_scan(report_files)
                    _rmdir_if_empty(sub)
            _rmdir_if_empty(ranks)
            _rmdir_if_empty(self.capture_dir)
        for path in self.rank_folders():
            removed += RunFolder(path).clear_previous_scan(report_files)
            _rmdir_if_empty(path)
        return removed

    def rank_folders(self) -> list[Path]:
        """``rankN/`` run folders of the captured ranks of a distributed scan (rank 0 is this one)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if _RANK_NAME.match(p.name) and _is_dir(p) and _is_dir(p / CAPTURE))

    # -- recovery ----------------------------------------------------------------------------
    def recoverable(self) -> bool:
        """A capture is here but no scan.json: the scan was killed before it wrote one."""
        return not self.scan_json.exists() and (self.steps_log.is_file() or self.config_path.is_file())


def recovery_config(folder: RunFolder) -> dict:
    """The child configuration of a killed scan: the folder's own, or, for a rank folder that a
    spawned rank wrote (``rankN/`` has no config of its own), the run folder's with that rank."""
    config = folder.read_config()
    if config is not None:
        return config
    rank = _RANK_NAME.match(folder.root.name)
    parent = RunFolder(folder.root.parent).read_config() if rank else None
    if parent is None:
        return {}
    rank_no = int(folder.root.name[4:])
    settings = dict(parent.get("settings") or {}, rank=rank_no)
    return dict(parent, settings=settings, rank=rank_no, out_dir=str(folder.root))


def _read_json(path: Path):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _unlink(path: Path, removed: list) -> None:
    try:
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path)
    except OSError:
        pass


def _clear_temps(folder: Path, names, removed: list) -> None:
    """``.scan.json.abc123.tmp`` and the like: a writer killed between write and rename."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for path in entries:
        found = _TEMP_NAME.match(path.name)
        if found and found[1] in names:
            _unlink(path, removed)


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


# -- disk space ----------------------------------------------------------------------------------
def free_bytes(path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def folder_bytes(path) -> int:
    """Bytes of the files under ``path`` (what a scan has written so far)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            if name in (RESERVE, LOCK):
                continue
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def space_warning(root, steps_done: int, steps: int) -> str | None:
    """After the first step: one line when the file system cannot hold the estimated final folder."""
    used = folder_bytes(root)
    free = free_bytes(root)
    if free is None or steps_done < 1:
        return None
    need = used / steps_done * steps * 1.2 - used    # the remaining steps, scan.json and the reports
    if need <= free:
        return None
    return (f"{root} has {_mb(free)} free but this scan needs about {_mb(need)} more (estimated from "
            f"step 1 for --steps {steps}); it will stop when the disk is full: free space or choose another --out")


def _mb(nbytes: float) -> str:
    return f"{max(nbytes, 0) / 2**20:,.1f} MB" if nbytes < 10 * 2**20 else f"{nbytes / 2**20:,.0f} MB"


def disk_error_text(exc: OSError) -> str:
    """'no space left on device', 'disk quota exceeded', ... (the strerror otherwise)."""
    return _ERRNO_TEXT.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()


def write_error_text(exc: OSError, path) -> str:
    """'no space left on device writing runs/x/traces/step_0004.json'."""
    return f"{disk_error_text(exc)} writing {path}"


_STATUS_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG)
_STATUS_BASE = 80   # the capture child's exit status when it cannot even write outcome.json: 80 + which error


def write_error_status(exc: OSError) -> int:
    code = exc.errno if exc.errno in _STATUS_ERRNOS else errno.EIO
    return _STATUS_BASE + _STATUS_ERRNOS.index(code)


def write_error_of_status(status: int | None) -> str | None:
    """'no space left on device' for the exit status ``write_error_status`` gave, else None."""
    if status is None or not 0 <= status - _STATUS_BASE < len(_STATUS_ERRNOS):
        return None
    return _ERRNO_TEXT[_STATUS_ERRNOS[status - _STATUS_BASE]]


# -- one scan per folder -------------------------------------------------------------------------
class FolderLock:
    """An exclusive ``flock`` on ``DIR/.opscope.lock``, which names its holder (pid, host, start)."""

    def __init__(self, path: Path, fd: int, note: str | None):
        self.path, self.fd, self.note = path, fd, note

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            self.path.unlink(missing_ok=True)   # before unlocking: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock(root, what: str, fix: str = "choose another --out") -> FolderLock:
    """Hold ``root`` for this process, or fail at once (exit 2) naming the scan that holds it.

    A lock file whose holder is gone (a killed scan) is taken over; ``FolderLock.note`` says so.
    """
    import fcntl
    root = Path(root)
    path = root / LOCK
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:   # a read-only folder: no scan can write there either; the caller says what is wrong
            return FolderLock(path, -1, None)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd, wait=True)
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(f"{root} is being written by another {holder.get('what', 'opscope command')} "
                            f"({_describe(holder)}); {fix}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:   # the holder released (and removed) it between our open and our lock: retry
            os.close(fd)
            continue
        previous = _holder(fd, wait=False)
        note = None
        if previous.get("pid"):
            note = (f"took over the lock of an earlier {previous.get('what', 'scan')} that did not release it "
                    f"({_describe(previous)}; that process is gone)")
        data = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "what": what}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(data).encode(), 0)
        except OSError:
            pass   # a full disk: the lock itself still holds
        return FolderLock(path, fd, note)
    raise UserError(f"{root}: could not take the folder's lock ({path}); {fix}")


def wait_for_release(root, timeout_s: float) -> bool:
    """Wait until no process holds ``root``'s lock (True), or ``timeout_s`` passed (False).

    For a caller that re-runs a job whose previous attempt was stopped and may still be writing
    its partial results (a fleet's retry): a user's second scan is refused at once instead."""
    import fcntl
    path = Path(root) / LOCK
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:   # no lock file: nobody holds it
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        finally:
            os.close(fd)
        time.sleep(0.2)


def _holder(fd: int, wait: bool) -> dict:
    deadline = time.monotonic() + (1.0 if wait else 0)
    while True:
        try:
            data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            if isinstance(data, dict) and (data or not wait):
                return data
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.05)


def _describe(holder: dict) -> str:
    parts = [f"pid {holder['pid']}" if holder.get("pid") else "pid unknown"]
    if holder.get("host") and holder["host"] != socket.gethostname():
        parts.append(f"on {holder['host']}")
    started = holder.get("started")
    if isinstance(started, (int, float)):
        parts.append("started " + time.strftime("%H:%M:%S", time.localtime(started)))
    return ", ".join(parts)
