"""Terminal output of `opscope verify`: a progress bar while replaying, tables after."""
from __future__ import annotations

from contextlib import contextmanager

from opscope.model import Verification
from opscope.report.verification_view import OUTCOME_ORDER

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "red", "measured": "blue", "skipped": "dim"}


@contextmanager
def progress_bar(console, total_label: str = "verifying"):
    """Yields ``update(done, total, result)`` that drives a rich progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[op]}", style="dim"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(total_label, total=None, op="")

        def update(done: int, total: int, result) -> None:
            bar.update(task, completed=done, total=total, op=f"{result.op} {result.outcome}")

        yield update


def _fmt(value, digits=4):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _dtypes(dtypes) -> str:
    return ",".join(str(d).replace("c10::", "") for d in dtypes or [] if d not in ("Scalar", "ScalarList", ""))


def print_verification(verification: Verification, console, top: int = 20, show_skipped: bool = False) -> None:
    """Counts per outcome, then the worst signatures with the msprobe metrics."""
    from rich.table import Table
    counts = verification.counts or {}
    summary = Table(title=f"Operator verification on {verification.device} "
                          f"({verification.inputs or 'synthetic'} inputs)", show_lines=False)
    for outcome in ("pass", "warn", "fail", "error", "measured", "skipped"):
        summary.add_column(outcome, justify="right", style=STYLE[outcome])
    summary.add_column("disagreements", justify="right")
    summary.add_row(*[str(counts.get(k, 0)) for k in ("pass", "warn", "fail", "error", "measured", "skipped",
                                                        "disagreements")])
    console.print(summary)
    if verification.device == "cpu":
        console.print("[blue]--device cpu: the device run would be the reference run, so nothing is judged; "
                      "'measured' rows are the CPU's own kernels against float64 (CPU numerics, not NPU "
                      "evidence). Substitutes are real comparisons.[/]")
    results = sorted(verification.results or [], key=lambda r: OUTCOME_ORDER.get(r.outcome or "", 9))
    rows = [r for r in results if show_skipped or r.outcome != "skipped"]
    if not rows:
        print_substitutes(verification, console)
        return
    table = Table(title=f"Signatures (worst first, {min(top, len(rows))} of {len(rows)})")
    for name in ("outcome", "op", "dtypes", "cosine", "max abs err", "max rel err", "<0.1%", "<0.5%",
                 "standard", "message"):
        table.add_column(name, overflow="fold")
    for row in rows[:top]:
        message = row.message or ""
        if row.disagreement:
            message = f"{row.disagreement}; {message}".strip("; ")
        m = row.metrics or {}   # msprobe's metrics by name
        table.add_row(f"[{STYLE.get(row.outcome or '', '')}]{row.outcome}[/]",
                      (row.op or "") + (f".{row.overload}" if row.overload else ""), _dtypes(row.dtypes),
                      _fmt(m.get("cosine"), 6), _fmt(m.get("max_abs_err")), _fmt(m.get("max_rel_err")),
                      _fmt(m.get("ratio_rel_err_lt_0_001")), _fmt(m.get("ratio_rel_err_lt_0_005")),
                      row.standard or "-", message[:160])
    console.print(table)
    print_substitutes(verification, console)


def print_substitutes(verification: Verification, console) -> None:
    """The suggested substitutes replayed against the ops they replace."""
    from rich.table import Table
    rows = verification.substitutes or []
    if not rows:
        return
    table = Table(title="Suggested substitutes, replayed against the original on the captured shapes")
    for name in ("outcome", "op", "dtypes", "substitute", "result"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(f"[{STYLE.get(row.outcome or '', '')}]{row.outcome}[/]", row.op or "", _dtypes(row.dtypes),
                      row.check or "", (row.message or "")[:200])
    console.print(table)


def print_e2e(e2e: dict, console) -> None:
    """Loss per step on the reference and the candidate, and the verdict."""
    from rich.table import Table
    table = Table(title=f"End-to-end: {e2e.get('reference_device')} vs {e2e.get('candidate')} "
                        f"({e2e.get('steps')} steps, seed {e2e.get('seed')})")
    for name in ("step", "loss (reference)", "loss (candidate)", "abs diff", "rel diff", "grad norm ref",
                 "grad norm cand", "ok"):
        table.add_column(name, justify="right")
    grads = {row["step"]: row for row in e2e["comparison"]["grad_norm"]["steps"]}
    for row in e2e["comparison"]["loss"]["steps"]:
        g = grads.get(row["step"], {})
        table.add_row(str(row["step"]), _fmt(row["reference"], 7), _fmt(row["candidate"], 7),
                      _fmt(row["abs_diff"], 3), _fmt(row["rel_diff"], 3), _fmt(g.get("reference"), 5),
                      _fmt(g.get("candidate"), 5), "[green]yes[/]" if row["ok"] else "[red]no[/]")
    console.print(table)
    verdict = e2e["comparison"]["verdict"]
    console.print(f"[{STYLE.get(verdict, 'bold')}]e2e {verdict}[/]: {e2e['comparison']['message']}")
