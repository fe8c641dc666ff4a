"""Turn a ScanResult into plain rows and figures every reporter shows the same way.

HTML, XLSX and Markdown must agree on what "time share" or "top fix" means, so the
arithmetic lives here once.  Everything is defensive: a scan.json written by an
older or partial scan (no verdicts yet, no summary) still renders, with "n/a".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opscope.model import VERDICTS, Operator, ScanResult

NA = "n/a"
BLOCKING = ("cpu-fallback", "unsupported", "unknown")

# One colour per verdict, shared by the HTML badges, the XLSX fills and the charts.
VERDICT_COLOURS = {
    "native": "#2e7d32",
    "composite": "#00838f",
    "cpu-fallback": "#ef6c00",
    "unsupported": "#c62828",
    "not-applicable": "#757575",
    "unknown": "#6a1b9a",
}
VERDICT_FILLS = {  # light backgrounds for spreadsheet cells
    "native": "C8E6C9",
    "composite": "B2EBF2",
    "cpu-fallback": "FFE0B2",
    "unsupported": "FFCDD2",
    "not-applicable": "E0E0E0",
    "unknown": "E1BEE7",
}


def verdict_of(op: Operator) -> str:
    """An operator's verdict, 'unknown' when the verdict engine has not run."""
    return op.verdict if op.verdict in VERDICTS else "unknown"


def op_time_us(op: Operator) -> float:
    """Time an operator costs: device time where measured, else host self time.

    Self time (not total) so nested operators are never counted twice.
    """
    return float(op.device_time_us or 0.0) or float(op.self_time_us or 0.0)


def verdicts_computed(result: ScanResult) -> bool:
    """False when no operator carries a verdict (scan made before/without the verdict engine)."""
    return any(op.verdict for op in result.operators)


def total_time_us(result: ScanResult) -> float:
    return sum(op_time_us(op) for op in result.operators)


def fmt_shapes(shapes) -> str:
    if not shapes:
        return ""
    if not isinstance(shapes, (list, tuple)):
        return str(shapes)
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" if isinstance(s, (list, tuple)) else str(s)
                     for s in shapes)


def fmt_dtypes(dtypes) -> str:
    if not isinstance(dtypes, (list, tuple)):
        return str(dtypes) if dtypes else ""
    return ", ".join(str(d) if d not in (None, "") else "None" for d in dtypes)


def fmt_evidence(evidence) -> str:
    """One line saying why a verdict was given (list, version, rule, decomposition path)."""
    if not evidence:
        return ""
    if not isinstance(evidence, dict):
        return str(evidence)
    parts = []
    if evidence.get("list"):
        version = evidence.get("version")
        parts.append(f"{evidence['list']}" + (f" {version}" if version else ""))
    if evidence.get("rule"):
        parts.append(str(evidence["rule"]))
    path = evidence.get("path")
    if path:
        parts.append(" -> ".join(str(p) for p in path) if isinstance(path, (list, tuple)) else str(path))
    extra = [f"{k}: {v}" for k, v in evidence.items() if k not in ("list", "version", "rule", "path") and v]
    return "; ".join(parts + extra)


def fmt_substitute(substitute) -> str:
    if not substitute:
        return ""
    if not isinstance(substitute, dict):
        return str(substitute)
    text = str(substitute.get("replacement") or "")
    if substitute.get("rationale"):
        text = f"{text} ({substitute['rationale']})" if text else str(substitute["rationale"])
    return text


def fmt_dims(varying_dims) -> str:
    """`arg0.dim0: 32, 8` for each varying dimension."""
    parts = []
    for d in varying_dims or []:
        if isinstance(d, dict):
            values = ", ".join(str(v) for v in seq(d.get("values")))
            where = f"arg{d.get('arg', '?')}." + (f"dim{d['dim']}" if d.get("dim") is not None
                                                   else str(d.get("what") or "rank"))
            parts.append(f"{where}: {values}")
        else:
            parts.append(str(d))
    return "; ".join(parts)


def fmt_percent(share) -> str:
    return NA if share is None else f"{share * 100:.1f}%"


@dataclass
class OperatorRow:
    """One operator signature as every table shows it."""
    name: str
    verdict: str
    calls: int
    shapes: str
    dtypes: str
    time_us: float
    share: float
    phase: str
    source: str
    evidence: str
    substitute: str
    dynamic: bool


def operator_rows(result: ScanResult) -> list[OperatorRow]:
    """Operator rows, most expensive first."""
    total = total_time_us(result) or 0.0
    rows = []
    for op in result.operators:
        t = op_time_us(op)
        rows.append(OperatorRow(
            name=op.qualified_name, verdict=verdict_of(op), calls=int(op.calls or 0),
            shapes=fmt_shapes(op.input_shapes), dtypes=fmt_dtypes(op.dtypes), time_us=t,
            share=(t / total) if total else 0.0, phase=op.phase or "",
            source=op.source or "", evidence=fmt_evidence(op.evidence),
            substitute=fmt_substitute(op.substitute), dynamic=bool(op.dynamic)))
    rows.sort(key=lambda r: (-r.time_us, r.name))
    return rows


def _pick(value, keys):
    """A number, or the first of ``keys`` when the summary nests {verdict: {count, share}}."""
    if isinstance(value, dict):
        return next((value[k] for k in keys if k in value), 0)
    return value


def verdict_counts(result: ScanResult) -> dict[str, int]:
    """Operator signatures per verdict: from the summary when present, else counted."""
    summary = result.summary or {}
    for key in ("verdict_counts", "counts", "verdicts"):
        given = summary.get(key)
        if isinstance(given, dict) and given:
            try:
                return {v: int(_pick(given.get(v), ("count", "signatures", "operators")) or 0) for v in VERDICTS}
            except (TypeError, ValueError):
                break
    counts = {v: 0 for v in VERDICTS}
    for op in result.operators:
        counts[verdict_of(op)] += 1
    return counts


def verdict_time_share(result: ScanResult) -> dict[str, float]:
    """Share (0..1) of measured operator time per verdict."""
    summary = result.summary or {}
    for key in ("time_share", "verdict_time_share", "time_share_by_verdict", "verdicts"):
        given = summary.get(key)
        if isinstance(given, dict) and given:
            try:
                return {v: float(_pick(given.get(v), ("time_share", "share")) or 0.0) for v in VERDICTS}
            except (TypeError, ValueError):
                break
    total = total_time_us(result)
    shares = {v: 0.0 for v in VERDICTS}
    if total:
        for op in result.operators:
            shares[verdict_of(op)] += op_time_us(op) / total
    return shares


def readiness_score(result: ScanResult):
    score = (result.summary or {}).get("readiness_score")
    return score if isinstance(score, (int, float)) else None


@dataclass
class Fix:
    """One thing to fix before porting, with the share of time it affects."""
    kind: str           # "operator" | "dynamic shape" | "CUDA API"
    what: str
    where: str
    share: float | None
    fix: str
    severity: str = "warning"
    ops: list = field(default_factory=list)


def top_fixes(result: ScanResult, limit: int = 10) -> list[Fix]:
    """Blocking operators, dynamic-shape root causes and CUDA-only APIs, biggest impact first.

    Impact is the share of measured time affected; errors that stop the port outright
    (unsupported operators, error-level findings) come before slow paths of equal share.
    """
    total = total_time_us(result)
    fixes: list[Fix] = []

    by_name: dict[str, dict] = {}
    for op in result.operators:
        verdict = verdict_of(op)
        if verdict not in BLOCKING or not op.verdict:  # no verdict computed is not a finding
            continue
        entry = by_name.setdefault(op.name, {"time": 0.0, "verdicts": set(), "sources": [], "sub": ""})
        entry["time"] += op_time_us(op)
        entry["verdicts"].add(verdict)
        if op.source and op.source not in entry["sources"]:
            entry["sources"].append(op.source)
        entry["sub"] = entry["sub"] or fmt_substitute(op.substitute)
    for name, entry in by_name.items():
        worst = next(v for v in ("unsupported", "cpu-fallback", "unknown") if v in entry["verdicts"])
        fixes.append(Fix(
            kind="operator", what=f"{name} ({worst})", where=", ".join(entry["sources"][:3]),
            share=entry["time"] / total if total else None,
            fix=entry["sub"] or ("check support or replace the call" if worst != "cpu-fallback"
                                 else "runs on the host CPU: replace or move off the hot path"),
            severity="error" if worst == "unsupported" else "warning", ops=[name]))

    op_time_by_name: dict[str, float] = {}
    for op in result.operators:
        op_time_by_name[op.name] = op_time_by_name.get(op.name, 0.0) + op_time_us(op)
    for rc in result.root_causes:
        affected = sum(op_time_by_name.get(name, 0.0) for name in rc.ops or [])
        fixes.append(Fix(
            kind="dynamic shape", what=f"{rc.kind or rc.cause}: {len(rc.ops or [])} ops get changing shapes",
            where=rc.source or "", share=affected / total if total else None,
            fix=rc.suggestion or "make the shape fixed (pad, drop_last=True)", ops=list(rc.ops or [])))

    for finding in result.findings:
        where = f"{finding.file}:{finding.line}" if finding.file else ""
        fixes.append(Fix(
            kind="CUDA API", what=finding.api, where=where, share=None,
            fix=finding.replacement or finding.message, severity=finding.severity or "warning"))

    severity_rank = {"error": 0, "warning": 1, "info": 2}
    fixes.sort(key=lambda f: (-(f.share or 0.0), severity_rank.get(f.severity, 1), f.kind, f.what))
    return fixes[:limit]


def scan_metadata(result: ScanResult) -> list[tuple[str, str]]:
    """(label, text) pairs describing what was scanned, for the summary block."""
    settings = result.settings or {}
    exit_info = result.exit or {}
    if result.complete:
        status = "complete"
    else:
        status = "incomplete: " + str(result.incomplete_reason or exit_info.get("message") or exit_info.get("kind") or NA)
    steps = len(result.steps) if result.steps else 0
    asked = settings.get("steps")
    return [
        ("Script", result.script or NA),
        ("Arguments", " ".join(str(a) for a in result.argv) if result.argv else "(none)"),
        ("Device", result.device + (f" (asked: {settings['requested_device']})"
                                    if settings.get("requested_device") not in (None, result.device) else "")),
        ("torch", result.torch_version or NA),
        ("Python", result.python_version or NA),
        ("Steps captured", f"{steps}" + (f" of {asked} asked" if asked else "")),
        ("Status", status),
        ("Started", result.started_at or NA),
        ("Duration", f"{result.duration_s:.1f} s" if result.duration_s else NA),
        ("opscope", result.tool_version or NA),
    ]


def target_text(result: ScanResult) -> str:
    target = result.target or {}
    if not target:
        return NA
    text = f"{target.get('package') or 'torch_npu'} {target.get('version') or NA}"
    if target.get("source"):
        text += f" ({target['source']})"
    if target.get("torch_schema"):  # whose composite/structured facts judged decompositions
        text += f", judged with {target['torch_schema']}"
    return text


def not_supported_rows(rows: list[OperatorRow]) -> list[OperatorRow]:
    return [r for r in rows if r.verdict in BLOCKING]


# ------------------------------------------------------------------ verification (opscope verify)

OUTCOMES = ("pass", "warn", "fail", "error", "measured", "skipped")
OUTCOME_ORDER = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "measured": 4, "skipped": 5}  # worst first, as result_rows
OUTCOME_FILLS = {"pass": "C8E6C9", "warn": "FFE082", "fail": "FFCDD2", "error": "FFCDD2", "measured": "BBDEFB",
                 "skipped": "E0E0E0"}


@dataclass
class VerificationRow:
    """One replayed operator signature as the HTML and XLSX tables show it."""
    op: str
    overload: str
    shapes: str
    dtypes: str
    outcome: str
    cosine: float | None
    max_abs_err: float | None
    max_rel_err: float | None
    standard: str
    message: str
    predicted_verdict: str
    disagreement: str


def obj(value) -> dict:
    """``value`` if it is a JSON object, else {}: blocks written by other tools may be malformed."""
    return value if isinstance(value, dict) else {}


def seq(value) -> list:
    """``value`` if it is a JSON list, else []."""
    return value if isinstance(value, list) else []


def _key(value):
    return value if isinstance(value, (int, str, float)) or value is None else str(value)


def _number(value):
    """A metric as a float, or None when absent or not a number (scan.json stores NaN as null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def verification_counts(verification: dict | None) -> dict[str, int]:
    """Signatures per outcome (pass/warn/fail/error/skipped), counted when the block has no counts."""
    verification = verification or {}
    given = obj(verification.get("counts"))
    counts = {o: 0 for o in OUTCOMES}
    if given:
        for o in OUTCOMES:
            try:
                counts[o] = int(given.get(o) or 0)
            except (TypeError, ValueError):
                counts[o] = 0
        return counts
    for r in seq(verification.get("results")):
        outcome = obj(r).get("outcome")
        if isinstance(outcome, str) and outcome in counts:
            counts[outcome] += 1
    return counts


def verification_rows(verification: dict | None) -> list[VerificationRow]:
    """Replayed signatures, worst outcome first (the order of analysis.verify.result_rows)."""
    rows = []
    for r in seq((verification or {}).get("results")):
        if not isinstance(r, dict):
            continue
        metrics = obj(r.get("metrics"))
        rows.append(VerificationRow(
            op=str(r.get("op") or ""), overload=str(r.get("overload") or ""),
            shapes=fmt_shapes(r.get("input_shapes")), dtypes=fmt_dtypes(r.get("dtypes")),
            outcome=str(r.get("outcome") or "skipped"), cosine=_number(metrics.get("cosine")),
            max_abs_err=_number(metrics.get("max_abs_err")), max_rel_err=_number(metrics.get("max_rel_err")),
            standard=str(r.get("standard") or ""), message=str(r.get("message") or ""),
            predicted_verdict=str(r.get("predicted_verdict") or ""), disagreement=str(r.get("disagreement") or "")))
    rows.sort(key=lambda row: OUTCOME_ORDER.get(row.outcome, 9))
    return rows


def verification_metadata(verification: dict | None) -> list[tuple[str, str]]:
    """(label, text) pairs saying how the verification ran."""
    v = verification or {}
    counts = obj(v.get("counts"))
    return [
        ("Device", str(v.get("device") or NA)),
        ("Inputs", str(v.get("inputs") or NA) + (f" (seed {v['seed']})" if v.get("seed") is not None else "")),
        ("Reference", str(v.get("reference") or NA)),
        ("Standards", str(v.get("standards") or NA)),
        ("Signatures", str(counts.get("total", len(seq(v.get("results")))))),
        ("Disagreements with predicted verdicts", str(counts.get("disagreements", 0))),
        ("Started", str(v.get("started_at") or NA)),
        ("Duration", f"{v['duration_s']:.1f} s" if isinstance(v.get("duration_s"), (int, float)) else NA),
    ]


def e2e_summary(verification: dict | None) -> dict | None:
    """The end-to-end loss comparison: verdict, message and one dict per step; None when absent."""
    e2e = (verification or {}).get("e2e")
    if not isinstance(e2e, dict):
        return None
    comparison = obj(e2e.get("comparison"))
    loss_steps = [row for row in seq(obj(comparison.get("loss")).get("steps")) if isinstance(row, dict)]
    grads = {_key(row.get("step")): row for row in seq(obj(comparison.get("grad_norm")).get("steps"))
             if isinstance(row, dict)}
    steps = []
    for row in loss_steps:
        g = grads.get(_key(row.get("step")), {})
        steps.append({"step": row.get("step"), "reference": _number(row.get("reference")),
                      "candidate": _number(row.get("candidate")), "abs_diff": _number(row.get("abs_diff")),
                      "rel_diff": _number(row.get("rel_diff")), "grad_reference": _number(g.get("reference")),
                      "grad_candidate": _number(g.get("candidate")), "ok": bool(row.get("ok"))})
    return {"verdict": str(comparison.get("verdict") or "error"), "message": str(comparison.get("message") or ""),
            "reference_device": str(e2e.get("reference_device") or "cpu"),
            "candidate": str(e2e.get("candidate") or NA), "seed": e2e.get("seed"), "steps": steps}


def fmt_metric(value, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}g}"
