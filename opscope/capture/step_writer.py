"""Turn each finished step into its record and write it: steps.jsonl, its trace, the kept records.

Runs on the training thread right after the step's profiler has stopped, before the next one
starts.  Kineto's results must not be read, saved or freed while another profiler session
records: a writer thread that did this work during the next step crashed the process (SIGSEGV,
``free(): invalid next size``) under ``--mode fake``, and on 2 cores it was no faster than this
(``bench/scan_overhead.py``, README *Measured*).
"""
from __future__ import annotations

import bisect
import gc
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.atomic import write_in_place
from opscope.capture.device_memory import step_peak
from opscope.capture.events import calls_from_kineto, compact_calls, launch_of
from opscope.capture.run_folder import CALL_FIELDS, disk_error_text
from opscope.overloads import overload_for

try:   # the profiler's own enum: a host event's device type
    from torch._C._autograd import DeviceType as _DeviceType
    _CPU: Any = _DeviceType.CPU
except ImportError:  # pragma: no cover
    _CPU = None

KEPT, EMPTY, FAILED = "kept", "empty", "failed"
STEP_END = "opscope.step_end"   # a zero-length annotation: the end of a step inside a profiler session of several


@dataclass
class StepJob:
    """One finished step, as the session hands it over."""
    prof: Any                 # the stopped torch.autograd.profiler.profile
    step: int
    duration_us: float
    complete: bool
    side: dict                # the tracker's per-step origins and shapes
    unrecorded: dict          # what ran unprofiled (bounded memory)
    entries: list             # the source table
    steps_file: Any           # the run folder's steps.jsonl (AppendLog)
    trace: Path | None        # where its Chrome trace goes, None: no trace
    out_dir: Path
    steps_log: Path           # named in the error when steps.jsonl cannot be written
    keep_in_memory: bool
    memory_state: dict | None = None   # device memory at the step's boundaries (``DeviceMemory.step_ended``)


class StepWriter:
    """Writes steps in order, keeping their records; remembers the first write that failed."""

    def __init__(self, records: list):
        self.records = records                # step records kept in memory (the child analyses these)
        self.shared: dict = {}                # equal lists/strings across steps share one object
        self.write_error: tuple[str, str] | None = None   # (path, what failed) once the folder is full

    def write(self, job: StepJob) -> str:
        """Write one step: KEPT, EMPTY (a partial step that recorded nothing) or FAILED (disk full)."""
        return self.write_batch([job])[0]

    def write_batch(self, jobs: list[StepJob]) -> list[str]:
        """Write the steps one profiler session recorded, in order (the last job holds the stopped profiler;
        the steps' ends are ``STEP_END`` marks).  Their Chrome trace is one file, the first step's; each
        step's status as ``write`` says it, FAILED for every step after one that failed."""
        # no cyclic GC while the step is converted: its ~10^4 short-lived records otherwise live
        # through young collections, get promoted and trigger a full collection of the whole
        # heap (torch, the model, the user's data) every other step: 0.13 s each on ResNet-50
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._write(jobs)
        finally:
            for job in jobs:
                job.prof = None
            if collecting:
                gc.enable()
            _release_freed_memory()

    def _write(self, jobs: list[StepJob]) -> list[str]:
        prof = jobs[-1].prof
        trace = jobs[0].trace
        full: OSError | None = None
        if trace is not None:
            try:
                write_in_place(trace, lambda path: prof.export_chrome_trace(str(path)), _whole_trace)
            except OSError as exc:   # the disk is full: unless the step is empty, it is not kept and capture stops
                full, trace = exc, None
            except Exception:  # a trace is a bonus; the step record is what matters
                trace = None
        # the trace is written first: then the profiler's results can go while the calls are
        # built from their events, and a step's results, events and calls are never all in memory
        results, prof.kineto_results = prof.kineto_results, None
        events = results.events() if results is not None else []
        del results
        parts = split_steps(events, len(jobs)) if len(jobs) > 1 else [events]
        del events
        statuses: list[str] = []
        for job, part in zip(jobs, parts, strict=True):
            if statuses and statuses[-1] == FAILED:
                statuses.append(FAILED)
                part.clear()
                continue
            statuses.append(self._write_step(job, part, trace, full, alone=len(jobs) == 1 or job is jobs[0]))
        return statuses

    def _write_step(self, job: StepJob, events: list, trace: Path | None, full: OSError | None, alone: bool) -> str:
        """Convert and write one step's events.  ``alone``: no earlier step of the batch is in its trace."""
        memory: dict[str, list] | None = ({"memory": [], "marks": [], "ranges": []}
                                          if job.memory_state is not None else None)
        calls = compact_calls(calls_from_kineto(events, job.step, job.entries, None, release=True, memory=memory),
                              self.shared)
        for call in calls:   # resolved here, where torch is imported: reading the capture back needs none
            if call.overload is None:
                call.overload = overload_for(call.name, call.dtypes)
        if not job.complete and not calls:   # a partial step that recorded nothing: no trace, no record
            if trace is not None and alone:
                Path(trace).unlink(missing_ok=True)
            return EMPTY
        if full is not None:
            self._failed(full, job.trace)
            return FAILED
        record: dict[str, Any] = {
            "step": job.step,
            "duration_us": job.duration_us,
            "complete": job.complete,
            "trace": os.path.relpath(trace, job.out_dir) if trace else None,
            "side": job.side,
            "unrecorded": job.unrecorded,
            "calls": [[getattr(c, f) for f in CALL_FIELDS] for c in calls],
            "overloads_resolved": True,   # each call's overload as torch's schemas give it (None: ambiguous)
        }
        if memory is not None and job.memory_state is not None:
            peak = step_peak(job.step, job.memory_state, memory["memory"], memory["marks"], memory["ranges"])
            if peak is not None:
                record["memory"] = peak
        try:
            job.steps_file.append(json.dumps(record, separators=(",", ":")) + "\n")
        except OSError as exc:
            if trace is not None and alone:
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


def split_steps(events: list, steps: int) -> list[list]:
    """A profiler session's events, one list per step, cut at its ``STEP_END`` marks (``steps`` - 1 of them).

    A host event belongs to the step in which it started; a device task (a kernel, a copy) to the step of
    the runtime call that launched it (same correlation id), else to the step in which it started."""
    host: list = []      # (start, event): each event's fields read once, in one pass
    device: list = []
    marks: list = []
    cpu = _CPU
    for e in events:
        if e.device_type() != cpu:
            device.append(e)
        elif e.name() == STEP_END:
            marks.append(e.start_ns())
        else:
            host.append((e.start_ns(), e))
    marks.sort()
    parts: list[list] = [[] for _ in range(len(marks) + 1)]
    cut = bisect.bisect_right
    for start, e in host:
        parts[cut(marks, start)].append(e)
    if device:
        launched: dict[int, int] = {}
        for index, events_of_step in enumerate(parts):
            for e in events_of_step:
                # a runtime call only (its id is in the device tasks' id space), never a host range such as an
                # annotation, whose correlation id counts in another space and could name any kernel
                if "::" not in e.name() and e.correlation_id() and launch_of(e, e.correlation_id()) is not None:
                    launched[e.correlation_id()] = index
        for e in device:
            owner = launched.get(e.correlation_id())
            parts[cut(marks, e.start_ns()) if owner is None else owner].append(e)
    if len(parts) != steps:   # a mark was not recorded: the events to the last step rather than to the wrong one
        parts = [[] for _ in range(steps - 1)] + [[e for events_of_step in parts for e in events_of_step]]
    return parts


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
    resident, _ = _statm_pages()
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


def private_rss_mb() -> float:
    """Resident memory of this process that no file backs, in MB: what it allocated (Python objects, tensors,
    the profiler's buffers), not the pages of shared libraries it maps.  A CUDA build of torch pages in hundreds
    of MB of its libraries as a script starts using them (seen: +175 MB within a set-up's first calls on a
    machine without a GPU); those are no capture memory.  0 where /proc is not there."""
    resident, file_backed = _statm_pages()
    return (resident - file_backed) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _statm_pages() -> tuple[int, int]:
    """(resident, file-backed resident) pages of this process from /proc/self/statm; (0, 0) without it."""
    try:
        with open("/proc/self/statm") as fh:
            fields = fh.read().split()
        return int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return 0, 0


class CpuAllocatorBytes:
    """Live bytes of torch's CPU allocator, as its profiled-memory reporter counts them.

    While a profiler records memory (``profile_memory``), c10's ``ProfiledCPUMemoryReporter`` keeps
    the bytes of every CPU block allocated and not yet freed (``allocated_``): the blocks the
    profiler's ``[memory]`` events report.  torch exposes no reader, so this reads the counter from
    the reporter that ``c10::profiledCPUMemoryReporter()`` returns (a mutex, the size map, then
    ``allocated_``), checked for plausibility; ``read()`` is None where that cannot be done.  Between
    memory-profiled steps the counter stands still.
    """

    OFFSET = 96        # std::mutex (40) + std::unordered_map (56), libstdc++ on 64-bit Linux

    def __init__(self, torch_file: str | None):
        self.address: int | None = None
        try:
            import ctypes
            import sys
            if torch_file is None or not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
                return
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch_file), "lib", "libc10.so"))
            fn = lib._ZN3c1025profiledCPUMemoryReporterEv   # c10::profiledCPUMemoryReporter()
            fn.restype = ctypes.c_void_p
            self.address = fn()
            self._value = ctypes.c_size_t
            buckets = ctypes.c_size_t.from_address(self.address + 48).value   # the size map's bucket count
            if not 0 < buckets < 2**40 or self.read() is None:
                self.address = None
        except (OSError, AttributeError, ValueError):
            self.address = None

    def read(self) -> int | None:
        if self.address is None:
            return None
        value = self._value.from_address(self.address + self.OFFSET).value
        return value if value < 2**50 else None


TRIM_AFTER_MB = 16
_TRIMMED_AT = 0.0
_MALLOC_TRIM: Any = None
