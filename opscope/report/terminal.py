"""Compact terminal summary of a scan (rich tables)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from opscope.model import ScanResult

VERDICT_STYLE = {"native": "green", "composite": "green", "cpu-fallback": "yellow", "unsupported": "red",
                 "not-applicable": "dim", "unknown": "magenta"}


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def print_summary(result: ScanResult, console: Console | None = None, top: int = 12) -> None:
    console = console or Console()
    status = "[green]complete[/]" if result.complete else f"[red]incomplete[/]: {result.incomplete_reason}"
    console.print(f"[bold]opscope scan[/] {result.script}  device={result.device}  torch={result.torch_version}  "
                  f"steps={len(result.steps)}  {status}")
    summary = result.summary or {}
    if summary:
        from opscope.analysis.verdicts import describe_readiness
        counts = summary.get("verdict_counts") or {}
        parts = [f"[{VERDICT_STYLE.get(k, '')}]{k}[/]={v}" for k, v in counts.items() if v]
        console.print(f"[bold]{describe_readiness(summary, result.target)}[/]")
        console.print("operator signatures by verdict: " + "  ".join(parts))
    table = Table(title="Top operators by self time", show_lines=False, header_style="bold")
    for col in ("operator", "calls", "self ms", "phase", "source", "verdict"):
        table.add_column(col, overflow="fold")
    for op in result.operators[:top]:
        verdict = op.verdict or "-"
        table.add_row(op.qualified_name, str(op.calls), _ms(op.self_time_us), op.phase, op.source or "-",
                      f"[{VERDICT_STYLE.get(verdict, '')}]{verdict}[/]" if op.verdict else "-")
    console.print(table)
    attention = [op for op in result.operators if op.verdict in ("cpu-fallback", "unsupported", "unknown")]
    if attention:
        t = Table(title="Operators that will not run natively on the NPU", header_style="bold")
        for col in ("operator", "verdict", "calls", "source", "substitute"):
            t.add_column(col, overflow="fold")
        for op in attention[:top]:
            t.add_row(op.qualified_name, op.verdict, str(op.calls), op.source or "-",
                      (op.substitute or {}).get("replacement", "-") if op.substitute else "-")
        console.print(t)
    if result.root_causes:
        t = Table(title=f"Dynamic shapes: {len(result.root_causes)} root cause(s), "
                        f"{len(result.dynamic_shapes)} dynamic operator(s)", header_style="bold")
        for col in ("line to fix", "cause", "ops", "fix"):
            t.add_column(col, overflow="fold")
        for rc in result.root_causes[:top]:
            ops = ", ".join(rc.ops[:4]) + (f" +{len(rc.ops) - 4}" if len(rc.ops) > 4 else "")
            t.add_row(rc.source or "?", rc.kind or rc.cause, ops, rc.suggestion)
        console.print(t)
    else:
        console.print("Dynamic shapes: none (every operator kept the shapes of the first step)")
    if result.findings:
        t = Table(title=f"CUDA-specific APIs: {len(result.findings)} finding(s)", header_style="bold")
        for col in ("where", "rule", "api", "replacement"):
            t.add_column(col, overflow="fold")
        for f in result.findings[:top]:
            t.add_row(f"{f.file}:{f.line}", f.rule, f.api, f.replacement or "-")
        console.print(t)
    remaps = remapped_calls(result)
    if remaps:
        t = Table(title=f"Remapped for this scan (no {result.device if result.device != 'cpu' else 'GPU'} "
                        f"needed): {len(remaps)} call site(s)", header_style="bold")
        for col in ("where", "api", "became", "calls"):
            t.add_column(col, overflow="fold")
        for f in remaps:
            t.add_row(f"{f.file}:{f.line}", f.api, f.remapped_to, str(f.count))
        console.print(t)
    for note in result.notes:
        console.print(f"[dim]note: {note}[/]")


def remapped_calls(result: ScanResult) -> list:
    """Run-time findings whose call opscope changed to let the script run here."""
    return [f for f in result.findings if getattr(f, "remapped_to", None)]
