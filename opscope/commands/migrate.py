"""`opscope migrate PATH --out DIR`: the safe CUDA->NPU rewrites as a patch to review.

Writes ``DIR/opscope-migrate.patch`` (unified diff, a/ b/ paths relative to the
current directory), ``DIR/opscope-migrate.md`` (what changed, what was left and why)
and the patched copies under ``DIR/<same relative path>``.  The user's files are
never modified: a symbolic link leading out of the project is not followed, a copy that
would land on an input file is refused, and every file is written atomically (a link at
the destination is replaced, never written through).
"""
from __future__ import annotations

import os
from pathlib import Path

from opscope.atomic import write_atomic
from opscope.errors import EXIT_USAGE, UserError

PATCH_NAME = "opscope-migrate.patch"
REPORT_NAME = "opscope-migrate.md"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "migrate", help="write a patch with the safe CUDA->NPU rewrites (device strings, torch.cuda, nccl)",
        description="Find CUDA-specific APIs statically and write a unified diff applying only the safe, "
                    "mechanical NPU replacements; everything needing judgement is listed, not changed.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python file(s) or project folder(s)")
    parser.add_argument("-o", "--out", required=True, metavar="DIR",
                        help="folder for the patch, the report and the patched copies")
    parser.add_argument("--root", metavar="DIR",
                        help="folder the patch paths are relative to (default: current directory)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    from opscope.analysis.static.migrate import plan_migration, render_report

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise UserError(f"path not found: {path} (give a Python file or a project folder)", EXIT_USAGE)
    out = Path(args.out)
    root = Path(args.root) if args.root else None
    if root is not None and not root.is_dir():
        raise UserError(f"--root {root} is not a folder", EXIT_USAGE)
    _prepare_out(out)
    try:
        migration = plan_migration(paths, root=root, exclude=out)
    except ValueError as exc:  # a path outside --root
        raise UserError(f"{exc}; choose a --root that contains every PATH", EXIT_USAGE) from None
    targets = _copy_targets(migration, out)
    try:
        write_atomic(out / PATCH_NAME, migration.diff(), newline="")
        write_atomic(out / REPORT_NAME, render_report(migration))
        for f, target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, f.patched, newline="")
    except OSError as exc:
        raise UserError(f"cannot write into --out {out} ({exc.strerror or exc}); choose a writable folder",
                        EXIT_USAGE) from None
    if not args.quiet:
        _print_summary(migration, out)
    return 0


def _prepare_out(out: Path) -> None:
    """Create --out, or fail with exit 2 before any work if it cannot hold the results."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the patch and the patched copies", EXIT_USAGE)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out {out} ({exc.strerror or exc}); choose a writable folder",
                        EXIT_USAGE) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"--out {out} is not writable; choose a writable folder", EXIT_USAGE)


def _copy_targets(migration, out: Path) -> list:
    """Where each patched copy goes, refusing any that would land on an input file or
    outside --out (through a linked folder); checked for all before anything is written."""
    out_real = out.resolve()
    inputs = {f.path.resolve() for f in migration.files if f.path.exists()}
    targets = []
    for f in migration.changed_files:
        target = out / f.rel
        real = target.parent.resolve() / target.name
        if real in inputs or target.resolve() in inputs:
            raise UserError(f"--out {out} would overwrite your file {f.path}; choose a folder outside "
                            "the project for the patched copies", EXIT_USAGE)
        if not real.is_relative_to(out_real):
            raise UserError(f"--out {out}: {f.rel} would be written outside it (through a linked folder); "
                            "choose another --out", EXIT_USAGE)
        targets.append((f, target))
    return targets


def _print_summary(migration, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    changed = migration.changed_files
    left = [(f, s) for f in migration.files for s in f.skipped]
    if left:
        table = Table(title=f"Left for you: {len(left)} finding(s) that need judgement", header_style="bold")
        table.add_column("where", overflow="fold")
        table.add_column("rule")
        table.add_column("why not changed / what to do", overflow="fold")
        for f, s in left[:60]:
            table.add_row(f"{f.rel}:{s.line}" if s.line else f.rel, s.rule,
                          s.reason if not s.replacement or s.replacement in s.reason else f"{s.reason} -> {s.replacement}")
        console.print(table)
        if len(left) > 60:
            console.print(f"... {len(left) - 60} more in {out / REPORT_NAME}")
    n = sum(len(f.changes) for f in changed)
    console.print(f"{n} safe rewrite(s) in {len(changed)} file(s): review {out / PATCH_NAME}, then "
                  f"`git apply {out / PATCH_NAME}` in {migration.root}; report: {out / REPORT_NAME}")
