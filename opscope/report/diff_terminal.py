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
    """Print a diff as what a porter reads first: one section after another (a table only where it has rows,
    ``top`` rows at most in the long ones), then the diff's notes."""
    if console is None:   # logs and CI are not terminals: wide enough that operator names stay whole
        console = Console() if sys.stdout.isatty() else Console(width=160)
    for section in _SECTIONS:
        section(result, console, top)
    for note in result.notes:
        console.print(f"[dim]note: {note}[/]")


def _print_header(result, console: Console, top: int) -> None:
    """The two runs compared: label, format, device (and B's rank)."""
    a, b = result.a, result.b
    console.print(f"[bold]opscope diff[/]  A={a['label']} ({a['format']}, {a['device']})  "
                  f"B={b['label']} ({b['format']}, {b['device']}{', rank ' + str(b['rank']) if b['rank'] is not None else ''})")


def _print_steps(result, console: Console, top: int) -> None:
    """Step time and throughput of both runs, always shown."""
    steps = _table("Step time and throughput (host span = ProfilerStep/step markers; device span = first to "
                   "last kernel, msprof-analyze E2E)",
                   ("run", "steps measured", "warm-up excluded", "host step ms", "device step ms", "FPS",
                    "batch (source)", "op calls/step", "host ms/step", "device ms/step", "unattributed device ms"))
    for side in (result.a, result.b):
        st = side["step"]
        steps.add_row(side["label"], ", ".join(map(str, st["measured_steps"])) or "-",
                      ", ".join(map(str, st["warmup_steps"])) or "none", _ms(st["avg_step_us"]),
                      _ms(st.get("avg_device_step_us")),
                      f"{st['fps']:.2f} ({st['batch_size']} x {st['devices']} dev)" if st["fps"] else "-",
                      f"{st['batch_size']} ({st['batch_size_source']})" if st.get("batch_size") else "unknown",
                      f"{side['op_calls_per_step']:g}", _ms(side["host_time_per_step_us"]),
                      _ms(side["device_time_per_step_us"]), _ms(side.get("device_time_unattributed_us")))
    console.print(steps)


def _print_device_split(result, console: Console, top: int) -> None:
    """Each run's device time per step split as step_trace_time.csv does, where the run has the split."""
    split_sides = [s for s in (result.a, result.b) if s["step"].get("device_split_us")]
    if split_sides:
        t = _table("Device time per step (as msprof-analyze's step_trace_time.csv)",
                   ("run", "host step ms", "preparing ms", "device step ms", "computing ms", "communication ms",
                    "overlapped ms", "comm not overlapped ms", "free ms", "H2D/D2H copies ms"))
        for side in split_sides:
            d = side["step"]["device_split_us"]
            t.add_row(side["label"], *(_ms(d.get(k)) for k in (
                "host_span_us", "preparing_us", "device_span_us", "computing_us", "communication_us",
                "overlapped_us", "communication_not_overlapped_us", "free_us", "transfer_us")))
        console.print(t)


def _print_collectives(result, console: Console, top: int) -> None:
    """The collectives of both runs per step, with their algorithm bandwidth."""
    coll = [(s["label"], c) for s in (result.a, result.b) for c in s.get("collectives") or []]
    if coll:
        t = _table("Collectives per step", ("run", "collective", "operator", "calls", "time ms", "MB",
                                            "algorithm GB/s (bytes / elapsed)"))
        for label, c in coll:
            t.add_row(label, c["name"], c["op"] or "(unattributed)", f"{c['calls']:g}", _ms(c["time_us"]),
                      f"{c['bytes'] / 1e6:.1f}" if c.get("bytes") else "-",
                      f"{c['algorithm_bandwidth_gb_s']:.2f}" if c.get("algorithm_bandwidth_gb_s") else "-")
        console.print(t)


def _print_regressions(result, console: Console, top: int) -> None:
    """The operators that differ, biggest regression first, or a line saying nothing differs."""
    regress = _table(f"Where the time went (per step, biggest regression first; top {top})",
                     ("operator", "phase", "status", "calls A", "calls B", "time A ms", "time B ms", "delta ms",
                      "host B ms", "device B ms"))
    differing = [r for r in result.operators if r.status != "same" or abs(r.delta_us) >= 0.0005 or r.calls_changed]
    if not differing:
        console.print("[bold]no differences[/]: every operator signature matches with the same calls and time")
    for r in differing[:top]:
        regress.add_row(r.name, r.phase, r.status, f"{r.calls_a:g}", f"{r.calls_b:g}", _ms(r.time_a_us),
                        _ms(r.time_b_us), _ms(r.delta_us), _ms(r.host_b_us), _ms(r.device_b_us))
    if differing:
        console.print(regress)


def _print_npu_stack(result, console: Console, top: int) -> None:
    """What the NPU stack added (casts, format conversions) and what fell back to the CPU."""
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


def _print_only_in_one(result, console: Console, top: int) -> None:
    """The operators only one run has, one table per run."""
    a, b = result.a, result.b
    for title, items in ((f"Only in {a['label']}", result.only_a), (f"Only in {b['label']}", result.only_b)):
        if items:
            t = _table(f"{title}: {len(items)} operator(s)", ("operator", "calls/step", "time ms", "phases", "under",
                                                              "likely cause"))
            for item in items[:top]:
                t.add_row(item["name"], f"{item['calls']:g}", _ms(item["time_us"]), ", ".join(item["phases"]),
                          item["under"] or "(top level)", item.get("cause") or "-")
            console.print(t)


def _print_transfers(result, console: Console, top: int) -> None:
    """Host<->device copies, compared as transfers rather than as operators; then the folded decompositions."""
    moved = [(tr["side"], it) for tr in result.transfers for it in tr["items"]]
    if moved:
        t = _table("Host<->device transfers per step (compared as transfers, not as operators)",
                   ("run", "operator", "tensor", "calls", "device ms", "source"))
        for side, it in moved[:top]:
            t.add_row(side, it["name"], f"{it['shape']} {it['dtype']}", f"{it['calls']:g}", _ms(it["device_us"]),
                      it["source"] or "-")
        console.print(t)
    if result.folded:
        console.print(f"[dim]{len(result.folded)} backend decomposition(s) folded into their parent operator "
                      f"(e.g. {', '.join(f['name'] + ' under ' + str(f['parent']) for f in result.folded[:3])}); "
                      f"see diff.json 'folded'[/]")


def _print_signature_changes(result, console: Console, top: int) -> None:
    """Operators matched across the runs whose dtypes, shapes or call counts changed."""
    if result.dtype_changes:
        t = _table(f"dtype changes: {len(result.dtype_changes)}", ("operator", "phase", "arg", "A", "B", "signatures",
                                                                   "likely cause"))
        for d in result.dtype_changes[:top]:
            t.add_row(d["name"], d["phase"], str(d["arg"]), str(d["a"]), str(d["b"]), str(d.get("signatures", 1)),
                      d.get("cause") or "-")
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


def _print_ranks(result, console: Console, top: int) -> None:
    """Per run with several ranks: each rank's step split and which one is slow, and why."""
    for side, ranks in result.ranks.items():
        label = (result.a if side == "a" else result.b)["label"]
        slow = ranks.get("slow_rank")
        t = _table(f"Ranks of {label}: slow rank {'none' if slow is None else slow} - "
                   f"{ranks.get('slow_rank_reason') or ''}",
                   ("rank", "host step ms", "device step ms", "computing ms", "communication ms",
                    "comm not overlapped ms", "wait (synchronisation) ms", "late arrival ms", "free ms"))
        for r in ranks["ranks"]:
            t.add_row(str(r["rank"]), _ms(r["host_step_us"]), _ms(r["device_step_us"]), _ms(r.get("computing_us")),
                      _ms(r.get("communication_us")), _ms(r.get("communication_not_overlapped_us")),
                      _ms(r.get("wait_us")), _ms(r.get("late_us")), _ms(r.get("free_us")))
        console.print(t)


# the sections of a printed diff, in the order they are printed
_SECTIONS = (_print_header, _print_steps, _print_device_split, _print_collectives, _print_regressions,
             _print_npu_stack, _print_only_in_one, _print_transfers, _print_signature_changes, _print_ranks)
