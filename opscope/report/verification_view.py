"""The ``verification`` section (written by ``opscope verify``) as rows and figures the reports share.

The loader has checked the section's types (``model.Verification``), so rows are read as
attributes; only ``e2e``, kept as the replay wrote it, is read defensively.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from opscope.model import Verification
from opscope.report.view import NA, fmt_dtypes, fmt_shapes, obj, seq

OUTCOMES = ("pass", "warn", "fail", "error", "measured", "skipped")
OUTCOME_ORDER = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "measured": 4, "skipped": 5}  # worst first
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


def _key(value):
    return value if isinstance(value, (int, str, float)) or value is None else str(value)


def _number(value):
    """A metric as a float, or None when absent or not a number (scan.json stores NaN as null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _typed(verification: Verification | dict | None) -> Verification:
    """The section as a record; ``opscope verify`` passes the dict it has just measured."""
    return Verification.of(verification) or Verification()


def verification_counts(verification: Verification | dict | None) -> dict[str, int]:
    """Signatures per outcome (pass/warn/fail/error/skipped), counted when the block has no counts."""
    v = _typed(verification)
    if v.counts:
        return {o: v.counts.get(o) or 0 for o in OUTCOMES}
    counts = {o: 0 for o in OUTCOMES}
    for r in v.results or []:
        if r.outcome in counts:
            counts[r.outcome] += 1
    return counts


def verification_rows(verification: Verification | dict | None) -> list[VerificationRow]:
    """Replayed signatures, worst outcome first (``OUTCOME_ORDER``, as the terminal lists them)."""
    rows = []
    for r in _typed(verification).results or []:
        metrics = r.metrics or {}
        rows.append(VerificationRow(
            op=r.op or "", overload=r.overload or "", shapes=fmt_shapes(r.input_shapes), dtypes=fmt_dtypes(r.dtypes),
            outcome=r.outcome or "skipped", cosine=_number(metrics.get("cosine")),
            max_abs_err=_number(metrics.get("max_abs_err")), max_rel_err=_number(metrics.get("max_rel_err")),
            standard=r.standard or "", message=r.message or "", predicted_verdict=r.predicted_verdict or "",
            disagreement=r.disagreement or ""))
    rows.sort(key=lambda row: OUTCOME_ORDER.get(row.outcome, 9))
    return rows


def skip_reason(message: str) -> str:
    """A skipped signature's message as a reason shared by others: 'argument weight was not recorded
    and has no default' -> 'an argument was not recorded and has no default'."""
    text = re.split(r" \(|;", str(message or "").strip(), maxsplit=1)[0]
    text = re.sub(r"^\S+::\S+?(?::| is)\s", lambda m: "" if m.group(0).endswith(": ") else "operator is ", text)
    text = re.sub(r"\bargument \w+", "an argument", text)
    text = re.sub(r"\bdtype \S+", "a dtype", text)
    text = re.sub(r"\d[\d,]*", "N", text)
    text = text.split(": ", 1)[0] if text.startswith("opscope could not replay") else text
    return text.strip() or "no reason recorded"


def skip_reasons(verification: Verification | dict | None) -> list[tuple[str, int]]:
    """(reason, count) for the skipped signatures, most frequent first."""
    counts: dict[str, int] = {}
    for r in _typed(verification).results or []:
        if r.outcome == "skipped":
            reason = skip_reason(r.message or "")
            counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def fmt_skip_reasons(verification: Verification | dict | None) -> str:
    return "; ".join(f"{n} {reason}" for reason, n in skip_reasons(verification))


def verification_metadata(verification: Verification | dict | None) -> list[tuple[str, str]]:
    """(label, text) pairs saying how the verification ran."""
    v = _typed(verification)
    counts = v.counts or {}
    return [
        ("Device", v.device or NA),
        ("Inputs", (v.inputs or NA) + (f" (seed {v.seed})" if v.seed is not None else "")),
        ("Reference", v.reference or NA),
        ("Standards", v.standards or NA),
        ("Signatures", str(counts.get("total", len(v.results or [])))),
        ("Disagreements with predicted verdicts", str(counts.get("disagreements", 0))),
        ("Skipped, by reason", fmt_skip_reasons(v) or "none"),
        ("Started", v.started_at or NA),
        ("Duration", f"{v.duration_s:.1f} s" if v.duration_s is not None else NA),
    ]


def e2e_summary(verification: Verification | dict | None) -> dict | None:
    """The end-to-end loss comparison: verdict, message and one dict per step; None when absent."""
    e2e = _typed(verification).e2e
    if e2e is None:
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
