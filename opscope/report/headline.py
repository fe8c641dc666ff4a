"""The headline of a scan: how it ended, what stands in the way, what was scanned.

Reads the typed sections of ``ScanResult`` (``exit``, ``summary``, ``target``,
``settings``); every reporter (terminal, HTML, Markdown, XLSX) states a run's state
with these same sentences.
"""
from __future__ import annotations

from opscope.analysis.scan_result import partial_steps_text
from opscope.model import ScanResult
from opscope.report import view


def score_colour(score, result: ScanResult) -> str:
    """'good' / 'mid' / 'bad' for the score card: never 'good' while an error finding or a blocking
    operator remains, whatever the number says."""
    if score is None:
        return ""
    level = "good" if score >= 80 else "mid" if score >= 50 else "bad"
    blocking = any(view.verdict_of(op) in view.BLOCKING and op.verdict for op in result.operators)
    errors = any((f.severity or "") == "error" for f in result.findings)
    if level == "good" and (blocking or errors):
        level = "mid"
    return level


def measured_steps(result: ScanResult) -> int:
    """Training iterations captured whole: what a verdict can stand on (a step whose recording stopped
    part-way is not one)."""
    return sum(1 for s in result.steps or [] if s.complete and not (s.unrecorded or {}).get("after_calls"))


def scan_state(result: ScanResult) -> tuple[str, str]:
    """('complete' | 'incomplete' | 'failed', why): a failed scan measured no training iteration (no
    score), so it has no verdict; an incomplete one has one only for the steps it measured."""
    reason = str(result.incomplete_reason or result.exit.message or result.exit.kind or "")
    unavailable = str(result.summary.score_unavailable or "")
    if unavailable or (not result.complete and not measured_steps(result)):
        why = "; ".join(dict.fromkeys(r for r in (reason, unavailable) if r)) or "nothing was measured"
        return "failed", why
    if not result.complete:
        return "incomplete", reason or "the run stopped early"
    return "complete", ""


def nothing_to_change_text(result: ScanResult) -> str:
    """What an empty what-to-change list means: never 'nothing to change' for a run that was not seen."""
    state, why = scan_state(result)
    if state == "failed":
        return f"No verdict: the scan failed before any training iteration was measured ({why})."
    if state == "incomplete":
        n = measured_steps(result)
        return (f"No change found in the {n} step{'s' if n != 1 else ''} measured; the run stopped early "
                f"({why}), so what comes after was not seen.")
    return "Nothing to change: every operator seen runs on the NPU and no CUDA-only call was found."


def verdict_line(result: ScanResult) -> str:
    """One sentence: what stands between this script and a clean run on the chosen torch_npu."""
    target = result.target.version
    state, why = scan_state(result)
    if state == "failed":
        return f"Scan failed — no verdict{f' for torch_npu {target}' if target else ''}: {why}."
    head = f"On torch_npu {target}" if target else "On the NPU"
    lead = []
    if state == "incomplete":
        n = measured_steps(result)
        lead.append(f"Incomplete — {n} step{'s' if n != 1 else ''} measured ({why}).")
    partial = partial_steps_text(result.steps)
    if partial:   # a cut step leads: its operators after the cut are missing from everything below
        lead.append(f"Partial steps — {partial}.")
    if lead:
        head = " ".join([*lead, f"{head}, in what was {'recorded' if partial else 'measured'}"])
    if not view.verdicts_computed(result):
        return f"{head}: support verdicts were not computed for this scan."
    names: dict[str, set] = {v: set() for v in view.BLOCKING}
    for op in result.operators:
        if op.verdict in view.BLOCKING:
            names[op.verdict].add(op.name)
    parts = []
    for verdict, label in (("unsupported", "cannot run"), ("cpu-fallback", "fall back to the CPU"),
                           ("unknown", "are not covered by the support list")):
        if names[verdict]:
            n = len(names[verdict])
            parts.append(f"{n} operator{'s' if n != 1 else ''} {label if n != 1 else _singular(label)}")
    errors = sum(1 for f in result.findings if f.severity == "error" and not view.is_chip_finding(f))
    if errors:
        parts.append(f"{errors} CUDA-only call{'s' if errors != 1 else ''} must change")
    chip_errors = sum(1 for f in result.findings if f.severity == "error" and view.is_chip_finding(f))
    if chip_errors:
        parts.append(f"{chip_errors} line{'s' if chip_errors != 1 else ''} use{'' if chip_errors != 1 else 's'} "
                     "a dtype the chip cannot run")
    if result.root_causes:
        n = len(result.root_causes)
        parts.append(f"{n} line{'s' if n != 1 else ''} cause{'' if n != 1 else 's'} dynamic shapes")
    if not parts and state == "incomplete":
        return f"{head}: no operator blocks the port and no CUDA-only call must change; the rest was not seen."
    if not parts:
        return f"{head}: every operator seen runs on the NPU and no CUDA-only call must change."
    share = result.summary.blocking_time_share
    tail = f" ({view.fmt_percent(share)} of operator time not native)" if share else ""
    return f"{head}: " + ", ".join(parts) + tail + "."


def _singular(label: str) -> str:
    return {"fall back to the CPU": "falls back to the CPU",
            "are not covered by the support list": "is not covered by the support list"}.get(label, label)


def scan_metadata(result: ScanResult) -> list[tuple[str, str]]:
    """(label, text) pairs describing what was scanned, for the summary block."""
    asked_device = result.settings.requested_device
    if result.complete:
        status = "complete"
    else:
        status = "incomplete: " + str(result.incomplete_reason or result.exit.message or result.exit.kind or view.NA)
    steps = len(result.steps) if result.steps else 0
    asked = result.settings.steps
    return [
        ("Script", result.script or view.NA),
        ("Arguments", " ".join(str(a) for a in result.argv) if result.argv else "(none)"),
        ("Device", result.device + (f" (asked: {asked_device})" if asked_device not in (None, result.device) else "")),
        ("torch", result.torch_version or view.NA),
        ("Python", result.python_version or view.NA),
        ("Steps captured", f"{steps}" + (f" of {asked} asked" if asked else "")),
        ("Status", status),
        ("Started", result.started_at or view.NA),
        ("Duration", f"{result.duration_s:.1f} s" if result.duration_s else view.NA),
        ("opscope", result.tool_version or view.NA),
    ]


def target_text(result: ScanResult) -> str:
    target = result.target
    if target.is_empty():
        return view.NA
    text = f"{target.package or 'torch_npu'} {target.version or view.NA}"
    if target.source:
        text += f" ({target.source})"
    if target.torch_schema:  # whose composite/structured facts judged decompositions
        text += f", judged with {target.torch_schema}"
    return text
