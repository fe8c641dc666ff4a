"""``opscope matrix build|show``: regenerate the torch_npu support matrix, or look an op up in it."""
from __future__ import annotations

import argparse
from pathlib import Path

from opscope.commands._args import non_empty
from opscope.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("matrix", help="build or query the torch_npu operator support matrix",
                       description="The support matrix lists, per torch_npu release line, the ATen overloads "
                                   "registered for the NPU (from the wheels' registration yaml), op-plugin's "
                                   "version ranges and the dtype failures of upstream tests.")
    actions = p.add_subparsers(dest="matrix_action", metavar="{build,show}")
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
    b.add_argument("--wheel-cache", metavar="DIR", help="reuse/keep downloaded wheels in this folder")
    b.add_argument("-o", "--out", metavar="DIR", help="where to write (default: the package's support_matrix/)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress and no list of files written")
    s = actions.add_parser("show", help="an operator's verdict across torch_npu versions",
                           description="Print, for every release line in the matrix, how an operator runs on "
                                       "the NPU and why.  OP is e.g. aten::gelu, gelu, gelu.out or "
                                       "torch_npu's npu::npu_rms_norm.")
    s.add_argument("op", type=non_empty, help="operator, e.g. aten::gelu or aten::add.Tensor")
    s.add_argument("--target", type=non_empty, help="only this torch_npu version")
    s.add_argument("--json", action="store_true", help="print the evidence as JSON")
    s.add_argument("-o", "--out", metavar="FILE", help="also write the evidence as JSON to FILE")
    s.add_argument("-q", "--quiet", action="store_true", help="print nothing (with -o: only write the file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.matrix_action == "build":
        return run_build(args)
    if args.matrix_action == "show":
        return run_show(args)
    raise UserError("say what to do: `opscope matrix build ...` or `opscope matrix show aten::gelu`")


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
    from opscope.report.terminal import progress_bar
    with progress_bar("building the support matrix", args.quiet) as update:
        written = build(out, wheels=args.wheel, versions=versions, op_plugin=args.op_plugin, download_dir=cache,
                        progress=update)
    if not args.quiet:
        for path in written:
            print(f"wrote {path}")
    return 0


def _parse_op(text: str) -> tuple[str, str | None]:
    name = text.strip()
    if "::" not in name:
        name = f"aten::{name}"
    ns, _, rest = name.partition("::")
    base, dot, overload = rest.partition(".")
    return f"{ns}::{base}", (overload if dot else None)


def run_show(args: argparse.Namespace) -> int:
    import json

    from rich.table import Table

    from opscope.analysis.verdicts import assign_verdicts
    from opscope.matrix.store import load_matrix, resolve_line
    from opscope.model import Operator
    name, overload = _parse_op(args.op)
    matrix = load_matrix()
    lines = [resolve_line(matrix, args.target)] if args.target else matrix.lines
    rows = []
    for line in lines:
        op = Operator(name=name, overload=overload)
        assign_verdicts([op], line)
        rows.append((matrix.release(line), op))
    evidence = json.dumps([{"version": rel.version, "line": rel.line, "verdict": op.verdict,
                            "evidence": op.evidence, "substitute": op.substitute} for rel, op in rows], indent=2)
    if args.out:
        Path(args.out).write_text(evidence + "\n", encoding="utf-8")
    if args.quiet:
        return 0
    if args.json:
        print(evidence)
        return 0
    table = Table(title=f"{name}{'.' + overload if overload else ''} on torch_npu", header_style="bold")
    for col in ("torch_npu", "verdict"):
        table.add_column(col, no_wrap=True)
    table.add_column("why", ratio=2)
    table.add_column("substitute", ratio=1)
    for rel, op in rows:
        ev = op.evidence or {}
        why = str(ev.get("rule", ""))
        if ev.get("path") and len(ev["path"]) > 1:
            why += "  path: " + " -> ".join(ev["path"])
        if ev.get("first_supported_in"):
            why += f"  (first supported in {ev['first_supported_in']})"
        version = rel.version + ("" if rel.from_wheel else " (op-plugin only)")
        table.add_row(version, op.verdict, why, (op.substitute or {}).get("replacement", "-"))
    from opscope.report.terminal import make_console
    make_console().print(table)
    return 0
