"""Chip- and dtype-aware findings: what the chosen Ascend chip does with each operator's dtypes.

A bf16 model on a 910A (no bf16 path), fp32 matmuls there (computed in fp16 by default), fp32
convolutions on a 910B (HF32 by default), float64 / unsigned / complex tensors (no cube path,
AI CPU or no kernel) and int64 index writes (AI CPU).  Every fact, its sources and the fix are
data: ``support_matrix/npu_chips.yaml`` ``families`` and ``dtypes``, and the AI CPU tables of
``npu_cost_model.yaml`` ``aicpu_rules`` (read through ``npu_kernels.aicpu_reason``).

Pure: operators and a chip name in, ``Finding``s out, one per rule and source line.
"""
from __future__ import annotations

from opscope.analysis.npu.cost import chips, cost_model, resolve_chip
from opscope.analysis.npu.kernels import aicpu_reason, base_name, cost_entry, op_tensors
from opscope.model import Finding

CUBE_MODELS = {"matmul", "conv", "conv_backward", "attention"}
CONV_MODELS = {"conv", "conv_backward"}
_SHOWN_OPS = 4


def _dtypes(op) -> list[str]:
    """The torch dtype of each tensor input with at least one dimension (0-dim wrapped numbers skipped)."""
    aliases = (chips().get("dtypes") or {}).get("aliases") or {}
    return [aliases.get(d, d) for _, d in op_tensors(op)]


def _op_family(op) -> str:
    """cube / conv / other, from the cost model's ATen table (a backend's own kernel: its public op's entry)."""
    model = (cost_entry(op, cost_model().get("aten") or {})[1] or {}).get("model", "")
    return "conv" if model in CONV_MODELS else "cube" if model in CUBE_MODELS else "other"


def _wrapper(op) -> bool:
    """A cube operator that calls another (``linear`` -> ``addmm``, autocast's outer ``linear``):
    its children carry the dtype the kernel computes in, so they are judged instead."""
    table = cost_model().get("aten") or {}
    return any((table.get(base_name(child)) or {}).get("model") in CUBE_MODELS for child in op.children or [])


def _matches(op, dtypes: list[str], when: dict) -> str | None:
    """The dtype of ``op`` that the rule's ``when`` names, or None."""
    ops = when.get("ops", "any")
    family = _op_family(op)
    if ops == "cube" and family == "other" or ops == "conv" and family != "conv":
        return None
    if ops != "any" and _wrapper(op):
        return None
    if when.get("compute"):
        compute = next((d for d in dtypes if d.startswith(("float", "bfloat"))), None)
        return compute if compute in when["compute"] else None
    return next((d for d in dtypes if d in (when.get("dtype") or [])), None)


def _judged(op) -> bool:
    """Operators the NPU will run: not import-time probes, not host-only set-up, not judged n/a."""
    return not getattr(op, "import_time", False) and getattr(op, "on_device", True) \
        and op.verdict != "not-applicable"


def _where(source: str | None) -> tuple[str | None, int | None]:
    if not source:
        return None, None
    file, _, line = source.rpartition(":")
    return (file, int(line)) if file and line.isdigit() else (source, None)


class _Group:
    """The operators one rule flags on one source line."""

    def __init__(self, rule: dict, source: str | None):
        self.rule, self.source = rule, source
        self.ops: dict[str, int] = {}       # operator name -> calls
        self.calls: list[tuple[str, str, int]] = []   # (name, parent name, calls) per signature
        self.dtypes: set[str] = set()
        self.cube: set[str] = set()
        self.phases: set[str] = set()
        self.aicpu: list[str] = []
        self.library: str | None = None

    def add(self, op, dtype: str, aicpu: str | None) -> None:
        name = base_name(op.name)
        self.ops[name] = self.ops.get(name, 0) + int(op.calls or 0)
        self.calls.append((name, base_name(op.parent or ""), int(op.calls or 0)))
        self.phases.add(op.phase or "other")
        if _op_family(op) != "other":
            self.cube.add(name)
        self.dtypes.add(dtype)
        if aicpu and aicpu not in self.aicpu:
            self.aicpu.append(aicpu)
        self.library = self.library or getattr(op, "library", None)

    def finding(self, chip: str, family: str) -> Finding:
        rule = self.rule
        # the cube operators first (what the chip fact is about), then by calls
        names = sorted(self.ops, key=lambda n: (n not in self.cube, -self.ops[n], n))
        shown = ", ".join(names[:_SHOWN_OPS]) + (f" and {len(names) - _SHOWN_OPS} more" if len(names) > _SHOWN_OPS else "")
        # calls of the outermost flagged operators (a linear's addmm child is the same call)
        calls = sum(c for _, parent, c in self.calls if parent not in self.ops) or sum(self.ops.values())
        dtypes = ", ".join(sorted(self.dtypes))
        fact = str(rule.get("fact", "")).format(family=family, chip=chip)
        sources = ", ".join(rule.get("sources") or [])
        phases = ", ".join(p for p in ("forward", "backward", "optimizer", "eval", "other") if p in self.phases)
        message = (f"{dtypes} in {shown} ({calls} call(s), {phases}) on {chip}: {fact}"
                   + (f"; per operator: {'; '.join(self.aicpu[:2])}" if self.aicpu else "")
                   + f" [npu_chips.yaml, sources: {sources}]")
        file, line = _where(self.source)
        return Finding(rule=str(rule["rule"]), file=file, line=line, api=f"{dtypes}: {', '.join(names[:_SHOWN_OPS])}",
                       message=message, replacement=rule.get("fix"), severity=str(rule.get("severity", "warning")),
                       origin="runtime", count=max(calls, 1), library=self.library)


def _int64_index_rule(op, data: dict, aicpu_rules: dict) -> dict | None:
    """The int64-index rule for an operator ``aicpu_rules.ops`` names (index_put & co.), its why/fix as fact/fix."""
    entry = (aicpu_rules.get("ops") or {}).get(base_name(op.name))
    spec = data.get("int64_index") or {}
    if not entry or not spec:
        return None
    return {"rule": spec.get("rule", "chip-dtype-int64-index"), "severity": spec.get("severity", "warning"),
            "fact": entry.get("why", "runs on AI CPU"), "fix": entry.get("fix"), "sources": spec.get("sources") or []}


def is_chip_dtype_finding(finding) -> bool:
    """A dtype the chosen chip cannot run, or runs differently (made here), not a CUDA API."""
    return str(getattr(finding, "rule", "") or "").startswith("chip-dtype")


def chip_dtype_findings(operators, chip: str | None) -> list[Finding]:
    """Findings for the dtypes of ``operators`` on ``chip`` (unknown chip: ``UserError`` listing the known ones)."""
    name, figures = resolve_chip(chip)
    table = chips()
    family = str(figures.get("family") or "")
    family_rules = list(((table.get("families") or {}).get(family) or {}).get("rules") or [])
    dtype_data = table.get("dtypes") or {}
    rules = family_rules + list(dtype_data.get("rules") or [])
    aicpu_rules = cost_model().get("aicpu_rules") or {}
    views = set(cost_model().get("views") or [])   # no kernel of their own: nothing computes in their dtype
    aliases = dtype_data.get("aliases") or {}
    groups: dict[tuple, _Group] = {}
    for op in operators:
        if not _judged(op) or base_name(op.name) in views:
            continue
        dtypes = _dtypes(op)
        hits = []
        for rule in rules:
            dtype = _matches(op, dtypes, rule.get("when") or {})
            if dtype:
                hits.append((rule, dtype))
        index_rule = _int64_index_rule(op, dtype_data, aicpu_rules)
        if index_rule:
            hits.append((index_rule, "int64 indices"))
        reason = aicpu_reason(op, aicpu_rules) if hits else None
        for raw, torch_name in aliases.items():   # the profiler's spelling -> torch's
            reason = reason.replace(f"dtype {raw} ", f"dtype {torch_name} ") if reason else reason
        for rule, dtype in hits:
            group = groups.get((rule["rule"], op.source))
            if group is None:
                group = groups[(rule["rule"], op.source)] = _Group(rule, op.source)
            group.add(op, dtype, reason if rule is not index_rule else None)
    findings = [g.finding(name, family) for g in groups.values()]
    return sorted(findings, key=lambda f: (f.file or "", f.line or 0, f.rule))


__all__ = ["chip_dtype_findings"]
