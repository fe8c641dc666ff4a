"""Step times, FPS, collectives and the comparison of ranks, for ``opscope diff`` and the reports.

Per-step figures use the steady-state steps (``WARMUP_RULE``); the slow rank is named by
arrival at the collectives, as msprof-analyze's slow-rank analysis does.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from opscope.analysis.diff.match import measured_steps, step_count, stepped_calls
from opscope.model import Profile

# ----------------------------------------------------------------------------- steps
WARMUP_RULE = ("the first captured step is warm-up when the capture starts at step 1 and has more "
               "than one step (a profiler schedule that starts later has already warmed up); --warmup K overrides")
_BATCH_FLAGS = ("-b", "--batch-size", "--batch_size", "--bs", "--train-batch-size", "--per-device-batch-size")


def batch_size_of(profile: Profile, measured_steps=None) -> tuple[int | None, str | None]:
    """The batch size a run used and how opscope knows it: the script's argv (an opscope
    run folder records it), else the leading size of the first 4-D input of the first
    forward operator of a measured step (an image batch; a guess, labelled so)."""
    argv = profile.metadata.get("argv") or []
    for i, arg in enumerate(argv):
        for flag in _BATCH_FLAGS:
            value = None
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "=") and flag.startswith("--"):
                value = arg.split("=", 1)[1]
            if value is not None and str(value).isdigit() and int(value) > 0:
                return int(value), f"script argv ({flag} {value})"
    steps = set(measured_steps or [])
    for call in profile.calls:
        if call.phase == "forward" and (not steps or call.step in steps):
            for shape in call.input_shapes or []:
                # (a TensorList input is a list of shapes: its first item is a list, not a size)
                if isinstance(shape, (list, tuple)) and len(shape) == 4 and isinstance(shape[0], int) \
                        and not isinstance(shape[0], bool) and shape[0] > 0:
                    return int(shape[0]), f"guessed from the first 4-D input {list(shape)} of {call.name}"
    return None, None


def _avg(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def step_summary(profile: Profile, warmup: int | None = None, batch_size: int | None = None,
                 devices: int | None = None, batch_size_source: str | None = None) -> dict:
    """Per-step times, the warm-up steps left out, average step time and FPS.

    Two step times, labelled: the **host span** (ProfilerStep# / step markers: the
    wall-clock iteration the training loop sees) and, when the profile has device
    tasks, the **device span** (first to last kernel of the step = msprof-analyze's
    E2E / ``Stage``; host time before it is ``Preparing``).  FPS = batch size x devices
    / average host step (seconds), over the steps after the warm-up (``WARMUP_RULE``),
    as the porting milestones are judged; the device-span FPS is given beside it.
    """
    steps = [s for s in profile.steps if s.duration_us > 0]
    if warmup is None:
        warmup = 1 if len(steps) > 1 and steps[0].index <= 1 else 0
    warm = steps[:warmup] if warmup < len(steps) else steps[:max(len(steps) - 1, 0)]
    measured = steps[len(warm):]
    avg = sum(s.duration_us for s in measured) / len(measured) if measured else None
    measured_idx = {s.index for s in measured}
    device_steps = [d for d in profile.metadata.get("device_steps") or []
                    if not measured_idx or d["step"] in measured_idx]
    avg_device = _avg([d["device_span_us"] for d in device_steps])
    if batch_size is None:
        batch_size, batch_size_source = batch_size_of(profile, measured_idx)
    elif batch_size_source is None:
        batch_size_source = "--batch-size"
    devices = devices or 1
    fps = batch_size * devices / (avg / 1e6) if avg and batch_size else None
    fps_device = batch_size * devices / (avg_device / 1e6) if avg_device and batch_size else None
    out = {
        "steps": [{"index": s.index, "duration_us": round(s.duration_us, 3), "warmup": s in warm} for s in steps],
        "warmup_steps": [s.index for s in warm],
        "measured_steps": [s.index for s in measured],
        "warmup_rule": WARMUP_RULE,
        "avg_step_us": round(avg, 3) if avg else None,
        "avg_host_step_us": round(avg, 3) if avg else None,
        "avg_device_step_us": round(avg_device, 3) if avg_device else None,
        "batch_size": batch_size, "batch_size_source": batch_size_source, "devices": devices,
        "fps": round(fps, 3) if fps else None,
        "fps_basis": "batch x devices / average host step span" if fps else None,
        "fps_device_span": round(fps_device, 3) if fps_device else None,
        "step_time_source": profile.metadata.get("step_time_source", "ProfilerStep# annotations"),
        "host_step_label": "host span: " + profile.metadata.get("step_time_source", "ProfilerStep# annotations"),
        "device_step_label": None, "device_split_us": None,
    }
    if device_steps:
        out["device_step_label"] = ("device span: first to last compute/communication task of the step "
                                    "(msprof-analyze E2E, 'Stage' in step_trace_time.csv)")
        out["device_split_us"] = {k: round(_avg([d.get(k) for d in device_steps]) or 0.0, 3) for k in DEVICE_SPLIT}
    if profile.metadata.get("device_step_breakdown_us"):
        out["device_breakdown_us"] = profile.metadata["device_step_breakdown_us"]
    return out


DEVICE_SPLIT = ("host_span_us", "preparing_us", "device_span_us", "computing_us", "communication_us",
                "overlapped_us", "communication_not_overlapped_us", "free_us", "transfer_us")


def collective_summary(profile: Profile, measured_steps=None) -> list[dict]:
    """Per collective (kernel type, launching operator): calls and time per step, payload
    and algorithm bandwidth (payload bytes / elapsed time, which includes any waiting)."""
    steps = set(measured_steps or [])
    chosen = [c for c in profile.metadata.get("collectives") or [] if not steps or c["step"] in steps]
    n = max(len({c["step"] for c in chosen}), 1)
    groups = defaultdict(list)
    for c in chosen:
        groups[(c["name"], c["op"])].append(c)
    out = []
    for (name, op), items in groups.items():
        time_us = sum(c["duration_us"] for c in items)
        sizes = [c["bytes"] for c in items if c.get("bytes")]
        row = {"name": name, "op": op, "calls": round(len(items) / n, 3), "time_us": round(time_us / n, 3),
               "bytes": round(sum(sizes) / n) if sizes else None}
        if sizes and len(sizes) == len(items) and time_us > 0:
            row["algorithm_bandwidth_gb_s"] = round(sum(sizes) / (time_us / 1e6) / 1e9, 3)
        out.append(row)
    out.sort(key=lambda r: -r["time_us"])
    return out


def side_summary(profile: Profile, label: str, warmup=None, batch_size=None, devices=None) -> dict:
    steady = measured_steps(profile, warmup)
    calls = [c for c in profile.calls if c.step in steady] if steady else []
    n = len(steady)
    if not calls:
        calls, n = stepped_calls(profile), step_count(profile)
    host = sum(c.self_time_us for c in calls)
    device = sum(c.device_time_us for c in calls)
    step = step_summary(profile, warmup, batch_size, devices)
    unattributed = profile.metadata.get("device_time_unattributed_us")
    n_all = step_count(profile)
    out = {
        "label": label, "path": profile.path, "format": profile.source_format, "device": profile.device,
        "rank": profile.rank, "op_calls_per_step": round(sum(c.count for c in calls) / n, 3),
        "distinct_operators": len({c.name for c in calls}),
        "host_time_per_step_us": round(host / n, 3), "device_time_per_step_us": round(device / n, 3),
        "device_time_unattributed_us": round(unattributed / n_all, 3) if unattributed is not None else None,
        "device_time_unattributed_note": ("device tasks (compute, communication, copies) no operator launched, "
                                          "per step; event record/wait tasks are not work and not counted")
        if unattributed is not None and profile.device != "cpu" else None,
        "step": step,
        "collectives": collective_summary(profile, step["measured_steps"]),
    }
    return out


# ----------------------------------------------------------------------------- ranks
SLOW_RANK_THRESHOLD = 0.05   # msprof-analyze slow-rank analysis: max gap / mean step > 5 %


def synchronisation(profiles: list[Profile]) -> dict:
    """Arrival and wait at every collective, across ranks (same host clock, as on one node).

    A collective is the same kernel name on every rank (``hcom_allReduce__586_0_1``).
    Its *arrival* on a rank is the collective's start; a rank that arrives before the
    last one waits (``wait_us`` = last arrival - own arrival; msprof-analyze calls it
    *Synchronization Time*); ``late_us`` = own arrival - first arrival.  Per rank: sums per
    step.  Empty when fewer than two ranks have collectives."""
    by_kernel: defaultdict[tuple, dict] = defaultdict(dict)
    steps_of: dict = {}
    for i, prof in enumerate(profiles):
        rank = prof.rank if prof.rank is not None else i
        colls = prof.metadata.get("collectives") or []
        steps_of[rank] = max(len({c["step"] for c in colls}), 1)
        for c in colls:
            by_kernel[(c["step"], c["kernel"])][rank] = c["start_us"]
    shared = {k: v for k, v in by_kernel.items() if len(v) == len(profiles) and len(v) > 1}
    if not shared:
        return {}
    wait: defaultdict = defaultdict(float)
    late: defaultdict = defaultdict(float)
    first_gap: dict | None = None
    for key in sorted(shared, key=lambda k: min(shared[k].values())):
        arrivals = shared[key]
        lo, hi = min(arrivals.values()), max(arrivals.values())
        for rank, t in arrivals.items():
            wait[rank] += hi - t
            late[rank] += t - lo
        if first_gap is None:
            first_gap = {"collective": key[1], "step": key[0], "late_rank": max(arrivals, key=arrivals.__getitem__),
                         "gap_us": round(hi - lo, 3)}
    return {"collectives_compared": len(shared), "first_collective": first_gap,
            "wait_us": {r: round(v / steps_of[r], 3) for r, v in wait.items()},
            "late_us": {r: round(v / steps_of[r], 3) for r, v in late.items()}}


def compare_ranks(profiles: list[Profile], warmup=None, top: int = 10) -> dict:
    """Per-rank table (host step, device step, compute, communication, wait, free), the
    slow rank by arrival at the collectives, and the operators whose time differs most.

    In synchronous data parallelism every rank's step ends together, so the rank with
    the longest host step is usually the one that *waited*.  The slow rank is the one
    that arrives late at the collectives (the others wait for it), named only when the
    gap in waiting time exceeds ``SLOW_RANK_THRESHOLD`` of the mean step (msprof-analyze's
    slow-rank threshold); otherwise "no slow rank"."""
    if len(profiles) < 2:
        return {}
    ranks = []
    per_op: defaultdict[str, dict] = defaultdict(dict)
    sync = synchronisation(profiles)
    for i, prof in enumerate(profiles):
        rank = prof.rank if prof.rank is not None else i
        st = step_summary(prof, warmup)
        calls = stepped_calls(prof)
        split = st.get("device_split_us") or {}
        row = {"rank": rank, "avg_step_us": st["avg_step_us"], "host_step_us": st["avg_host_step_us"],
               "device_step_us": st["avg_device_step_us"],
               "computing_us": split.get("computing_us"), "communication_us": split.get("communication_us"),
               "communication_not_overlapped_us": split.get("communication_not_overlapped_us"),
               "free_us": split.get("free_us"),
               "wait_us": sync.get("wait_us", {}).get(rank), "late_us": sync.get("late_us", {}).get(rank),
               "device_time_us": round(sum(c.device_time_us for c in calls) / step_count(prof), 3),
               "host_time_us": round(sum(c.self_time_us for c in calls) / step_count(prof), 3)}
        ranks.append(row)
        on_device = prof.device != "cpu"
        for call in calls:
            t = call.device_time_us if on_device else call.self_time_us
            per_op[call.name][rank] = per_op[call.name].get(rank, 0.0) + t / step_count(prof)
    result: dict[str, Any] = {"ranks": ranks, "slow_rank": None, "threshold_pct": 100 * SLOW_RANK_THRESHOLD}
    if sync:
        result["synchronisation"] = sync
    result.update(_slow_rank(ranks, sync))
    spread = []
    for name, times in per_op.items():
        if len(times) > 1:
            lo, hi = min(times.values()), max(times.values())
            spread.append({"name": name, "min_us": round(lo, 3), "max_us": round(hi, 3), "spread_us": round(hi - lo, 3),
                           "slowest_rank": max(times, key=times.__getitem__)})
    spread.sort(key=lambda r: -r["spread_us"])
    result["op_spread"] = spread[:top]
    return result


def _slow_rank(ranks: list[dict], sync: dict) -> dict:
    steps = [r["device_step_us"] or r["host_step_us"] for r in ranks if (r["device_step_us"] or r["host_step_us"])]
    mean_step = _avg(steps)
    out: dict = {"slow_rank": None}
    host = [r for r in ranks if r["host_step_us"]]
    if host:
        longest = max(host, key=lambda r: r["host_step_us"])
        out["longest_host_step_rank"] = longest["rank"]
    # msprof-analyze's per-dimension check: max gap of compute / communication / free over the mean step
    gaps = {}
    for key in ("computing_us", "communication_not_overlapped_us", "free_us"):
        values = [r[key] for r in ranks if r.get(key) is not None]
        if len(values) == len(ranks) and mean_step:
            gaps[key] = round(100 * (max(values) - min(values)) / mean_step, 2)
    out["dimension_gap_pct"] = gaps
    if sync and mean_step:
        waits = sync["wait_us"]
        gap = max(waits.values()) - min(waits.values())
        late = min(waits, key=waits.get)           # the rank the others wait for
        out["wait_gap_pct"] = round(100 * gap / mean_step, 2)
        out["latest_arrival_rank"] = late
        if gap / mean_step > SLOW_RANK_THRESHOLD:
            out["slow_rank"] = late
            out["slow_rank_reason"] = (f"rank {late} arrives last at the collectives: the other ranks wait "
                                       f"{gap / 1000:.2f} ms per step more for it ({100 * gap / mean_step:.1f} % of "
                                       f"the step, threshold {100 * SLOW_RANK_THRESHOLD:.0f} %)")
        else:
            out["slow_rank_reason"] = (f"no slow rank: rank {late} arrives last at the collectives, but the gap in "
                                       f"waiting time is {gap / 1000:.2f} ms per step ({100 * gap / mean_step:.1f} % "
                                       f"of the step), under the {100 * SLOW_RANK_THRESHOLD:.0f} % threshold")
    elif mean_step and host:
        # no collectives to compare: ranks that do not synchronise; the longest step is the slow one
        fast = min(host, key=lambda r: r["host_step_us"])
        gap = longest["host_step_us"] - fast["host_step_us"]
        if gap / mean_step > SLOW_RANK_THRESHOLD:
            out["slow_rank"] = longest["rank"]
            out["slow_rank_reason"] = (f"no collectives to compare arrival times; rank {longest['rank']} has the "
                                       f"longest host step ({100 * gap / mean_step:.1f} % over the fastest)")
        else:
            out["slow_rank_reason"] = "no slow rank: host steps within the threshold and no collectives to compare"
    if host:
        fast = min(host, key=lambda r: r["host_step_us"])
        out["imbalance_pct"] = round(100 * (longest["host_step_us"] - fast["host_step_us"]) / fast["host_step_us"], 2)
    return out
