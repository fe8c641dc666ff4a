"""Compare two profiles of the same job (CPU vs NPU, GPU vs NPU, before vs after).

Pure functions: Profiles in, a ``DiffResult`` out.  Operators are matched at the ATen
level on (name, phase, input shapes, dtypes) - never by event order - after the
parsers folded backend-private work into its ATen parent.  Signatures left over
under the same name and phase are paired as shape/dtype *changes*; the rest are only
in one run.  Counts and times are per step, because the two runs rarely captured the
same number of steps.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.model import Profile, _clean, freeze

ANY_PHASE = "*"
NON_TENSOR_TYPES = {None, "", "Scalar", "ScalarList", "TensorList", "GenericList", "None"}


@dataclass
class OpDiff:
    """One operator signature compared across the two runs (per-step figures)."""
    name: str
    phase: str
    status: str                      # same | changed | only-a | only-b | inserted
    input_shapes_a: list | None = None
    input_shapes_b: list | None = None
    dtypes_a: list | None = None
    dtypes_b: list | None = None
    calls_a: float = 0.0
    calls_b: float = 0.0
    host_a_us: float = 0.0
    host_b_us: float = 0.0
    device_a_us: float = 0.0
    device_b_us: float = 0.0
    time_a_us: float = 0.0           # the time that counts: device time on an accelerator, host self time on CPU
    time_b_us: float = 0.0
    delta_us: float = 0.0
    parent: str | None = None
    source: str | None = None
    changes: list = field(default_factory=list)

    @property
    def calls_changed(self) -> bool:
        return self.status in ("same", "changed") and abs(self.calls_a - self.calls_b) > 1e-6


@dataclass
class DiffResult:
    """Everything ``opscope diff`` reports; ``to_dict`` is diff.json."""
    a: dict
    b: dict
    operators: list = field(default_factory=list)          # list[OpDiff], biggest regression first
    only_a: list = field(default_factory=list)             # operator names absent from B
    only_b: list = field(default_factory=list)             # operator names absent from A (not inserted)
    call_count_changes: list = field(default_factory=list)
    shape_changes: list = field(default_factory=list)
    dtype_changes: list = field(default_factory=list)
    inserted: list = field(default_factory=list)           # NPU-inserted operators and kernels
    fallbacks: list = field(default_factory=list)
    ranks: dict = field(default_factory=dict)              # {"a": {...}, "b": {...}} for multi-rank sides
    transfers: list = field(default_factory=list)          # per side: host<->device copies, compared as transfers
    folded: list = field(default_factory=list)             # one-sided backend decompositions folded into a parent
    excluded: dict = field(default_factory=dict)           # per side: steps compared, set-up/transfer calls left out
    identical: bool = False                                # nothing differs but timing
    notes: list = field(default_factory=list)
    schema: str = "opscope.diff/1"

    def to_dict(self) -> dict:
        return _clean(self)


# ----------------------------------------------------------------------------- aggregation
def _thaw(value):
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def step_count(profile: Profile) -> int:
    """Steps the per-step figures divide by: the stepped calls' distinct steps."""
    steps = {c.step for c in profile.calls if c.step}
    return max(len(steps), 1)


def stepped_calls(profile: Profile) -> list:
    """Calls inside a step; calls before the first marker (set-up) are left out when steps exist."""
    inside = [c for c in profile.calls if c.step]
    return inside or list(profile.calls)


def measured_steps(profile: Profile, warmup: int | None = None) -> set:
    """The steady-state steps (after the warm-up, ``WARMUP_RULE``) that per-step figures use."""
    steps = [s for s in profile.steps if s.duration_us > 0]
    if warmup is None:
        warmup = 1 if len(steps) > 1 and steps[0].index <= 1 else 0
    warmup = min(warmup, max(len(steps) - 1, 0))
    return {s.index for s in steps[warmup:]}


SETUP_PHASE = "other"   # set-up, data loading, zero_grad: outside the compared training step


def compared_calls(profile: Profile, warmup: int | None = None) -> tuple[list, int, dict]:
    """The calls compared operator by operator, the steps they span, and what was left out.

    Only steady-state steps (the warm-up step carries set-up and one-off work, which
    would show as fractional per-step counts); set-up and data loading (phase 'other':
    DataLoader, opscope.setup) and host<->device transfers (compared separately) are
    left out."""
    steps: set | None = measured_steps(profile, warmup)
    calls = [c for c in profile.calls if c.step in steps] if steps else []
    if not calls:
        calls, steps = stepped_calls(profile), None
    n = len(steps) if steps else step_count(profile)
    transfers = {id(profile.calls[i]) for i in profile.metadata.get("transfer_calls") or []
                 if i < len(profile.calls)}
    # phase 'other' means set-up only where the profile has phases at all (not a text table,
    # not a profile whose every call is unclassified)
    has_phases = profile.metadata.get("has_phases", True) and any(c.phase != SETUP_PHASE for c in calls)
    kept, setup, moved = [], 0, 0
    for call in calls:
        if has_phases and call.phase == SETUP_PHASE:
            setup += 1
        elif id(call) in transfers:
            moved += 1
        else:
            kept.append(call)
    return kept, n, {"steps": sorted(steps) if steps else None, "setup_calls_per_step": round(setup / n, 3),
                     "transfer_calls_per_step": round(moved / n, 3)}


def aggregate(profile: Profile, use_phase: bool = True, use_dtypes: bool = True, calls=None, n=None) -> dict:
    """(name, phase, shapes, dtypes) -> per-step calls and times, parent and source."""
    if calls is None:
        calls, n = stepped_calls(profile), step_count(profile)
    table: dict = {}
    for call in calls:
        key = (call.name, call.phase if use_phase else ANY_PHASE, freeze(call.input_shapes),
               freeze(call.dtypes) if use_dtypes else ())
        row = table.get(key)
        if row is None:
            row = table[key] = {"calls": 0.0, "host": 0.0, "total": 0.0, "device": 0.0,
                                "parents": Counter(), "source": call.source, "dtypes": call.dtypes}
        row["calls"] += call.count
        row["host"] += call.self_time_us
        row["total"] += call.total_time_us
        row["device"] += call.device_time_us
        row["parents"][call.parent] += call.count
    for row in table.values():
        for k in ("calls", "host", "total", "device"):
            row[k] /= n
        row["parent"] = row["parents"].most_common(1)[0][0]
    return table


def _resolve_truncated(names_from: set, names_to: set) -> dict:
    """Map names cut short by a text table ('aten::max_pool2d_with_in...') to full names."""
    mapping = {}
    for name in names_from:
        if name.endswith("..."):
            prefix = name[:-3]
            hits = [n for n in names_to if n.startswith(prefix)]
            if len(hits) == 1:
                mapping[name] = hits[0]
    return mapping


def _rename(table: dict, mapping: dict) -> dict:
    if not mapping:
        return table
    out: dict = {}
    for (name, *rest), row in table.items():
        key = (mapping.get(name, name), *rest)
        if key in out:   # merge rows that collapse onto one name
            for k in ("calls", "host", "total", "device"):
                out[key][k] += row[k]
        else:
            out[key] = row
    return out


# ----------------------------------------------------------------------------- matching
def _similarity(key_a, key_b) -> tuple:
    shapes_a, dtypes_a = key_a[2], key_a[3]
    shapes_b, dtypes_b = key_b[2], key_b[3]
    same_arity = len(shapes_a) == len(shapes_b)
    equal_args = sum(1 for x, y in zip(shapes_a, shapes_b, strict=False) if x == y)
    equal_ranks = sum(1 for x, y in zip(shapes_a, shapes_b, strict=False) if len(x or ()) == len(y or ()))
    equal_types = sum(1 for x, y in zip(dtypes_a, dtypes_b, strict=False) if x == y)
    return (same_arity, equal_ranks, equal_types, equal_args)


def _describe_changes(key_a, key_b) -> tuple[list, list, list]:
    """Human-readable change list plus structured shape and dtype changes per argument."""
    text, shapes, dtypes = [], [], []
    sa, sb, da, db = key_a[2], key_b[2], key_a[3], key_b[3]
    for i in range(max(len(sa), len(sb))):
        x = sa[i] if i < len(sa) else None
        y = sb[i] if i < len(sb) else None
        if x != y:
            shapes.append({"arg": i, "a": _thaw(x), "b": _thaw(y)})
            text.append(f"arg{i} shape {list(_thaw(x)) if x is not None else '-'} -> "
                        f"{list(_thaw(y)) if y is not None else '-'}")
    for i in range(max(len(da), len(db))) if da and db else ():
        x = da[i] if i < len(da) else None
        y = db[i] if i < len(db) else None
        if x != y and x not in NON_TENSOR_TYPES and y not in NON_TENSOR_TYPES:
            dtypes.append({"arg": i, "a": x, "b": y})
            text.append(f"arg{i} dtype {x or '-'} -> {y or '-'}")
    return text, shapes, dtypes


def _effective(row: dict | None, on_device: bool) -> float:
    if row is None:
        return 0.0
    return row["device"] if on_device else row["host"]


def _row(name, phase, status, key_a, key_b, ra, rb, dev_a, dev_b) -> OpDiff:
    ta, tb = _effective(ra, dev_a), _effective(rb, dev_b)
    return OpDiff(
        name=name, phase=phase, status=status,
        input_shapes_a=_thaw(key_a[2]) if key_a else None, input_shapes_b=_thaw(key_b[2]) if key_b else None,
        dtypes_a=_thaw(key_a[3]) if key_a else None, dtypes_b=_thaw(key_b[3]) if key_b else None,
        calls_a=round(ra["calls"], 3) if ra else 0.0, calls_b=round(rb["calls"], 3) if rb else 0.0,
        host_a_us=round(ra["host"], 3) if ra else 0.0, host_b_us=round(rb["host"], 3) if rb else 0.0,
        device_a_us=round(ra["device"], 3) if ra else 0.0, device_b_us=round(rb["device"], 3) if rb else 0.0,
        time_a_us=round(ta, 3), time_b_us=round(tb, 3), delta_us=round(tb - ta, 3),
        parent=(rb or ra)["parent"], source=(ra or rb)["source"])


def _ranks(key) -> tuple:
    return tuple(len(s) if isinstance(s, (list, tuple)) else -1 for s in key[2])


def _pairable(key_a, key_b, ta, tb) -> bool:
    """Two signatures of one operator are the same call site changed only when they have
    the same arguments with the same tensor ranks and the same parent operator (a batch
    or dtype change); otherwise they are unrelated calls (an H2D copy is not a CPU copy)."""
    if not key_a[2] or not key_b[2]:
        return True                      # a text table without shapes
    return _ranks(key_a) == _ranks(key_b) and ta[key_a]["parent"] == tb[key_b]["parent"]


def match_operators(a: Profile, b: Profile, rules=None, warmup: int | None = None) -> list[OpDiff]:
    """Pair operator signatures of A and B; returns every row, biggest regression first.

    Rows of only one run whose parent operator exists are backend decompositions
    (``clamp_min_`` under ``relu_`` on the CPU, ``_npu_dropout`` under ``dropout`` on the
    NPU) and get status ``folded``: listed with their parent, never as a difference of
    their own.  A dtype cast under a user's ``aten::to`` is the user's cast, not an inserted one."""
    from opscope.parsers.rules import rules as load_rules

    rules = rules or load_rules()
    use_phase = a.metadata.get("has_phases", True) and b.metadata.get("has_phases", True)
    use_dtypes = a.metadata.get("has_dtypes", True) and b.metadata.get("has_dtypes", True)
    calls_a, n_a, _ = compared_calls(a, warmup)
    calls_b, n_b, _ = compared_calls(b, warmup)
    ta = aggregate(a, use_phase, use_dtypes, calls_a, n_a)
    tb = aggregate(b, use_phase, use_dtypes, calls_b, n_b)
    names_a, names_b = {k[0] for k in ta}, {k[0] for k in tb}
    ta = _rename(ta, _resolve_truncated(names_a, names_b))
    tb = _rename(tb, _resolve_truncated(names_b, names_a))
    dev_a, dev_b = a.device != "cpu", b.device != "cpu"

    rows: list[OpDiff] = []
    groups_a, groups_b = defaultdict(list), defaultdict(list)
    for key in ta:
        if key in tb:
            rows.append(_row(key[0], key[1], "same", key, key, ta[key], tb[key], dev_a, dev_b))
        else:
            groups_a[key[:2]].append(key)
    for key in tb:
        if key not in ta:
            groups_b[key[:2]].append(key)
    for group in sorted(set(groups_a) | set(groups_b)):
        left = sorted(groups_a.get(group, []), key=lambda k: -ta[k]["calls"])
        right = sorted(groups_b.get(group, []), key=lambda k: -tb[k]["calls"])
        for key_a in left:
            candidates = [k for k in right if _pairable(key_a, k, ta, tb)]
            if candidates:
                key_b = max(candidates, key=lambda k: (_similarity(key_a, k), tb[k]["calls"]))
                right.remove(key_b)
                row = _row(group[0], group[1], "changed", key_a, key_b, ta[key_a], tb[key_b], dev_a, dev_b)
                row.changes = _describe_changes(key_a, key_b)[0]
            else:
                row = _row(group[0], group[1], "only-a", key_a, None, ta[key_a], None, dev_a, dev_b)
            rows.append(row)
        for key_b in right:
            user_cast = rules.is_user_cast_parent(tb[key_b]["parent"]) and tb[key_b]["source"]
            status = "inserted" if rules.is_inserted_op(group[0]) and not user_cast else "only-b"
            rows.append(_row(group[0], group[1], status, None, key_b, None, tb[key_b], dev_a, dev_b))
    _fold_decompositions(rows, rules)
    rows.sort(key=lambda r: (-r.delta_us, r.name))
    return rows


def _fold_decompositions(rows: list, rules) -> None:
    """Mark one-sided rows nested in another operator as ``folded`` into that parent.

    A backend implements a public operator with its own sub-operators (the CPU's
    ``relu_`` calls ``clamp_min_``, ``zero_`` calls ``fill_``, dropout calls ``bernoulli_``;
    the NPU's ``dropout`` calls ``_npu_dropout``, ``_foreach_add_`` calls ``result_type``):
    the difference that matters is at the top, reported once.  ``never_fold`` in the rules
    keeps an operator visible wherever it is nested."""
    for r in rows:
        if r.status in ("only-a", "only-b") and r.parent and not rules.never_fold(r.name):
            r.status = "folded"
            r.changes = [f"backend decomposition of {r.parent} (only in {'A' if r.calls_a else 'B'})"]


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
                if isinstance(shape, (list, tuple)) and len(shape) == 4 and shape[0] and shape[0] > 0:
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


# ----------------------------------------------------------------------------- fallbacks
def fallbacks_from_log(text: str, rules=None) -> list[dict]:
    """Operators a torch_npu log says fell back to the CPU, with how often."""
    from opscope.parsers.rules import rules as load_rules

    rules = rules or load_rules()
    seen: Counter[str] = Counter()
    for line in text.splitlines():
        for pattern in rules.fallback_log:   # first matching pattern wins: one warning, one count
            match = pattern.search(line)
            if match:
                op = match.group("op")
                seen[op if "::" in op else f"aten::{op}"] += 1
                break
    return [{"op": op, "evidence": "fallback warning in log", "count": n} for op, n in seen.most_common()]


def _fallbacks(profile: Profile, side: str, log_text: str | None) -> list[dict]:
    out = []
    counts: Counter[str] = Counter()
    evidence: dict = {}
    for item in profile.metadata.get("fallback_evidence") or []:
        counts[item["op"]] += 1
        evidence[item["op"]] = "CPU kernels under it: " + ", ".join(item["evidence"])
    out += [{"side": side, "op": op, "evidence": evidence[op], "count": n} for op, n in counts.most_common()]
    if log_text:
        out += [dict(item, side=side) for item in fallbacks_from_log(log_text)]
    return out


# ----------------------------------------------------------------------------- entry point
def diff_profiles(a, b, *, label_a: str = "A", label_b: str = "B", warmup: int | None = None,
                  batch_size: int | None = None, devices_a: int | None = None, devices_b: int | None = None,
                  log_a: str | None = None, log_b: str | None = None,
                  batch_size_a: int | None = None, batch_size_b: int | None = None) -> DiffResult:
    """Compare run A with run B.  ``a``/``b`` are a Profile or a list of per-rank Profiles
    (the first is compared operator by operator; all ranks are compared with each other).
    ``batch_size`` applies to both sides; ``batch_size_a``/``_b`` override it per side;
    without either, each side's batch size is read from its scan (argv) or guessed from
    its first input shape, and the source is reported."""
    ranks_a = a if isinstance(a, list) else [a]
    ranks_b = b if isinstance(b, list) else [b]
    pa, pb = ranks_a[0], ranks_b[0]
    devices_a = devices_a or len(ranks_a)
    devices_b = devices_b or len(ranks_b)
    rows = match_operators(pa, pb, warmup=warmup)
    bs_a = batch_size_a if batch_size_a is not None else batch_size
    bs_b = batch_size_b if batch_size_b is not None else batch_size
    from opscope.parsers.rules import rules as load_rules

    rules = load_rules()
    result = DiffResult(a=side_summary(pa, label_a, warmup, bs_a, devices_a),
                        b=side_summary(pb, label_b, warmup, bs_b, devices_b), operators=rows)
    present_a = {r.name for r in rows if r.status != "only-b" and r.status != "inserted"}
    present_b = {r.name for r in rows if r.status != "only-a"}
    result.only_a = _name_summary(rows, "only-a", present_b)
    result.only_b = _name_summary(rows, "only-b", present_a)
    result.call_count_changes = [
        {"name": r.name, "phase": r.phase, "calls_a": r.calls_a, "calls_b": r.calls_b,
         "input_shapes_a": r.input_shapes_a, "input_shapes_b": r.input_shapes_b}
        for r in sorted(rows, key=lambda r: -abs(r.calls_b - r.calls_a)) if r.calls_changed]
    for r in rows:
        if r.status != "changed":
            continue
        _, shapes, dtypes = _describe_changes(
            (r.name, r.phase, freeze(r.input_shapes_a), freeze(r.dtypes_a or [])),
            (r.name, r.phase, freeze(r.input_shapes_b), freeze(r.dtypes_b or [])))
        if shapes:
            result.shape_changes.append({"name": r.name, "phase": r.phase, "args": shapes})
        for d in dtypes:
            shape_a = (r.input_shapes_a or [])[d["arg"]] if d["arg"] < len(r.input_shapes_a or []) else None
            shape_b = (r.input_shapes_b or [])[d["arg"]] if d["arg"] < len(r.input_shapes_b or []) else None
            if shape_a == [] and shape_b == [] and rules.is_python_scalar_dtype(d["a"]) \
                    and rules.is_python_scalar_dtype(d["b"]):
                continue        # a Python number wrapped as a 0-dim tensor: int vs float literal, not a port issue
            key = (r.name, r.phase, d["arg"], d["a"], d["b"])
            same = next((x for x in result.dtype_changes if (x["name"], x["phase"], x["arg"], x["a"], x["b"]) == key),
                        None)
            if same:
                same["signatures"] += 1
            else:
                result.dtype_changes.append({"name": r.name, "phase": r.phase, **d, "signatures": 1,
                                             "cause": rules.known_cause(r.name, "dtype", d["a"], d["b"])})
    for item in result.only_a:
        item["cause"] = rules.known_cause(item["name"], "a")
    for item in result.only_b:
        item["cause"] = rules.known_cause(item["name"], "b")
    _, _, excl_a = compared_calls(pa, warmup)
    _, _, excl_b = compared_calls(pb, warmup)
    result.transfers = [_transfers(p, label) for p, label in ((pa, label_a), (pb, label_b))]
    result.excluded = {"a": excl_a, "b": excl_b}
    result.folded = _folded(rows)
    result.inserted = _inserted(rows, pb, label_b) + _inserted_kernels(pa, label_a)
    result.fallbacks = _fallbacks(pb, label_b, log_b) + _fallbacks(pa, label_a, log_a)
    result.ranks = {k: v for k, v in (("a", compare_ranks(ranks_a, warmup)), ("b", compare_ranks(ranks_b, warmup))) if v}
    result.identical = not (result.only_a or result.only_b or result.dtype_changes or result.shape_changes
                            or result.call_count_changes or result.folded
                            or any(r.status not in ("same",) for r in rows))
    result.notes = _notes(pa, pb, result)
    return result


def _transfers(profile: Profile, label: str) -> dict:
    """Host<->device copies of the steady-state steps, per step: the operator that launched
    each copy task (the batch and labels moving to the device)."""
    steps = measured_steps(profile)
    idx = profile.metadata.get("transfer_calls") or []
    n = max(len(steps), 1)
    leaves: defaultdict[tuple, dict[str, float]] = defaultdict(lambda: {"calls": 0, "device_us": 0.0})
    for i in idx:
        call = profile.calls[i] if i < len(profile.calls) else None
        if call is None or (steps and call.step not in steps) or call.device_time_us <= 0:
            continue
        e = leaves[(call.name, freeze(call.input_shapes[:1]), freeze(call.dtypes[:1]), call.source)]
        e["calls"] += 1
        e["device_us"] += call.device_time_us
    items = [{"name": k[0], "shape": _thaw(k[1])[0] if k[1] else None, "dtype": k[2][0] if k[2] else None,
              "source": k[3], "calls": round(v["calls"] / n, 3), "device_us": round(v["device_us"] / n, 3)}
             for k, v in leaves.items()]
    note = None
    if profile.device == "cpu":
        note = "a CPU run moves no data to a device: .to(device) is a no-op there"
    return {"side": label, "items": sorted(items, key=lambda x: -x["device_us"]), "note": note}


def _folded(rows) -> list[dict]:
    by: defaultdict[tuple, dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "time_us": 0.0})
    for r in rows:
        if r.status == "folded":
            side = "a" if r.calls_a else "b"
            e = by[(side, r.parent, r.name)]
            e["calls"] += r.calls_a or r.calls_b
            e["time_us"] += r.time_a_us if side == "a" else r.time_b_us
    return [{"side": k[0], "parent": k[1], "name": k[2], "calls": round(v["calls"], 3), "time_us": round(v["time_us"], 3)}
            for k, v in sorted(by.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2]))]


def _name_summary(rows, status, present_other) -> list[dict]:
    by_name: defaultdict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0.0, "time_us": 0.0, "phases": set(), "parents": Counter()})
    for r in rows:
        if r.status == status and r.name not in present_other:
            entry = by_name[r.name]
            entry["calls"] += r.calls_a if status == "only-a" else r.calls_b
            entry["time_us"] += r.time_a_us if status == "only-a" else r.time_b_us
            entry["phases"].add(r.phase)
            entry["parents"][r.parent] += 1
    return [{"name": n, "calls": round(e["calls"], 3), "time_us": round(e["time_us"], 3),
             "phases": sorted(e["phases"]), "under": e["parents"].most_common(1)[0][0]}
            for n, e in sorted(by_name.items(), key=lambda kv: -kv[1]["time_us"])]


def _inserted(rows, profile_b, label_b) -> list[dict]:
    ops: defaultdict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0.0, "host_us": 0.0, "device_us": 0.0, "parents": Counter()})
    for r in rows:
        if r.status == "inserted":
            e = ops[r.name]
            e["calls"] += r.calls_b
            e["host_us"] += r.host_b_us
            e["device_us"] += r.device_b_us
            e["parents"][r.parent] += 1
    out = [{"side": label_b, "kind": "operator", "name": n, "calls": round(e["calls"], 3),
            "host_us": round(e["host_us"], 3), "device_us": round(e["device_us"], 3),
            "triggered_by": [p for p, _ in e["parents"].most_common() if p]}
           for n, e in ops.items()]
    return out + _inserted_kernels(profile_b, label_b)


def _inserted_kernels(profile, label) -> list[dict]:
    n = step_count(profile)
    return [{"side": label, "kind": "kernel", "name": k["kernel"], "calls": round(k["calls"] / n, 3),
             "host_us": 0.0, "device_us": round(k["device_time_us"] / n, 3), "triggered_by": list(k["ops"])}
            for k in profile.metadata.get("inserted_kernels") or []]


def _notes(pa, pb, result) -> list[str]:
    notes = ["counts and times are per steady-state step (the warm-up step is left out); 'time' is device time "
             "on an accelerator, host self time on the CPU"]
    if result.identical:
        notes.insert(0, "no differences: every operator signature matches with the same calls per step "
                        "(only timing differs)")
    for key, side in (("a", result.a), ("b", result.b)):
        ex = result.excluded.get(key) or {}
        if ex.get("setup_calls_per_step") or ex.get("transfer_calls_per_step"):
            notes.append(f"{side['label']}: left out of the operator comparison per step: "
                         f"{ex.get('setup_calls_per_step', 0):g} set-up/data-loading calls (phase other) and "
                         f"{ex.get('transfer_calls_per_step', 0):g} host<->device transfer calls (listed as transfers)")
    if not (pa.metadata.get("has_phases", True) and pb.metadata.get("has_phases", True)):
        notes.append("one input has no phase information (text table): forward and backward matched together")
    if not (pa.metadata.get("has_dtypes", True) and pb.metadata.get("has_dtypes", True)):
        notes.append("one input has no dtypes (text table): dtype changes cannot be seen")
    for side in (result.a, result.b):
        st = side["step"]
        if st["warmup_steps"]:
            notes.append(f"{side['label']}: warm-up step(s) {', '.join(map(str, st['warmup_steps']))} "
                         f"excluded from the average step time")
        if st["fps"] is None and st["avg_step_us"]:
            notes.append(f"{side['label']}: batch size unknown; pass --batch-size A,B to get FPS")
        elif st["fps"] is not None:
            notes.append(f"{side['label']}: FPS = batch {st['batch_size']} ({st['batch_size_source']}) x "
                         f"{st['devices']} device(s) / average host step")
        if st.get("avg_device_step_us"):
            notes.append(f"{side['label']}: host step {st['avg_host_step_us'] / 1000:.2f} ms (ProfilerStep span) vs "
                         f"device step {st['avg_device_step_us'] / 1000:.2f} ms (first to last kernel, msprof-analyze "
                         f"E2E); the gap is host time before the first kernel (Preparing) and after the last")
    for side, prof in ((result.a, pa), (result.b, pb)):
        notes.extend(f"{side['label']}: {n}" for n in prof.metadata.get("notes") or [])  # what a loader skipped
    return notes
