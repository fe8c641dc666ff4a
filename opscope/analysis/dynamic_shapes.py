"""Find dynamic-shape operators and the few source lines that cause them.

Seed method (torch_npu porting guide, "算子提取脚本样例"): an operator is dynamic when
a later step shows input shapes that the first step did not.  Beyond the seed, each
dynamic call carries the *origin* of its input (recorded at capture time: the user line
that produced the data), so hundreds of downstream operators collapse into the 3-5
lines worth fixing, each with a cause class and a suggested fix.
"""
from __future__ import annotations

from collections import defaultdict

from opscope.model import DynamicShape, OpCall, RootCause


def _knowledge() -> dict:
    from opscope.capture.source import KNOWLEDGE
    return KNOWLEDGE


def _shape_key(shapes) -> tuple:
    return tuple(tuple(s) if isinstance(s, list) else s for s in shapes)


def varying_dims(shape_sets: list) -> list[dict]:
    """Per argument and dimension, the distinct sizes seen (only where more than one)."""
    out = []
    n_args = max((len(s) for s in shape_sets), default=0)
    for arg in range(n_args):
        per_arg = [s[arg] for s in shape_sets if arg < len(s)]
        ranks = {len(x) for x in per_arg if isinstance(x, (list, tuple))}
        if len(ranks) > 1:
            out.append({"arg": arg, "dim": None, "values": sorted(ranks), "what": "rank"})
            continue
        if not ranks:
            continue
        for dim in range(ranks.pop()):
            values = sorted({x[dim] for x in per_arg if isinstance(x, (list, tuple))})
            if len(values) > 1:
                out.append({"arg": arg, "dim": dim, "values": values})
    return out


def find_dynamic_shapes(calls: list[OpCall], baseline_step: int = 1, side: dict | None = None,
                        dataloaders: dict | None = None):
    """Return (dynamic_shapes, root_causes, dynamic_keys).

    ``side`` maps step -> {"data_dependent_outputs": {"line|aten::op": [shapes...]}};
    ``dataloaders`` maps a DataLoader's "file:line" -> {"drop_last": bool}.
    ``dynamic_keys`` is the set of (op name, source line) pairs found dynamic.
    """
    know = _knowledge()
    data_dep_ops = set(know["data_dependent_ops"])
    host_sync_ops = set(know["host_sync_ops"])
    dataloaders = dataloaders or {}
    base_by_name_src: dict[tuple, set] = defaultdict(set)
    for c in calls:
        if c.step == baseline_step:
            key = _shape_key(c.input_shapes)
            base_by_name_src[(c.name, c.source)].add(key)
    # shapes of each (op, line) per later step
    later: dict[tuple, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    for c in calls:
        if c.step > baseline_step:
            later[(c.name, c.source)][c.step].add(_shape_key(c.input_shapes))
    entries: dict[tuple, dict] = {}
    for c in calls:
        if c.step <= baseline_step:
            continue
        name_src = (c.name, c.source)
        # Only the same op at the same line is comparable, and only a *changed* shape
        # counts: the step must show a shape the first step did not AND miss one it had.
        # An op first seen later (GradScaler skipping step 1) or a one-off extra call
        # (optimizer state created lazily) is a new code path, not a dynamic shape.
        seen = base_by_name_src.get(name_src)
        key = _shape_key(c.input_shapes)
        if seen is None or key in seen or seen <= later[name_src][c.step]:
            continue
        entry = entries.get(name_src)
        if entry is None:
            entry = entries[name_src] = {"calls": [], "roots": defaultdict(int), "shapes": defaultdict(set)}
        entry["roots"][_root_of(c, data_dep_ops, host_sync_ops)] += 1
    # collect shapes per step for the dynamic ones (all steps, for the report)
    for c in calls:
        entry = entries.get((c.name, c.source))
        if entry is not None:
            entry["shapes"][c.step].add(_shape_key(c.input_shapes))
            entry["calls"].append(c)
    dynamic: list[DynamicShape] = []
    dynamic_keys: set = set()
    for (name, source), entry in entries.items():
        (root, cause), _ = max(entry["roots"].items(), key=lambda kv: kv[1])
        shape_sets = [list(s) for shapes in entry["shapes"].values() for s in shapes]
        dims = varying_dims(shape_sets)
        dynamic.append(DynamicShape(
            op=name, source=source, cause=cause, varying_dims=dims,
            shapes_per_step={str(k): sorted([list(map(list, s)) for s in v]) for k, v in sorted(entry["shapes"].items())},
            root_cause=root, suggestion=_suggest(cause, root, dims, dataloaders, know)))
        dynamic_keys.add((name, source))
    # data-dependent ops whose *outputs* varied even though their inputs did not
    outputs: dict[str, set] = defaultdict(set)
    for step, data in (side or {}).items():
        if int(step) < baseline_step:
            continue
        for key, shapes in data.get("data_dependent_outputs", {}).items():
            for s in shapes:
                outputs[key].add(_shape_key(s))
    known = {(d.op, d.source) for d in dynamic}
    for key, shapes in outputs.items():
        line, op = key.split("|", 1)
        if len(shapes) < 2 or (op, line) in known:
            continue
        dims = varying_dims([list(s) for s in shapes])
        dynamic.append(DynamicShape(op=op, source=line, cause="data-dependent-output", varying_dims=dims,
                                    shapes_per_step={"outputs": sorted([list(map(list, s)) for s in shapes])},
                                    root_cause=line, suggestion=know["suggestions"]["data-dependent-output"]))
        dynamic_keys.add((op, line))
    return dynamic, group_root_causes(dynamic), dynamic_keys


def _root_of(c: OpCall, data_dep_ops: set, host_sync_ops: set) -> tuple:
    if c.name in data_dep_ops or (c.name == "aten::index" and "aten::nonzero" in c.children):
        return (c.source, "data-dependent-output")
    if c.name in host_sync_ops:
        return (c.source, "host-sync")
    if c.origin and c.origin_cause in ("data-dependent-output", "host-sync", "input-varies"):
        return (c.origin, c.origin_cause)
    return (c.source, "input-varies")


def _suggest(cause: str, root: str | None, dims: list, dataloaders: dict, know: dict) -> str:
    tips = know["suggestions"]
    if cause == "input-varies" and root in dataloaders:
        if any(d.get("dim") == 0 for d in dims) and not dataloaders[root].get("drop_last"):
            return tips["partial-batch"]
        return tips["input-varies-loader"]
    return tips.get(cause, tips["input-varies"])


def group_root_causes(dynamic: list[DynamicShape]) -> list[RootCause]:
    groups: dict[tuple, RootCause] = {}
    for d in dynamic:
        key = (d.root_cause, d.cause)
        rc = groups.get(key)
        if rc is None:
            rc = groups[key] = RootCause(source=d.root_cause, cause=d.cause, suggestion=d.suggestion)
            # the first dynamic op of this root (execution order) shows the varying input best
            rc.varying_dims = list(d.varying_dims)
        if d.op not in rc.ops:
            rc.ops.append(d.op)
    out = sorted(groups.values(), key=lambda r: -len(r.ops))
    for rc in out:
        rc.evidence = f"{len(rc.ops)} operator(s) changed input shapes after the first step; their data comes from this line"
    return out
