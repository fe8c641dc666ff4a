"""One torch_npu support verdict, with its evidence, for every captured operator.

Verdicts (``opscope.model.VERDICTS``):

* ``native``: the overload is registered for the NPU in the target release;
* ``composite``: no NPU kernel of its own, but it runs as operators that are supported
  (structured delegate/inherit to a registered ``.out``, Composite* kernels; recursive,
  only as good as the weakest child);
* ``cpu-fallback``: no NPU kernel, no composite path, torch has a CPU kernel: torch_npu
  runs it on the CPU with host<->device copies;
* ``adapter``: a third-party library's op (``torchvision::roi_align``) that an Ascend adapter package
  (torchvision_npu) registers an NPU kernel for, once the release paired with the target is installed
  (``verdicts/third_party.py``);
* ``unsupported``: no NPU kernel and nothing to fall back to;
* ``not-applicable``: a backend-private kernel of the scanning machine (mkldnn, cuDNN,
  NNPACK...), or an op that only runs inside another op's kernel: judged through that op;
* ``unknown``: a namespace or op the matrix does not cover: said so, never guessed.

Context matters: an op called inside another op's kernel (``aten::empty`` inside the CPU
``aten::addmm``) never runs as such on the NPU when the parent has a kernel there (or
falls back as a whole), so it is not blamed; an op called by a Composite parent is part
of the decomposition and is judged on its own.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opscope.analysis.verdicts.third_party import judge_third_party, version_here
from opscope.knowledge import (
    backend_kernel,
    implemented_public_op,
    is_backend_private,
    is_private_kernel,
    kernel_public_op,
    load_optional,
    public_op_note,
)
from opscope.matrix.judge import FOREIGN_DECOMPOSITION, GOOD, RANK, Judge, Judgement
from opscope.matrix.store import SupportMatrix, load_matrix, resolve_release
from opscope.matrix.torch_schema import load_torch_schema, schema_for
from opscope.model import ScanSummary, ScanTarget

BAD = ("cpu-fallback", "unsupported", "unknown")


def resolve_target(target: str | None) -> str:
    """'2.8.0' / 'torch_npu==2.8.0' / None -> the exact torch_npu version judged against.

    Raises UserError naming the known versions for one the matrix does not have.
    """
    return resolve_release(load_matrix(), target).version


def schema_of(release):
    """(facts of the torch ``release`` was built for, note) - the installed torch's, with a note
    saying so, when the matrix has none for it."""
    schema = schema_for(release.torch)
    if schema is not None:
        return schema, None
    installed = load_torch_schema()
    if release.torch:
        why = f"torch_npu {release.version} is built for torch {release.torch}, whose facts are not in the matrix"
    elif not release.from_wheel:
        why = f"torch_npu {release.version} has no wheel, so the torch it is built for is not known"
    else:
        why = f"the torch_npu {release.version} wheel does not pin a torch release"
    return installed, (f"{why}: composite/structured facts from the installed {installed.source} instead "
                       "(run `opscope matrix build --version V` to add them)")


def substitute_for(name: str, verdict: str, release) -> dict | None:
    """First substitute option for ``name`` whose torch_npu requirements exist in ``release``."""
    for option in (load_optional("substitutes.yaml").get("substitutes") or {}).get(name, []):
        if verdict not in option.get("applies_to", BAD):
            continue
        missing = missing_requirements(option.get("requires") or {}, release)
        if not missing:
            return {"replacement": option["replacement"], "rationale": option.get("rationale", ""),
                    "requires": option.get("requires") or {}, "checked_in": release.source}
    return None


def missing_requirements(requires: dict, release) -> list[str]:
    missing = [f"torch_npu.{n}" for n in requires.get("custom", []) if n not in release.custom]
    missing += [f"torch_npu.contrib.{n}" for n in requires.get("contrib", []) if n not in release.contrib]
    missing += [f"aten::{n}" for n in requires.get("aten", []) if n not in release.aten]
    return missing


class _Context:
    """Operators of one scan by name: parents, observed children, and one judge."""

    def __init__(self, operators, matrix: SupportMatrix, release):
        self.by_name: dict = {}
        self.children: dict = {}
        for op in operators:
            self.by_name.setdefault(op.name, []).append(op)
            self.children.setdefault(op.name, [])
            for child in op.children or []:
                child = child.split(" (", 1)[0]  # the scan tags folded kernels "(backend-private)"
                if child not in self.children[op.name] and not is_private_kernel(child):
                    self.children[op.name].append(child)
        self.matrix, self.line = matrix, release.line
        self.release = release
        self.schema, self.schema_note = schema_of(release)
        self.judge = Judge(matrix, self.schema, release.line, children_of=lambda n: self.children.get(n, []),
                           release=release, schema_note=self.schema_note)
        self.namespaces = load_optional("substitutes.yaml").get("namespaces") or {}
        self._row_memo: dict = {}
        self._row_stack: set = set()

    def observed(self, op) -> Judgement:
        """Judgement of one signature, its decomposition from the children seen under it."""
        key = id(op)
        if key in self._row_memo:
            return self._row_memo[key]
        if key in self._row_stack or op.name.rpartition("::")[0] != "aten":
            return self.intrinsic(op.name, op.overload)
        self._row_stack.add(key)
        try:
            children = [c.split(" (", 1)[0] for c in op.children or []]
            children = [c for c in dict.fromkeys(children) if not is_private_kernel(c)]
            judged = self.judge.judge_observed(op.name, op.overload, children,
                                               lambda name, overload: self._child(op, name, overload))
        finally:
            self._row_stack.discard(key)
        self._row_memo[key] = judged
        return judged

    def _child(self, parent, name: str, overload: str | None) -> Judgement:
        """A child as observed under ``parent``: the best of its signatures there, else by name."""
        rows = [r for r in self.by_name.get(name, []) if r.parent == parent.name and r is not parent]
        if overload is None and rows:
            return min((self.observed(r) for r in rows), key=lambda j: RANK[j.verdict])
        return self.intrinsic(name, overload)

    def parent_of(self, name: str) -> str | None:
        """The operator ``name`` most often runs inside (ties: by name), so that evidence naming an
        ancestor does not depend on the order operators are listed in (which follows their times)."""
        counts: dict[str, int] = {}
        for op in self.by_name.get(name) or []:
            if op.parent:
                counts[op.parent] = counts.get(op.parent, 0) + (op.calls or 1)
        return min(counts, key=lambda parent: (-counts[parent], parent)) if counts else None

    def public_ancestor(self, op) -> str | None:
        seen, parent = set(), op.parent
        while parent and parent not in seen:
            seen.add(parent)
            if not is_backend_private(parent):
                return parent
            parent = self.parent_of(parent)
        return None

    def as_run(self, name: str) -> Judgement:
        """``name`` as the NPU runs it: a backend's own kernel for a public op (``backend_private_ops.yaml``
        ``implements``) as that public op, unless torch_npu registers the kernel itself."""
        own = self.intrinsic(name, None)
        implemented = implemented_public_op(name)
        if implemented and own.verdict != "native":
            return self.intrinsic(implemented[0], None)
        return own

    def intrinsic(self, name: str, overload: str | None) -> Judgement:
        ns = name.rpartition("::")[0]
        if ns == "aten":
            return self.judge.judge(name, overload)
        rule = self.namespaces.get(ns)
        base = name.rpartition("::")[2]
        evidence = {"list": "torch_npu registrations" if self.release.from_wheel else "op-plugin yaml",
                    "version": self.release.version}
        if rule and rule.get("verdict") == "from-custom":
            if base in self.release.custom:
                return Judgement("native", {**evidence, "rule": rule["rule"], "entry": base,
                                            "section": self.release.custom[base]})
            return Judgement("unknown", {**evidence, "rule": rule["rule"],
                                         "detail": f"{base} is not in the custom section of torch_npu "
                                                   f"{self.release.version}"}, "decomposes")
        if rule:
            return Judgement(rule["verdict"], {**evidence, "list": "support_matrix/substitutes.yaml namespaces",
                                               "rule": rule["rule"], "namespace": ns})
        third_party = judge_third_party(name, self.release.version)   # a library's op: Ascend's answer
        if third_party is not None:
            return third_party
        installed = version_here(ns) if ns else None
        library = f"the {ns} library ({installed} here)" if installed else f"the {ns or '(none)'} namespace"
        return Judgement("unknown", {**evidence, "rule": "namespace-not-covered", "library_version": installed,
                                     "detail": f"neither the matrix (ATen, torch_npu custom ops, c10d collectives) "
                                               f"nor support_matrix/third_party.yaml covers {library}: "
                                               f"check {name} by hand at its call site (a custom TORCH_LIBRARY "
                                               "op needs its own NPU kernel)"}, "decomposes")

    def covering_kernel(self, op) -> tuple[str, Judgement] | None:
        """The nearest ancestor whose kernel replaces this op's subtree on the NPU (or falls back whole)."""
        seen, parent = set(), op.parent
        while parent and parent not in seen and parent != op.name:
            seen.add(parent)
            if not is_backend_private(parent):
                judged = self.as_run(parent)
                if judged.kind == "kernel":
                    return parent, judged
            parent = self.parent_of(parent)
        return None


def assign_verdicts(operators, target: str | None) -> dict:
    """Set ``op.verdict``/``op.evidence``/``op.substitute`` in place for one torch_npu release.

    Returns the ``target`` block of scan.json: ``{"package", "version", "line", "source", ...}``.
    """
    matrix = load_matrix()
    ctx = _Context(operators, matrix, resolve_release(matrix, target))
    for op in operators:
        op.verdict, op.evidence = _verdict(op, ctx)
        op.substitute = substitute_for(op.name, op.verdict, ctx.release)
        warnings = dtype_warnings(op) if op.verdict in GOOD else []
        if warnings:
            op.evidence["dtype_warnings"] = warnings
    release = ctx.release
    info = {"package": "torch_npu", "version": release.version, "line": release.line, "source": release.source,
            "torch": release.torch, "torch_schema": ctx.schema.source,
            "op_plugin_commit": matrix.plugin_commit}
    if release.note:
        info["note"] = release.note
    if ctx.schema_note:
        info["torch_schema_note"] = ctx.schema_note
    return info


def mark_host_only(operators, uses_device: bool = True) -> None:
    """Operators that only ran at import time or on host tensors during set-up or data loading: not-applicable
    (they stay on the CPU after porting), whatever the release."""
    for op in operators:
        if op.import_time:
            op.verdict = "not-applicable"
            op.evidence = {"rule": "import-time",
                           "detail": "only ran while a library was being imported (module-level code run by the "
                                     f"import at {op.source or 'an import'}, on host tensors): not part of the "
                                     "training job, so no NPU kernel is needed",
                           "source": op.source}
            op.substitute = None
        elif not op.on_device:
            rule = "host-tensors" if uses_device else "setup-without-device"
            detail = ("only ran on host (CPU) tensors during set-up or data loading in the original script: it "
                      "stays on the CPU after porting, so no NPU kernel is needed")
            if rule == "setup-without-device":
                detail = ("only ran during set-up or data loading of a script that uses no accelerator; set-up "
                          "normally stays on the host when the model and data are moved to the NPU afterwards, so "
                          "no NPU kernel is needed (unless the port creates these tensors on the NPU directly)")
            op.verdict = "not-applicable"
            op.evidence = {"rule": rule, "detail": detail, "source": op.source}
            op.substitute = None


def _verdict(op, ctx: _Context) -> tuple[str, dict]:
    pattern = is_backend_private(op.name)
    ancestor = ctx.public_ancestor(op) if pattern else None
    if pattern and (ancestor or not implemented_public_op(op.name)):
        judged_as = ctx.as_run(ancestor).verdict if ancestor else None
        return "not-applicable", {"rule": "backend-private", "pattern": pattern,
                                  "detail": f"an implementation kernel of the scanning machine's backend; "
                                            f"on the NPU the kernel of {ancestor or 'its public parent'} "
                                            "replaces it",
                                  "judged_through": ancestor, "parent_verdict": judged_as}
    own = ctx.observed(op)
    evidence = dict(own.evidence)
    kernel = backend_kernel(op.name) if own.verdict != "native" else None   # torch_npu's own kernel wins
    if own.verdict in ("unsupported", "unknown") and op.parent and op.parent != op.name:
        parent_own = ctx.intrinsic(op.parent, None)
        if parent_own.evidence.get("decomposition") == FOREIGN_DECOMPOSITION:
            return "not-applicable", {"rule": "other-torch-decomposition", "judged_through": op.parent,
                                      "parent_verdict": parent_own.verdict,
                                      "detail": f"part of how the scanning torch decomposes {op.parent}; "
                                                f"{ctx.schema.source} (the torch torch_npu {ctx.release.version} "
                                                "is built for) decomposes it differently, so this op does not "
                                                "run there",
                                      "own": {k: evidence[k] for k in ("rule", "dispatch") if evidence.get(k)}}
    cover = ctx.covering_kernel(op)
    if cover:
        parent, parent_judged = cover
        inside = (f"runs inside {parent}'s kernel ({parent_judged.verdict} on the NPU), which replaces the "
                  "whole subtree: it needs no NPU support of its own")
        if kernel:
            inside = f"{_recorded_as(kernel)}; it {inside}"
        if own.verdict not in GOOD:
            extra = {"recorded_as": kernel["kernel"], "backend": kernel["backend"],
                     "implements": kernel_public_op(kernel, op.scalars)} if kernel else {}
            return "not-applicable", {"rule": "inside-parent-kernel", "detail": inside, "judged_through": parent,
                                      "parent_verdict": parent_judged.verdict, **extra,
                                      "own": {k: evidence[k] for k in ("rule", "dispatch") if evidence.get(k)}}
        evidence["inside"] = inside
    if kernel:
        return _as_public_op(op, kernel, ctx)
    return own.verdict, evidence


def _recorded_as(kernel: dict) -> str:
    return f"recorded as {kernel['kernel']} ({kernel['backend']})"


def _as_public_op(op, kernel: dict, ctx: _Context) -> tuple[str, dict]:
    """A backend's own kernel for a public op (cuDNN's SDPA backward, the CPU's fused-attention backward,
    cuDNN's batch norm): on the NPU the public op's kernel and autograd run instead, so it gets the public
    op's verdict and evidence, with the backend kernel named."""
    public, part = kernel_public_op(kernel, op.scalars), kernel["part"]
    judged = ctx.intrinsic(public, None)
    half = "the backward of " if part == "backward" and not public.endswith("_backward") else ""
    how = public_op_note(public)
    evidence = {**judged.evidence, "rule": "backend-implements", "implements": public, "part": part,
                "recorded_as": op.name, "backend": kernel["backend"],
                "public_rule": judged.evidence.get("rule"),
                "detail": f"{_recorded_as(kernel)}; on the NPU {half}{public} runs instead"
                          + (f" ({how})" if how else "")
                          + f": {public} is {judged.verdict} in torch_npu {ctx.release.version}, so it is judged "
                            "as that op"
                          + (f": {judged.evidence['detail']}" if judged.evidence.get("detail") else ""),
                "judged_through": public}
    return judged.verdict, evidence


def dtype_warnings(op) -> list[str]:
    """Dtypes seen in the scan for which upstream tests fail on the NPU (op otherwise supported)."""
    config = load_optional("dtype_tests.yaml")
    notes = load_matrix().dtype_notes
    base = op.name.rpartition("::")[2]
    names = [base, base.rstrip("_"), f"nn.functional.{base}"] + list((config.get("opinfo_aliases") or {}).get(base, []))
    seen: set = {(config.get("profiler_dtypes") or {}).get(d) for d in op.dtypes or []} - {None}
    out = []
    for opinfo in dict.fromkeys(names):
        for dtype in sorted(seen):
            for test, meaning in (config.get("warn") or {}).items():
                scope = notes.get(opinfo, {}).get(dtype, {}).get(test)
                if scope:
                    out.append(f"{dtype}: upstream {test} fails for {opinfo} on the NPU ({meaning}; "
                               f"unsupported_ops_info, lines {scope})")
    return out


def op_time_basis(operators) -> tuple[bool, Callable[[Any], float]]:
    """(steady, op_time): the one time basis of the readiness score and its shares.  The estimated NPU time per
    step (``Operator.npu_time_us``, ``npu/weights.py``: deterministic) once the estimate has set it; before that,
    or for a scan without one, an operator's median self time per steady-state step when any step after the
    first was captured, else its total self time."""
    if any(op.npu_time_us is not None for op in operators):
        return True, lambda op: float(op.npu_time_us or 0.0)
    steady = any(op.steady_time_us is not None for op in operators)

    def op_time(op) -> float:
        return float((op.steady_time_us if steady else op.self_time_us) or 0.0)
    return steady, op_time


def refreshed_summary(result, old: dict) -> ScanSummary:
    """The readiness summary computed again (new verdicts or weights) over the stored one ``old``: what it holds
    besides the score and shares (precision, why there is no score) is kept, and a scan that measured nothing
    still has no score."""
    merged = {**old, **readiness_summary(result)}
    if old.get("readiness_score") is None and old.get("score_unavailable"):
        merged["readiness_score"] = None
    return ScanSummary.from_dict(merged, "$.summary")


def readiness_summary(result) -> dict:
    """Counts, time shares and a 0-100 readiness score for a ScanResult with verdicts set.

    Time is operator self time (host) in the steady state: per signature the median of its
    self time per step over the steps after the first (``Operator.steady_time_us``; set-up
    and first-step work such as optimizer-state creation or one-off warm-up weigh nothing,
    and one slow step does not move the median), summed per verdict, as a share of all
    operators'.  Only when no such step was captured is the total self time used
    (``time_basis`` says which).
    ``readiness_score`` = 100 x (0.5 x time_ok + 0.5 x signatures_ok)
        - 5 per dynamic-shape root cause (at most 20)
        - 2 per error finding + 0.5 per warning finding (at most 10 together)
        - 10 when any operator is ``unsupported`` (the script cannot run as is),
    clamped to 0..100 and rounded; where ``time_ok`` is 1 minus the time share of
    cpu-fallback/unsupported operators (unknown ones count half: not judged, not cleared),
    rounded to the nearest 10 % so timing noise between identical runs cannot move the score,
    and ``signatures_ok`` the same over operator signatures, both among operators that
    need an NPU kernel (not-applicable ones left out).
    """
    from opscope.model import VERDICTS
    ops = list(result.operators)
    steady, op_time = op_time_basis(ops)

    counts = {v: 0 for v in VERDICTS}
    times = {v: 0.0 for v in VERDICTS}
    for op in ops:
        verdict = op.verdict or "unknown"
        counts[verdict] = counts.get(verdict, 0) + 1
        times[verdict] = times.get(verdict, 0.0) + op_time(op)
    total = sum(times.values())
    share = {v: (t / total if total else 0.0) for v, t in times.items()}
    judged = [op for op in ops if op.verdict != "not-applicable"]
    judged_time = sum(op_time(op) for op in judged)
    weight = {"cpu-fallback": 1.0, "unsupported": 1.0, "unknown": 0.5}
    bad_sig = sum(weight.get(op.verdict, 0.0) for op in judged)
    bad_time = sum(weight.get(op.verdict, 0.0) * op_time(op) for op in judged)
    signatures_ok = 1 - bad_sig / len(judged) if judged else 1.0
    # Measured time is noisy between identical runs; the score sees the blocking time share
    # in 10 % bands so that noise cannot move it (the exact share is reported alongside).
    time_ok = 1 - round(10 * bad_time / judged_time) / 10 if judged_time else signatures_ok
    findings = list(result.findings or [])
    errors = sum(1 for f in findings if getattr(f, "severity", "") == "error")
    warnings = sum(1 for f in findings if getattr(f, "severity", "") == "warning")
    roots = len(result.root_causes or [])
    score = 100 * (0.5 * time_ok + 0.5 * signatures_ok)
    score -= min(20, 5 * roots)
    score -= min(10, 2 * errors + 0.5 * warnings)
    score -= 10 if counts.get("unsupported") else 0
    blocking = [op for op in ops if op.verdict in BAD]
    return {
        "verdict_counts": counts,
        "time_share": {v: round(s, 6) for v, s in share.items()},
        "cpu_fallback_time_share": round(share.get("cpu-fallback", 0.0), 6),
        "blocking_signatures": len(blocking),
        "blocking_ops": _blocking_ops(blocking, total, op_time),
        "blocking_time_share": round(sum(share.get(v, 0.0) for v in BAD), 6),
        "native_or_composite_share": round((counts["native"] + counts["composite"]) / len(judged), 6)
        if judged else 1.0,
        "dynamic_root_causes": roots,
        "findings": len(findings),
        "findings_by_severity": {"error": errors, "warning": warnings,
                                 "info": sum(1 for f in findings if getattr(f, "severity", "") == "info")},
        "readiness_score": int(round(max(0.0, min(100.0, score)))),
        "score_formula": "100*(0.5*time_ok+0.5*signatures_ok) - min(20,5*root_causes) "
                         "[time_ok = 1 - blocking time share rounded to 0.1] "
                         "- min(10,2*errors+0.5*warnings) - 10*any_unsupported",
        "time_basis": "estimated NPU time per step (from shapes: the same in every identical scan)"
        if any(op.npu_time_us is not None for op in ops)
        else "median self time per steady-state step (steps after the first)" if steady
        else "total self time of all captured steps (no step after the first)",
    }


def _blocking_ops(blocking, total_us: float, op_time=lambda op: float(op.self_time_us or 0.0)) -> list[dict]:
    """Operators between the script and a clean NPU run, by name, most time first."""
    by_name: dict = {}
    for op in blocking:
        row = by_name.setdefault(op.name, {"op": op.name, "verdict": op.verdict, "signatures": 0, "calls": 0,
                                           "self_time_us": 0.0, "source": op.source,
                                           "first_supported_in": (op.evidence or {}).get("first_supported_in"),
                                           "substitute": (op.substitute or {}).get("replacement")})
        if RANK[op.verdict] > RANK[row["verdict"]]:
            row["verdict"] = op.verdict
        row["signatures"] += 1
        row["calls"] += int(op.calls or 0)
        row["self_time_us"] += op_time(op)
    rows = sorted(by_name.values(), key=lambda r: (-r["self_time_us"], r["op"]))
    for row in rows:
        row["time_share"] = round(row["self_time_us"] / total_us, 6) if total_us else 0.0
    return rows


def describe_readiness(summary: ScanSummary | dict, target: ScanTarget | dict | None = None) -> str:
    """One line for a terminal: what stands between the script and a clean NPU run."""
    summary = summary if isinstance(summary, ScanSummary) else ScanSummary.from_dict(summary, "$.summary")
    target = target if isinstance(target, ScanTarget) else ScanTarget.from_dict(target or {}, "$.target")
    if summary.is_empty():
        return "readiness: not computed"
    version = target.version or "?"
    if summary.readiness_score is None:
        return (f"readiness for torch_npu {version}: no score (n/a) - "
                f"{summary.score_unavailable or 'nothing was measured'}")
    share = summary.blocking_time_share or 0.0
    return (f"readiness for torch_npu {version}: {summary.readiness_score}/100 - "
            f"{summary.blocking_signatures or 0} operator signature(s) not running natively "
            f"({share:.1%} of operator time, {summary.cpu_fallback_time_share or 0.0:.1%} in CPU fallbacks), "
            f"{summary.dynamic_root_causes or 0} dynamic-shape root cause(s), "
            f"{summary.findings or 0} finding(s)")


__all__ = ["assign_verdicts", "mark_host_only", "readiness_summary", "resolve_target", "describe_readiness", "substitute_for", "dtype_warnings",
           "is_backend_private", "RANK"]
