"""Terminal summary of a diff (rich tables): what a porter reads first."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"


def _shapes(shapes) -> str:
    if shapes is None:
        return "-"
    text = ", ".join(str(s) for s in shapes if s)
    return text if len(text) < 60 else text[:57] + "..."


def _table(title, columns) -> Table:
    table = Table(title=title, header_style="bold", title_justify="left")
    for i, col in enumerate(columns):  # the first column names an operator/run: never split mid-name
        table.add_column(col, no_wrap=True) if i == 0 else table.add_column(col)
    return table


def print_diff(result, console: Console | None = None, top: int = 15) -> None:
    if console is None:   # logs and CI are not terminals: wide enough that operator names stay whole
        console = Console() if sys.stdout.isatty() else Console(width=160)
    a, b = result.a, result.b
    console.print(f"[bold]opscope diff[/]  A={a['label']} ({a['format']}, {a['device']})  "
                  f"B={b['label']} ({b['format']}, {b['device']}{', rank ' + str(b['rank']) if b['rank'] is not None else ''})")

    steps = _table("Step time and throughput", ("run", "steps measured", "warm-up excluded", "avg step ms", "FPS",
                                                "op calls/step", "host ms/step", "device ms/step"))
    for side in (a, b):
        st = side["step"]
        steps.add_row(side["label"], ", ".join(map(str, st["measured_steps"])) or "-",
                      ", ".join(map(str, st["warmup_steps"])) or "none", _ms(st["avg_step_us"]),
                      f"{st['fps']:.1f} (batch {st['batch_size']} x {st['devices']} dev)" if st["fps"] else "-",
                      f"{side['op_calls_per_step']:g}", _ms(side["host_time_per_step_us"]),
                      _ms(side["device_time_per_step_us"]))
    console.print(steps)

    moved = [r for r in result.operators if r.status != "same" or r.delta_us or r.calls_changed]
    if moved:
        regress = _table(f"Where the time went (per step, biggest regression first; top {top})",
                         ("operator", "phase", "status", "calls A", "calls B", "time A ms", "time B ms", "delta ms",
                          "host B ms", "device B ms"))
        for r in moved[:top]:
            regress.add_row(r.name, r.phase, r.status, f"{r.calls_a:g}", f"{r.calls_b:g}", _ms(r.time_a_us),
                            _ms(r.time_b_us), _ms(r.delta_us), _ms(r.host_b_us), _ms(r.device_b_us))
        console.print(regress)
    if not (moved or result.inserted or result.fallbacks or result.only_a or result.only_b or result.dtype_changes
            or result.shape_changes or result.call_count_changes):
        console.print(f"[green]no differences[/]: {len(result.operators)} operator signature(s) with the same calls, "
                      "shapes, dtypes and time per step in both runs")

    if result.inserted:
        t = _table("Inserted by the NPU stack (casts, format conversions)",
                   ("side", "kind", "name", "calls/step", "host ms", "device ms", "triggered by"))
        for i in result.inserted:
            t.add_row(i["side"], i["kind"], i["name"], f"{i['calls']:g}", _ms(i["host_us"]), _ms(i["device_us"]),
                      ", ".join(i["triggered_by"][:4]))
        console.print(t)
    if result.fallbacks:
        t = _table("Fell back to the CPU", ("side", "operator", "count", "evidence"))
        for f in result.fallbacks[:top]:
            t.add_row(f["side"], f["op"], str(f["count"]), f["evidence"])
        console.print(t)
    for title, items in ((f"Only in {a['label']}", result.only_a), (f"Only in {b['label']}", result.only_b)):
        if items:
            t = _table(f"{title}: {len(items)} operator(s)", ("operator", "calls/step", "time ms", "phases", "under"))
            for item in items[:top]:
                t.add_row(item["name"], f"{item['calls']:g}", _ms(item["time_us"]), ", ".join(item["phases"]),
                          item["under"] or "(top level)")
            console.print(t)
    if result.dtype_changes:
        t = _table(f"dtype changes: {len(result.dtype_changes)}", ("operator", "phase", "arg", "A", "B"))
        for d in result.dtype_changes[:top]:
            t.add_row(d["name"], d["phase"], str(d["arg"]), str(d["a"]), str(d["b"]))
        console.print(t)
    changed = [r for r in result.operators if r.status == "changed"]
    if changed:
        t = _table(f"Shape changes: {len(result.shape_changes)} signature(s)", ("operator", "phase", "change"))
        for r in changed[:top]:
            t.add_row(r.name, r.phase, "; ".join(r.changes[:3]))
        console.print(t)
    if result.call_count_changes:
        t = _table(f"Call-count changes: {len(result.call_count_changes)}", ("operator", "phase", "calls A", "calls B"))
        for c in result.call_count_changes[:top]:
            t.add_row(c["name"], c["phase"], f"{c['calls_a']:g}", f"{c['calls_b']:g}")
        console.print(t)
    for side, ranks in result.ranks.items():
        label = (a if side == "a" else b)["label"]
        t = _table(f"Ranks of {label}: straggler rank {ranks.get('straggler')}, "
                   f"step-time imbalance {ranks.get('imbalance_pct')}%",
                   ("rank", "avg step ms", "device ms", "host ms", "computing ms", "comm (not overlapped) ms", "free ms"))
        for r in ranks["ranks"]:
            t.add_row(str(r["rank"]), _ms(r["avg_step_us"]), _ms(r["device_time_us"]), _ms(r["host_time_us"]),
                      _ms(r.get("Computing")), _ms(r.get("Communication(Not Overlapped)")), _ms(r.get("Free")))
        console.print(t)
    for note in result.notes:
        console.print(f"[dim]note: {note}[/]")
