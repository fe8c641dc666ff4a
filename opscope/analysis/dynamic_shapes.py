"""Find dynamic-shape operators and the few source lines that cause them.

Seed method (torch_npu porting guide, "算子提取脚本样例"): an operator is dynamic when
a later step shows input shapes that the first step did not.  Here the comparison is
per *call site* (operator, user line, enclosing operator, phase) and only a *changed*
shape counts: work done once on the first step (optimizer state, lazy modules, RNN
state, GradScaler's first step) is a new code path, not a dynamic shape.

Root causes come from the shape origins recorded at capture time (``capture/source.py``):
every tensor carries the set of origins its shape depends on (a DataLoader batch, a
factory call, a slice or view sized by its arguments, a data-dependent op, a size read
back with ``.item()``), passed from inputs to outputs by tensor identity.  A varying size
*enters* the data at an origin whose own output shapes changed between steps while the
shapes of its inputs' origins did not; each dynamic operator is traced to those entry
points among its origins.  A factory, view or slice whose varying sizes are, step by
step, sizes of an earlier entry point (a GRU's initial state sized from the batch, a
causal mask sized from the sequence) only passes that size on (shape flow): it is folded
into that root cause and listed in its ``related`` lines.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from opscope.model import DynamicShape, OpCall, RootCause

# origin kinds -> the cause class of scan.json (input-varies, data-dependent-output, host-sync)
CAUSE_OF_KIND = {"data-dependent-output": "data-dependent-output", "host-sync": "host-sync"}
# kinds that are a new source of variation whatever their inputs do
_ALWAYS_ENTRY = ("data-dependent-output", "host-sync")
# kinds that may merely pass on a size read from another tensor
_FOLDABLE = ("factory", "sized", "slice")


def _knowledge() -> dict:
    from opscope.knowledge import load
    return load("dynamic_shapes.yaml")


def _shape_key(shapes) -> tuple:
    return tuple(_shape_key(s) if isinstance(s, (list, tuple)) else s for s in shapes)


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
            values = sorted({x[dim] for x in per_arg if isinstance(x, (list, tuple)) and isinstance(x[dim], int)})
            if len(values) > 1:
                out.append({"arg": arg, "dim": dim, "values": values})
    return out


def _changed(per_step: dict) -> list[int]:
    """Steps whose set of shapes *changed* from the first step that has any.

    A step changes when it shows a shape the first step did not and misses one the first
    step had: a later step that only adds or drops calls is a different code path.
    """
    if not per_step:
        return []
    steps = sorted(per_step)
    ref = per_step[steps[0]]
    return [s for s in steps[1:] if not per_step[s] <= ref and not ref <= per_step[s]]


def load_origins(side: dict | None, baseline_step: int = 1) -> tuple[dict, dict]:
    """(origin id -> {where, kind, parents, calls}, origin id -> {step -> set of shape keys})."""
    table: dict[int, dict] = {}
    shapes: dict[int, dict] = defaultdict(dict)
    side = side or {}
    for step in sorted((side or {}), key=int):
        data = side[step] or {}
        for oid, (where, kind, parents, calls) in (data.get("origins") or {}).items():
            table[int(oid)] = {"where": where, "kind": kind, "parents": set(parents), "calls": list(calls)}
        if int(step) < baseline_step:
            continue
        for oid, produced in (data.get("origin_shapes") or {}).items():
            shapes[int(oid)][int(step)] = {_shape_key(s) for s in produced}
    return table, dict(shapes)


def find_dynamic_shapes(calls: list[OpCall], baseline_step: int = 1, side: dict | None = None,
                        dataloaders: dict | None = None):
    """Return (dynamic_shapes, root_causes, dynamic_keys).

    ``side`` maps step -> the capture's side data (``origins``, ``origin_shapes``);
    ``dataloaders`` maps a DataLoader's "file:line" -> {"drop_last", "batch_size", ...}.
    ``dynamic_keys`` is the set of (op name, source line) pairs found dynamic.
    """
    know = _knowledge()
    dataloaders = dataloaders or {}
    origins, produced = load_origins(side, baseline_step)
    changed = {oid: _changed(per_step) for oid, per_step in produced.items()}
    entries = sorted(oid for oid, steps in changed.items() if steps and oid in origins and (
        origins[oid]["kind"] in _ALWAYS_ENTRY or not any(changed.get(p) for p in origins[oid]["parents"])))
    folded = _fold_by_shape_flow(entries, origins, produced)

    # -- dynamic operators: the same op at the same call site, a changed shape later ----
    per_site: dict[tuple, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    site_calls: dict[tuple, list] = defaultdict(list)
    for c in calls:
        if c.step < baseline_step:
            continue
        site = (c.name, c.source, c.parent, c.phase)
        per_site[site][c.step].add(_shape_key(c.input_shapes))
        site_calls[site].append(c)
    by_op: dict[tuple, dict] = {}
    for site, per_step in per_site.items():
        steps = _changed(per_step)
        if not steps:
            continue
        entry = by_op.setdefault((site[0], site[1]), {"shapes": defaultdict(set), "roots": set(), "steps": set()})
        entry["steps"].update(steps)
        for step, shapes in per_step.items():
            entry["shapes"][step] |= shapes
        for c in site_calls[site]:
            entry["roots"].update(folded.get(o, o) for o in (c.origins or []) if o in folded or o in entries)
    dynamic: list[DynamicShape] = []
    roots: dict = {}
    for (name, source), entry in by_op.items():
        shape_sets = [list(s) for shapes in entry["shapes"].values() for s in shapes]
        dims = varying_dims(shape_sets)
        shapes_per_step = {str(k): sorted([_listify(s) for s in v]) for k, v in sorted(entry["shapes"].items())}
        if entry["roots"]:
            primary = max(entry["roots"])  # the closest (latest created) entry point
            for oid in sorted(entry["roots"]):
                _root(roots, oid, origins, produced, changed, folded, dataloaders, know).ops.append(name)
            where, kind = origins[primary]["where"], _kind(primary, origins, produced, dataloaders)
        elif name in know["data_dependent_ops"]:
            # a data-dependent operator called from inside a library (no Python call to follow)
            where, kind = source, "data-dependent-output"
            rc = roots.get(("data-dependent-output", source))
            if rc is None:
                rc = roots[("data-dependent-output", source)] = RootCause(
                    source=source, cause=kind, kind=kind, suggestion=know["suggestions"][kind],
                    varying_dims=list(dims),
                    evidence=f"{name} (output size depends on tensor values) runs on this line with changing shapes")
            rc.ops.append(name)
        else:
            where, kind = source, "untraced"
            rc = roots.get(("untraced", source))
            if rc is None:
                rc = roots[("untraced", source)] = RootCause(
                    source=source, cause="input-varies", kind="untraced", suggestion=know["suggestions"]["untraced"],
                    varying_dims=list(dims),
                    evidence="the input shapes of operators on this line changed between steps, but none of their "
                             "inputs carries a traced origin whose shape changed (opscope cannot say where the "
                             "size comes from)")
            rc.ops.append(name)
        dynamic.append(DynamicShape(op=name, source=source, cause=CAUSE_OF_KIND.get(kind, "input-varies"),
                                    varying_dims=dims, shapes_per_step=shapes_per_step, root_cause=where,
                                    suggestion=know["suggestions"].get(kind, know["suggestions"]["input-varies"])))
    # data-dependent operators are dynamic by their outputs, whatever their inputs did
    known = {(d.op, d.source) for d in dynamic}
    for oid in entries:
        meta = origins[oid]
        if meta["kind"] != "data-dependent-output":
            continue
        rc = _root(roots, oid, origins, produced, changed, folded, dataloaders, know)
        for op in meta["calls"]:
            if op not in rc.ops:
                rc.ops.insert(0, op)
            if (op, meta["where"]) in known:
                continue
            outputs = [list(s) for shapes in produced[oid].values() for s in shapes]
            dynamic.append(DynamicShape(
                op=op, source=meta["where"], cause="data-dependent-output", varying_dims=varying_dims(outputs),
                shapes_per_step={"outputs": sorted(_listify(s) for s in set(map(_shape_key, outputs)))},
                root_cause=meta["where"], suggestion=know["suggestions"]["data-dependent-output"]))
            known.add((op, meta["where"]))
    dynamic_keys = {(d.op, d.source) for d in dynamic}
    out = []
    for rc in roots.values():
        rc.ops = list(dict.fromkeys(rc.ops))
        out.append(rc)
    out.sort(key=lambda r: (-len(r.ops), r.source or ""))
    return dynamic, out, dynamic_keys


def _listify(value):
    return [_listify(v) for v in value] if isinstance(value, (list, tuple)) else value


def _values_by_step(per_step: dict, positions: Collection | None) -> dict:
    """Per step, the sizes at ``positions`` ((arg, dim) pairs), or every size when None."""
    out = {}
    for step, shapes in per_step.items():
        values = set()
        for shape in shapes:
            for arg, dims in enumerate(shape):
                for dim, size in enumerate(dims if isinstance(dims, tuple) else ()):
                    if positions is None or (arg, dim) in positions:
                        values.add(size)
        out[step] = values
    return out


def _fold_by_shape_flow(entries: list, origins: dict, produced: dict) -> dict:
    """Entry points that only pass on a size of an earlier entry point -> that entry point.

    A factory/view/slice origin A is folded into an earlier entry point B when, in every
    step, each varying size of A's outputs is a size of B's outputs in that same step.
    """
    folded: dict[int, int] = {}
    for a in entries:
        if origins[a]["kind"] not in _FOLDABLE:
            continue
        shape_sets = [list(s) for shapes in produced[a].values() for s in shapes]
        positions = {(d["arg"], d["dim"]) for d in varying_dims(shape_sets) if d.get("dim") is not None}
        if not positions:
            continue
        mine = _values_by_step(produced[a], positions)
        for b in entries:
            if b >= a or b in folded:
                continue
            theirs = _values_by_step(produced[b], None)
            if all(step in theirs and values <= theirs[step] for step, values in mine.items()):
                folded[a] = b
                break
    return folded


def _kind(oid: int, origins: dict, produced: dict, dataloaders: dict) -> str:
    meta = origins[oid]
    kind = meta["kind"]
    if kind != "loader":
        return kind
    info = dataloaders.get(meta["where"]) or {}
    batch = info.get("batch_size")
    shape_sets = [list(s) for shapes in produced.get(oid, {}).values() for s in shapes]
    dim0 = [d for d in varying_dims(shape_sets) if d.get("dim") == 0]
    if dim0 and isinstance(batch, int) and min(v for d in dim0 for v in d["values"]) < batch:
        return "partial-batch"
    return "loader-varies"


def _root(roots: dict, oid: int, origins: dict, produced: dict, changed: dict, folded: dict,
          dataloaders: dict, know: dict) -> RootCause:
    rc = roots.get(oid)
    if rc is not None:
        return rc
    meta = origins[oid]
    kind = _kind(oid, origins, produced, dataloaders)
    shape_sets = [list(s) for shapes in produced[oid].values() for s in shapes]
    dims = varying_dims(shape_sets)
    tips = know["suggestions"]
    suggestion = tips.get(kind, tips["input-varies"])
    if kind == "partial-batch" and any(d.get("dim") not in (0, None) for d in dims):
        suggestion = f"{suggestion} {tips['loader-varies']}"
    related = sorted({origins[a]["where"] for a, b in folded.items() if b == oid and origins[a]["where"] != meta["where"]})
    first = min(produced[oid])
    steps = changed[oid]
    what = {"loader": "the batches this DataLoader yields", "data-dependent-output":
            f"the output of {', '.join(meta['calls'])} (its size depends on tensor values)",
            "host-sync": "the tensor sized with a value read back to the host on this line",
            "factory": "the tensor created on this line", "slice": "the slice cut on this line",
            "sized": "the tensor this line sizes from its arguments"}.get(meta["kind"], "the data made on this line")
    evidence = (f"{what} changed shape after step {first} (in step(s) {_ranges(steps)}) while the shapes of "
                f"its inputs did not; the operators listed take their data from it (traced by tensor identity)")
    if meta["kind"] in _ALWAYS_ENTRY:
        evidence = (f"{what} changed shape after step {first} (in step(s) {_ranges(steps)}); the operators "
                    "listed take their data from it (traced by tensor identity)")
    if related:
        evidence += (f"; {', '.join(related)} pass(es) on the same varying size in the same steps (shape flow) "
                     "and are fixed with it")
    rc = roots[oid] = RootCause(source=meta["where"], cause=CAUSE_OF_KIND.get(kind, "input-varies"), kind=kind,
                                varying_dims=dims, suggestion=suggestion, evidence=evidence, related=related)
    return rc


def _ranges(steps: list) -> str:
    steps = sorted(steps)
    if len(steps) > 6:
        return f"{', '.join(map(str, steps[:5]))}, ... ({len(steps)} steps)"
    return ", ".join(map(str, steps))


def epoch_notes(dataloaders: dict | None, steps_done: int) -> list[str]:
    """Say when the run stopped before a DataLoader's first epoch ended (its last batch unseen)."""
    notes = []
    for site, info in sorted((dataloaders or {}).items()):
        batches, length = int(info.get("batches") or 0), info.get("length")
        if not batches or info.get("epochs_finished") or not isinstance(length, int) or batches >= length:
            continue
        size, batch = info.get("dataset_size"), info.get("batch_size")
        known = isinstance(size, int) and isinstance(batch, int) and batch > 0
        if known and (info.get("drop_last") or size % batch == 0):
            continue  # its last batch is a full one: nothing unseen at the epoch's end
        need = steps_done + (length - batches)
        note = (f"the run stopped before the end of the first epoch of the DataLoader at {site}: {batches} of its "
                f"{length} batches were seen, so its last batch and any shape change it brings were not "
                f"observed; --steps {need} reaches the end of the epoch")
        if known:
            note += f" (with {size} samples in batches of {batch}, the last batch will hold {size % batch})"
        notes.append(note)
    return notes
