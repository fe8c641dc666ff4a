"""The "What will be slow on <chip>" section, one content for every report format.

Reads ``ScanResult.npu_estimate`` (opscope.analysis.npu.estimate) only.  Every figure
is labelled an estimate and carries its calibration error; the CPU times of the other
sections stay labelled "on this machine".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opscope.model import NpuEstimate

HEADERS = ["#", "what (estimate)", "where", "est. NPU ms/step", "kernels", "why it is slow", "fix"]
TOP = 12


@dataclass
class Section:
    title: str
    sentences: list[str] = field(default_factory=list)
    calibration: list[str] = field(default_factory=list)
    fps: list[list] = field(default_factory=list)          # devices, step ms, FPS, bound
    rows: list[list] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)         # per row: the kernel that costs most, and its pricing rule
    more: int = 0

    def rows_with_rules(self) -> list[list]:
        """The rows with each rule in brackets after the kernels (Markdown, XLSX, terminal; HTML shows it on hover)."""
        return [[*r[:4], f"{r[4]} [{rule}]" if rule else r[4], *r[5:]] for r, rule in zip(self.rows, self.rules or
                                                                                       [""] * len(self.rows), strict=True)]


def _ms(us) -> str:
    return f"{(us or 0) / 1000:.2f}"


def build(result, top: int | None = TOP) -> Section | None:
    """The section's content, or None when the scan has no estimate (an older scan.json); a stored
    estimate that cannot be read gives a section saying so, never a failed report."""
    est = result.npu_estimate
    if est is None:
        return None
    try:
        return _build(est, top)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        return Section(title="What will be slow on the NPU (estimate)",
                       sentences=[f"The NPU estimate stored in scan.json could not be read ({type(exc).__name__}); "
                                  "run `opscope scan` again to store a fresh one."])


def _build(est: NpuEstimate, top: int | None) -> Section | None:
    from opscope.analysis.npu.estimate import bound_sentence
    step = est.step
    if not est.rows and step.is_empty():
        return None
    chip = est.chip or "?"
    batch = est.batch
    sentences = [bound_sentence(est, 1) + "."]
    sentences.append(f"Estimated NPU work per step: {_ms(step.device_us)} ms (cube {_ms(step.compute_us)}, "
                     f"vector {_ms(step.vector_us)}, TransData {_ms(step.transdata_us)} in "
                     f"{step.transdata_kernels:.0f} inserted kernels, AI CPU {_ms(step.aicpu_us)}); "
                     f"host launch {_ms(step.host_us)} ms for the step's operators.")
    if batch.value:
        sentences.append(f"FPS = batch x devices / step, batch {batch.value} ({batch.evidence or ''}).")
    else:
        sentences.append(f"FPS not computed: {batch.evidence or 'batch size unknown'}.")
    grads = est.gradients
    if grads.bytes:
        sentences.append(f"DDP all-reduce of {grads.bytes / 1e6:,.0f} MB of gradients ({grads.parameters} "
                         f"parameters) per step; {grads.evidence or ''}.")
    fps = [[w.devices, _ms(w.step_us), f"{w.fps:,.0f}" if w.fps else "-", w.bound, _ms(w.communication_us)]
           for w in step.per_world_size]
    rows: list[list] = []
    rules: list[str] = []
    ranked = est.rows
    shown = ranked if top is None else ranked[:top]
    for i, r in enumerate(shown, start=1):
        where = r.source or "-"
        if r.library and r.library != r.source:   # the library call inside the user's line
            where = f"{where} (in {r.library})"
        rows.append([i, r.operator, where, _ms(r.npu_time_us), r.kernels or "", r.reason or "", r.fix or ""])
        rules.append(r.priced_by or "")   # the kernel that costs most, and the rule that priced it
    calibration = [str(v) for v in est.calibration.values()]
    return Section(title=f"What will be slow on {chip} (estimate)", sentences=sentences, calibration=calibration,
                   fps=fps, rows=rows, rules=rules, more=max(0, len(ranked) - len(shown)))


FPS_HEADERS = ["devices", "est. step ms", "est. samples/s", "bound", "all-reduce ms"]


def markdown_lines(result, cell, table) -> list[str]:
    """Markdown lines (``cell``/``table`` are the Markdown reporter's escaping helpers)."""
    sec = build(result)
    if sec is None:
        return []
    out = ["", f"## {cell(sec.title)}", ""]
    out += ["- " + cell(s) for s in sec.sentences]
    out += [""] + table(FPS_HEADERS, sec.fps)
    if sec.rows:
        out += ["", "Operators ranked by estimated NPU time:", ""] + table(HEADERS, sec.rows_with_rules())
    if sec.more:
        out.append(f"\n… and {sec.more} more (report.xlsx, sheet NPU estimate).")
    out += ["", "_Calibration: " + cell("; ".join(sec.calibration)) + "_"]
    return out


def print_terminal(result, console) -> None:
    """The section for the terminal summary (rich)."""
    from rich.markup import escape
    from rich.table import Table
    sec = build(result, top=10)
    if sec is None:
        return
    console.print(f"[bold]{escape(sec.title)}[/]")
    for s in sec.sentences[:2]:
        console.print(escape(s))
    t = Table(header_style="bold", title_justify="left")
    for h in FPS_HEADERS:
        t.add_column(h, justify="right" if h != "bound" else "left")
    for row in sec.fps:
        t.add_row(*(escape(str(v)) for v in row))
    console.print(t)
    if sec.rows:
        t = Table(title="Top operators by estimated NPU time per step (not CPU time)", header_style="bold",
                  title_justify="left")
        for h in HEADERS:   # names and file:line never split mid-word (an ellipsis instead)
            t.add_column(h, overflow="ellipsis" if h in ("what (estimate)", "where") else "fold",
                         justify="right" if h in ("#", "est. NPU ms/step") else "left",
                         max_width=48 if h in ("why it is slow", "fix") else None)
        for row in sec.rows_with_rules():
            t.add_row(*(escape(str(v)) for v in row))
        console.print(t)
    console.print(f"[dim]estimates; calibration: {escape('; '.join(sec.calibration))}[/]")


def print_comparison(cmp: dict, console) -> None:
    """`opscope diff RUN NPU_PROFILE`: estimated vs measured per kernel family and per step."""
    from rich.markup import escape
    from rich.table import Table

    def ms(us):
        return "-" if us is None else f"{us / 1000:.2f}"

    def ratio(r):
        return "-" if r is None else f"{r:.2f}x"

    t = Table(title=f"NPU estimate ({escape(str(cmp.get('chip')))}, {cmp.get('devices')} device(s)) vs the measured "
                    "profile, per kernel family (ms per step)", header_style="bold", title_justify="left")
    for h in ("kernel family", "estimated", "measured", "estimated / measured"):
        t.add_column(h, justify="left" if h == "kernel family" else "right")
    for row in cmp["families"]:
        t.add_row(escape(row["family"]), ms(row["estimated_us"]), ms(row["measured_us"]), ratio(row["ratio"]))
    console.print(t)
    t = Table(title="Per step (ms)", header_style="bold", title_justify="left")
    for h in ("", "estimated", "measured", "estimated / measured"):
        t.add_column(h, justify="left" if not h else "right")
    for row in cmp["steps"]:
        t.add_row(escape(row["item"]), ms(row["estimated_us"]), ms(row["measured_us"]), ratio(row["ratio"]))
    console.print(t)
    bound = cmp.get("bound") or {}
    console.print(f"bound: estimated {bound.get('estimated')}, measured {bound.get('measured') or '-'}"
                  + (f"; slowest rank: {escape(str(cmp['slowest_rank']))}" if cmp.get("slowest_rank") and
                     len(cmp.get("ranks") or []) > 1 else ""))
