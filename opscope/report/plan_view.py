"""The port plan as every report shows it: one line, the changes, the install block (``ScanResult.plan``).

The plan itself is made by ``analysis/plan/releases.py`` (``opscope matrix plan RUN_DIR`` prints it in full);
this module only words it, so the terminal, HTML, Markdown and XLSX say the same thing.
"""
from __future__ import annotations

CHANGE_HEADERS = ["where", "package", "now", "planned", "why"]


def ranges_text(runs: list) -> str:
    """``[["2.1.0.post8", "2.14.0"]]`` -> ``2.1.0.post8 .. 2.14.0``."""
    return ", ".join(a if a == b else f"{a} .. {b}" for a, b in runs or [])


def release_text(facts: dict) -> str:
    """``torch_npu 2.12.0 (torch 2.12.0, Python 3.10-3.13, CANN 9.1.0)``."""
    python = facts.get("python") or []
    py = f"Python {python[0]}-{python[-1]}" if len(python) > 1 else f"Python {python[0]}" if python else "Python ?"
    cann = facts.get("cann") or "unknown"
    if facts.get("cann") and facts.get("cann_inferred"):
        cann += " (inferred)"
    return f"torch_npu {facts.get('torch_npu')} (torch {facts.get('torch') or '?'}, {py}, CANN {cann})"


def summary_line(plan: dict) -> str:
    """One sentence: the release to install and the range of releases that run the scan."""
    planned = plan.get("planned") or {}
    best = ranges_text(plan.get("best_ranges") or [])
    blockers = plan.get("blockers") or []
    never = sum(1 for b in blockers if not b.get("first_supported_in"))
    if plan.get("all_native"):
        where = f"every captured operator runs without CPU fallback on torch_npu {best}"
    else:
        where = (f"the fewest operator signatures do not run natively ({plan.get('fewest_blocking')}) on torch_npu "
                 f"{best}")
        if never:
            where += f"; {never} operator(s) run natively on no release: replace them"
        if len(blockers) > never:
            where += f"; {len(blockers) - never} operator(s) block older releases"
    return f"Port plan: install {release_text(planned)}; {where}."


def choice_line(plan: dict) -> str | None:
    """Why the plan installs an older release than the newest that runs as many operators natively."""
    planned, newest = plan.get("planned") or {}, plan.get("newest") or {}
    if not newest.get("torch_npu") or newest.get("torch_npu") == planned.get("torch_npu"):
        return None
    if planned.get("why") == "asked for with --target":
        return f"Why {planned.get('torch_npu')}: asked for with --target."
    pairing = "only an inferred CANN pairing" if newest.get("cann") else "no CANN pairing"
    return (f"Why {planned.get('torch_npu')}: {newest['torch_npu']} runs as many operators natively, but has "
            f"{pairing} in Ascend's compatibility table yet.")


def change_rows(plan: dict) -> list[list[str]]:
    """What in the scanned environment and the project's requirement files must change for the plan."""
    env = plan.get("environment") or {}
    return [[str(c.get("where") or ""), str(c.get("package") or ""), str(c.get("from") or "not installed"),
             str(c.get("to") or ""), str(c.get("reason") or "")] for c in env.get("changes") or []]


def blocker_rows(plan: dict) -> list[list[str]]:
    """Each operator that blocks an older release: the first release that runs it."""
    return [[str(b.get("op") or ""), ", ".join(b.get("verdicts") or []), str(b.get("first_supported_in") or "never"),
             str(b.get("supported_from") or "none"), ranges_text(b.get("blocked_in") or [])]
            for b in plan.get("blockers") or []]


BLOCKER_HEADERS = ["operator", "verdict where blocked", "first release that runs it", "runs in every release from",
                   "blocked in"]


def install_text(plan: dict) -> str:
    return str(plan.get("install") or "")


def notes(plan: dict) -> list[str]:
    return [str(n) for n in (plan.get("environment") or {}).get("notes") or []]


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
