"""A Markdown summary of a scan, for pull requests, issues and chat.

Short on purpose: the summary, the top fixes, the operators that need work,
dynamic-shape root causes and CUDA API findings.  The full table is in the HTML
and XLSX reports.
"""
from __future__ import annotations

from pathlib import Path

from opscope.model import VERDICTS, ScanResult, Verification
from opscope.report import headline, verification_view, view

MAX_ROWS = 50
TOP_OPERATORS = 12   # the costliest operators listed (a GPU scan's)


def _cell(value) -> str:
    """Text safe inside a Markdown table cell: no pipes, newlines or raw HTML, and no
    link/image syntax (``![t](http://...)`` from argv must not load a remote image)."""
    text = "" if value is None else str(value)
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    for char in "[]!`":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _table(headers: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(result: ScanResult) -> str:
    """The Markdown summary of ``result``: headline, port plan, verdicts, fixes, what needs work, details."""
    score = view.readiness_score(result)
    counts = view.verdict_counts(result)
    shares = view.verdict_time_share(result)
    name = Path(result.script).name if result.script else "unknown script"
    out = [f"# NPU readiness: {_cell(name)}", "", f"**{_cell(headline.verdict_line(result))}**", ""]
    out.append(f"**Readiness score:** {view.NA if score is None else f'{score:.0f}/100'} · "
               f"**target:** {_cell(headline.target_text(result))} · "
               f"**operator signatures:** {len(result.operators)}")
    if not result.complete:
        out += ["", f"> **Incomplete scan:** {_cell(result.incomplete_reason or view.NA)}"]
    out += _plan_lines(result)
    out += ["", "## Verdicts", ""]
    out += _table(["verdict", "signatures", "time share"],
                  [[v, counts.get(v, 0), view.fmt_percent(shares.get(v))] for v in VERDICTS])
    out += ["", "## Scan", ""] + _table(["", ""], [list(item) for item in headline.scan_metadata(result)])

    fixes = view.top_fixes(result)
    out += ["", "## Top things to fix", ""]
    if fixes:
        out += _table(["#", "kind", "what", "where", "time affected", "fix"],
                      [[i, f.kind, f.what, f.where, view.fmt_percent(f.share) if f.share is not None else "—", f.fix]
                       for i, f in enumerate(fixes, start=1)])
    else:
        out.append(_cell(headline.nothing_to_change_text(result)))
    libraries = view.third_party_rows(result)
    if libraries:
        out += ["", "## Third-party libraries", ""]
        out += _table(view.THIRD_PARTY_HEADERS, [row[:4] + [view.fmt_percent(row[4])] for row in libraries])
    from opscope.report.npu_section import markdown_lines
    out += markdown_lines(result, _cell, _table)

    checks = view.numeric_checks(result)
    if checks:
        before, command, after = view.VERIFY_HINT.format(run_dir="RUN_DIR").split("`")   # one code span
        out += ["", "## Numerics to check", "", f"{_cell(before)}`{command}`{_cell(after)} "
                "(RUN_DIR: the folder of this report).", ""]
        out += [f"- {_cell(c.line())} ({view.fmt_percent(c.share)} of time)" for c in checks[:MAX_ROWS]]

    blocking = view.not_supported_rows(view.operator_rows(result))
    out += ["", f"## Operators that need work ({len(blocking)})", ""]
    if blocking:
        out += _table(["operator", "verdict", "calls", "input shapes", "time share", "source", "substitute"],
                      [[r.name, r.verdict, r.calls, r.shapes, view.fmt_percent(r.share), r.source, r.substitute]
                       for r in blocking[:MAX_ROWS]])
        if len(blocking) > MAX_ROWS:
            out.append(f"\n… and {len(blocking) - MAX_ROWS} more (see report.html / report.xlsx).")
    else:
        out.append("None.")

    out += _detail_lines(result)
    if result.verification is not None and not result.verification.is_empty():
        out += _verification_lines(result.verification)
    return "\n".join(out) + "\n"


def _detail_lines(result: ScanResult) -> list[str]:
    """The sections after the operators that need work, each only when the scan has it: the GPU's costliest
    operators, dynamic-shape root causes, CUDA API findings, the memory fit and fake mode's places."""
    out: list[str] = []
    if view.has_device_time(result):   # a GPU run: where the step's kernel time goes
        costly = [row for row in view.costliest_operators(result) if row[1] > 0]
        out += ["", "## Costliest operators on the GPU", "",
                "Steady-state time per step of the kernels each operator launched, and its own host (CPU) time.", ""]
        out += _table(["operator", "verdict", "input shapes", "GPU ms/step", "host ms/step", "calls", "source"],
                      [[op.qualified_name, view.verdict_of(op), view.fmt_shapes(op.input_shapes),
                        f"{device_us / 1000:.3f}", f"{host_us / 1000:.3f}", op.calls, view.where_of(op, result)]
                       for op, device_us, host_us in costly[:TOP_OPERATORS]])
    if result.root_causes:
        out += ["", "## Dynamic shapes: lines to fix", ""]
        out += _table(["source line", "cause", "varying dims", "affected ops", "suggested fix"],
                      [[view.where_of(rc, result), view.root_cause_what(rc), view.fmt_dims(rc.varying_dims), ", ".join(map(str, rc.ops or [])),
                        rc.suggestion] for rc in result.root_causes])
    if result.findings:
        out += ["", "## CUDA-specific APIs", ""]
        out += _table(["severity", "location", "API", "replacement"],
                      [[f.severity, view.where_of(f, result) if f.file else view.NA, f.api, f.replacement or ""]
                       for f in result.findings[:MAX_ROWS]])
    if result.memory_fit:
        from opscope.analysis.npu.memory_fit import basis_text, one_line, rows
        out += ["", "## Memory fit", "", one_line(result.memory_fit), ""]
        out += _table(["layout", f"cards needed ({result.memory_fit.chip})", "GiB per card"],
                      [[r["layout"], r["cards"] or "does not fit", r["per_card_gib"]] for r in rows(result.memory_fit)])
        out += ["", _cell(basis_text(result.memory_fit))]
    if result.fake_mode is not None:
        out += ["", "## Fake mode", "", f"Operator times: {result.fake_mode.timings}.", ""]
        out += _table(["location", "what", "operator", "calls", "policy (results can differ from a real run)"],
                      [[p.where, p.kind, p.op, p.count, p.policy] for p in result.fake_mode.places])
    return out


def _verification_lines(verification: Verification) -> list[str]:
    """Counts per outcome, the signatures that did not pass and the e2e verdict."""
    counts = verification_view.verification_counts(verification)
    out = ["", f"## Verification on {_cell(verification.device or view.NA)}", ""]
    out += _table(["outcome", "signatures"], [[o, counts[o]] for o in verification_view.OUTCOMES])
    bad = [r for r in verification_view.verification_rows(verification) if r.outcome in ("fail", "error", "warn")]
    if bad:
        out += [""] + _table(["operator", "outcome", "cosine", "max rel err", "message"],
                             [[r.op + (f".{r.overload}" if r.overload else ""), r.outcome,
                               verification_view.fmt_metric(r.cosine, 6),
                               verification_view.fmt_metric(r.max_rel_err), r.message]
                              for r in bad[:MAX_ROWS]])
    e2e = verification_view.e2e_summary(verification)
    if e2e is not None:
        out += ["", f"**End-to-end losses ({_cell(e2e['candidate'])} vs {_cell(e2e['reference_device'])}):** "
                    f"{_cell(e2e['verdict'])}: {_cell(e2e['message'])}"]
    return out


def write_markdown(result: ScanResult, path: Path) -> Path:
    path = Path(path)
    path.write_text(render_markdown(result), encoding="utf-8")
    return path


def _plan_lines(result: ScanResult) -> list[str]:
    """The port plan, first after the verdict: the release, what must change, the install block."""
    if result.plan is None:
        return []
    from opscope.report import plan_view
    plan = result.plan
    out = ["", "## Port plan", "", _cell(plan_view.summary_line(plan))]
    choice = plan_view.choice_line(plan)
    if choice:
        out += ["", _cell(choice)]
    chip = plan_view.chip_line(result)
    if chip:
        out += ["", _cell(chip)]
    if plan_view.change_rows(plan):
        out += ["", *_table(plan_view.CHANGE_HEADERS, plan_view.change_rows(plan))]
    if plan_view.blocker_rows(plan):
        out += ["", *_table(plan_view.BLOCKER_HEADERS, plan_view.blocker_rows(plan))]
    fence = "`" * 3
    install = plan_view.install_text(plan).replace(fence, "'" * 3)
    return out + ["", "Install on the Ascend machine:", "", fence + "sh", install, fence]

