"""The port plan as every report shows it: one line, the changes, the install block (``ScanResult.plan``).

The plan itself is made by ``analysis/plan/releases.py`` (``opscope matrix plan RUN_DIR`` prints it in full);
this module only words it, so the terminal, HTML, Markdown and XLSX say the same thing.
"""
from __future__ import annotations

from opscope.model import PortPlan, ReleaseFacts

CHANGE_HEADERS = ["where", "package", "now", "planned", "why"]


def ranges_text(runs: list) -> str:
    """``[["2.1.0.post8", "2.14.0"]]`` -> ``2.1.0.post8 .. 2.14.0``."""
    return ", ".join(a if a == b else f"{a} .. {b}" for a, b in runs or [])


def release_text(facts: ReleaseFacts) -> str:
    """``torch_npu 2.12.0 (torch 2.12.0, Python 3.10-3.13, CANN 9.1.0)``."""
    python = facts.python
    py = f"Python {python[0]}-{python[-1]}" if len(python) > 1 else f"Python {python[0]}" if python else "Python ?"
    cann = facts.cann or "unknown"
    if facts.cann and facts.cann_inferred:
        cann += " (inferred)"
    return f"torch_npu {facts.torch_npu} (torch {facts.torch or '?'}, {py}, CANN {cann})"


def summary_line(plan: PortPlan) -> str:
    """One sentence: the release to install and the range of releases that run the scan."""
    best = ranges_text(plan.best_ranges)
    never = sum(1 for b in plan.blockers if not b.first_supported_in)
    if plan.all_native:
        where = f"every captured operator runs without CPU fallback on torch_npu {best}"
    else:
        where = (f"the fewest operator signatures do not run natively ({plan.fewest_blocking}) on torch_npu "
                 f"{best}")
        if never:
            where += f"; {never} operator(s) run natively on no release: replace them"
        if len(plan.blockers) > never:
            where += f"; {len(plan.blockers) - never} operator(s) block older releases"
    return f"Port plan: install {release_text(plan.planned)}; {where}."


def choice_line(plan: PortPlan) -> str | None:
    """Why the plan installs an older release than the newest that runs as many operators natively."""
    planned, newest = plan.planned, plan.newest
    if newest.torch_npu == planned.torch_npu:
        return None
    if planned.why == "asked for with --target":
        return f"Why {planned.torch_npu}: asked for with --target."
    pairing = "only an inferred CANN pairing" if newest.cann else "no CANN pairing"
    return (f"Why {planned.torch_npu}: {newest.torch_npu} runs as many operators natively, but has "
            f"{pairing} in Ascend's compatibility table yet.")


def change_rows(plan: PortPlan) -> list[list[str]]:
    """What in the scanned environment and the project's requirement files must change for the plan."""
    changes = plan.environment.changes if plan.environment else []
    return [[c.where or "", c.package or "", c.from_ or "not installed", c.to or "", c.reason or ""] for c in changes]


def blocker_rows(plan: PortPlan) -> list[list[str]]:
    """Each operator that blocks an older release: the first release that runs it."""
    return [[b.op, ", ".join(b.verdicts), b.first_supported_in or "never", b.supported_from or "none",
             ranges_text(b.blocked_in)] for b in plan.blockers]


BLOCKER_HEADERS = ["operator", "verdict where blocked", "first release that runs it", "runs in every release from",
                   "blocked in"]


def install_text(plan: PortPlan) -> str:
    return plan.install or ""


def notes(plan: PortPlan) -> list[str]:
    return list(plan.environment.notes) if plan.environment else []


def chip_line(result) -> str | None:
    """The chip part of the plan: the chip judged, its dtype findings, and whether the step fits its memory."""
    fit = result.memory_fit
    est = result.npu_estimate
    chip = (fit.chip if fit else None) or (est.chip if est else None) or result.settings.chip
    if not chip:
        return None
    from opscope.analysis.verdicts.chip_dtypes import is_chip_dtype_finding
    dtype = [f for f in result.findings if is_chip_dtype_finding(f)]
    errors = sum(1 for f in dtype if f.severity == "error")
    parts = [f"Chip {chip}: "
             + (f"{len(dtype)} dtype finding(s) ({errors} blocking), listed under what to change"
                if dtype else "no dtype the chip cannot run natively")]
    if fit:
        from opscope.analysis.npu.memory_fit import LAYOUT_NAMES, size_text
        peak, usable = size_text(fit.peak_bytes), size_text(fit.capacity_bytes)
        if fit.fits_one_card:
            parts.append(f"the step's peak {peak} fits one card ({usable} usable)")
        else:
            cards = {k: v.cards for k, v in fit.cards.items()}
            fewest = min(((n, k) for k, n in cards.items() if n), default=None)
            parts.append(f"the step's peak {peak} does NOT fit one card ({usable} usable)"
                         + (f": {fewest[0]} cards with {LAYOUT_NAMES.get(fewest[1], fewest[1])}" if fewest else ""))
    else:
        parts.append("memory fit not measured")
    return "; ".join(parts) + "."
