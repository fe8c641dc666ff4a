"""Compare two profiles of the same job (CPU vs NPU, GPU vs NPU, before vs after).

Pure functions: Profiles in, a ``DiffResult`` out.  Operators are matched at the ATen
level on (name, phase, input shapes, dtypes) - never by event order - after the
parsers folded backend-private work into its ATen parent.  Signatures left over
under the same name and phase are paired as shape/dtype *changes*; the rest are only
in one run.  Counts and times are per step, because the two runs rarely captured the
same number of steps.  The pairing is ``diff_match``; step times, FPS and ranks are
``diff_steps``; this module assembles the ``DiffResult``.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.analysis.diff.match import (
    compared_calls,
    describe_changes,
    match_operators,
    measured_steps,
    step_count,
    thaw,
)
from opscope.analysis.diff.steps import compare_ranks, side_summary
from opscope.model import Profile, freeze, json_safe


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
        return json_safe(self)


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
        _, shapes, dtypes = describe_changes(
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
    items = [{"name": k[0], "shape": thaw(k[1])[0] if k[1] else None, "dtype": k[2][0] if k[2] else None,
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
