"""Operator signatures of two profiles, aggregated per step and paired (the core of ``opscope diff``).

Operators are matched at the ATen level on (name, phase, input shapes, dtypes) - never by
event order - after the parsers folded backend-private work into its ATen parent.
Signatures left over under the same name and phase are paired as shape/dtype *changes*;
the rest are only in one run.  Counts and times are per step, because the two runs rarely
captured the same number of steps.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from opscope.model import Profile, freeze

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


# ----------------------------------------------------------------------------- aggregation
def thaw(value):
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
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
    """The steady-state steps (after the warm-up, ``diff_steps.WARMUP_RULE``) that per-step figures use."""
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


def describe_changes(key_a, key_b) -> tuple[list, list, list]:
    """Human-readable change list plus structured shape and dtype changes per argument."""
    text, shapes, dtypes = [], [], []
    sa, sb, da, db = key_a[2], key_b[2], key_a[3], key_b[3]
    for i in range(max(len(sa), len(sb))):
        x = sa[i] if i < len(sa) else None
        y = sb[i] if i < len(sb) else None
        if x != y and not _unrecorded_list(i, x, y, da, db):
            shapes.append({"arg": i, "a": thaw(x), "b": thaw(y)})
            text.append(f"arg{i} shape {list(thaw(x)) if x is not None else '-'} -> "
                        f"{list(thaw(y)) if y is not None else '-'}")
    for i in range(max(len(da), len(db))) if da and db else ():
        x = da[i] if i < len(da) else None
        y = db[i] if i < len(db) else None
        if x != y and x not in NON_TENSOR_TYPES and y not in NON_TENSOR_TYPES:
            dtypes.append({"arg": i, "a": x, "b": y})
            text.append(f"arg{i} dtype {x or '-'} -> {y or '-'}")
    return text, shapes, dtypes


def _unrecorded_list(i: int, x, y, da, db) -> bool:
    """Argument ``i`` is a tensor list one profiler recorded without its shapes (``[]``): no change to report."""
    listed = "TensorList" in ((da[i] if da and i < len(da) else None), (db[i] if db and i < len(db) else None))
    return listed and (not x or not y)


def _effective(row: dict | None, on_device: bool) -> float:
    if row is None:
        return 0.0
    return row["device"] if on_device else row["host"]


def _row(name, phase, status, key_a, key_b, ra, rb, dev_a, dev_b) -> OpDiff:
    ta, tb = _effective(ra, dev_a), _effective(rb, dev_b)
    return OpDiff(
        name=name, phase=phase, status=status,
        input_shapes_a=thaw(key_a[2]) if key_a else None, input_shapes_b=thaw(key_b[2]) if key_b else None,
        dtypes_a=thaw(key_a[3]) if key_a else None, dtypes_b=thaw(key_b[3]) if key_b else None,
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
    return _same_ranks(key_a, key_b) and ta[key_a]["parent"] == tb[key_b]["parent"]


def _same_ranks(key_a, key_b) -> bool:
    """The same tensor ranks argument by argument; a tensor list one profiler recorded without its shapes (the
    Ascend trace writes ``[]`` for a TensorList) matches any list (``_foreach_add_`` of the optimizer)."""
    ranks_a, ranks_b = _ranks(key_a), _ranks(key_b)
    if len(ranks_a) != len(ranks_b):
        return False
    return all(ra == rb or (0 in (ra, rb) and _unrecorded_list(i, key_a[2][i], key_b[2][i], key_a[3], key_b[3]))
               for i, (ra, rb) in enumerate(zip(ranks_a, ranks_b, strict=True)))


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
                changes = describe_changes(key_a, key_b)[0]
                row = _row(group[0], group[1], "changed" if changes else "same", key_a, key_b, ta[key_a], tb[key_b],
                           dev_a, dev_b)
                row.changes = changes
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
