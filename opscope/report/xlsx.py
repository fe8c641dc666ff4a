"""Write the readiness workbook (openpyxl): one sheet per question a porter asks.

Every sheet has a frozen header row, an autofilter and readable widths; numbers
stay numbers.  Text from the scan (operator names, paths, argv) is written as a
string cell with Excel's quote prefix, so ``=HYPERLINK(...)`` in a file name is
shown, never evaluated.
"""
from __future__ import annotations

import math
from pathlib import Path

from opscope.model import VERDICTS, FakeMode, MemoryFit, PortPlan, ScanResult, Verification
from opscope.report import headline, verification_view, view
from opscope.report.cells import set_cell

MAX_WIDTH = 60
PERCENT = "0.0%"
MS = "0.000"


def _text_cell(cell, value) -> None:
    """Store user text as text: openpyxl would otherwise turn '=...' into a formula (and
    refuse control characters such as the ANSI colours of a captured error message)."""
    set_cell(cell, value)


def _sheet(wb, title: str, headers: list[str], rows, formats: dict | None = None,
           verdict_col: int | None = None, fills: dict | None = None):
    """Append a table sheet. ``formats`` maps a column index to a number format."""
    from openpyxl.styles import Font, PatternFill
    from openpyxl.utils import get_column_letter

    ws = wb.create_sheet(title)
    for c, header in enumerate(headers, start=1):
        set_cell(ws.cell(row=1, column=c), header)
        ws.cell(row=1, column=c).font = Font(bold=True)
    formats = formats or {}
    fill_cache: dict = {}
    widths = [len(h) for h in headers]
    for r, row in enumerate(rows, start=2):
        for c, value in enumerate(row, start=1):
            cell = ws.cell(row=r, column=c)
            set_cell(cell, value)
            if not isinstance(cell.value, str) and c - 1 in formats and value is not None:
                cell.number_format = formats[c - 1]
            if cell.value is not None:
                widths[c - 1] = max(widths[c - 1], min(len(str(cell.value)), MAX_WIDTH))
        if verdict_col is not None and fills:
            verdict = row[verdict_col]
            if verdict in fills:
                fill = fill_cache.get(verdict) or fill_cache.setdefault(
                    verdict, PatternFill("solid", start_color=fills[verdict], end_color=fills[verdict]))
                ws.cell(row=r, column=verdict_col + 1).fill = fill
    for c, width in enumerate(widths, start=1):
        ws.column_dimensions[get_column_letter(c)].width = max(8, width + 2)
    ws.freeze_panes = "A2"
    ws.auto_filter.ref = f"A1:{get_column_letter(len(headers))}{max(1, ws.max_row)}"
    return ws


OPERATOR_HEADERS = ["operator", "verdict", "calls", "input shapes", "dtypes", "time ms", "time share",
                    "phase", "source", "dynamic", "evidence", "substitute", "evidence details"]


# a scan that measured device time (a GPU run): time is the kernels' on the GPU, the host's own time beside it
DEVICE_OPERATOR_HEADERS = ["operator", "verdict", "calls", "input shapes", "dtypes", "GPU time ms", "host time ms",
                           "GPU time share", "phase", "source", "dynamic", "evidence", "substitute",
                           "evidence details"]


def _operator_table(rows: list[view.OperatorRow], device: bool = False):
    if device:
        return [[r.name, r.verdict, r.calls, r.shapes, r.dtypes, r.time_us / 1000, r.host_time_us / 1000, r.share,
                 r.phase, r.source, r.dynamic, r.evidence, r.substitute, r.evidence_detail] for r in rows]
    return [[r.name, r.verdict, r.calls, r.shapes, r.dtypes, r.time_us / 1000, r.share, r.phase,
             r.source, r.dynamic, r.evidence, r.substitute, r.evidence_detail] for r in rows]


FIX_HEADERS = ["#", "kind", "severity", "what", "where", "time share", "change", "why", "operators"]


def _fix_table(result: ScanResult):
    """The ranked "what to change" list, in the order of the HTML report (all of it, not only the top)."""
    return [[i, f.kind, f.severity, f.what, f.where, f.share, f.fix, f.detail, ", ".join(f.ops)]
            for i, f in enumerate(view.top_fixes(result, limit=None), start=1)]


VERIFICATION_HEADERS = ["operator", "overload", "input shapes", "dtypes", "outcome", "cosine", "max abs err",
                        "max rel err", "standard", "message", "predicted verdict", "disagreement"]
E2E_HEADERS = ["step", "loss (reference)", "loss (candidate)", "abs diff", "rel diff", "grad norm ref",
               "grad norm cand", "ok"]
METRIC = "0.000000"
SCIENTIFIC = "0.00E+00"


def _finite(value):
    """Numbers stay numbers; inf/nan (not storable as an xlsx number) become their text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _add_verification(wb, summary_ws, verification: Verification) -> None:
    """Outcome counts on the Summary sheet, the replayed signatures (worst first) and e2e losses."""
    from openpyxl.styles import PatternFill

    counts = verification_view.verification_counts(verification)
    for outcome in verification_view.OUTCOMES:
        summary_ws.append([f"verification: {outcome}", counts[outcome], None])
        colour: str | None = verification_view.OUTCOME_FILLS[outcome]
        summary_ws.cell(row=summary_ws.max_row, column=1).fill = PatternFill("solid", start_color=colour,
                                                                             end_color=colour)
    summary_ws.append(["verification device", None, None])
    _text_cell(summary_ws.cell(row=summary_ws.max_row, column=2), verification.device or view.NA)
    summary_ws.auto_filter.ref = f"A1:C{summary_ws.max_row}"

    rows = [[r.op, r.overload, r.shapes, r.dtypes, r.outcome, _finite(r.cosine), _finite(r.max_abs_err),
             _finite(r.max_rel_err),
             r.standard, r.message, r.predicted_verdict, r.disagreement]
            for r in verification_view.verification_rows(verification)]
    _sheet(wb, "Verification", VERIFICATION_HEADERS, rows, formats={5: METRIC, 6: SCIENTIFIC, 7: SCIENTIFIC},
           verdict_col=4, fills=verification_view.OUTCOME_FILLS)

    e2e = verification_view.e2e_summary(verification)
    if e2e is not None:
        steps = [[s["step"]] + [_finite(s[k]) for k in ("reference", "candidate", "abs_diff", "rel_diff",
                                                           "grad_reference", "grad_candidate")]
                 + ["yes" if s["ok"] else "no"] for s in e2e["steps"]]
        steps.append([f"verdict: {e2e['verdict']}", None, None, None, None, None, None, e2e["message"]])
        ws = _sheet(wb, "E2E losses", E2E_HEADERS, steps, formats={3: SCIENTIFIC, 4: SCIENTIFIC})
        colour = verification_view.OUTCOME_FILLS.get(e2e["verdict"])
        if colour:
            ws.cell(row=ws.max_row, column=1).fill = PatternFill("solid", start_color=colour, end_color=colour)


def _number(value):
    """'1,234.5' -> 1234.5 (numbers stay numbers in the workbook); other text unchanged."""
    try:
        return float(str(value).replace(",", "")) if not isinstance(value, (int, float)) else value
    except ValueError:
        return value


def _add_npu_estimate(wb, result: ScanResult) -> None:
    """Sheet "NPU estimate": the bound, FPS per device count, then every operator by estimated NPU time."""
    from openpyxl.styles import Font

    from opscope.report.npu_section import FPS_HEADERS, HEADERS, build
    sec = build(result, top=None)
    if sec is None:
        return
    ws = _sheet(wb, "NPU estimate", [sec.title], [])
    lines: list[list] = [[s] for s in sec.sentences] + [["calibration: " + "; ".join(sec.calibration)], []]
    lines += [list(FPS_HEADERS)] + [[_number(v) for v in r] for r in sec.fps] + [[]]
    header_rows = {len(lines) - len(sec.fps) - 1 + 1, len(lines) + 2}
    lines += [list(HEADERS)] + [[r[0], r[1], r[2], float(r[3]), *r[4:]] for r in sec.rows_with_rules()]
    for r, row in enumerate(lines, start=2):
        for c, value in enumerate(row, start=1):
            set_cell(ws.cell(row=r, column=c), value)
            if r in header_rows:
                ws.cell(row=r, column=c).font = Font(bold=True)
    for column, width in (("A", 12), ("B", MAX_WIDTH), ("C", 30), ("D", 16), ("E", 40), ("F", MAX_WIDTH), ("G", MAX_WIDTH)):
        ws.column_dimensions[column].width = width


def _plan_rows(result: ScanResult, plan: PortPlan) -> list[list]:
    """The port plan as rows: the release, why it, the chip, what must change, blockers, the install block."""
    from opscope.report import plan_view
    plan_rows = [["plan", "", "", "", plan_view.summary_line(plan)]]
    choice = plan_view.choice_line(plan)
    if choice:
        plan_rows.append(["why this release", "", "", "", choice])
    chip = plan_view.chip_line(result)
    if chip:
        plan_rows.append(["chip", "", "", "", chip])
    plan_rows += [["change", *row[:3], f"{row[3]} ({row[4]})"] for row in plan_view.change_rows(plan)]
    plan_rows += [["runs natively on no release" if row[2] == "never" else "blocks older releases", row[0], row[1],
                   row[2], f"runs in every release from {row[3]}"] for row in plan_view.blocker_rows(plan)]
    plan_rows += [["install", "", "", "", line] for line in plan_view.install_text(plan).splitlines()]
    return plan_rows


def _add_fixes(wb, result: ScanResult) -> None:
    """Sheet "Fixes": the ranked list of what to change, coloured by severity."""
    fixes_ws = _sheet(wb, "Fixes", FIX_HEADERS, _fix_table(result), formats={5: PERCENT},
                      verdict_col=2, fills={"error": "FFCDD2", "warning": "FFE0B2", "info": "BBDEFB"})
    for column in ("D", "G"):
        fixes_ws.column_dimensions[column].width = MAX_WIDTH


def _add_summary(wb, result: ScanResult) -> None:
    """Sheet "Summary": verdict, score, target, scan metadata, verdict counts, top fixes and numerics to check."""
    counts = view.verdict_counts(result)
    shares = view.verdict_time_share(result)
    score = view.readiness_score(result)

    summary = [["verdict", headline.verdict_line(result), None],
               ["readiness score (0-100)", score if score is not None else view.NA, None],
               ["target", headline.target_text(result), None],
               ["operator signatures", len(result.operators), None]]
    summary += [[label, text, None] for label, text in headline.scan_metadata(result)]
    summary += [[f"verdict: {v}", counts.get(v, 0), shares.get(v, 0.0)] for v in VERDICTS]
    summary += [[f"fix {i}: {f.kind}", f"{f.what} @ {f.where}: {f.fix}" if f.where else f"{f.what}: {f.fix}",
                 f.share] for i, f in enumerate(view.top_fixes(result), start=1)]
    summary += [[f"numerics to check: {c.what}", c.line(), c.share] for c in view.numeric_checks(result)]
    ws = _sheet(wb, "Summary", ["item", "value", "time share"], summary, formats={2: PERCENT})
    ws.column_dimensions["B"].width = MAX_WIDTH


def _add_operators(wb, result: ScanResult, rows: list[view.OperatorRow]) -> None:
    """Sheets "Operators" and "Not supported", with device time columns when the scan measured them."""
    device = view.has_device_time(result)
    op_formats = {5: MS, 6: MS, 7: PERCENT} if device else {5: MS, 6: PERCENT}
    headers = DEVICE_OPERATOR_HEADERS if device else OPERATOR_HEADERS
    _sheet(wb, "Operators", headers, _operator_table(rows, device), formats=op_formats,
           verdict_col=1, fills=view.VERDICT_FILLS)
    _sheet(wb, "Not supported", headers, _operator_table(view.not_supported_rows(rows), device),
           formats=op_formats, verdict_col=1, fills=view.VERDICT_FILLS)


def _add_dynamic_shapes(wb, result: ScanResult) -> None:
    """Sheet "Dynamic shapes": the root causes, then each dynamic operator."""
    dynamic = [["root cause", view.where_of(rc, result) or view.NA, view.root_cause_what(rc),
                view.fmt_dims(rc.varying_dims),
                ", ".join(str(o) for o in rc.ops or []), rc.source or view.NA,
                rc.suggestion] for rc in result.root_causes]
    dynamic += [["dynamic op", view.where_of(ds, result) or view.NA, ds.cause, view.fmt_dims(ds.varying_dims), ds.op,
                 ds.root_cause or view.NA, ds.suggestion] for ds in result.dynamic_shapes]
    _sheet(wb, "Dynamic shapes", ["kind", "source line", "cause", "varying dims", "operators",
                                  "root cause line", "suggested fix"], dynamic)


def _add_findings(wb, result: ScanResult) -> None:
    """Sheet "Findings": the static scan's findings, one a row."""
    findings = [[f.severity, f.file or view.NA, f.line, f.column, f.api, f.replacement or "", f.origin,
                 int(f.count or 1), f.rule, f.message, f.snippet or ""] for f in result.findings]
    _sheet(wb, "Findings", ["severity", "file", "line", "column", "API", "replacement", "origin", "count",
                            "rule", "message", "snippet"], findings)


def _add_substitutes(wb, rows: list[view.OperatorRow]) -> None:
    """Sheet "Substitutes": calls and time share per operator and substitute, largest share first."""
    substitutes: dict = {}
    for r in rows:
        if r.substitute:
            entry = substitutes.setdefault((r.name, r.substitute), [r.name, r.verdict, r.substitute, 0, 0.0])
            entry[3] += r.calls
            entry[4] += r.share
    _sheet(wb, "Substitutes", ["operator", "verdict", "substitute (rationale)", "calls", "time share"],
           sorted(substitutes.values(), key=lambda e: -e[4]), formats={4: PERCENT},
           verdict_col=1, fills=view.VERDICT_FILLS)


def _add_memory_fit(wb, fit: MemoryFit) -> None:
    """Sheet "Memory fit": peak memory per step and the NPU cards it needs, per layout."""
    from opscope.analysis.npu.memory_fit import GIB, basis_text, one_line
    from opscope.analysis.npu.memory_fit import rows as fit_rows
    table = [[r["layout"], r["cards"] if r["cards"] else "does not fit", r["per_card_gib"]] for r in fit_rows(fit)]
    table += [["", "", None], [f"peak ({one_line(fit)})", "", round(fit.peak_bytes / GIB, 3)]]
    table += [[f"  {part}", "", round(value / GIB, 3)] for part, value in fit.parts.items()]
    table += [["", "", None], [basis_text(fit), "", None]]
    _sheet(wb, "Memory fit", ["layout / part", f"cards needed ({fit.chip})", "GiB per card"], table)


def _add_fake_mode(wb, fake_mode: FakeMode) -> None:
    """Sheet "Fake mode": where the scan ran without real tensors and the policy that stood in for them."""
    _sheet(wb, "Fake mode", ["location", "what", "operator", "calls", "policy (results can differ from a real run)"],
           [[p.where or view.NA, p.kind, p.op, p.count, p.policy] for p in fake_mode.places])


def build_workbook(result: ScanResult):
    """The workbook in memory (tests re-read it; write_xlsx saves it)."""
    from openpyxl import Workbook

    wb = Workbook()
    wb.remove(wb.active)
    _add_fixes(wb, result)
    if result.plan is not None:   # the port plan: the release, what must change, the install block (one line a row)
        _sheet(wb, "Plan", ["kind", "where / operator", "package / verdict", "now / first release", "planned"],
               _plan_rows(result, result.plan))
    _add_npu_estimate(wb, result)
    rows = view.operator_rows(result)
    _add_summary(wb, result)
    _add_operators(wb, result, rows)
    _add_dynamic_shapes(wb, result)
    _add_findings(wb, result)
    _add_substitutes(wb, rows)
    libraries = view.third_party_rows(result)
    if libraries:
        _sheet(wb, "Third-party", view.THIRD_PARTY_HEADERS, libraries, formats={5: PERCENT})
    if result.memory_fit:   # peak memory per step and the NPU cards it needs
        _add_memory_fit(wb, result.memory_fit)
    if result.fake_mode is not None:
        _add_fake_mode(wb, result.fake_mode)
    if result.verification is not None and not result.verification.is_empty():
        _add_verification(wb, wb["Summary"], result.verification)
    return wb


def write_xlsx(result: ScanResult, path: Path) -> Path:
    path = Path(path)
    build_workbook(result).save(path)
    return path
