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

from opscope.model import Profile, _clean

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
    notes: list = field(default_factory=list)
    schema: str = "opscope.diff/1"

    def to_dict(self) -> dict:
        return _clean(self)


# ----------------------------------------------------------------------------- aggregation
def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


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


def aggregate(profile: Profile, use_phase: bool = True, use_dtypes: bool = True) -> dict:
    """(name, phase, shapes, dtypes) -> per-step calls and times, parent and source."""
    n = step_count(profile)
    table: dict = {}
    for call in stepped_calls(profile):
        key = (call.name, call.phase if use_phase else ANY_PHASE, _freeze(call.input_shapes),
               _freeze(call.dtypes) if use_dtypes else ())
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
    equal_args = sum(1 for x, y in zip(shapes_a, shapes_b) if x == y)
    equal_ranks = sum(1 for x, y in zip(shapes_a, shapes_b) if len(x or ()) == len(y or ()))
    equal_types = sum(1 for x, y in zip(dtypes_a, dtypes_b) if x == y)
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


def match_operators(a: Profile, b: Profile, rules=None) -> list[OpDiff]:
    """Pair operator signatures of A and B; returns every row, biggest regression first."""
    from opscope.parsers.rules import rules as load_rules

    rules = rules or load_rules()
    use_phase = a.metadata.get("has_phases", True) and b.metadata.get("has_phases", True)
    use_dtypes = a.metadata.get("has_dtypes", True) and b.metadata.get("has_dtypes", True)
    ta, tb = aggregate(a, use_phase, use_dtypes), aggregate(b, use_phase, use_dtypes)
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
            candidates = [k for k in right if len(k[2]) == len(key_a[2]) or not k[2] or not key_a[2]]
            if candidates:
                key_b = max(candidates, key=lambda k: (_similarity(key_a, k), tb[k]["calls"]))
                right.remove(key_b)
                row = _row(group[0], group[1], "changed", key_a, key_b, ta[key_a], tb[key_b], dev_a, dev_b)
                row.changes = _describe_changes(key_a, key_b)[0]
            else:
                row = _row(group[0], group[1], "only-a", key_a, None, ta[key_a], None, dev_a, dev_b)
            rows.append(row)
        for key_b in right:
            status = "inserted" if rules.is_inserted_op(group[0]) else "only-b"
            rows.append(_row(group[0], group[1], status, None, key_b, None, tb[key_b], dev_a, dev_b))
    rows.sort(key=lambda r: (-r.delta_us, r.name))
    return rows


# ----------------------------------------------------------------------------- steps
def step_summary(profile: Profile, warmup: int | None = None, batch_size: int | None = None,
                 devices: int | None = None) -> dict:
    """Per-step times, the warm-up steps left out, average step time and FPS.

    FPS = batch size x devices / average step time (seconds), over the steps after the
    warm-up, as the porting milestones are judged.  Default warm-up: the first step
    when the capture starts at step 1 and has more than one step (a profiler schedule
    that starts later has already warmed up).
    """
    steps = [s for s in profile.steps if s.duration_us > 0]
    if warmup is None:
        warmup = 1 if len(steps) > 1 and steps[0].index <= 1 else 0
    warm = steps[:warmup] if warmup < len(steps) else steps[:max(len(steps) - 1, 0)]
    measured = steps[len(warm):]
    avg = sum(s.duration_us for s in measured) / len(measured) if measured else None
    fps = None
    if avg and batch_size:
        fps = batch_size * (devices or 1) / (avg / 1e6)
    out = {
        "steps": [{"index": s.index, "duration_us": round(s.duration_us, 3), "warmup": s in warm} for s in steps],
        "warmup_steps": [s.index for s in warm],
        "measured_steps": [s.index for s in measured],
        "avg_step_us": round(avg, 3) if avg else None,
        "batch_size": batch_size, "devices": devices or 1,
        "fps": round(fps, 3) if fps else None,
        "step_time_source": profile.metadata.get("step_time_source", "ProfilerStep# annotations"),
    }
    if profile.metadata.get("device_step_breakdown_us"):
        out["device_breakdown_us"] = profile.metadata["device_step_breakdown_us"]
    return out


def side_summary(profile: Profile, label: str, warmup=None, batch_size=None, devices=None) -> dict:
    calls = stepped_calls(profile)
    host = sum(c.self_time_us for c in calls)
    device = sum(c.device_time_us for c in calls)
    n = step_count(profile)
    return {
        "label": label, "path": profile.path, "format": profile.source_format, "device": profile.device,
        "rank": profile.rank, "op_calls_per_step": round(sum(c.count for c in calls) / n, 3),
        "distinct_operators": len({c.name for c in calls}),
        "host_time_per_step_us": round(host / n, 3), "device_time_per_step_us": round(device / n, 3),
        "device_time_unattributed_us": profile.metadata.get("device_time_unattributed_us"),
        "step": step_summary(profile, warmup, batch_size, devices),
    }


# ----------------------------------------------------------------------------- ranks
def compare_ranks(profiles: list[Profile], warmup=None, top: int = 10) -> dict:
    """Step time per rank, the straggler and the operators whose time differs most."""
    if len(profiles) < 2:
        return {}
    ranks = []
    per_op = defaultdict(dict)
    for i, prof in enumerate(profiles):
        rank = prof.rank if prof.rank is not None else i
        st = step_summary(prof, warmup)
        calls = stepped_calls(prof)
        row = {"rank": rank, "avg_step_us": st["avg_step_us"],
               "device_time_us": round(sum(c.device_time_us for c in calls) / step_count(prof), 3),
               "host_time_us": round(sum(c.self_time_us for c in calls) / step_count(prof), 3)}
        for entry in prof.metadata.get("device_step_breakdown_us") or []:
            for col in ("Computing", "Communication(Not Overlapped)", "Free"):
                if col in entry:
                    row[col] = row.get(col, 0.0) + entry[col] / len(prof.metadata["device_step_breakdown_us"])
        ranks.append(row)
        on_device = prof.device != "cpu"
        for call in calls:
            t = call.device_time_us if on_device else call.self_time_us
            per_op[call.name][rank] = per_op[call.name].get(rank, 0.0) + t / step_count(prof)
    timed = [r for r in ranks if r["avg_step_us"]]
    result = {"ranks": ranks}
    if timed:
        slow = max(timed, key=lambda r: r["avg_step_us"])
        fast = min(timed, key=lambda r: r["avg_step_us"])
        result.update({"straggler": slow["rank"], "fastest": fast["rank"],
                       "imbalance_pct": round(100 * (slow["avg_step_us"] - fast["avg_step_us"]) / fast["avg_step_us"], 2)})
    spread = []
    for name, times in per_op.items():
        if len(times) > 1:
            lo, hi = min(times.values()), max(times.values())
            spread.append({"name": name, "min_us": round(lo, 3), "max_us": round(hi, 3), "spread_us": round(hi - lo, 3),
                           "slowest_rank": max(times, key=times.get)})
    spread.sort(key=lambda r: -r["spread_us"])
    result["op_spread"] = spread[:top]
    return result


# ----------------------------------------------------------------------------- fallbacks
def fallbacks_from_log(text: str, rules=None) -> list[dict]:
    """Operators a torch_npu log says fell back to the CPU, with how often."""
    from opscope.parsers.rules import rules as load_rules

    rules = rules or load_rules()
    seen = Counter()
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
    counts = Counter()
    evidence = {}
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
                  log_a: str | None = None, log_b: str | None = None) -> DiffResult:
    """Compare run A with run B.  ``a``/``b`` are a Profile or a list of per-rank Profiles
    (the first is compared operator by operator; all ranks are compared with each other)."""
    ranks_a = a if isinstance(a, list) else [a]
    ranks_b = b if isinstance(b, list) else [b]
    pa, pb = ranks_a[0], ranks_b[0]
    devices_a = devices_a or len(ranks_a)
    devices_b = devices_b or len(ranks_b)
    rows = match_operators(pa, pb)
    result = DiffResult(a=side_summary(pa, label_a, warmup, batch_size, devices_a),
                        b=side_summary(pb, label_b, warmup, batch_size, devices_b), operators=rows)
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
            (r.name, r.phase, _freeze(r.input_shapes_a), _freeze(r.dtypes_a or [])),
            (r.name, r.phase, _freeze(r.input_shapes_b), _freeze(r.dtypes_b or [])))
        if shapes:
            result.shape_changes.append({"name": r.name, "phase": r.phase, "args": shapes})
        for d in dtypes:
            result.dtype_changes.append({"name": r.name, "phase": r.phase, **d})
    result.inserted = _inserted(rows, pb, label_b) + _inserted_kernels(pa, label_a)
    result.fallbacks = _fallbacks(pb, label_b, log_b) + _fallbacks(pa, label_a, log_a)
    result.ranks = {k: v for k, v in (("a", compare_ranks(ranks_a, warmup)), ("b", compare_ranks(ranks_b, warmup))) if v}
    result.notes = _notes(pa, pb, result)
    return result


def _name_summary(rows, status, present_other) -> list[dict]:
    by_name = defaultdict(lambda: {"calls": 0.0, "time_us": 0.0, "phases": set(), "parents": Counter()})
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
    ops = defaultdict(lambda: {"calls": 0.0, "host_us": 0.0, "device_us": 0.0, "parents": Counter()})
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
    notes = ["counts and times are per captured step; 'time' is device time on an accelerator, "
             "host self time on the CPU"]
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
            notes.append(f"{side['label']}: pass --batch-size to get FPS")
    for side, prof in ((result.a, pa), (result.b, pb)):
        notes.extend(f"{side['label']}: {n}" for n in prof.metadata.get("notes") or [])  # what a loader skipped
    return notes
