"""Compact terminal summary of a scan (rich tables): the answer first.

The one-line verdict, then the same ranked "what to change" list as the HTML report,
then the operators that cost the most steady-state time (not-applicable set-up work left
out) with their shapes.  Names, paths and ``file:line`` never wrap mid-word; piped output
is not cut at 80 columns.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opscope.model import ScanResult
from opscope.report import headline, view

if TYPE_CHECKING:
    from rich.progress import Progress

VERDICT_STYLE = {"native": "green", "composite": "green", "adapter": "blue", "cpu-fallback": "yellow",
                 "unsupported": "red", "not-applicable": "dim", "unknown": "magenta"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "blue"}
PIPE_WIDTH = 200  # piped or redirected output: wide enough that tables keep one row per line
NARROW = 110      # below this many columns the fixes and top operators print as lists, not tables


def make_console(stderr: bool = False, **kwargs) -> Console:
    """A rich Console that wraps at the terminal's width, or at PIPE_WIDTH (not 80, whatever
    ``COLUMNS`` says) when piped or redirected: logs and CI keep one table row per line."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(stderr=stderr, width=width, **kwargs)


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def _name_column(table: Table, title: str, **kwargs) -> None:
    """A column of names or places: wrapped only at spaces, and a name too long for its column ends
    in an ellipsis: never split inside a word (``aten::gelu_ba|ckward``)."""
    table.add_column(title, overflow="ellipsis", **kwargs)


def fixes_table(result: ScanResult, top: int = 10) -> Table | None:
    """The ranked "what to change" list (the HTML report's, same order)."""
    fixes = view.top_fixes(result, limit=top)
    if not fixes:
        return None
    t = Table(title="What to change, most important first", header_style="bold", title_justify="left")
    t.add_column("#", justify="right")
    _name_column(t, "kind")
    _name_column(t, "what", max_width=60)
    _name_column(t, "where", max_width=40)
    t.add_column("time", justify="right")
    t.add_column("change")
    for i, f in enumerate(fixes, start=1):
        style = SEVERITY_STYLE.get(f.severity, "")
        t.add_row(str(i), f"[{style}]{f.kind}[/]" if style else f.kind, f.what, f.where or "-",
                  view.fmt_percent(f.share) if f.share is not None else "-", f.fix)
    return t


def top_operators_table(result: ScanResult, top: int = 12) -> Table | None:
    """Operators by steady-state time, with their shapes; not-applicable set-up work left out.  A GPU scan
    ranks them by the time their kernels took on the GPU, with their own CPU time beside it."""
    ops = view.costliest_operators(result)
    if not ops:
        return None
    device = view.has_device_time(result)
    title = ("Top operators by steady-state GPU time per step on this machine (the kernels each launched; CPU: "
             "its own host time; not-applicable set-up work left out)" if device else
             "Top operators by steady-state CPU time per step on this machine (not-applicable set-up work "
             "left out)")
    t = Table(title=title, header_style="bold", title_justify="left")
    _name_column(t, "operator")
    t.add_column("input shapes")
    if device:
        t.add_column("GPU ms/step", justify="right")
        t.add_column("CPU ms/step", justify="right")
    else:
        t.add_column("ms/step", justify="right")
    t.add_column("calls", justify="right")
    _name_column(t, "phase")
    _name_column(t, "source")
    _name_column(t, "verdict")
    for op, device_us, host_us in ops[:top]:
        verdict = op.verdict or "-"
        times = [_ms(device_us), _ms(host_us)] if device else [_ms(host_us)]
        t.add_row(op.qualified_name, view.fmt_shapes(op.input_shapes) or "-", *times,
                  str(op.calls), op.phase or "-", view.where_of(op, result) or "-",
                  f"[{VERDICT_STYLE.get(verdict, '')}]{verdict}[/]" if op.verdict else "-")
    return t


def _print_fixes_list(result: ScanResult, console: Console, top: int = 10) -> None:
    """Narrow terminals: one fix per entry, wrapped at spaces (a table would cut file:line)."""
    fixes = view.top_fixes(result, limit=top)
    console.print("[bold]What to change, most important first[/]")
    for i, f in enumerate(fixes, start=1):
        style = SEVERITY_STYLE.get(f.severity, "")
        share = f", {view.fmt_percent(f.share)} of time" if f.share is not None else ""
        console.print(f"{i:>2}. [{style}]{f.kind}[/] {escape(f.what)} at {escape(f.where or '-')}{share}")
        console.print(f"    -> {escape(f.fix)}")


def _print_top_operators_list(result: ScanResult, console: Console, top: int = 12) -> None:
    ops = view.costliest_operators(result)
    if not ops:
        return
    device = view.has_device_time(result)
    console.print(f"[bold]Top operators by steady-state {'GPU ' if device else ''}time per step[/] "
                  "(not-applicable set-up work left out)")
    for op, device_us, host_us in ops[:top]:
        verdict = op.verdict or "-"
        times = f"GPU {_ms(device_us)} ms/step, CPU {_ms(host_us)}" if device else _ms(host_us)
        console.print(f"  {escape(op.qualified_name)}  {times} ms/step  x{op.calls}  "
                      f"{op.phase or '-'}  {escape(view.where_of(op, result) or '-')}  [{VERDICT_STYLE.get(verdict, '')}]{verdict}[/]")
        console.print(f"      shapes {escape(view.fmt_shapes(op.input_shapes) or '-')}")


def print_numeric_checks(result: ScanResult, console: Console, run_dir: str = "RUN_DIR", top: int = 5) -> None:
    """One dim evidence line per operator family with an upstream numeric mismatch (not a fix)."""
    checks = view.numeric_checks(result)
    if not checks:
        return
    console.print(f"[bold]Numerics to check[/] ({escape(view.VERIFY_HINT.format(run_dir=run_dir))}):")
    for check in checks[:top]:
        share = f"  {view.fmt_percent(check.share)} of time" if check.share is not None else ""
        console.print(f"[dim]  {escape(check.line())}{share}[/]")
    if len(checks) > top:
        console.print(f"[dim]  +{len(checks) - top} more operator families in report.html (Numerics to check)[/]")


def print_summary(result: ScanResult, console: Console | None = None, top: int = 12,
                  run_dir: str | None = None) -> None:
    console = console or make_console()
    state, why = headline.scan_state(result)
    status = "[green]complete[/]" if result.complete else f"[red]{'failed' if state == 'failed' else 'incomplete'}[/]: " \
        + escape(result.incomplete_reason or why)
    console.print(f"[bold]opscope scan[/] {result.script}  device={result.device}  torch={result.torch_version}  "
                  f"steps={len(result.steps)}  {status}")
    if not result.summary.is_empty():
        from opscope.analysis.verdicts.support import describe_readiness
        console.print(f"[bold]{describe_readiness(result.summary, result.target)}[/]")
    console.print(headline.verdict_line(result))
    print_plan(result, console, run_dir or "RUN_DIR")
    narrow = console.width < NARROW
    fixes = fixes_table(result, top=10)
    if fixes is not None:
        if narrow:
            _print_fixes_list(result, console, top=10)
        else:
            console.print(fixes)
        more = len(view.top_fixes(result, limit=None)) - 10
        if more > 0:
            console.print(f"[dim]+{more} more in report.html / report.xlsx (sheet Fixes)[/]")
    else:
        console.print(headline.nothing_to_change_text(result))
    from opscope.report.npu_section import print_terminal
    print_terminal(result, console)
    print_numeric_checks(result, console, run_dir or "RUN_DIR")
    if not result.summary.is_empty():
        counts = result.summary.verdict_counts or {}
        parts = [f"[{VERDICT_STYLE.get(k, '')}]{k}[/]={v}" for k, v in counts.items() if v]
        console.print("operator signatures by verdict: " + "  ".join(parts))
    table = top_operators_table(result, top=top)
    if table is not None and narrow:
        _print_top_operators_list(result, console, top=top)
    elif table is not None:
        console.print(table)
    if result.root_causes:
        t = Table(title=f"Dynamic shapes: {len(result.root_causes)} root cause(s), "
                        f"{len(result.dynamic_shapes)} dynamic operator(s)", header_style="bold", title_justify="left")
        _name_column(t, "line to fix")
        _name_column(t, "cause")
        t.add_column("ops")
        t.add_column("fix")
        for rc in result.root_causes[:top]:
            ops = ", ".join(rc.ops[:4]) + (f" +{len(rc.ops) - 4}" if len(rc.ops) > 4 else "")
            t.add_row(view.where_of(rc, result) or "?", view.root_cause_what(rc), ops, rc.suggestion)
        console.print(t)
    else:
        console.print("Dynamic shapes: none (every operator kept the shapes of the first step)")
    remaps = remapped_calls(result)
    if remaps:
        t = Table(title=f"Remapped for this scan (no {result.device if result.device != 'cpu' else 'GPU'} "
                        f"needed): {len(remaps)} call site(s)", header_style="bold", title_justify="left")
        _name_column(t, "where")
        _name_column(t, "api")
        t.add_column("became")
        t.add_column("calls", justify="right")
        for f in remaps:
            t.add_row(view.where_of(f, result), f.api, f.remapped_to, str(f.count))
        console.print(t)
    _print_third_party(result, console)
    _print_fake_and_memory(result, console)
    for note in result.notes:
        console.print(f"[dim]note: {escape(note)}[/]")


def _print_third_party(result: ScanResult, console: Console) -> None:
    """Third-party libraries: version here, what to install on the Ascend machine, their operators."""
    rows = view.third_party_rows(result)
    if not rows:
        return
    t = Table(title="Third-party libraries", header_style="bold", title_justify="left")
    for header in view.THIRD_PARTY_HEADERS[:4]:
        t.add_column(header)
    t.add_column("time", justify="right")
    for row in rows:
        t.add_row(*(escape(str(cell)) for cell in row[:4]), view.fmt_percent(row[4]))
    console.print(t)


def _print_fake_and_memory(result: ScanResult, console: Console) -> None:
    """--mode fake: timings are absent and said so; the memory fit as one line."""
    if result.fake_mode is not None:
        places = result.fake_mode.places
        console.print(f"Operator times: {result.fake_mode.timings} (fake tensors carry shapes and dtypes, "
                      f"no data); {len(places)} data-dependent place(s) listed in the notes")
    if result.memory_fit:
        from opscope.analysis.npu.memory_fit import one_line
        console.print(one_line(result.memory_fit), markup=False, highlight=False)


def remapped_calls(result: ScanResult) -> list:
    """Run-time findings whose call opscope changed to let the script run here."""
    return [f for f in result.findings if getattr(f, "remapped_to", None)]


class progress_bar:
    """A rich progress bar on stderr for a long step (a no-op with ``quiet``); use as
    ``with progress_bar("scanning", quiet) as update: ... update(done, total[, what])``."""

    def __init__(self, label: str, quiet: bool = False):
        self.label, self.quiet = label, quiet
        self._progress: Progress | None = None
        self._task: Any = None   # the progress bar's TaskID

    def __enter__(self):
        if not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=make_console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=None)
        return self.update

    def update(self, done: int, total: int | None = None, what: str | None = None) -> None:
        if self._progress is not None:
            description = f"{self.label}: {what}" if what else self.label
            self._progress.update(self._task, completed=done, total=total, description=description)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()
        return False


def print_plan(result: ScanResult, console: Console, run_dir: str) -> None:
    """The port plan, first after the verdict: the release to install and what must change here."""
    plan = result.plan
    if plan is None:
        return
    from opscope.report import plan_view
    console.print(escape(plan_view.summary_line(plan)))
    choice = plan_view.choice_line(plan)
    if choice:
        console.print(f"  {escape(choice)}")
    chip = plan_view.chip_line(result)
    if chip:
        console.print(f"  {escape(chip)}")
    for where, package, now, planned, why in plan_view.change_rows(plan)[:8]:
        console.print(f"  change {escape(where)}: {escape(package)} {escape(now)} -> {escape(planned)} ({escape(why)})")
    for row in plan_view.blocker_rows(plan)[:5]:
        when = ("runs natively on no release: replace it" if row[2] == "never"
                else f"blocks older releases: first runs in torch_npu {escape(row[2])}")
        console.print(f"  {escape(row[0])} {when}")
    console.print(f"[dim]  the install block for the Ascend machine: report.html (Port plan) or "
                  f"`opscope matrix plan {escape(run_dir)}`[/]")

