"""What will be slow on the NPU: a per-signature and per-step estimate from a CPU scan.

Two stages, both pure.  ``build_basis`` turns the captured operators into the NPU kernels
they become (with FLOPs and bytes, TransData the NPU inserts, AI CPU fall-backs,
unaligned cube shapes, fusable op sequences, dynamic shapes) - chip-independent, stored in
scan.json.  ``price`` puts a chip's figures on that basis: device time per signature,
host launch time, DDP communication for 1/8/16 devices, the bound, step time and FPS.
``opscope report --chip`` re-prices a stored basis without re-running the script.
Every figure is an estimate: the calibration error (bench/npu_estimate_accuracy.py) is
stated with it.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import fields

from opscope.analysis.npu.cost import (
    Kernel,
    cost_model,
    dtype_bytes,
    kernel_time_us,
    numel,
    pricing_rule,
    resolve_chip,
)
from opscope.analysis.npu.kernels import (
    MODELS,
    aicpu_reason,
    alignment_reason,
    apply_passes,
    base_name,
    cache_tensors,
    clear_tensors,
    cost_entry,
    launches_nothing,
    match_fused_patterns,
    model_elementwise,
    nested_lists,
    nz_transdata,
    op_tensors,
    set_tensor_lists,
    tensor_lists,
    transdata,
)
from opscope.model import EstimateBasis, NpuEstimate

__all__ = ["BASIS_VERSION", "MODELS", "allreduce_us", "bound_sentence", "build_basis", "estimate", "price",
           "rebuild_basis"]

BASIS_VERSION = 1


# --- the chip-independent basis ---

def _steady(steps) -> set[int]:
    complete = sorted(s.index for s in steps if s.complete)
    return set(complete[1:]) if len(complete) > 1 else set(complete)


def _per_step(op, steady: set[int]) -> float:
    ran = set(op.steps or [])
    if steady and not (ran & steady):
        return 0.0
    return op.calls / max(len(ran), 1)


def _parents(operators) -> dict[str, str | None]:
    """Each operator name's most common parent (the name chain nesting is judged by)."""
    votes: dict[str, dict] = {}
    for op in operators:
        by_parent = votes.setdefault(op.name, {})
        by_parent[op.parent] = by_parent.get(op.parent, 0) + op.calls
    return {name: max(c, key=c.__getitem__) for name, c in votes.items()}


def _nested_in_priced(op, parent_of: dict, priced: set, kernel_ops: frozenset = frozenset()) -> bool:
    """``op`` runs inside an operator priced by its own kernel(s): a mapped one (``priced``: base names),
    one torch_npu registers itself or a library op's single kernel (``kernel_ops``: full names)."""
    parent, seen = op.parent, 0
    while parent and seen < 12:
        if parent == op.name:   # an overload calling its sibling (upsample_nearest2d.vec -> upsample_nearest2d)
            return base_name(parent) in priced
        if base_name(parent) in priced or parent in kernel_ops:
            return True
        parent, seen = parent_of.get(parent), seen + 1
    return False


def _verdicts(operators) -> dict[str, str | None]:
    """Each operator name's most common verdict (calls-weighted)."""
    votes: dict[str, Counter] = {}
    for op in operators:
        votes.setdefault(op.name, Counter())[op.verdict] += max(op.calls, 1)
    return {name: c.most_common(1)[0][0] for name, c in votes.items()}


def composite_wrapper(op, mapped: set, has_children: set) -> bool:
    """A composite signature (torch_npu registers no kernel of its own: the support matrix's ``composite``
    verdict) whose children the scan recorded, and that the cost model does not map to kernels itself:
    it is priced by its children's kernels, never on top of them."""
    return op.verdict == "composite" and base_name(op.name) not in mapped and op.name in has_children \
        and not third_party_kernel(op)


THIRD_PARTY_RULES = ("third-party", "third-party-default", "third-party-no-adapter-release")


def third_party_kernel(op) -> bool:
    """A library's op that runs as one kernel on the NPU (an adapter's, or the CPU fallback's, or none):
    what the scan recorded below it is the scanning machine's implementation, never an NPU kernel."""
    return (op.evidence or {}).get("rule") in THIRD_PARTY_RULES and op.verdict != "composite"


def _batch(operators, calls=None) -> dict:
    dims: Counter = Counter()
    where: dict[int, str] = {}
    for op in operators:
        if op.phase != "forward" or op.parent is not None:
            continue
        for shape, dtype in op_tensors(op)[:1]:
            if len(shape) >= 2 and dtype.startswith(("float", "bfloat")):
                dims[shape[0]] += op.calls
                if shape[0] not in where:
                    where[shape[0]] = f"{op.name} input {list(shape)} at {op.source or '?'}"
    if not dims:
        return {"value": None, "evidence": "no forward input with a batch dimension was captured"}
    value = dims.most_common(1)[0][0]
    return {"value": value, "evidence": f"leading dimension of the forward inputs, e.g. {where[value]}"}


def _optimizer_lists(operators, lists_of) -> tuple[list, str] | None:
    """The parameters a foreach or fused optimizer step covers, as (shapes, dtype), from the optimizer-phase
    operators' first tensor lists (``lists_of(op)``): per operator name the distinct lists it took (one per
    parameter group), and of those names the one whose lists hold the most bytes (the update, and
    clip_grad_norm_'s norms, cover every parameter).  Lists of 0-dim tensors only (the step counters, the
    per-tensor norms clip_grad_norm_ stacks) are not parameters, however long."""
    per_name: dict[str, dict[str, tuple[list, str]]] = {}
    for op in operators:
        if op.phase != "optimizer":
            continue
        lists = lists_of(op)
        if not lists or not any(lists[0][0]):
            continue
        shapes, dtype = lists[0]
        per_name.setdefault(op.name, {})[str(shapes)] = (shapes, dtype)
    best: tuple[list, str, float] | None = None
    for groups in per_name.values():
        shapes = [shape for lst, _ in groups.values() for shape in lst]
        dtype = next(iter(groups.values()))[1]
        size = float(sum(numel(shape) for shape in shapes) * dtype_bytes(dtype))
        if best is None or size > best[2]:
            best = (shapes, dtype, size)
    return (best[0], best[1]) if best else None


def _gradient_bytes(operators, steady) -> dict:
    """Parameter gradient bytes: the parameters a foreach/fused optimizer's tensor lists cover
    (``_optimizer_lists``); else each optimizer-phase tensor shape counted as often as the least-called
    optimizer operator on that shape runs per step (one call per parameter)."""
    covered = _optimizer_lists(operators, tensor_lists)
    if covered:
        shapes, dtype = covered
        return {"bytes": sum(numel(s) for s in shapes) * dtype_bytes(dtype), "parameters": len(shapes),
                "evidence": "tensor lists of the foreach optimizer ops (every parameter group)"}
    per_shape: dict[tuple, float] = {}
    dtype_of: dict[tuple, str] = {}
    for op in operators:
        if op.phase != "optimizer" or nested_lists(op):
            continue
        tensors = op_tensors(op)
        if not tensors or not tensors[0][1].startswith(("float", "bfloat")):
            continue
        shape = tuple(tensors[0][0])
        n = _per_step(op, steady)
        if n:
            per_shape[shape] = min(per_shape.get(shape, n), n)
            dtype_of[shape] = tensors[0][1]
    total = sum(numel(s) * round(n) * dtype_bytes(dtype_of[s]) for s, n in per_shape.items())
    count = sum(round(n) for n in per_shape.values())
    if not total:
        return {"bytes": 0, "parameters": 0, "evidence": "no optimizer step captured: gradient size unknown"}
    return {"bytes": total, "parameters": count, "evidence": "parameter shapes updated in the optimizer phase"}


_KERNEL_FIELDS = [f.name for f in fields(Kernel) if f.name != "shapes"]


def _kernel_dict(k: Kernel) -> dict:
    return {name: getattr(k, name) for name in _KERNEL_FIELDS}


def _key(name: str, shapes, dtypes) -> tuple:
    """A signature key; ``str`` of the nested lists is the cheap exact spelling."""
    return (name, str(shapes), str(dtypes))


def _steady_counts(calls, steady: set[int]) -> dict[tuple, float]:
    """Median calls per steady step of each signature, from the captured call stream."""
    from statistics import median
    per: dict[tuple, dict] = {}
    for c in calls or []:
        if c.step in steady:
            counts = per.setdefault(_key(c.name, c.input_shapes, c.dtypes), {})
            counts[c.step] = counts.get(c.step, 0) + max(int(getattr(c, "count", 1) or 1), 1)
    return {key: median(counts.get(s, 0) for s in steady) for key, counts in per.items()}


def build_basis(operators, steps, calls=None) -> EstimateBasis:
    """The chip-independent part of the estimate (stored in scan.json ``npu_estimate.basis``)."""
    return EstimateBasis.from_dict(_basis_dict(operators, steps, calls), "$.npu_estimate.basis")


def _basis_dict(operators, steps, calls=None) -> dict:
    """The basis as the JSON object it is stored as (the record keeps its key order)."""
    cache_tensors(operators)
    try:
        return _build_basis(operators, steps, calls)
    finally:
        clear_tensors()


def _build_basis(operators, steps, calls=None) -> dict:
    model = cost_model()
    views = set(model.get("views") or [])
    mapped = set(model.get("aten") or {})
    # a backend's own kernel priced as its public op (cost_entry) is priced by its own kernels too
    mapped |= {base_name(op.name) for op in operators if cost_entry(op, model.get("aten") or {})[1]}
    steady = _steady(steps)
    parent_of = _parents(operators)
    verdict_of = _verdicts(operators)
    has_children = {op.parent for op in operators if op.parent}
    # priced by its own kernel: mapped, or registered by torch_npu (native) and launching something; what the
    # CPU recorded below such an operator is the CPU's implementation, not NPU kernels
    registered = {base_name(n) for n, v in verdict_of.items() if v == "native" and base_name(n) not in views}
    kernel_ops = frozenset(op.name for op in operators if third_party_kernel(op))
    aten = model.get("aten") or {}
    # a signature launches nothing only when none of its calls does (an operator keeps its first call's
    # arguments: a validation pass's dropout(train=False) before training must not free the training calls)
    launching = {_key(c.name, c.input_shapes, c.dtypes) for c in calls or []
                 if (aten.get(base_name(c.name)) or {}).get("free_when")
                 and not launches_nothing(c, aten.get(base_name(c.name)) or {})}
    candidates = [op for op in operators if op.verdict != "not-applicable" and op.phase != "other"
                  and not op.import_time and base_name(op.name) not in views
                  and (not launches_nothing(op, aten.get(base_name(op.name)) or {})
                       or _key(op.name, op.input_shapes, op.dtypes) in launching)
                  and not composite_wrapper(op, mapped, has_children)
                  and not _nested_in_priced(op, parent_of, mapped | registered, kernel_ops)]
    _recover_tensor_lists(candidates, operators, steady)
    wanted = {op.name for op in candidates}
    counts = _steady_counts([c for c in calls if c.name in wanted], steady) if calls else {}
    dynamic_shapes = Counter((op.name, op.source) for op in operators if op.dynamic)
    rows: list[dict] = []
    foreach_launches: set[str] = set()
    weights = {tuple(s) for s in _parameter_shapes(operators, steady) if len(s) == 2}   # 2-D parameters
    for op in candidates:
        per_step = counts.get(_key(op.name, op.input_shapes, op.dtypes), 0.0) if counts \
            else _per_step(op, steady)
        if per_step:
            rows.append(_basis_row(op, per_step, model, dynamic_shapes, foreach_launches, weights))
    _mark_repeats(rows, [c for c in calls if c.name in wanted] if calls else [], steady)
    patterns = match_fused_patterns(calls or [], model.get("fused_patterns") or [], views) if calls else []
    _mark_unfused(rows, patterns)
    return {"version": BASIS_VERSION, "rows": rows, "patterns": patterns, "batch": _batch(operators),
            "gradients": _gradient_bytes(operators, steady), "foreach_launches": sorted(foreach_launches)}


def rebuild_basis(operators, steps, old: EstimateBasis) -> EstimateBasis:
    """``build_basis`` again from stored operators (``opscope report --target``: verdicts changed).  The op
    stream is not stored, so what was read from it is carried over from ``old``: the fused-pattern matches
    (and the rows' `unfused` reasons) and each signature's share of re-runs (its kernels' ``warm``)."""
    basis = _basis_dict(operators, steps)
    basis["patterns"] = old.patterns
    _mark_unfused(basis["rows"], basis["patterns"])
    _put_warm(basis["rows"], {_key(r.get("name") or "", r.get("input_shapes"), r.get("dtypes")):
                              max((float(k.get("warm") or 0.0) for k in r.get("kernels") or []), default=0.0)
                              for r in old.rows})
    return EstimateBasis.from_dict(basis, "$.npu_estimate.basis")


def _put_warm(rows: list[dict], shares: dict[tuple, float]) -> None:
    """Each row's re-run share (by signature key) on its vector kernels (``Kernel.warm``)."""
    for row in rows:
        share = shares.get(_key(row["name"], row["input_shapes"], row["dtypes"]))
        for kernel in row["kernels"] if share else ():
            if kernel.get("unit") == "vector":
                kernel["warm"] = share


_REPEAT_PHASES = ("forward", "eval")


def _mark_repeats(rows: list[dict], calls, steady: set[int]) -> None:
    """Each signature's share of steady calls that re-ran the call before them (``OpCall.repeats``: a loop over
    one operator) goes on its vector kernels as ``warm``: priced from L2 on a chip whose L2 holds them.  Forward
    and eval calls only: back-to-back equal calls of a backward (one per gate) or an optimizer (one per
    parameter of a shape) work on other tensors each time."""
    ran: dict[tuple, list[int]] = {}
    for c in calls:
        if c.step in steady and c.repeats and c.phase in _REPEAT_PHASES:
            ran.setdefault(_key(c.name, c.input_shapes, c.dtypes), [0, 0])[0] += c.repeats
    if not ran:
        return
    for c in calls:
        key = _key(c.name, c.input_shapes, c.dtypes)
        if c.step in steady and key in ran:
            ran[key][1] += max(int(c.count or 1), 1)
    _put_warm(rows, {key: round(min(repeats / total, 1.0), 3) for key, (repeats, total) in ran.items() if total})


_LIST_KINDS = {"TensorList": "T", "Scalar": "S", "ScalarList": "S"}


def _arg_kinds(dtypes, parent: bool) -> list[str]:
    """T (a tensor, or one element of a parent's tensor list) / S (a scalar) / - per argument."""
    out = []
    for d in dtypes or []:
        if parent and d in _LIST_KINDS:
            out.append(_LIST_KINDS[d])
        elif d in ("Scalar", "ScalarList"):
            out.append("S")
        else:
            out.append("T" if d else "-")
    return out


def _recover_tensor_lists(candidates, operators, steady: set[int]) -> None:
    """Tensor lists whose shapes the capture did not keep (the profiler's flat shapes record a
    TensorList as ``[]``): from the per-tensor calls the CPU made below the op (foreach slow path),
    else the optimizer's parameter shapes (a fused optimizer runs one CPU kernel and records none)."""
    params: list | None = None
    children_of: dict[str, list] = {}
    for c in operators:
        if c.parent:
            children_of.setdefault(c.parent, []).append(c)
    for op in candidates:
        if op.phase != "optimizer" and not base_name(op.name).startswith(("_foreach_", "_fused_")):
            continue
        n_lists = sum(1 for d in op.dtypes or [] if d == "TensorList")
        if not n_lists or nested_lists(op):
            continue
        kinds = _arg_kinds(op.dtypes, parent=True)
        below = [c for c in children_of.get(op.name, []) if c.phase == op.phase]
        children = [c for c in below if op_tensors(c)
                    and _arg_kinds(c.dtypes, parent=False)[:len(kinds)] == kinds]
        if children:
            shapes: list = []
            for c in children:
                shapes += [op_tensors(c)[0][0]] * max(round(c.calls / max(op.calls, 1)), 1)
            dtype = op_tensors(children[0])[0][1]
            set_tensor_lists(op, [(shapes, dtype)] * n_lists)
            continue
        if any(c.input_shapes and not op_tensors(c) and _arg_kinds(c.dtypes, parent=False)[:len(kinds)] == kinds
               for c in below):
            set_tensor_lists(op, [([[]], "float32")] * n_lists)   # a list of 0-dim tensors (step counters)
            continue
        if params is None:
            params = _parameter_shapes(operators, steady)
        if params:
            set_tensor_lists(op, [(params, "float32")] * n_lists)


def _parameter_shapes(operators, steady: set[int]) -> list:
    """The parameter shapes the optimizer updates: recorded tensor lists, else per-parameter optimizer
    ops of a steady step, else the optimizer's state initialisation (zeros_like per state per parameter)."""
    covered = _optimizer_lists(operators, lambda op: [(lst, "float32") for lst in nested_lists(op)])
    if covered:
        return covered[0]
    per_shape: dict[tuple, float] = {}
    for op in operators:
        tensors = op_tensors(op)
        if op.phase != "optimizer" or not tensors or not tensors[0][1].startswith(("float", "bfloat")):
            continue
        n = _per_step(op, steady)
        if n:
            shape = tuple(tensors[0][0])
            per_shape[shape] = min(per_shape.get(shape, n), n)
    if not per_shape:   # state init: zeros_like(param) once per state tensor, in the first step
        from math import gcd
        inits: Counter = Counter()
        for op in operators:
            tensors = op_tensors(op)
            if op.phase == "optimizer" and base_name(op.name) == "zeros_like" and tensors:
                inits[tuple(tensors[0][0])] += op.calls
        states = 0
        for count in inits.values():
            states = gcd(states, count)
        per_shape = {shape: count / max(states, 1) for shape, count in inits.items()}
    return [list(shape) for shape, n in per_shape.items() for _ in range(max(round(n), 0))]


def _basis_row(op, per_step: float, model: dict, dynamic_shapes: Counter, foreach_launches: set,
               weights: frozenset | set = frozenset()) -> dict:
    """One operator signature: the kernels it becomes and every reason it is slow."""
    name, entry, priced, backend = cost_entry(op, model.get("aten") or {})
    reasons: list[dict] = []
    alternative = None
    if entry:
        kernels = MODELS[entry["model"]](priced, list(entry["kernels"]))
        if entry.get("passes"):
            apply_passes(priced, kernels, entry["passes"])
        without = entry.get("without")
        if without:   # the chips that lack this kernel run another decomposition
            alternative = {"families": list(without["families"]), "why": without.get("why", ""), "kernels": [
                _kernel_dict(k) for k in MODELS[without["model"]](priced, list(without["kernels"]))]}
        if backend:   # a backend's own kernel: the NPU runs the public op it implements
            recorded = backend["kernel"] if backend["kernel"] == op.name else f"{op.name} ran {backend['kernel']}"
            public = base_name(backend["op"])
            half = "the backward of " if backend["part"] == "backward" and not public.endswith("_backward") else ""
            entry_note = f" (the cost model's {name} entry)" if name != public else ""
            reasons.append({"kind": "backend-kernel", "fix": "",
                            "text": f"{recorded} ({backend['backend']}): priced as {half}{public}, which the NPU "
                                    f"runs instead{entry_note}"})
    elif third_party_kernel(op):
        kernels, reason = _third_party_kernels(op)
        reasons.append(reason)
    else:
        kernels = model_elementwise(op, [f"{name} (generic)"])
        reasons.append({"kind": "unmapped", "text": "no kernel mapping: priced as one generic vector kernel",
                        "fix": ""})
    launches = _foreach(op, name, kernels, model, foreach_launches)
    if not op_tensors(priced) and not tensor_lists(op) and entry:     # Python-scalar arithmetic: one tiny launch
        for k in kernels:
            k.bytes = 0.0
    reasons += _unit_reasons(priced, name, kernels, model)
    inserted = []
    rule_name = (entry or {}).get("transdata")
    if rule_name:
        rule = (model.get("transdata") or {}).get(rule_name) or {}
        inserted = transdata(priced, rule, kernels)
    inserted_910a = nz_transdata(priced, (model.get("transdata") or {}).get("matmul_nz"), weights)
    reasons += _run_reasons(op, dynamic_shapes)
    fallback = op.verdict == "cpu-fallback"
    row = {"name": op.name, "overload": op.overload, "input_shapes": op.input_shapes,
            "dtypes": op.dtypes, "phase": op.phase, "source": op.source, "calls_per_step": per_step,
            "launches_per_step": per_step * launches,
            "cpu_time_us": _cpu_time_per_step(op, per_step) if fallback and third_party_kernel(op)
            else op.steady_time_us if op.steady_time_us is not None else op.self_time_us,
            "fallback": fallback,
            "kernels": [_kernel_dict(k) for k in kernels],
            "transdata": [_kernel_dict(k) for k in inserted],
            "transdata_rule": rule_name,
            "transdata_910a": [_kernel_dict(k) for k in inserted_910a],
            "reasons": reasons}
    if alternative:
        row["alternative"] = alternative
    if op.library:   # the library call a user can act on (torchvision/ops/roi_align.py:NNN)
        row["library"] = op.library
    if fallback:   # what crosses to the host and back each call
        row["fallback_bytes"] = _tensor_bytes(op.input_shapes, op.dtypes) + _tensor_bytes(op.output_shapes, op.dtypes)
    return row


def _third_party_kernels(op) -> tuple[list[Kernel], dict]:
    """A library op on the NPU: the adapter's kernel (``kernel`` in third_party.yaml), priced as one vector kernel
    over its tensors; with no kernel named, the torch_npu API it runs as, priced the same way."""
    evidence = op.evidence or {}
    kernel = evidence.get("kernel") or evidence.get("via") or f"{base_name(op.name)} (library kernel)"
    kernels = model_elementwise(op, [str(kernel).split(" ")[0] if evidence.get("kernel") else f"{base_name(op.name)} "
                                     "(library kernel)"])
    if op.verdict == "adapter":
        text = (f"runs as {kernel} once {evidence.get('install') or evidence.get('adapter') or 'its adapter'} is "
                "installed (priced as one vector kernel over its tensors)")
    elif op.verdict == "cpu-fallback":
        text = "a library op with no NPU kernel: torch_npu runs it on the host (priced below as host time)"
    else:
        text = f"cannot run on the NPU ({op.verdict}): priced as one vector kernel until it is replaced"
    return kernels, {"kind": "third-party", "text": text, "fix": evidence.get("install", "")
                     and f"install {evidence['install']}"}


def _cpu_time_per_step(op, per_step: float) -> float:
    """A library op's whole CPU time (its kernel's ATen calls were recorded below it): per step, steady."""
    total = float(op.total_time_us or 0.0)
    steps = max(len(set(op.steps or [])), 1)
    return total / steps if per_step else 0.0


def _tensor_bytes(shapes, dtypes) -> float:
    total = 0.0
    for i, shape in enumerate(shapes or []):
        dtype = dtypes[i] if dtypes and i < len(dtypes) else "float"
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            total += numel(shape) * dtype_bytes(str(dtype))
    return total


def _foreach(op, name: str, kernels: list[Kernel], model: dict, foreach_launches: set) -> float:
    """Launches per call: 0 for an optimizer op the NPU runs as one foreach kernel per step."""
    foreach_kernels = (model.get("optimizers") or {}).get("foreach_kernels") or {}
    tensors = op_tensors(op)
    if op.phase == "optimizer" and name in foreach_kernels and tensors and len(tensors[0][0]) >= 1:
        for k in kernels:
            k.type = foreach_kernels[name]
            k.note = "foreach on the NPU"
        foreach_launches.add(foreach_kernels[name])
        return 0.0
    return 1.0


def _unit_reasons(op, name: str, kernels: list[Kernel], model: dict) -> list[dict]:
    """AI CPU fall-back and unaligned cube shapes: they also change the kernels' unit and FLOPs."""
    reasons = []
    why = aicpu_reason(op, model.get("aicpu_rules") or {}, kernels)
    if why:
        for k in kernels:
            k.unit = "aicpu"
        rules = model.get("aicpu_rules") or {}
        fix = ((rules.get("ops") or {}).get(name) or {}).get("fix") or rules.get("fix_dtype", "")
        reasons.append({"kind": "aicpu", "text": why, "fix": fix})
    unaligned = alignment_reason(op, model.get("alignment") or {})
    if unaligned:
        rule = (model.get("alignment") or {}).get("attention" if "attention" in unaligned else "matmul") or {}
        for k in kernels:
            if k.unit in ("cube", "fa"):
                k.flops *= float(rule.get("slowdown", 1.0))
        reasons.append({"kind": "alignment", "text": unaligned, "fix": rule.get("fix", "")})
    return reasons


def _run_reasons(op, dynamic_shapes: Counter) -> list[dict]:
    """What the scan saw the operator do: fall back to the CPU, change shape."""
    reasons = []
    if op.verdict == "cpu-fallback":
        reasons.append({"kind": "cpu-fallback", "text": "runs on the host CPU on the NPU (cpu-fallback): its CPU "
                        "time plus two host<->device copies", "fix": (op.substitute or {}).get("replacement", "")
                        if isinstance(op.substitute, dict) else ""})
    if op.dynamic:
        shapes = dynamic_shapes.get((op.name, op.source), 1)
        reasons.append({"kind": "dynamic", "text": f"dynamic shape: compiled again for each new shape "
                        f"({shapes} shape(s) of {op.name} at {op.source or '?'} seen in the scan)",
                        "fix": "make the shape fixed (pad, drop_last=True); see the dynamic-shape fixes"})
    return reasons


def _mark_unfused(rows: list[dict], patterns: list[dict]) -> None:
    """A forward row whose line holds a fusable sequence of its operator gets the `unfused` reason: the user's
    line and, where a library made the call (a framework's model run from one line), the library's line."""
    by_source: dict[str, list] = {}
    for p in patterns:
        for src in p["sources"]:
            by_source.setdefault(src, []).append(p)
    for row in rows:
        for p in by_source.get(row["source"], []):
            if "sites" in p and [row["source"], row.get("library")] not in p["sites"]:
                continue
            if row["phase"] == "forward" and base_name(row["name"]) in {o.rstrip("_") for o in p["ops"]} | set(p["ops"]):
                row["reasons"].append({"kind": "unfused", "text": f"unfused {'-'.join(p['ops'])} at {p['source']}",
                                       "fix": p["fix"]})


# --- prices on a chip ---

def _converts(row: dict, family: str, model: dict) -> bool:
    """Whether the chip family converts this operator's tensors around it each call (its TransData rule's
    ``families``); a basis stored before the rule was named converts on every chip, as it was priced then."""
    rule = ((model.get("transdata") or {}).get(row.get("transdata_rule") or "") or {})
    families = rule.get("families")
    return not families or not family or family in families


def _kernels(items) -> list[Kernel]:
    return [Kernel(**k) for k in items]


def _fallback_transfer_us(row: dict, model: dict) -> float:
    """Per call: the operator's tensors over PCIe (both ways) and one synchronising copy's latency."""
    host = model.get("host") or {}
    gbps = float(host.get("fallback_copy_gbps") or 0.0)
    moved = float(row.get("fallback_bytes") or 0.0)
    return (moved / (gbps * 1e3) if gbps else 0.0) + float(host.get("fallback_sync_us") or 0.0)


def _row_kernels(row: dict, family: str, model: dict) -> tuple[list[Kernel], list[Kernel], dict, bool]:
    """The kernels a row runs on the chip family, the TransData it inserts, its alternative and whether that runs."""
    kernels = _kernels(row.get("kernels") or [])
    inserted = _kernels(row.get("transdata") or []) if _converts(row, family, model) else []
    if family == "910A":
        inserted += _kernels(row.get("transdata_910a") or [])
    alternative = row.get("alternative") or {}
    lacks_kernel = bool(family) and family in (alternative.get("families") or [])
    if lacks_kernel:   # this chip lacks the kernel: the alternative decomposition runs
        everything = _kernels(alternative.get("kernels") or [])
        kernels = [k for k in everything if not k.inserted]
        inserted = [k for k in everything if k.inserted]
    return kernels, inserted, alternative, lacks_kernel


def _unit_times(kernels: list[Kernel], n: float, figures: dict, factors: dict | None,
                by_type: dict[str, float]) -> tuple[defaultdict[str, float], Kernel | None]:
    """Time per unit of ``n`` calls' kernels (each kernel type's time added to ``by_type``) and the costliest kernel."""
    units: defaultdict[str, float] = defaultdict(float)
    costliest: tuple[float, Kernel | None] = (-1.0, None)
    for k in kernels:
        t = kernel_time_us(k, figures, factors) * n
        units[k.unit] += t
        by_type[k.type + (" (AI CPU)" if k.unit == "aicpu" else "")] += t
        if t > costliest[0]:
            costliest = (t, k)
    return units, costliest[1]


def _row_reasons(row: dict, kernels: list[Kernel], inserted: list[Kernel], transdata: float, alternative: dict,
                 lacks_kernel: bool, model: dict) -> list[dict]:
    """The row's reasons on this chip: the basis's own, less or plus the missing fused kernel, plus TransData."""
    reasons = list(row.get("reasons") or [])
    if lacks_kernel:   # the fused kernel's own rules do not apply
        reasons = [r for r in reasons if not (r["kind"] == "alignment" and "attention" in r["text"])]
        reasons.append({"kind": "no-fused-kernel", "text": f"{alternative.get('why') or 'no fused kernel here'} "
                        f"({', '.join(dict.fromkeys(k.type for k in kernels))})", "fix": ""})
    if inserted and transdata > 0:
        reasons.append({"kind": "transdata", "text": f"{len(inserted)} TransData per call "
                        f"({', '.join(k.note for k in inserted[:3])}{'...' if len(inserted) > 3 else ''})",
                        "fix": (model.get("transdata") or {}).get("fix", "")})
    return reasons


def _price_row(row: dict, family: str, figures: dict, factors: dict | None, model: dict, launch_us: float,
               totals: dict[str, float], by_type: dict[str, float]) -> dict:
    """One basis row priced on the chip (its times added to ``totals`` and ``by_type``) as an "operator" row."""
    n = float(row.get("calls_per_step") or 0)
    kernels, inserted, alternative, lacks_kernel = _row_kernels(row, family, model)
    units, costliest = _unit_times(kernels, n, figures, factors, by_type)
    transdata = sum(kernel_time_us(k, figures, factors) for k in inserted) * n
    by_type["TransData"] += transdata
    host = float(row.get("launches_per_step") or 0) * launch_us
    # what the operator weighs in the readiness score: deterministic (from shapes), so never this machine's
    # CPU time; a CPU fallback weighs its kernel as the NPU would run it plus the copies and the sync
    weight = sum(units.values()) + transdata
    if row.get("fallback"):   # host time, the copies each way and the sync that waits for them
        transfer = _fallback_transfer_us(row, model) * n
        host += float(row.get("cpu_time_us") or 0) + transfer
        weight += transfer
        units = defaultdict(float)
    device = sum(units.values()) + transdata
    for unit, t in units.items():
        totals[unit] += t
    totals["transdata"] += transdata
    totals["transdata_kernels"] += len(inserted) * n
    totals["host"] += host
    totals["kernels"] += len(kernels) * n
    reasons = _row_reasons(row, kernels, inserted, transdata, alternative, lacks_kernel, model)
    return {"kind": "operator", "operator": row["name"] + (f".{row['overload']}" if row.get("overload") else ""),
            "input_shapes": row.get("input_shapes"), "dtypes": row.get("dtypes"), "phase": row.get("phase"),
            "source": row.get("source"), "library": row.get("library"), "calls_per_step": round(n, 2),
            "kernels": ", ".join(dict.fromkeys(k.type for k in kernels)),
            "npu_time_us": round(device, 2), "cube_us": round(units["cube"] + units["fa"], 2),
            "vector_us": round(units["vector"] + units["dma"], 2), "aicpu_us": round(units["aicpu"], 2),
            "transdata_us": round(transdata, 2), "host_us": round(host, 2),
            "reason": "; ".join(r["text"] for r in reasons),
            "fix": next((r["fix"] for r in reasons if r.get("fix")), ""),
            "reason_kinds": [r["kind"] for r in reasons], "weight_us": round(weight, 2),
            "priced_by": _priced_by(costliest, figures, row, model)}


def _calibration(model: dict, factors: dict | None, calibrated_with: str | None) -> dict:
    """The cost model's calibration notes, plus the local scaling when the user's own profiles give ``factors``."""
    calibration = dict(model.get("calibration") or {})
    if factors:
        calibration["local"] = (f"scaled by your own profiles ({calibrated_with or 'opscope calibrate'}): "
                                + ", ".join(f"{unit} x{f:.2f}" for unit, f in sorted(factors.items())))
    return calibration


def price(basis: EstimateBasis, chip: str | None = None, factors: dict | None = None,
          world_sizes: list[int] | None = None, calibrated_with: str | None = None) -> NpuEstimate:
    """Per-signature and per-step NPU estimate of a basis on one chip (scan.json ``npu_estimate``)."""
    model = cost_model()
    name, figures = resolve_chip(chip)
    family = figures.get("family", "")
    launch_us = float((model.get("host") or {}).get("launch_us_per_op", 30.0))
    totals: dict[str, float] = defaultdict(float)
    by_type: dict[str, float] = defaultdict(float)
    rows: list[dict] = [_price_row(row, family, figures, factors, model, launch_us, totals, by_type)
                        for row in basis.rows]
    foreach = basis.foreach_launches
    totals["host"] += len(foreach) * launch_us
    fused_lines = {src for p in basis.patterns for src in p["sources"]}
    rows.extend(_pattern_rows(basis.patterns, rows) + _alignment_rows(rows, fused_lines)
                + _optimizer_rows(rows, foreach))
    rows.sort(key=lambda r: (-r["npu_time_us"], r["operator"]))
    step = _step(basis, totals, figures, rows, world_sizes)
    step["kernel_types_us"] = {k: round(v, 1) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]) if v > 0}
    # built as the JSON object scan.json stores, then read as the record: the key order stays the file's
    est = NpuEstimate.from_dict(
        {"chip": name, "family": family, "rows": rows, "step": step, "patterns": basis.patterns,
         "batch": basis.batch.to_dict(), "gradients": basis.gradients.to_dict(),
         "calibration": _calibration(model, factors, calibrated_with), "factors": factors or None,
         "basis": None, "label": f"estimate for {name} from the CPU scan (calibration error: see calibration)"},
        "$.npu_estimate")
    est.basis = basis   # the record itself, not a copy
    return est


def _priced_by(kernel: Kernel | None, figures: dict, row: dict, model: dict) -> str:
    """The kernel that costs the row most and the rule that priced it; a CPU fallback's host price on top."""
    text = pricing_rule(kernel, figures) if kernel is not None else "no kernel"
    if row.get("fallback"):
        host = model.get("host") or {}
        text = (f"CPU fallback: this machine's CPU time + {float(row.get('fallback_bytes') or 0) / 1e6:,.2f} MB over "
                f"PCIe at {host.get('fallback_copy_gbps')} GB/s + {host.get('fallback_sync_us')} us sync; "
                f"as an NPU kernel: {text}")
    return text


def _pattern_rows(patterns: list[dict], rows: list[dict]) -> list[dict]:
    """One ranked row per fusable sequence: the estimated time of its operators (forward and the
    backward that autograd runs for the same lines), which the fused API replaces."""
    out = []
    for p in patterns:
        members = [r for r in rows if r["source"] in p["sources"] and "pattern" not in r["reason_kinds"]]
        if not members:
            continue
        api = p["api"].rsplit(".", 1)[-1]
        out.append({"kind": "pattern", "operator": f"unfused {'-'.join(p['ops'])} ({api})", "input_shapes": None, "dtypes": None,
                    "phase": "forward+backward", "source": p["source"], "calls_per_step": p.get("count", 1),
                    "kernels": f"{sum(len(r['kernels'].split(', ')) for r in members)} kernels of "
                               f"{len(members)} operator signatures",
                    "npu_time_us": round(sum(r["npu_time_us"] for r in members), 2),
                    "cube_us": round(sum(r["cube_us"] for r in members), 2),
                    "vector_us": round(sum(r["vector_us"] for r in members), 2),
                    "aicpu_us": round(sum(r["aicpu_us"] for r in members), 2),
                    "transdata_us": round(sum(r["transdata_us"] for r in members), 2),
                    "host_us": round(sum(r["host_us"] for r in members), 2),
                    "reason": f"unfused pattern {'-'.join(p['ops'])} at {', '.join(p['sources'])}: "
                              f"{p['api']} does it in one kernel"
                              + (f" (CANN {p['min_cann']} or newer)" if p.get("min_cann") else ""),
                    "fix": p.get("fix", ""), "reason_kinds": ["pattern"]})
    return out


def _optimizer_rows(rows: list[dict], foreach: list) -> list[dict]:
    """The optimizer's per-parameter element-wise ops as one row, with torch_npu's fused optimizer as the fix."""
    members = [r for r in rows if r["phase"] == "optimizer" and r["kernels"].startswith("Foreach")]
    if len(members) < 2:
        return []
    fused = (cost_model().get("optimizers") or {}).get("fused") or {}
    names = {r["operator"].split("::")[-1].split(".")[0] for r in members}
    guess = "AdamW" if names & {"addcdiv_", "lerp_"} else "SGD" if names & {"mul_", "add_"} else None
    api = fused.get(guess or "", "torch_npu.optim.NpuFused<your optimizer>")
    return [{"kind": "pattern", "operator": f"optimizer step ({len(members)} per-parameter op signatures)",
             "input_shapes": None, "dtypes": None, "phase": "optimizer", "source": members[0]["source"],
             "calls_per_step": round(sum(r["calls_per_step"] for r in members), 2),
             "kernels": ", ".join(foreach) or "Foreach*",
             **{k: round(sum(r[k] for r in members), 2) for k in (
                 "npu_time_us", "cube_us", "vector_us", "aicpu_us", "transdata_us", "host_us")},
             "reason": f"the optimizer updates each parameter with separate element-wise ops; torch runs them as "
                       f"{len(foreach)} foreach kernel(s) per step on the NPU, a fused optimizer in fewer passes",
             "fix": f"use {api}" + (f" (looks like {guess} from its ops)" if guess else ""),
             "reason_kinds": ["pattern"]}]


_UNALIGNED = re.compile(r"unaligned (matmul|attention): (.*?) not a multiple of (\d+)")


def _alignment_rows(rows: list[dict], fused_lines: set) -> list[dict]:
    """One ranked row per source line and kind (matmul / attention) with two or more unaligned cube
    signatures (forward and backward); lines inside a fusable pattern are left to that pattern's row (the
    fused kernel replaces them).  Its time is what the alignment penalty adds to their cube time (what
    aligning would save), not their whole time."""
    alignment = cost_model().get("alignment") or {}
    groups: dict[tuple, list] = {}
    for r in rows:
        if "alignment" not in r["reason_kinds"] or not r["source"] or r["source"] in fused_lines:
            continue
        found = _UNALIGNED.search(r["reason"])
        if found:
            groups.setdefault((r["source"], found.group(1)), []).append((r, found))
    out = []
    for (source, kind), members in groups.items():
        if len(members) < 2:
            continue
        rule = alignment.get(kind) or {}
        slowdown = float(rule.get("slowdown", 1.0))
        axes = sorted({axis for _, found in members for axis in found.group(2).split(", ") if "=" in axis})
        whole = sum(r["npu_time_us"] for r, _ in members)
        penalty = sum(r["cube_us"] for r, _ in members) * (1.0 - 1.0 / slowdown) if slowdown > 1 else 0.0
        label = "matmuls" if kind == "matmul" else "attention calls"
        out.append({"kind": "pattern", "operator": f"unaligned {label} ({', '.join(axes)})", "input_shapes": None,
                    "dtypes": None, "phase": "forward+backward", "source": source,
                    "calls_per_step": sum(r["calls_per_step"] for r, _ in members),
                    "kernels": f"{len(members)} {kind} signatures", "npu_time_us": round(penalty, 2),
                    "cube_us": round(penalty, 2), "vector_us": 0.0, "aicpu_us": 0.0, "transdata_us": 0.0,
                    "host_us": 0.0,
                    "reason": f"unaligned {kind} shapes at {source} ({', '.join(axes)}; the cube wants multiples of "
                              f"{rule.get('multiple')}): the alignment penalty (x{slowdown:g} on their cube time) "
                              f"adds {penalty:,.0f} us of their {whole:,.0f} us",
                    "fix": rule.get("fix", ""), "reason_kinds": ["pattern"]})
    return out


def _step(basis: EstimateBasis, totals: dict[str, float], figures: dict, rows: list, world_sizes: list[int] | None = None) -> dict:
    model = cost_model()
    comm_cfg = model.get("communication") or {}
    cube = totals["cube"] + totals["fa"]
    vector = totals["vector"] + totals["dma"]
    aicpu = totals["aicpu"]
    transdata = totals["transdata"]
    device = cube + vector + aicpu + transdata
    backward = sum(r["npu_time_us"] for r in rows if r["phase"] == "backward")
    grad = float(basis.gradients.bytes or 0)
    batch = basis.batch.value
    per_world = []
    params = float(basis.gradients.parameters or 0)
    launch_us = float((model.get("host") or {}).get("launch_us_per_op", 30.0))
    ddp_kernels = [Kernel(k, "vector", 0.0, 2.0 * grad * float(passes)) for k, passes in
                   (comm_cfg.get("ddp_gradient_passes") or {}).items()]
    ddp_vector = sum(kernel_time_us(k, figures) for k in ddp_kernels) if grad else 0.0
    for world in world_sizes or comm_cfg.get("world_sizes") or [1, 8, 16]:
        comm, link, host = allreduce_us(grad, world, figures), "-", totals["host"]
        ddp = ddp_vector if world > 1 else 0.0
        if world > 1:
            link = "hccs" if world <= int(figures.get("npus_per_server", 8)) else "roce"
            host += params * float(comm_cfg.get("ddp_launches_per_parameter", 2)) * launch_us
        exposed = max(0.0, comm - float(comm_cfg.get("overlap", 0.8)) * backward)
        device_side = device + ddp + exposed
        step_us = max(host, device_side)
        parts = {"host": host, "compute": cube, "memory": vector + transdata + ddp, "aicpu": aicpu,
                 "communication": exposed}
        if host >= device_side:
            bound = "host"
        else:
            bound = max(("compute", "memory", "aicpu", "communication"), key=lambda k: parts[k])
        per_world.append({"devices": world, "communication_us": round(comm, 1), "exposed_communication_us":
                          round(exposed, 1), "link": link, "host_us": round(host, 1), "ddp_vector_us": round(ddp, 1),
                          "device_us": round(device + ddp, 1), "step_us": round(step_us, 1),
                          "bound": bound,
                          "fps": round(batch * world / (step_us / 1e6), 1) if batch and step_us else None})
    return {"device_us": round(device, 1), "compute_us": round(cube, 1), "vector_us": round(vector, 1),
            "transdata_us": round(transdata, 1), "transdata_kernels": round(totals["transdata_kernels"], 1),
            "aicpu_us": round(aicpu, 1), "host_us": round(totals["host"], 1), "kernels": round(totals["kernels"], 1),
            "gradient_bytes": grad, "batch": batch, "per_world_size": per_world}


def allreduce_us(grad_bytes: float, world: int, figures: dict) -> float:
    """DDP's gradient all-reduce on ``world`` NPUs: ring 2(p-1)/p x bytes over the link (inside a
    server the measured all-reduce bandwidth where the chip has one), plus a latency per bucket."""
    if world <= 1 or not grad_bytes:
        return 0.0
    cfg = cost_model().get("communication") or {}
    buckets = max(1.0, -(-grad_bytes // (float(cfg.get("bucket_mb", 25)) * 1e6)))
    latency = buckets * float(cfg.get("latency_us_per_bucket", 60))
    measured = {int(k): float(v) for k, v in (figures.get("allreduce_gbps") or {}).items()}
    if world <= int(figures.get("npus_per_server", 8)) and measured:
        near = max((k for k in measured if k <= world), default=min(measured))
        return grad_bytes / (measured[near] * 1e9) * 1e6 + latency
    link = "hccs" if world <= int(figures.get("npus_per_server", 8)) else "roce"
    gbps = float((figures.get("link_gbps") or {}).get(link, 25))
    return 2 * (world - 1) / world * grad_bytes / (gbps * 1e9) * 1e6 + latency


def estimate(operators, steps, calls=None, chip: str | None = None, factors: dict | None = None,
             calibrated_with: str | None = None) -> NpuEstimate:
    """``price(build_basis(...))``: the whole NPU estimate of a scan."""
    return price(build_basis(operators, steps, calls), chip, factors, calibrated_with=calibrated_with)


def bound_sentence(est: NpuEstimate, devices: int = 1) -> str:
    """One sentence: what bounds the step on this chip, and the step time/FPS behind it."""
    step = est.step
    world = step.world(devices)
    if not world:
        return "no estimate"
    ms = lambda us: f"{us / 1000:.2f} ms"   # noqa: E731
    what = {"host": f"host-bound: launching the step's operators takes {ms(step.host_us)} on the host, more than "
                    f"the {ms(step.device_us)} of NPU work",
            "compute": f"compute-bound: cube kernels take {ms(step.compute_us)} of {ms(step.device_us)} NPU time",
            "memory": f"memory-bound: vector kernels and TransData take {ms(step.vector_us + step.transdata_us)}"
                      f" of {ms(step.device_us)} NPU time",
            "aicpu": f"AI CPU-bound: {ms(step.aicpu_us)} on AI CPU",
            "communication": f"communication-bound: {ms(world.exposed_communication_us)} of gradient all-reduce "
                             "not hidden behind backward"}[world.bound or ""]
    fps = f", {world.fps:,.0f} samples/s" if world.fps else ""
    return f"On {est.chip} x{devices}, estimated {what}; step {ms(world.step_us)}{fps} (estimate)"
