"""Profiler events as the live capture reads them (``_KinetoEvent``), rebuilt from the Kineto Chrome trace of
the same step: the GPU traces in ``../shared`` replay through the scan's own event path on a machine without one.

What each accessor returns follows torch's ``collection.cpp`` / ``profiler_kineto.cpp``:

- an operator or annotation (``cpu_op``, ``user_annotation``) is a host event whose ``correlation_id()`` is
  the trace's ``External id`` and whose ``linked_correlation_id()`` is 0;
- a runtime or driver call (``cuda_runtime``, ``cuda_driver``) is a host event whose ``correlation_id()`` is
  its CUPTI correlation (the trace's ``correlation``), ``linked_correlation_id()`` the ``External id`` of
  the range it was called in, and ``start_thread_id()`` that range's thread;
- a kernel, copy or memset (and a ``gpu_user_annotation``) is a CUDA event with the same two ids.

The link is a weak reference (torch's ``linked_activity_`` is a ``weak_ptr``): once the linked operator's
event is gone, ``linked_correlation_id()`` reads 0, as it does in torch once the scan has released the
operator's ``_KinetoEvent`` and the profiler's results.
"""
from __future__ import annotations

import gzip
import json
import weakref
from pathlib import Path

HOST_CATS = ("cpu_op", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
TASK_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class TraceEvent:
    """One trace event behind the ``_KinetoEvent`` accessors the capture reads."""

    def __init__(self, ev: dict, device_type, linked: TraceEvent | None = None):
        args = ev.get("args") or {}
        self._ev, self._args, self._device_type = ev, args, device_type
        self._linked = weakref.ref(linked) if linked is not None else None
        cat = ev["cat"]
        self._activity = cat
        host = cat in HOST_CATS
        self._corr = int(args.get("External id", 0) if host else args.get("correlation", 0))
        tid = linked.start_thread_id() if linked is not None and not host else ev["tid"]
        self._tid = tid

    def name(self) -> str:
        return self._ev["name"]

    def device_type(self):
        return self._device_type

    def activity_type(self) -> str:
        return self._activity

    def is_user_annotation(self) -> bool:
        return self._activity in ("user_annotation", "gpu_user_annotation")

    def start_thread_id(self) -> int:
        return self._tid

    def start_ns(self) -> int:
        return round(self._ev["ts"] * 1000)

    def duration_ns(self) -> int:
        return round(self._ev.get("dur", 0) * 1000)

    def sequence_nr(self) -> int:
        seq = self._args.get("Sequence number", -1)
        return seq if isinstance(seq, int) else -1

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        linked = self._linked() if self._linked is not None else None
        return linked.correlation_id() if linked is not None else 0

    def dtypes(self) -> list:
        return [t or "" for t in self._args.get("Input type") or []]

    def shapes(self) -> list:
        return [d if isinstance(d, list) and all(isinstance(x, int) for x in d) else []
                for d in self._args.get("Input Dims") or []]

    def structured_input_shapes(self) -> list:
        return list(self._args.get("Input Dims") or [])

    def concrete_inputs(self) -> list:
        return list(self._args.get("Concrete Inputs") or [])

    def nbytes(self) -> int:
        return int(self._args.get("Bytes", 0) or 0)


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def kineto_events(trace: list[dict]) -> list[TraceEvent]:
    """The step's events, hosts first, in the one list the capture gets (its only strong references)."""
    from torch._C._autograd import DeviceType

    events: list[TraceEvent] = []
    host: dict[int, TraceEvent] = {}
    for ev in trace:
        if ev.get("ph") == "X" and ev.get("cat") in HOST_CATS:
            event = TraceEvent(ev, DeviceType.CPU)
            host[event.correlation_id()] = event
            events.append(event)
    for ev in trace:
        cat = ev.get("cat")
        if ev.get("ph") != "X" or cat not in LAUNCH_CATS + DEVICE_CATS:
            continue
        linked = host.get(int((ev.get("args") or {}).get("External id", 0) or 0))
        events.append(TraceEvent(ev, DeviceType.CPU if cat in LAUNCH_CATS else DeviceType.CUDA, linked))
    return events


def device_total_us(trace: list[dict]) -> float:
    """The trace's device time: every kernel, copy and memset it recorded."""
    return sum(ev.get("dur", 0) for ev in trace if ev.get("ph") == "X" and ev.get("cat") in TASK_CATS)
