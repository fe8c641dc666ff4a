"""Terminal table of CUDA-specific API findings (used by ``opscope scan --static-only``)."""
from __future__ import annotations

from collections import Counter

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_ORDER = {"error": 0, "warning": 1, "info": 2}


def print_findings(findings, console, limit: int | None = 200) -> None:
    """A rich table, most severe first, then a one-line count per severity."""
    from rich.table import Table

    findings = list(findings)
    if not findings:
        console.print("No CUDA-specific API found.")
        return
    ordered = sorted(findings, key=lambda f: (_ORDER.get(f.severity, 3), f.file or "", f.line or 0, f.rule))
    table = Table(title=f"CUDA-specific APIs: {len(findings)} finding(s)", header_style="bold", show_lines=False)
    table.add_column("severity")
    table.add_column("where", overflow="fold")
    table.add_column("rule")
    table.add_column("API", overflow="fold")
    table.add_column("NPU replacement", overflow="fold")
    shown = ordered if limit is None else ordered[:limit]
    for f in shown:
        where = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "")
        table.add_row(f"[{_STYLE.get(f.severity, '')}]{f.severity}[/]", where, f.rule, f.api,
                      f.replacement or f.message)
    console.print(table)
    if len(shown) < len(ordered):
        console.print(f"... {len(ordered) - len(shown)} more in findings.json")
    counts = Counter(f.severity for f in findings)
    console.print(", ".join(f"{counts[s]} {s}" for s in ("error", "warning", "info") if counts[s]))
