"""Turn each finished step into its record and write it, off the training thread.

Converting a step's profiler events into folded ``OpCall`` records, encoding the step
record and exporting its Chrome trace cost about a third of a small model's step when done
in line.  The session hands the step's raw profiler results to one writer thread instead,
which does that work while the script runs its next step (the training thread spends most
of a step in operators that release the GIL).  At most one step waits to be written: a step
that ends while the previous one is still being written waits for it, so capture memory
stays bounded by two steps of profiler events.

``OPSCOPE_STEP_WRITER=inline`` writes each step on the training thread, as before
(``bench/scan_overhead.py`` compares both).
"""
from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.atomic import write_in_place
from opscope.capture.events import calls_from_kineto, compact_calls
from opscope.capture.run_folder import CALL_FIELDS, disk_error_text

KEPT, EMPTY, FAILED = "kept", "empty", "failed"


@dataclass
class StepJob:
    """One finished step as the training thread hands it over (everything read from live state)."""
    prof: Any                 # the stopped torch.autograd.profiler.profile
    step: int
    duration_us: float
    complete: bool
    side: dict                # the tracker's per-step origins and shapes
    unrecorded: dict          # what ran unprofiled (bounded memory)
    entries: list             # the source table as of this step's end (a copy: later steps add to it)
    steps_file: Any           # the run folder's steps.jsonl (AppendLog)
    trace: Path | None        # where its Chrome trace goes, None: no trace
    out_dir: Path
    steps_log: Path           # named in the error when steps.jsonl cannot be written
    keep_in_memory: bool


class StepWriter:
    """Writes steps in order on one background thread (or in line), keeping their records."""

    def __init__(self, records: list, background: bool | None = None):
        self.records = records                # step records kept in memory (the child analyses these)
        self.shared: dict = {}                # equal lists/strings across steps share one object
        self.write_error: tuple[str, str] | None = None   # (path, what failed) once the folder is full
        self.first_lost: int | None = None    # the first step a write failure lost (later ones are dropped)
        if background is None:
            background = os.environ.get("OPSCOPE_STEP_WRITER", "thread") != "inline"
        self.background = background
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._crash: BaseException | None = None

    # -- the training thread's side ------------------------------------------------------
    def submit(self, job: StepJob) -> None:
        """Write ``job`` in the background (after the previous one is done) or, in line, now."""
        if not self.background:
            self.write(job)
            return
        self.wait()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="opscope-step-writer", daemon=True)
            self._thread.start()
        self._queue.put(job)

    def wait(self) -> None:
        """Return once every submitted step is written; a bug in the writer is raised here."""
        if self._thread is not None:
            self._queue.join()
        if self._crash is not None:
            crash, self._crash = self._crash, None
            raise crash

    def write(self, job: StepJob) -> str:
        """Write one step now (the caller has waited for the writer): KEPT, EMPTY or FAILED."""
        try:
            return self._write(job)
        finally:
            job.prof = None
            _release_freed_memory()

    # -- the writer thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is not None and self.first_lost is None:
                    if self.write(job) == FAILED:
                        self.first_lost = job.step
                elif job is not None and self.first_lost is not None:
                    job.prof = None   # the folder is full: later steps are not kept
            except BaseException as exc:   # noqa: BLE001 - handed to the training thread by wait()
                self._crash = exc
            finally:
                del job
                self._queue.task_done()

    def _write(self, job: StepJob) -> str:
        prof = job.prof
        events = prof.kineto_results.events() if prof.kineto_results is not None else []
        calls = compact_calls(calls_from_kineto(events, job.step, job.entries, None), self.shared)
        del events
        if not job.complete and not calls:
            return EMPTY
        trace = job.trace
        if trace is not None:
            try:
                write_in_place(trace, lambda path: prof.export_chrome_trace(str(path)), _whole_trace)
            except OSError as exc:   # the disk is full: this step is not kept, and capture stops
                self._failed(exc, trace)
                return FAILED
            except Exception:  # a trace is a bonus; the step record is what matters
                trace = None
        record: dict[str, Any] = {
            "step": job.step,
            "duration_us": job.duration_us,
            "complete": job.complete,
            "trace": os.path.relpath(trace, job.out_dir) if trace else None,
            "side": job.side,
            "unrecorded": job.unrecorded,
            "calls": [[getattr(c, f) for f in CALL_FIELDS] for c in calls],
        }
        try:
            job.steps_file.append(json.dumps(record, separators=(",", ":")) + "\n")
        except OSError as exc:
            if trace is not None:
                Path(trace).unlink(missing_ok=True)   # a trace without its step record is not kept
            self._failed(exc, job.steps_log)
            return FAILED
        if job.keep_in_memory:
            record.pop("calls")
            record["op_calls"] = calls
            self.records.append(record)
        return KEPT

    def _failed(self, exc: OSError, path) -> None:
        """A write into the run folder failed (disk full, quota, I/O error): record no more."""
        if self.write_error is None:
            self.write_error = (str(path), disk_error_text(exc))


def _whole_trace(path) -> bool:
    """Kineto reports no write error: a trace cut short by a full disk does not end its JSON."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - 64))
            return fh.read().rstrip().endswith(b"}")
    except OSError:
        return False


def _release_freed_memory() -> None:
    """Give the profiler's freed per-step buffers back to the OS (glibc keeps them otherwise).

    Each step's Kineto results are large and short-lived while the folded records kept
    from it are small and long-lived; without a trim the heap fragments and the RSS of a
    long scan creeps up with the number of steps.  A trim walks the whole heap (~10 ms for
    a ResNet-50 step), so it runs only once the RSS has grown ``TRIM_AFTER_MB`` since the last.
    """
    global _MALLOC_TRIM, _TRIMMED_AT
    if _MALLOC_TRIM is None:
        try:
            import ctypes
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to do
            _MALLOC_TRIM = False
    if not _MALLOC_TRIM:
        return
    rss = rss_mb()
    if rss and rss - _TRIMMED_AT < TRIM_AFTER_MB:
        return
    _MALLOC_TRIM(0)
    _TRIMMED_AT = rss_mb()


def rss_mb() -> float:
    """Resident memory of this process in MB (0 where /proc is not there: then every step trims)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


TRIM_AFTER_MB = 16
_TRIMMED_AT = 0.0
_MALLOC_TRIM: Any = None
