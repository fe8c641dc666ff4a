"""A step's device time split the way msprof-analyze's ``step_trace_time.csv`` splits it.

Input: the device tasks of a profile, each ``(start_us, end_us, klass, step)`` with
``klass`` from ``CompiledRules.task_class`` (compute / communication / transfer; sync
and communication sub-tasks are no work of their own and are not passed in).  Per step:

- ``device_span_us`` (msprof's *Stage*, its E2E step): first compute or communication
  task start to last end;
- ``computing_us``: time covered by compute tasks; ``communication_us``: by collectives;
  ``overlapped_us``: covered by both; ``communication_not_overlapped_us``;
- ``free_us``: the device span covered by neither (host-bound gaps, copies, waits);
- ``transfer_us``: host<->device copy tasks (inside *free*, as msprof counts them);
- ``preparing_us``: host step start to the first device task (msprof's *Preparing*).

Pure functions over intervals; no Profile, no I/O.
"""
from __future__ import annotations


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list, b: list) -> float:
    """Length covered by both of two merged, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def step_breakdown(tasks: list[tuple], host_windows: dict) -> list[dict]:
    """Per step (ascending): the msprof-style device split.  ``host_windows`` maps a step
    to its host ``(start_us, end_us)`` (the ProfilerStep span), for *Preparing*."""
    by_step: dict[int, dict[str, list]] = {}
    for start, end, klass, step in tasks:
        if not step:
            continue
        by_step.setdefault(step, {"compute": [], "communication": [], "transfer": []})[klass].append((start, end))
    out = []
    for step in sorted(by_step):
        groups = by_step[step]
        compute, comm = _union(groups["compute"]), _union(groups["communication"])
        busy = _union(compute + comm)
        if not busy:
            continue
        span = busy[-1][1] - busy[0][0]
        overlapped = _intersection(compute, comm)
        comm_len = _length(comm)
        row = {
            "step": step,
            "device_span_us": round(span, 3),
            "computing_us": round(_length(compute), 3),
            "communication_us": round(comm_len, 3),
            "overlapped_us": round(overlapped, 3),
            "communication_not_overlapped_us": round(comm_len - overlapped, 3),
            "free_us": round(span - _length(busy), 3),
            "transfer_us": round(sum(e - s for s, e in groups["transfer"]), 3),
            "device_start_us": busy[0][0],
        }
        window = host_windows.get(step)
        if window:
            row["host_span_us"] = round(window[1] - window[0], 3)
            row["preparing_us"] = round(busy[0][0] - window[0], 3)
            row["tail_us"] = round(window[1] - busy[-1][1], 3)
        out.append(row)
    return out
