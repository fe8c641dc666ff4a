"""``opscope matrix build|show``: regenerate the torch_npu support matrix, or look an op up in it."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.commands._args import non_empty
from opscope.errors import UserError

if TYPE_CHECKING:
    from opscope.model import PlanBlocker, PortPlan


def register(sub) -> None:
    p = sub.add_parser("matrix", help="build or query the torch_npu operator support matrix",
                       description="The support matrix lists, per torch_npu release line, the ATen overloads "
                                   "registered for the NPU (from the wheels' registration yaml), op-plugin's "
                                   "version ranges and the dtype failures of upstream tests.")
    actions = p.add_subparsers(dest="matrix_action", metavar="{build,show,versions,plan}")
    b = actions.add_parser("build", help="regenerate support_matrix/ from torch_npu wheels and op-plugin yaml",
                           description="Regenerate the committed matrix files from the real sources. "
                                       "Rebuilding from the same sources is byte-for-byte identical.")
    b.add_argument("--wheel", action="append", default=[], metavar="FILE", help="a torch_npu wheel file (repeatable)")
    b.add_argument("--version", action="append", default=[], metavar="V",
                   help="a torch_npu version to fetch with `pip download` (repeatable), e.g. 2.14.0")
    b.add_argument("--refresh", action="store_true",
                   help="re-fetch every version already in the matrix (see support_matrix/versions/)")
    b.add_argument("--op-plugin", metavar="DIR",
                   help="folder with op_plugin_functions.yaml and unsupported_ops_info*.yaml")
    b.add_argument("--torch-wheel", action="append", default=[], metavar="FILE",
                   help="a torch wheel whose native_functions.yaml facts to add (repeatable); by default the "
                        "torch each torch_npu release requires is fetched with pip when the matrix lacks it")
    b.add_argument("--wheel-cache", metavar="DIR", help="reuse/keep downloaded wheels in this folder")
    b.add_argument("-o", "--out", metavar="DIR", help="where to write (default: the package's support_matrix/)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress and no list of files written")
    s = actions.add_parser("show", help="an operator's verdict across torch_npu versions",
                           description="Print, for every release line in the matrix, how an operator runs on "
                                       "the NPU and why.  OP is e.g. aten::gelu, gelu, gelu.out or "
                                       "torch_npu's npu::npu_rms_norm.")
    s.add_argument("op", type=non_empty, help="operator, e.g. aten::gelu or aten::add.Tensor (no overload: every overload)")
    s.add_argument("--target", type=non_empty, help="only this torch_npu release (exact: 2.8.0 is not 2.8.0.post5; "
                                    "a bare line, 2.8, is its newest release)")
    _print_options(s, "the evidence", json_help="print the evidence as JSON")
    v = actions.add_parser("versions", help="every torch_npu release in the matrix",
                           description="List every exact torch_npu release the matrix has, with the torch it is "
                                       "built for and how many ATen overloads it registers.")
    _print_options(v, "the list")
    pl = actions.add_parser("plan", help="the torch_npu releases that run a scan's operators, and what to install",
                            description="Judge a scan's operators on every torch_npu release of the matrix: the "
                                        "oldest and newest release on which none falls back (or the fewest do), "
                                        "the first release that runs each blocking operator, the torch / Python / "
                                        "CANN each pairs with (support_matrix/release_pairs.yaml), what in this "
                                        "environment and the project's requirement files must change, and the "
                                        "install commands.")
    pl.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by `opscope scan` (or its scan.json)")
    pl.add_argument("--target", type=non_empty, help="plan this torch_npu release instead of the recommended one")
    _print_options(pl, "the plan")
    p.set_defaults(func=run)


def _print_options(parser, what: str, json_help: str | None = None) -> None:
    """--json, -o FILE and -q of the actions that print what the matrix holds."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("-o", "--out", metavar="FILE", help=f"also write {what} as JSON to FILE")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with -o: only write the file)")


def run(args: argparse.Namespace) -> int:
    if args.matrix_action == "build":
        return run_build(args)
    if args.matrix_action == "show":
        return run_show(args)
    if args.matrix_action == "versions":
        return run_versions(args)
    if args.matrix_action == "plan":
        return run_plan(args)
    raise UserError("say what to do: `opscope matrix build ...`, `opscope matrix show aten::gelu` "
                    "`opscope matrix versions` or `opscope matrix plan RUN_DIR`")


def run_build(args: argparse.Namespace) -> int:
    from opscope.matrix.build import build, committed_versions
    from opscope.resources import support_matrix_dir
    out = Path(args.out) if args.out else support_matrix_dir()
    versions = list(args.version) + (committed_versions(out) if args.refresh else [])
    if not (args.wheel or versions or args.op_plugin):
        raise UserError("nothing to build from: give --wheel FILE, --version V, --refresh and/or --op-plugin DIR")
    for wheel in args.wheel:
        if not Path(wheel).is_file():
            raise UserError(f"wheel not found: {wheel}")
    cache = Path(args.wheel_cache) if args.wheel_cache else None
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    for wheel in args.torch_wheel:
        if not Path(wheel).is_file():
            raise UserError(f"torch wheel not found: {wheel}")
    from opscope.report.terminal import progress_bar
    with progress_bar("building the support matrix", args.quiet) as update:
        written = build(out, wheels=args.wheel, versions=versions, op_plugin=args.op_plugin, download_dir=cache,
                        torch_wheels=args.torch_wheel, refresh_torch=args.refresh, progress=update)
    if not args.quiet:
        for path in written:
            print(f"wrote {path}")
    return 0


def _parse_op(text: str) -> tuple[str, str | None]:
    name = text.strip()
    if "::" not in name:
        name = f"aten::{name}"
    ns, _, rest = name.partition("::")
    if _third_party_op(ns, rest):   # a library's Python API recorded by name (apex::amp.scale_loss): no overload
        return name, None
    base, dot, overload = rest.partition(".")
    return f"{ns}::{base}", (overload if dot else None)


def _third_party_op(namespace: str, op: str) -> bool:
    from opscope.knowledge import load_optional
    libraries = load_optional("third_party.yaml").get("libraries") or {}
    return any(lib.get("namespace") == namespace and op in (lib.get("ops") or {}) for lib in libraries.values())


def show_rows(op_text: str, target: str | None = None) -> list[dict]:
    """One row per (release, overload): the verdict and evidence a scan of that overload gets.

    Without an overload in ``op_text`` every overload of the family is shown (those in the
    torch the release is built for, and any the release registers).
    """
    from opscope.analysis.verdicts.support import assign_verdicts, schema_of
    from opscope.matrix.store import load_matrix, resolve_release
    from opscope.model import Operator
    name, overload = _parse_op(op_text)
    matrix = load_matrix()
    releases = [resolve_release(matrix, target)] if target else list(matrix.releases.values())
    base = name.rpartition("::")[2]
    rows = []
    for release in releases:
        overloads: list[str | None]
        if overload is not None or not name.startswith("aten::"):
            overloads = [overload]
        else:
            schema, _ = schema_of(release)
            names = list(dict.fromkeys(schema.families.get(base, []) + release.families().get(base, [])))
            ordered = sorted(names, key=lambda o: (o.endswith("out"), o))
            overloads = list(ordered) or [None]
        for ov in overloads:
            op = Operator(name=name, overload=ov)
            target_info = assign_verdicts([op], release.version)
            rows.append({"op": name + (f".{ov}" if ov else ""), "overload": ov, "version": release.version,
                         "line": release.line, "from_wheel": release.from_wheel, "torch": target_info.get("torch"),
                         "verdict": op.verdict, "evidence": op.evidence, "substitute": op.substitute})
    return rows


def _rows_done(rows: list, args: argparse.Namespace) -> bool:
    """Write ``rows`` as JSON to ``--out``; print them as JSON with ``--json``.  True: nothing
    more to print (``--quiet`` or ``--json``)."""
    import json
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    if args.json and not args.quiet:
        print(json.dumps(rows, indent=2))
    return bool(args.quiet or args.json)


def run_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    rows = show_rows(args.op, args.target)
    if _rows_done(rows, args):
        return 0
    name, overload = _parse_op(args.op)
    table = Table(title=f"{name}{'.' + overload if overload else ' (every overload)'} on torch_npu",
                  header_style="bold")
    for col in ("torch_npu", "overload", "verdict"):  # names: wrapped at spaces only, never mid-word
        table.add_column(col, overflow="ellipsis")
    table.add_column("why", ratio=2)
    table.add_column("substitute", ratio=1)
    for row in rows:
        ev = row["evidence"] or {}
        why = str(ev.get("rule", ""))
        if ev.get("path") and len(ev["path"]) > 1:
            why += "  path: " + " -> ".join(ev["path"])
        if ev.get("first_supported_in"):
            why += f"  (first supported in {ev['first_supported_in']})"
        if ev.get("torch_schema_note"):
            why += f"  [{ev['torch_schema_note']}]"
        version = row["version"] + ("" if row["from_wheel"] else " (op-plugin only)")
        table.add_row(version, row["op"], row["verdict"], why, (row["substitute"] or {}).get("replacement", "-"))
    from opscope.report.terminal import make_console
    make_console().print(table)  # piped: 200 columns, no folding mid-word
    return 0


def run_versions(args: argparse.Namespace) -> int:
    from opscope.matrix.store import load_matrix
    matrix = load_matrix()
    rows, previous = [], None
    for version in matrix.versions:
        rel = matrix.exact[version]
        differs = None
        if previous is not None and previous.line == rel.line:
            differs = len(set(previous.aten.items()) ^ set(rel.aten.items()))
        rows.append({"version": version, "line": rel.line, "torch": rel.torch, "aten_overloads": len(rel.aten),
                     "custom_ops": len(rel.custom), "newest_of_line": matrix.release(rel.line) is rel,
                     "changed_vs_previous": differs})
        previous = rel
    for line, rel in matrix.releases.items():
        if not rel.from_wheel:
            rows.append({"version": rel.version, "line": line, "torch": None, "aten_overloads": len(rel.aten),
                         "custom_ops": len(rel.custom), "newest_of_line": True, "changed_vs_previous": None,
                         "note": rel.note})
    if _rows_done(rows, args):
        return 0
    print(f"{'torch_npu':<16}{'torch':<9}{'aten':>6}{'custom':>8}  notes")
    for row in rows:
        notes = []
        if row.get("note"):
            notes.append("op-plugin yaml only (no wheel)")
        if row["newest_of_line"] and not row.get("note"):
            notes.append(f"newest of {row['line']} (target {row['line']})")
        if row["changed_vs_previous"]:
            notes.append(f"{row['changed_vs_previous']} registration(s) differ from the previous release")
        print(f"{row['version']:<16}{row['torch'] or '-':<9}{row['aten_overloads']:>6}{row['custom_ops']:>8}  "
              + "; ".join(notes))
    return 0


def run_plan(args: argparse.Namespace) -> int:
    import json

    from opscope.analysis.plan.releases import plan_for
    from opscope.report.terminal import make_console
    from opscope.schema import load_scan
    result = load_scan(args.run_dir)   # InputError (exit 2, one line) on a bad RUN_DIR
    plan = plan_for(result, target=args.target)
    if args.out:
        Path(args.out).write_text(json.dumps(plan.to_dict(), indent=2) + "\n", encoding="utf-8")
    if args.json and not args.quiet:
        print(json.dumps(plan.to_dict(), indent=2))
    if args.quiet or args.json:
        return 0
    console = make_console()
    ranges = _ranges(plan.best_ranges)
    if plan.all_native:
        console.print(f"torch_npu range: {ranges} - every captured operator runs without CPU fallback "
                      f"({plan.releases_judged} releases judged)")
    else:
        never = sum(1 for b in plan.blockers if not b.first_supported_in)
        console.print(f"torch_npu range: {ranges} - the fewest operator signatures do not run natively there "
                      f"({plan.fewest_blocking}; {plan.releases_judged} releases judged)"
                      + (f"; {never} operator(s) run natively on no release: replace them" if never else ""))
    console.print(_release_table(plan))
    if plan.blockers:
        console.print(_blockers_table(plan.blockers))
    for adapter in plan.adapters:
        console.print(f"adapter for {adapter.library}: {adapter.adapter} {adapter.tag or ''} - "
                      f"{adapter.paired}", markup=False)
    _print_environment(console, plan)
    console.print("install on the Ascend machine:")
    console.print(plan.install, markup=False, highlight=False, soft_wrap=True)
    return 0


def _ranges(runs: list) -> str:
    return ", ".join(a if a == b else f"{a} .. {b}" for a, b in runs)


def _release_table(plan: PortPlan):
    from rich.table import Table
    table = Table(title="Release plan", header_style="bold")
    for col in ("", "torch_npu", "torch", "python", "CANN", "line status"):
        table.add_column(col, overflow="fold")
    table.add_column("source", ratio=2)
    planned = plan.planned
    for label, facts in (("oldest", plan.oldest), ("newest", plan.newest), ("planned", planned)):
        cann = (facts.cann + (" (inferred)" if facts.cann_inferred else "")) if facts.cann else "unknown"
        status = facts.line_status or "-"
        if facts.line_eol:
            status = f"EOL {facts.line_eol}" if status == "EOL" else f"{status} (EOL {facts.line_eol})"
        source = facts.cann_source or facts.cann_why or "-"
        if label == "planned":
            source = f"{planned.why}; CANN: {source}"
        table.add_row(label, facts.torch_npu, facts.torch or "?", " ".join(facts.python) or "?", cann, status,
                      source)
    return table


def _blockers_table(rows: list[PlanBlocker]):
    from rich.table import Table
    table = Table(title="Operators that block releases ('never': on no release: replace them)", header_style="bold")
    for col in ("operator", "verdict", "first supported in", "supported in every release from", "blocked in"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(row.op, "/".join(row.verdicts), row.first_supported_in or "never", row.supported_from or "-",
                      _ranges(row.blocked_in))
    return table


def _print_environment(console, plan: PortPlan) -> None:
    from rich.table import Table
    env, planned = plan.environment, plan.planned
    assert env is not None, "plan_for checks the environment by default"
    if env.changes:
        table = Table(title=f"What must change for torch_npu {planned.torch_npu}", header_style="bold")
        for col in ("where", "now", "change to"):
            table.add_column(col, overflow="fold")
        table.add_column("why", ratio=2)
        for change in env.changes:
            where = (change.where or "") + (f" {change.package}" if change.where == "installed" else "")
            table.add_row(where, change.from_ or "(not installed)", change.to or "(see why)", change.reason)
        console.print(table)
    else:
        console.print(f"nothing in this environment or the project's requirement files needs to change for "
                      f"torch_npu {planned.torch_npu}")
    if env.python_ok is False:
        console.print(f"Python {env.python} here: torch_npu {planned.torch_npu} has wheels for Python "
                      f"{', '.join(planned.python)} only")
    for note in env.notes:
        console.print(f"note: {note}", markup=False)
