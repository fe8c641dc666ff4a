"""Render the self-contained HTML readiness report from a ScanResult.

One file, no network: CSS and JS are inlined, charts are base64 SVG.  Jinja2
autoescape covers every server-rendered string; the operators table travels as a
JSON blob whose ``<``, ``>`` and ``&`` are \\u-escaped, so a ``</script>`` inside an
operator name or path can neither close the script element nor run.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markupsafe import Markup

from opscope.model import VERDICTS, MemoryFit, PortPlan, ScanResult, Verification
from opscope.report import glossary, headline, verification_view, view
from opscope.resources import templates_dir

TEMPLATE = "report.html.j2"

# Columns of the operators table: key, title, numeric (sorts as numbers), searchable.
COLUMNS: list[dict] = [
    {"key": "name", "title": "operator", "cls": "mono wrap", "search": True},
    {"key": "verdict", "title": "verdict", "search": True},
    {"key": "calls", "title": "calls", "numeric": True, "cls": "num"},
    {"key": "shapes", "title": "input shapes", "cls": "mono wrap", "search": True},
    {"key": "dtypes", "title": "dtypes", "cls": "mono wrap", "search": True},
    {"key": "time_ms", "title": "time ms", "numeric": True, "cls": "num"},
    {"key": "share", "title": "time share", "numeric": True, "cls": "num"},
    {"key": "phase", "title": "phase", "search": True},
    {"key": "source", "title": "source", "cls": "mono", "search": True},
    {"key": "evidence", "title": "evidence", "cls": "wrap", "search": True},
    {"key": "substitute", "title": "substitute", "cls": "wrap", "search": True},
]
# a scan that measured device time (a GPU run): time is the kernels' on the GPU, the host's own time beside it
DEVICE_TITLES: dict[str, str] = {"time_ms": "GPU time ms", "share": "GPU time share"}
HOST_COLUMN: dict = {"key": "host_ms", "title": "host time ms", "numeric": True, "cls": "num"}


def operator_columns(result: ScanResult) -> list[dict]:
    """The operators table's columns: with a host time column after the GPU time when the scan measured one."""
    if not view.has_device_time(result):
        return COLUMNS
    columns = []
    for c in COLUMNS:
        columns.append({**c, "title": DEVICE_TITLES.get(c["key"], c["title"])})
        if c["key"] == "time_ms":
            columns.append(HOST_COLUMN)
    return columns


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined, finalize=_printable)


def _printable(value):
    """Every captured string shown without terminal escapes or control characters."""
    from markupsafe import Markup
    if isinstance(value, str) and not isinstance(value, Markup):
        from opscope.text import printable
        return printable(value, "")
    return value


def _asset(name: str):
    from markupsafe import Markup
    return Markup((templates_dir() / name).read_text(encoding="utf-8"))


def script_safe_json(data) -> Markup:
    """JSON that can sit inside <script>: no character of it can end the element."""
    from markupsafe import Markup
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return Markup(text)


def _ops_payload(rows: list[view.OperatorRow], columns: list[dict] = COLUMNS) -> dict:
    keys = [c["key"] for c in columns]
    data = [[{"name": r.name, "verdict": r.verdict, "calls": r.calls, "shapes": r.shapes, "dtypes": r.dtypes,
              "time_ms": round(r.time_us / 1000, 4), "host_ms": round(r.host_time_us / 1000, 4),
              "share": round(r.share, 6), "phase": r.phase, "source": r.source, "evidence": r.evidence,
              "substitute": r.substitute}[k] for k in keys] for r in rows]
    columns = [{k: c.get(k) for k in ("key", "numeric", "cls", "search") if c.get(k)} for c in columns]
    # the evidence cell shows one sentence; its full text is opened on demand
    details = [r.evidence_detail if r.evidence_detail != r.evidence else "" for r in rows]
    return {"columns": columns, "rows": data, "details": details}


def _split_fix(text: str, limit: int = 140) -> tuple[str, str]:
    """A long fix as its first sentence, and the rest shown on demand."""
    text = str(text or "")
    if len(text) <= limit:
        return text, ""
    import re
    match = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.\s").search(text, 40)  # a sentence end, not "e.g. "
    if match is None or match.start() > limit * 2:
        return text, ""
    return text[:match.start() + 1], text[match.end():]


def _fix_row(f: view.Fix) -> dict:
    head, rest = _split_fix(f.fix)
    return {"kind": f.kind, "what": f.what, "where": f.where, "fix": head, "more": rest, "severity": f.severity,
            "code": f.kind in ("operator", "CUDA API", "chip / dtype"), "link": f.link, "detail": f.detail,
            "filter": f.ops[0] if len(f.ops) == 1 else "",
            "share_text": view.fmt_percent(f.share) if f.share is not None else "—"}


def _score_class(score, result: ScanResult | None = None) -> str:
    """Never green while an error finding or a blocking operator remains."""
    if score is None:
        return ""
    if result is None:
        return "score-good" if score >= 80 else "score-mid" if score >= 50 else "score-bad"
    return "score-" + headline.score_colour(score, result)


def _verification_context(verification: Verification | None) -> dict | None:
    """The Verification section (counts, worst-first table, e2e losses); None when not verified."""
    if verification is None or verification.is_empty():
        return None
    counts = verification_view.verification_counts(verification)
    metric = verification_view.fmt_metric
    rows = [{"op": r.op, "overload": r.overload, "shapes": r.shapes, "dtypes": r.dtypes, "outcome": r.outcome,
             "cosine": metric(r.cosine, 6), "max_abs_err": metric(r.max_abs_err),
             "max_rel_err": metric(r.max_rel_err), "standard": r.standard, "message": r.message,
             "predicted_verdict": r.predicted_verdict, "disagreement": r.disagreement}
            for r in verification_view.verification_rows(verification)]
    e2e = verification_view.e2e_summary(verification)
    if e2e is not None:
        e2e = dict(e2e, steps=[{k: (metric(v, 7) if k not in ("step", "ok") else v) for k, v in s.items()}
                               for s in e2e["steps"]])
    return {"counts": [{"name": o, "count": counts[o]} for o in verification_view.OUTCOMES],
            "metadata": verification_view.verification_metadata(verification), "rows": rows, "e2e": e2e}


def _npu_context(result: ScanResult) -> dict | None:
    """The "What will be slow on <chip>" section (an estimate); None for a scan without one."""
    from opscope.report.npu_section import FPS_HEADERS, HEADERS, build
    sec = build(result, top=25)
    if sec is None:
        return None
    return {"title": sec.title, "sentences": sec.sentences, "calibration": "; ".join(sec.calibration),
            "fps_headers": FPS_HEADERS, "fps": sec.fps, "headers": HEADERS, "rows": sec.rows, "rules": sec.rules, "more": sec.more}


def _memory_fit_context(fit: MemoryFit | None) -> dict | None:
    if not fit:
        return None
    from opscope.analysis.npu.memory_fit import basis_text, one_line, rows
    return {"line": one_line(fit), "rows": rows(fit), "chip": fit.chip, "basis": basis_text(fit)}


def _plan_context(plan: PortPlan | None, result: ScanResult) -> dict | None:
    if plan is None:
        return None
    from opscope.report import plan_view
    return {"summary": plan_view.summary_line(plan), "choice": plan_view.choice_line(plan),
            "chip": plan_view.chip_line(result),
            "changes": plan_view.change_rows(plan),
            "change_headers": plan_view.CHANGE_HEADERS, "blockers": plan_view.blocker_rows(plan),
            "blocker_headers": plan_view.BLOCKER_HEADERS, "install": plan_view.install_text(plan),
            "notes": plan_view.notes(plan)}


def build_context(result: ScanResult, charts: dict | None = None) -> dict:
    """Everything the template shows, as plain strings and lists (escaped by jinja2)."""
    from opscope.report import charts as chart_module

    rows = view.operator_rows(result)
    columns = operator_columns(result)
    counts = view.verdict_counts(result)
    shares = view.verdict_time_share(result)
    score = view.readiness_score(result)
    if charts is None:
        charts = chart_module.all_charts(result)
    chart_titles = {"time_by_phase": "Operator time by phase and verdict",
                    "dynamic_shapes": "Shapes per step of dynamic operators"}
    fixes = view.top_fixes(result)
    na_count = counts.get("not-applicable", 0)
    return {
        "script_name": Path(result.script).name if result.script else "unknown script",
        "tool_version": result.tool_version or "",
        "complete": bool(result.complete),
        "verdicts_computed": view.verdicts_computed(result) or not result.operators,
        "incomplete_reason": result.incomplete_reason or result.exit.kind or view.NA,
        "score_text": f"{score:.0f}" if score is not None else view.NA,
        "score_class": _score_class(score, result),
        "verdict_line": headline.verdict_line(result),
        "scan_state": headline.scan_state(result)[0],
        "nothing_to_change": headline.nothing_to_change_text(result),
        "na_count": na_count,
        "operator_count": len(result.operators),
        "blocking_count": sum(counts.get(v, 0) for v in view.BLOCKING),
        "dynamic_count": len(result.dynamic_shapes),
        "finding_count": len(result.findings),
        "target": headline.target_text(result),
        "verdicts": [{"name": v, "count": counts.get(v, 0), "share": view.fmt_percent(shares.get(v))}
                     for v in VERDICTS],
        "metadata": headline.scan_metadata(result),
        "notes": [str(n) for n in result.notes or []],
        "fixes": [_fix_row(f) for f in fixes],
        "numeric_hint": view.VERIFY_HINT.format(run_dir="RUN_DIR").split("`"),   # [before, command, after]
        "numeric_checks": [{"what": c.what, "line": c.line(), "share": view.fmt_percent(c.share),
                            "filter": c.ops[0] if len(c.ops) == 1 else ""}
                           for c in view.numeric_checks(result)],
        "charts": [(chart_titles.get(k, k), uri) for k, uri in charts.items() if uri],
        "columns": columns,
        "device_time": view.has_device_time(result),
        "ops_json": script_safe_json(_ops_payload(rows, columns)),
        "root_causes": [{"source": view.where_of(rc, result) or view.NA, "cause": view.root_cause_what(rc), "dims": view.fmt_dims(rc.varying_dims),
                         "ops": ", ".join(str(o) for o in rc.ops or []), "suggestion": rc.suggestion,
                         "evidence": rc.evidence} for rc in result.root_causes],
        "dynamic_shapes": [{"op": ds.op, "source": view.where_of(ds, result) or view.NA, "cause": ds.cause,
                            "dims": view.fmt_dims(ds.varying_dims), "root_cause": ds.root_cause or view.NA,
                            "suggestion": ds.suggestion} for ds in result.dynamic_shapes],
        "findings": [{"severity": f.severity or "warning",
                      "where": view.where_of(f, result) or view.NA,
                      "api": f.api, "origin": f.origin, "count": int(f.count or 1),
                      "replacement": f.replacement or "", "message": f.message, "snippet": f.snippet}
                     for f in result.findings],
        "remaps": [{"where": view.where_of(f, result) or view.NA, "api": f.api,
                    "became": f.remapped_to, "count": int(f.count or 1)}
                   for f in result.findings if getattr(f, "remapped_to", None)],
        "verification": _verification_context(result.verification),
        "npu": _npu_context(result),
        "memory_fit": _memory_fit_context(result.memory_fit),
        "third_party": [dict(zip(("library", "version", "ascend", "ops", "share"),
                                 row[:4] + [view.fmt_percent(row[4])], strict=True))
                        for row in view.third_party_rows(result)],
        "fake_places": result.fake_mode.places if result.fake_mode is not None else None,
        "glossary": glossary.terms(),
        "plan": _plan_context(result.plan, result),
        "css": _asset("report.css"),
        "js": _asset("report.js"),
    }


def render_html(result: ScanResult, charts: dict | None = None) -> str:
    """The report as one HTML string (pass ``charts={}`` to skip matplotlib)."""
    return _environment().get_template(TEMPLATE).render(**build_context(result, charts))


def write_html(result: ScanResult, path: Path, charts: dict | None = None) -> Path:
    path = Path(path)
    path.write_text(render_html(result, charts), encoding="utf-8")
    return path
