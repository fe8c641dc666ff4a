"""Prove a suggested substitute equivalent to the op it replaces, on the captured shapes and dtypes.

``support_matrix/substitutes.yaml`` options may carry a ``check``: the substitute as a Python
expression over the replaced op's schema argument names (``self``, ``target``, ``delta``...)
with ``torch`` and ``F`` (torch.nn.functional) in scope, and ``grad``: the tensor arguments
whose gradients must agree too.  For every captured signature of an op whose suggested
substitute has a check:

* reference: the original op on the CPU in the captured dtypes;
* oracle:    the original op on the CPU in float64;
* candidate: the substitute on the device under test (the CPU with ``--device cpu``) in the
  captured dtypes;

forward outputs, then the gradients of ``grad`` for one fixed random output gradient, judged
with the same msprobe standards as the operator pass.  These are two different computations,
so on the CPU too a pass means something: the substitute is as accurate as the original.
"""
from __future__ import annotations

import time

from opscope.replay.inputs import NotReplayable, build_call, load_standards, short_name


def _substitute_options(data: dict | None = None) -> dict:
    if data is None:
        from opscope.knowledge import load_optional
        data = load_optional("substitutes.yaml")
    return (data or {}).get("substitutes") or {}


def _check_for(op, options: dict) -> tuple[dict, dict | None] | None:
    """(option, check) of the substitute suggested for this op (check None when it has none)."""
    suggested = (getattr(op, "substitute", None) or {}).get("replacement")
    for option in options.get(op.name, []):
        if suggested is not None and option["replacement"] != suggested:
            continue
        if option.get("check") or suggested is not None:
            return option, option.get("check")
    return None


def _unchecked(op, option: dict) -> dict:
    """A suggested substitute that cannot be replayed here, and why (never silently left out)."""
    requires = option.get("requires") or {}
    if option.get("covered_by"):
        why = f"covered by the check of {option['covered_by']} (its backward is compared there)"
    elif requires.get("custom") or requires.get("contrib"):
        why = ("needs torch_npu (" + ", ".join(requires.get("custom", []) + requires.get("contrib", []))
               + "): it can only be proven on an NPU")
    else:
        why = "substitutes.yaml has no executable check for it"
    return {"op": op.name, "overload": op.overload, "input_shapes": op.input_shapes, "dtypes": op.dtypes,
            "replacement": option["replacement"], "check": None, "outcome": "skipped", "message": f"not checked: {why}"}


def _named(call) -> dict:
    names = [a.name for a in call.schema.arguments]
    values = dict(zip(names, call.args, strict=False))
    values.update(call.kwargs)
    return values


def _run(fn, named: dict, grad_names: list, grad_seed: int, dtype_of=None):
    """Forward outputs and gradients of ``fn(**named)`` w.r.t. ``grad_names`` (CPU results)."""
    import torch

    from opscope.replay.outputs import flatten_outputs
    leaves = {}
    for name in grad_names:
        value = named.get(name)
        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            leaves[name] = value.detach().clone().requires_grad_(True)
    inputs = {**named, **leaves}
    out = fn(inputs)
    outs = [o for o in flatten_outputs(out)]
    grads = []
    if leaves:
        first = outs[0]
        gen = torch.Generator().manual_seed(grad_seed)
        g = torch.randn(first.shape, generator=gen, dtype=torch.float64).to(first.dtype).to(first.device)
        grads = list(torch.autograd.grad(first, list(leaves.values()), g, allow_unused=True))
    detach = [o.detach().cpu() if o is not None else None for o in outs]
    return detach, [g.detach().cpu() if g is not None else None for g in grads]


def _move(named: dict, device, to_double: bool = False) -> dict:
    import torch
    out = {}
    for k, v in named.items():
        if isinstance(v, torch.Tensor):
            v = v.to(torch.float64) if to_double and v.dtype.is_floating_point else v.clone()
            v = v.to(device)
        out[k] = v
    return out


def verify_substitute(op, option: dict, check: dict, device, source=None, standards: dict | None = None) -> dict:
    """Replay one signature's substitute against the original; returns the result row."""
    import torch
    import torch.nn.functional as F

    from opscope.analysis.verify import judge_outputs
    standards = standards or load_standards()
    started = time.perf_counter()
    row = {"op": op.name, "overload": op.overload, "input_shapes": op.input_shapes, "dtypes": op.dtypes,
           "replacement": option["replacement"], "check": check["substitute"], "outcome": "skipped",
           "device": str(device.type)}
    try:
        call = build_call(op, source=source, standards=standards)
        named = _named(call)
        grad_names = list(check.get("grad") or [])
        original = call.packet()
        arg_names = [a.name for a in call.schema.arguments]

        def run_original(values):
            args = [values[n] for n in arg_names if n in values and n not in call.kwargs]
            return original(*args, **{k: values[k] for k in call.kwargs})

        def run_substitute(values):
            return eval(check["substitute"], {"torch": torch, "F": F, "__builtins__": {}}, dict(values))  # noqa: S307

        ref_out, ref_grad = _run(run_original, _move(named, torch.device("cpu")), grad_names, 0)
        orc_out, orc_grad = _run(run_original, _move(named, torch.device("cpu"), to_double=True), grad_names, 0)
        try:
            dev_out, dev_grad = _run(run_substitute, _move(named, device), grad_names, 0)
        except Exception as exc:
            row["outcome"] = "error"
            row["message"] = f"the substitute raised: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return row
        _, base = short_name(op.name)
        forward = judge_outputs(base, dev_out, ref_out, orc_out, standards)
        backward = judge_outputs(base, dev_grad, ref_grad, orc_grad, standards) if ref_grad else None
        row["forward"] = forward
        if backward is not None:
            row["backward"] = backward
        parts = [("forward", forward)] + ([("backward", backward)] if backward else [])
        rank = {"pass": 0, "warn": 1, "fail": 2}
        row["outcome"] = max((j["outcome"] for _, j in parts), key=lambda o: rank.get(o, 3))
        from opscope.analysis.verify import msprobe_outcome
        row["msprobe"] = msprobe_outcome(row["outcome"], standards)
        errs = ", ".join(f"{name} max rel err {j['metrics'].get('max_rel_err', 0):.3g}" for name, j in parts
                         if j["metrics"].get("max_rel_err") is not None)
        if row["outcome"] == "pass":
            row["message"] = (f"verified equivalent on your shapes ({', '.join(n for n, _ in parts)}, "
                              f"msprobe benchmark standard vs the original in float64): {errs}")
        else:
            bad = "; ".join(f"{name}: {j['message']}" for name, j in parts if j["outcome"] != "pass")
            row["message"] = f"NOT equivalent on your shapes: {bad} ({errs})"
    except NotReplayable as why:
        row["message"] = f"not checked: {why}"
    except Exception as exc:  # a bug in a check must not stop the others
        row["message"] = f"not checked: opscope could not run the check ({type(exc).__name__}: {exc})"[:300]
    finally:
        row["seconds"] = round(time.perf_counter() - started, 4)
    return row


def verify_substitutes(operators, device, source=None, standards: dict | None = None, substitutes: dict | None = None,
                       only=None) -> list[dict]:
    """Check the suggested substitute of every captured signature that has one with a ``check``."""
    options = _substitute_options(substitutes)
    rows, seen = [], set()
    for op in operators:
        if only and not any(s in op.name for s in only):
            continue
        found = _check_for(op, options)
        if found is None or getattr(op, "on_device", True) is False:
            continue
        key = (op.name, op.overload, repr(op.input_shapes), repr(op.dtypes), repr(getattr(op, "scalars", None)))
        if key in seen:
            continue
        seen.add(key)
        option, check = found
        rows.append(verify_substitute(op, option, check, device, source=source, standards=standards) if check
                    else _unchecked(op, option))
    return rows
