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
from dataclasses import dataclass

from opscope.model import DynamicShape, OpCall, RootCause, freeze, freeze_shared, loader_key

# origin kinds -> the cause class of scan.json (input-varies, data-dependent-output, host-sync)
CAUSE_OF_KIND = {"data-dependent-output": "data-dependent-output", "host-sync": "host-sync"}
# kinds that are a new source of variation whatever their inputs do
_ALWAYS_ENTRY = ("data-dependent-output", "host-sync")
# kinds that may merely pass on a size read from another tensor
_FOLDABLE = ("factory", "sized", "slice")


def _knowledge() -> dict:
    from opscope.knowledge import load
    return load("dynamic_shapes.yaml")


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


def _changed(per_step: dict, counts: dict | None = None) -> list[int]:
    """Steps whose set of shapes *changed* from the first step that has any.

    A step changes when it shows a shape the first step did not and misses one the first
    step had: a later step that only adds or drops calls is a different code path.  A step
    that keeps the first step's shapes and adds a *resized* one (the same arguments and
    ranks, other sizes) in place of some of them changed too: under gradient accumulation an
    optimizer step runs several batches, and the one holding the epoch's partial last batch
    still has full ones.  With ``counts`` (step -> shape -> calls) "in place of" means fewer
    calls of a same-layout shape than the first step; a step that only *adds* calls (DDP
    rebuilding its buckets once, in step 2's forward) is a new code path.
    """
    if not per_step:
        return []
    steps = sorted(per_step)
    ref = per_step[steps[0]]
    out = []
    for s in steps[1:]:
        new = per_step[s] - ref
        if not new:
            continue
        if not ref <= per_step[s]:
            out.append(s)
            continue
        layouts = {_layout(n) for n in new}
        replaced = [r for r in ref if _layout(r) in layouts]
        if replaced and (counts is None or any(counts[s].get(r, 0) < counts[steps[0]].get(r, 0) for r in replaced)):
            out.append(s)
    return out


def _set_up_once(per_step: dict, steps: list, site_origins: set, changed: dict) -> bool:
    """A call site whose shapes changed once, right after the first step, and then stayed the same
    in at least two later steps, when none of the data it depends on changed in that step: one-time
    set-up (DDP rebuilds its gradient buckets after the first iteration: the backward's bucket views
    change once), not a dynamic shape."""
    later = sorted(per_step)[1:]
    if len(later) < 2 or steps != later or any(per_step[s] != per_step[later[0]] for s in later):
        return False
    return not any(later[0] in changed.get(o, ()) for o in site_origins)


def _layout(shape) -> tuple:
    """A shape key without its sizes: the number of arguments and each one's rank."""
    return tuple(len(a) if isinstance(a, tuple) else -1 for a in shape) if isinstance(shape, tuple) else ()


def load_origins(side: dict | None, baseline_step: int = 1) -> tuple[dict, dict]:
    """(origin id -> {where, kind, parents, calls}, origin id -> {step -> set of shape keys})."""
    table: dict[int, dict] = {}
    shapes: dict[int, dict] = defaultdict(dict)
    side = side or {}
    for step in sorted((side or {}), key=int):
        data = side[step] or {}
        for oid, meta in (data.get("origins") or {}).items():
            where, kind, parents, calls = meta[:4]
            table[int(oid)] = {"where": where, "kind": kind, "parents": set(parents), "calls": list(calls),
                               "library": meta[4] if len(meta) > 4 else None}
        if int(step) < baseline_step:
            continue
        for oid, produced in (data.get("origin_shapes") or {}).items():
            shapes[int(oid)][int(step)] = {freeze(s) for s in produced}
    return table, dict(shapes)


@dataclass(frozen=True)
class _Trace:
    """The shape origins of a capture, worked out once: the tables every step of the attribution reads."""
    know: dict
    dataloaders: dict
    origins: dict     # origin id -> {where, kind, parents, calls, library}
    produced: dict    # origin id -> {step -> set of shape keys}
    changed: dict     # origin id -> the steps whose shapes changed
    entries: list     # origin ids where a varying size enters the data
    folded: dict      # entry point that only passes a size on -> the entry point it takes it from

    def root(self, roots: dict, oid: int) -> RootCause:
        """The root cause of entry point ``oid``, made once and kept in ``roots``."""
        return _root(roots, oid, self.origins, self.produced, self.changed, self.folded, self.dataloaders,
                     self.know)


def find_dynamic_shapes(calls: list[OpCall], baseline_step: int = 1, side: dict | None = None,
                        dataloaders: dict | None = None, notes: list | None = None):
    """Return (dynamic_shapes, root_causes, dynamic_keys).

    ``notes`` (optional) receives a sentence about call sites judged one-time set-up.

    ``side`` maps step -> the capture's side data (``origins``, ``origin_shapes``);
    ``dataloaders`` maps a DataLoader's "file:line" -> {"drop_last", "batch_size", ...}.
    ``dynamic_keys`` is the set of (op name, source line) pairs found dynamic.
    """
    trace = _trace(side, baseline_step, dataloaders or {})
    by_op, setup_sites = _dynamic_sites(*_group_by_site(calls, baseline_step), trace)
    roots: dict = {}
    dynamic = [_dynamic_op(name, source, entry, roots, trace) for (name, source), entry in by_op.items()]
    _add_data_dependent(dynamic, roots, trace)
    if setup_sites and notes is not None:
        notes.append(_set_up_note(setup_sites, baseline_step))
    dynamic_keys = {(d.op, d.source) for d in dynamic}
    out = []
    for rc in roots.values():
        rc.ops = list(dict.fromkeys(rc.ops))
        _library_fix(rc, trace.know)
        out.append(rc)
    out.sort(key=lambda r: (-len(r.ops), r.source or ""))
    return dynamic, out, dynamic_keys


def _trace(side: dict | None, baseline_step: int, dataloaders: dict) -> _Trace:
    """Which origins changed shape and which of them are entry points: an origin whose shapes changed
    while its parents' did not (or one that is always a new source of variation), shape flow folded."""
    origins, produced = load_origins(side, baseline_step)
    changed = {oid: _changed(per_step) for oid, per_step in produced.items()}
    entries = sorted(oid for oid, steps in changed.items() if steps and oid in origins and (
        origins[oid]["kind"] in _ALWAYS_ENTRY or not any(changed.get(p) for p in origins[oid]["parents"])))
    return _Trace(know=_knowledge(), dataloaders=dataloaders, origins=origins, produced=produced,
                  changed=changed, entries=entries, folded=_fold_by_shape_flow(entries, origins, produced))


def _group_by_site(calls: list[OpCall], baseline_step: int) -> tuple[dict, dict, dict]:
    """Per call site (op, line, enclosing op, phase): the shapes per step, the calls per step and shape,
    and the calls themselves.  One pass over every captured call, so it stays a plain loop."""
    per_site: dict[tuple, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    site_counts: dict[tuple, dict[int, dict]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    site_calls: dict[tuple, list] = defaultdict(list)
    frozen: dict[int, tuple] = {}   # freeze_shared's: ``calls`` holds every list it names
    for c in calls:
        if c.step < baseline_step:
            continue
        site = (c.name, c.source, c.parent, c.phase)
        key = freeze_shared(c.input_shapes, frozen)
        per_site[site][c.step].add(key)
        site_counts[site][c.step][key] += int(c.count or 1)
        site_calls[site].append(c)
    return per_site, site_counts, site_calls


def _dynamic_sites(per_site: dict, site_counts: dict, site_calls: dict, trace: _Trace) -> tuple[dict, list]:
    """(op, line) -> its changed steps, shapes per step, entry points and libraries, merged over the call
    sites whose shapes changed; and the sites set aside as one-time set-up."""
    by_op: dict[tuple, dict] = {}
    setup_sites: list[tuple] = []
    for site, per_step in per_site.items():
        steps = _changed(per_step, site_counts[site])
        if not steps:
            continue
        site_origins = {o for c in site_calls[site] for o in (c.origins or [])}
        if _set_up_once(per_step, steps, site_origins, trace.changed):
            setup_sites.append(site)
            continue
        entry = by_op.setdefault((site[0], site[1]), {"shapes": defaultdict(set), "roots": set(), "steps": set(),
                                                      "libraries": defaultdict(int)})
        entry["steps"].update(steps)
        for step, shapes in per_step.items():
            entry["shapes"][step] |= shapes
        for c in site_calls[site]:
            if c.library:
                entry["libraries"][c.library] += c.count or 1
            entry["roots"].update(trace.folded.get(o, o) for o in (c.origins or [])
                                  if o in trace.folded or o in trace.entries)
    return by_op, setup_sites


def _dynamic_op(name: str, source, entry: dict, roots: dict, trace: _Trace) -> DynamicShape:
    """One dynamic operator at one line, its root causes recorded in ``roots``: its traced entry points,
    else the line itself (a data-dependent op inside a library, or an untraced size)."""
    know = trace.know
    shape_sets = [list(s) for shapes in entry["shapes"].values() for s in shapes]
    dims = varying_dims(shape_sets)
    shapes_per_step = {str(k): sorted([_listify(s) for s in v]) for k, v in sorted(entry["shapes"].items())}
    library = max(entry["libraries"].items(), key=lambda kv: kv[1], default=(None, 0))[0]
    if entry["roots"]:
        primary = max(entry["roots"])  # the closest (latest created) entry point
        for oid in sorted(entry["roots"]):
            trace.root(roots, oid).ops.append(name)
        where, kind = trace.origins[primary]["where"], _kind(primary, trace.origins, trace.produced,
                                                              trace.dataloaders)
    elif name in know["data_dependent_ops"]:
        # a data-dependent operator called from inside a library (no Python call to follow)
        where, kind = source, "data-dependent-output"
        if (kind, source) not in roots:
            roots[(kind, source)] = RootCause(
                source=source, cause=kind, kind=kind, suggestion=know["suggestions"][kind],
                varying_dims=list(dims), library=library,
                evidence=f"{name} (output size depends on tensor values) runs on this line with changing shapes")
        roots[(kind, source)].ops.append(name)
    else:
        where, kind = source, "untraced"
        if (kind, source) not in roots:
            roots[(kind, source)] = RootCause(
                source=source, cause="input-varies", kind="untraced", suggestion=know["suggestions"]["untraced"],
                varying_dims=list(dims), library=library,
                evidence="the input shapes of operators on this line changed between steps, but none of their "
                         "inputs carries a traced origin whose shape changed (opscope cannot say where the "
                         "size comes from)")
        roots[(kind, source)].ops.append(name)
    return DynamicShape(op=name, source=source, cause=CAUSE_OF_KIND.get(kind, "input-varies"),
                        varying_dims=dims, shapes_per_step=shapes_per_step, root_cause=where,
                        suggestion=know["suggestions"].get(kind, know["suggestions"]["input-varies"]),
                        library=library)


def _add_data_dependent(dynamic: list[DynamicShape], roots: dict, trace: _Trace) -> None:
    """Data-dependent operators are dynamic by their outputs, whatever their inputs did: list each one
    (once) that the input comparison did not already find, and name it in its root cause."""
    known = {(d.op, d.source) for d in dynamic}
    for oid in trace.entries:
        meta = trace.origins[oid]
        if meta["kind"] != "data-dependent-output":
            continue
        rc = trace.root(roots, oid)
        for op in meta["calls"]:
            if op not in rc.ops:
                rc.ops.insert(0, op)
            if (op, meta["where"]) in known:
                continue
            outputs = [list(s) for shapes in trace.produced[oid].values() for s in shapes]
            dynamic.append(DynamicShape(
                op=op, source=meta["where"], cause="data-dependent-output", varying_dims=varying_dims(outputs),
                shapes_per_step={"outputs": sorted(_listify(s) for s in set(map(freeze, outputs)))},
                root_cause=meta["where"], suggestion=trace.know["suggestions"]["data-dependent-output"]))
            known.add((op, meta["where"]))


def _set_up_note(setup_sites: list[tuple], baseline_step: int) -> str:
    """The note saying which call sites were judged one-time set-up rather than dynamic, and why."""
    shown = ", ".join(sorted({f"{name} at {source or 'an unattributed line'}" for name, source, _, _ in setup_sites}))
    return (f"{len(setup_sites)} operator call site(s) changed shape once after step {baseline_step} and then "
            f"kept the new shapes in every later step while the data they depend on did not change then "
            f"({shown}): one-time set-up such as DistributedDataParallel rebuilding its gradient buckets "
            "after the first iteration or ZeRO partitioning optimizer state, not a dynamic shape")


def _library_fix(rc: RootCause, know: dict) -> None:
    """A root cause inside a library whose own parameters decide the shape (torchvision's detection models):
    say which ones first (``library_fixes`` in dynamic_shapes.yaml), then the general advice."""
    where = str(rc.library or "")
    for entry in know.get("library_fixes") or []:
        if where.startswith(entry["path"]) and (not entry.get("kinds") or rc.kind in entry["kinds"]):
            rc.suggestion = f"{entry['fix']} {rc.suggestion or ''}".strip()
            rc.set_by = rc.set_by or entry.get("set_by")
            return


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
            # a loader that prefetches (accelerate's DataLoaderShard, a pin-memory thread) made the
            # batch a step uses in that step or the one before
            ahead = 1 if origins[b]["kind"] == "loader" else 0
            if all(any(values <= theirs.get(step - k, set()) | (theirs.get(step, set()) if k else set())
                       for k in range(ahead + 1)) for step, values in mine.items()):
                folded[a] = b
                break
    return folded


def _loader_info(meta: dict, dataloaders: dict) -> dict:
    return (dataloaders.get(loader_key(meta["where"], meta.get("library")))
            or dataloaders.get(meta["where"]) or {})


def _kind(oid: int, origins: dict, produced: dict, dataloaders: dict) -> str:
    meta = origins[oid]
    kind = meta["kind"]
    if kind != "loader":
        return kind
    info = _loader_info(meta, dataloaders)
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
    set_by, varied, library, source = None, "", meta.get("library"), meta["where"]
    if meta["kind"] == "loader":
        info = _loader_info(meta, dataloaders)
        named = _name_dims(dims, shape_sets, know)
        varied = _dims_text(named)
        set_by, suggestion, extra, built_at = _loader_advice(kind, meta, info, named, suggestion, know)
        evidence += extra
        library = built_at or library
        collator_line = _collator_line(kind, info, set_by, source)
        if collator_line:   # the user's object that sets the size, built on its own line: the line to change
            evidence += f"; the collator was built at {collator_line}, the DataLoader under {source}"
            source = collator_line
    rc = roots[oid] = RootCause(source=source, cause=CAUSE_OF_KIND.get(kind, "input-varies"), kind=kind,
                                varying_dims=dims, suggestion=suggestion, evidence=evidence, related=related,
                                library=library, set_by=set_by, varied=varied)
    return rc


def _collator_line(kind: str, info: dict, set_by: str | None, loader_line: str | None) -> str | None:
    """The user's line that built the collator setting a varying size, when it is not the loader's line (a
    DataCollatorWithPadding handed to a Trainer, which builds the DataLoader inside trainer.train()).  A
    partial last batch is the loader's to fix (drop_last), so it keeps the loader's line."""
    collate = info.get("collate") or {}
    built_at = collate.get("built_at")
    if kind == "partial-batch" or not built_at or built_at == loader_line or not set_by:
        return None
    return built_at if set_by.startswith(str(collate.get("name"))) else None


def _name_dims(dims: list, shape_sets: list, know: dict) -> list[dict]:
    """``dims`` with each batch dimension named by its tensor's rank (batch-first data):
    ``sequence length`` for dim 1 of a rank-2 batch tensor."""
    names = know.get("dimension_names") or {}
    out = []
    for d in dims:
        d = dict(d)
        if d.get("dim") is not None:
            ranks = {len(s[d["arg"]]) for s in shape_sets
                     if d["arg"] < len(s) and isinstance(s[d["arg"]], (list, tuple))}
            per_rank = (names.get(ranks.pop()) or []) if len(ranks) == 1 else []
            if d["dim"] < len(per_rank):
                d["name"] = per_rank[d["dim"]]
        out.append(d)
    return out


def _dims_text(dims: list) -> str:
    """``sequence length (dim 1), batch size (dim 0)``: the varying dimensions, each once."""
    return ", ".join(dict.fromkeys(f"{d['name']} (dim {d['dim']})" if d.get("name") else f"dim {d['dim']}"
                                   for d in sorted(dims, key=lambda d: -(d.get("dim") or 0))
                                   if d.get("dim") is not None))


def _loader_advice(kind: str, meta: dict, info: dict, dims: list, suggestion: str, know: dict):
    """(set_by, suggestion, extra evidence, builder line) for a DataLoader root cause: the collate
    function or collate call that sets the varying size, the fix in the terms of the framework that
    built the loader (``support_matrix/dynamic_shapes.yaml`` ``shape_setters`` / ``loader_builders``)
    and that framework's line building it (the Trainer's, not accelerate's wrapper inside it)."""
    setters = know.get("shape_setters") or {}
    built_in = info.get("built_in") or ([meta["library"]] if meta.get("library") else [])
    builder = next((b for b in know.get("loader_builders") or []
                    if any(str(line).startswith(b["path"]) for line in built_in)), None)
    collate = info.get("collate") or {}
    called = [c.split(" at ", 1) for c in meta.get("calls") or [] if " at " in c]
    spec, set_by = None, None
    if collate.get("name"):
        spec = setters.get(str(collate["name"]).rsplit(".", 1)[-1])
        settings = ", ".join(f"{k}={v!r}" for k, v in (collate.get("settings") or {}).items()
                             if v is not None)   # an unset option (max_length=None) says nothing, and no "None"
        set_by = f"{collate['name']}({settings})" + (f" at {collate['where']}" if collate.get("where") else "")
    for name, at in called:
        if spec is None and name in setters:
            spec = setters[name]
            set_by = f"{name} at {at}" + (f" (in the collate function {set_by})" if set_by else "")
    varies = [d for d in dims if d.get("dim") not in (0, None)]
    extra = ""
    if varies:
        extra = f"; the {_dims_text(varies)} varied"
        if set_by:
            extra += f", set by {set_by}" + (f", which {spec['sets']}" if spec else "")
        if spec:
            suggestion = f"{spec['fix'][:1].upper()}{spec['fix'][1:]}"
            if kind == "partial-batch":
                suggestion += " " + _drop_last_fix(builder, know)
        elif set_by:
            suggestion = f"{suggestion} (the collate function is {set_by})"
    elif kind == "partial-batch" and builder:
        suggestion = _drop_last_fix(builder, know)
    at = None
    if builder:
        at = next((line for line in built_in if str(line).startswith(builder["path"])), meta.get("library"))
        extra += f"; the DataLoader is built by {builder['framework']} at {at}"
    return set_by, suggestion, extra, at


def _drop_last_fix(builder: dict | None, know: dict) -> str:
    if builder is None:
        return know["suggestions"]["partial-batch"]
    return (f"The last batch of an epoch was smaller than the others (seen in this run): use {builder['drop_last']} "
            "so every step has the same shapes.")


def _ranges(steps: list) -> str:
    steps = sorted(steps)
    if len(steps) > 6:
        return f"{', '.join(map(str, steps[:5]))}, ... ({len(steps)} steps)"
    return ", ".join(map(str, steps))


def epoch_notes(dataloaders: dict | None, steps_done: int) -> list[str]:
    """Say when the run stopped before a DataLoader's first epoch ended (its last batch unseen).

    Steps are optimizer steps: under gradient accumulation each takes several batches, so the
    steps still needed are the unseen batches divided by the batches per step.  Sizes are this
    process's share: a DistributedSampler gives each rank ``len(sampler)`` samples (padded to
    equal shares), so each rank's last batch is full when that share divides by the batch size.
    """
    notes = []
    for site, info in sorted((dataloaders or {}).items()):
        batches, length = int(info.get("batches") or 0), info.get("length")
        if not batches or info.get("epochs_finished") or not isinstance(length, int) or batches >= length:
            continue
        size, batch = info.get("dataset_size"), info.get("batch_size")
        known = isinstance(size, int) and isinstance(batch, int) and batch > 0
        if known and (info.get("drop_last") or size % batch == 0):
            continue  # its last batch is a full one: nothing unseen at the epoch's end
        per_step = max(1, batches // steps_done) if steps_done else 1
        need = steps_done + -(-(length - batches) // per_step)
        shown = site
        if info.get("where"):
            shown = f"{info.get('library')} (under {info['where']})" if info.get("library") else info["where"]
        accumulation = f", {per_step} batches per optimizer step" if per_step > 1 else ""
        note = (f"the run stopped before the end of the first epoch of the DataLoader at {shown}: {batches} of its "
                f"{length} batches were seen{accumulation}, so its last batch and any shape change it brings were "
                f"not observed; --steps {need} reaches the end of the epoch")
        if known:
            sampler = info.get("sampler") or {}
            if isinstance(sampler.get("num_replicas"), int) and sampler["num_replicas"] > 1:
                note += (f" (this rank's {sampler.get('name', 'sampler')} share is {size} samples of "
                         f"{sampler['num_replicas']} ranks' in batches of {batch}: each rank's last batch will hold "
                         f"{size % batch})")
            else:
                note += f" (with {size} samples in batches of {batch}, the last batch will hold {size % batch})"
        notes.append(note)
    return notes
