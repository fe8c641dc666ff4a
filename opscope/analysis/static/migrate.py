"""Apply the *safe* CUDA->NPU rewrites the static scan found, as a reviewable unified diff.

Safe means mechanical and meaning-preserving once ``torch_npu`` is imported: device
strings (``'cuda:0'`` -> ``'npu:0'``), ``torch.cuda.X`` -> ``torch_npu.npu.X`` for members
torch_npu provides, ``.cuda()`` -> ``.npu()``, ``nccl`` -> ``hccl``, and adding
``import torch_npu``.  Everything that needs judgement (apex, DataParallel, extensions,
pin_memory, cudnn flags...) is left alone and listed with the reason.  Nothing is
written over the user's files: the caller writes the diff and patched copies.
"""
from __future__ import annotations

import ast
import difflib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from opscope.analysis.static.scan import CPP_SUFFIXES, Hit, iter_source_files, load_rules, scan_cpp, scan_source

IMPORT_LINE = "import torch_npu  # added by opscope migrate: registers the NPU device with torch\n"


@dataclass
class Change:
    """One applied rewrite (for the report)."""
    line: int
    rule: str
    before: str
    after: str


@dataclass
class Skipped:
    """A finding left for a person, and why."""
    line: int | None
    rule: str
    api: str
    reason: str
    replacement: str | None = None


@dataclass
class FileMigration:
    path: Path                 # as found (for reading)
    rel: str                   # posix path relative to the diff root (for a/ b/ headers)
    original: str = ""
    patched: str = ""
    changes: list = field(default_factory=list)    # list[Change]
    skipped: list = field(default_factory=list)    # list[Skipped]
    import_added: bool = False
    error: str | None = None
    error_kind: str = "parse-error"   # or "not-followed" (a symlink), "unreadable"

    @property
    def changed(self) -> bool:
        return self.patched != self.original

    def diff(self) -> str:
        """Unified diff with a/ b/ prefixes: applies with ``git apply`` and ``patch -p1``."""
        if not self.changed:
            return ""
        lines = difflib.unified_diff(self.original.splitlines(keepends=True), self.patched.splitlines(keepends=True),
                                     fromfile="a", tofile="b")
        out = []
        for k, line in enumerate(lines):
            if k < 2:   # the ---/+++ headers, written so that any file name survives
                line = f"{line[:4]}{header_name(line[4], self.rel)}\n"
            if not line.endswith("\n"):  # last line without a newline: say so, as diff(1) does
                line += "\n\\ No newline at end of file\n"
            out.append(line)
        return "".join(out)


@dataclass
class Migration:
    root: Path
    files: list = field(default_factory=list)     # list[FileMigration]

    def diff(self) -> str:
        return "".join(f.diff() for f in self.files)

    @property
    def changed_files(self) -> list:
        return [f for f in self.files if f.changed]


def header_name(prefix: str, rel: str) -> str:
    """``a/rel`` as a ---/+++ header name that ``git apply`` and ``patch -p1`` both read back.

    A name with whitespace ends with a tab (else both stop at the first space); a name
    with control characters, quotes or backslashes is C-quoted, as git writes it.
    """
    name = f"{prefix}/{rel}"
    if any(ord(c) < 32 or c in '"\\' or ord(c) == 127 for c in name):
        escapes = {"\t": "\\t", "\n": "\\n", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
        body = "".join(escapes.get(c) or (f"\\{ord(c):03o}" if ord(c) < 32 or ord(c) == 127 else c) for c in name)
        return f'"{body}"'
    if any(c.isspace() for c in name):
        return name + "\t"
    return name


def _imports(tree: ast.Module, package: str) -> bool:
    """Does the file import ``package`` (or a module of it) anywhere, absolutely?"""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == package for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package and not node.level:
            return True
    return False


def _import_insert_line(tree: ast.Module) -> int:
    """0-based line index to insert ``import torch_npu`` at: after the first top-level torch
    import, else after the docstring and ``from __future__`` imports."""
    node: ast.stmt
    for node in tree.body:
        assert node.end_lineno is not None   # parsed statements have positions
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return node.end_lineno
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch" and not node.level:
            return node.end_lineno
    after = 0
    for node in tree.body:
        assert node.end_lineno is not None
        is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        if is_doc or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            after = node.end_lineno
        else:
            break
    return after


def _apply_edits(lines: list[bytes], hits: list[Hit]) -> tuple[list[bytes], list, list]:
    """Apply the hits' edits right-to-left per line; overlapping or stale edits are skipped."""
    by_line: dict[int, list] = {}
    applied, refused = [], []
    for hit in hits:
        for edit in hit.edits:
            by_line.setdefault(edit.line, []).append((edit, hit))
    new_lines = list(lines)
    for line_no, items in by_line.items():
        raw = new_lines[line_no - 1]
        items.sort(key=lambda item: item[0].start, reverse=True)
        limit = len(raw) + 1
        for edit, hit in items:
            current = raw[edit.start:edit.end].decode("utf-8", "replace")
            if edit.end > limit or current != edit.old:
                refused.append((hit, "overlaps another rewrite on the same line"))
                continue
            raw = raw[:edit.start] + edit.new.encode("utf-8") + raw[edit.end:]
            limit = edit.start
            applied.append((edit, hit))
        new_lines[line_no - 1] = raw
    return new_lines, applied, refused


def migrate_source(source: str, rel: str, path: Path | None = None) -> FileMigration:
    """The safe rewrites of one Python source (its text), with what was left and why."""
    result = FileMigration(path=path or Path(rel), rel=rel, original=source, patched=source)
    bom = "\ufeff" if source.startswith("\ufeff") else ""
    data = source[len(bom):].encode("utf-8")
    try:
        tree = ast.parse(data)
        hits = scan_source(data, rel)
    except (SyntaxError, ValueError) as exc:
        result.error = f"could not parse ({getattr(exc, 'msg', exc)}); nothing changed"
        return result
    lines = data.splitlines(keepends=True)
    new_lines, applied, refused = _apply_edits(lines, [h for h in hits if h.edits])
    refused_ids = {id(h) for h, _ in refused}
    for edit, hit in applied:
        result.changes.append(Change(edit.line, hit.rule.id, edit.old, edit.new))
    for hit in hits:
        reason = hit.unsafe_reason or next((r for h, r in refused if h is hit), None)
        if not hit.edits or id(hit) in refused_ids:
            result.skipped.append(Skipped(hit.line, hit.rule.id, hit.api, reason or "needs judgement", hit.replacement))
    if applied and _imports(tree, "torch") and not _imports(tree, "torch_npu"):
        at = _import_insert_line(tree)
        newline = b"\r\n" if lines and lines[0].endswith(b"\r\n") else b"\n"
        if at and at <= len(new_lines) and not new_lines[at - 1].endswith((b"\n", b"\r")):
            new_lines[at - 1] += newline
        new_lines.insert(at, IMPORT_LINE.encode().replace(b"\n", newline))
        result.import_added = True
    patched = bom + b"".join(new_lines).decode("utf-8")
    try:
        ast.parse(patched[len(bom):])
    except SyntaxError as exc:  # never hand out a patch that breaks the file
        result.error = f"the rewrite would not parse ({exc.msg}); nothing changed"
        result.changes, result.import_added = [], False
        return result
    result.patched = patched
    if applied and not result.import_added and not _imports(tree, "torch_npu"):
        result.skipped.append(Skipped(None, "import-torch-npu", "import torch_npu",
                                      "this file does not import torch: add `import torch_npu` in the entry "
                                      "script so 'npu' devices and torch.npu exist"))
    return result


def _root_for(paths: list[Path]) -> Path:
    cwd = Path.cwd().resolve()
    resolved = [p.resolve() for p in paths]
    if all(p.is_relative_to(cwd) for p in resolved):
        return cwd
    common = Path(os.path.commonpath([str(p if p.is_dir() else p.parent) for p in resolved]))
    return common


def plan_migration(paths, root: Path | None = None, exclude: Path | None = None) -> Migration:
    """Safe rewrites for files and/or project folders.

    Diff paths are relative to ``root`` (default: the current directory when every path
    lies under it, else their common folder), so ``git apply`` / ``patch -p1`` run there.
    ``exclude`` (e.g. the output folder) is never scanned.
    """
    paths = [Path(p) for p in paths]
    root = Path(root).resolve() if root else _root_for(paths)
    excluded = Path(exclude).resolve() if exclude else None
    migration = Migration(root=root)
    rules = load_rules()
    seen: set[Path] = set()
    for path in iter_source_files(paths):
        full, problem = _real_path(path)
        if full is None:
            migration.files.append(FileMigration(path=path, rel=_display(path, root), error_kind="not-read",
                                                 error=f"{problem}; nothing changed"))
            continue
        if excluded and (full == excluded or full.is_relative_to(excluded)):
            continue
        if not full.is_relative_to(root) and (path.is_symlink() or _linked_dir(path, root)):
            migration.files.append(FileMigration(
                path=path, rel=_display(path, root), error_kind="not-followed",
                error=f"a symbolic link to {full}, outside {root}: not followed, nothing changed "
                      "(migrate that project itself)"))
            continue
        if full in seen:   # the same file reached through a link inside the root
            continue
        seen.add(full)
        rel = full.relative_to(root).as_posix() if full.is_relative_to(root) else path.name
        if path.suffix in CPP_SUFFIXES:
            text = path.read_text(encoding="utf-8", errors="replace")
            hits = scan_cpp(text, rel, rules)
            if hits:
                fm = FileMigration(path=path, rel=rel, original=text, patched=text)
                fm.skipped = [Skipped(h.line, h.rule.id, h.api, h.unsafe_reason or "needs an NPU implementation",
                                      h.replacement) for h in hits]
                migration.files.append(fm)
            continue
        try:
            raw = path.read_bytes()
            source = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            migration.files.append(FileMigration(path=path, rel=rel, error_kind="unreadable",
                                                 error=f"not read as UTF-8 ({exc}); nothing changed"))
            continue
        if b"\r" in raw and b"\r\n" not in raw:
            migration.files.append(FileMigration(path=path, rel=rel, original=source, patched=source,
                                                 error="old Mac (CR) line endings; nothing changed"))
            continue
        fm = migrate_source(source, rel, path)
        if fm.changes or fm.skipped or fm.error:
            migration.files.append(fm)
    return migration


def _real_path(path: Path) -> tuple[Path | None, str]:
    """(the regular file a path names after following every link, or None and why not).

    A FIFO or device named ``*.py`` would block or never end when read, so only regular
    files are read."""
    try:
        full = path.resolve(strict=True)
    except (OSError, RuntimeError):   # RuntimeError: a symlink loop (Python < 3.13)
        return None, "a symbolic link loop or a broken link"
    try:
        regular = stat.S_ISREG(full.stat().st_mode)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    return (full, "") if regular else (None, "not a regular file (a FIFO, device or socket)")


def _linked_dir(path: Path, root: Path) -> bool:
    """Whether a folder on the way from the root to ``path`` is a symbolic link."""
    parent = path.absolute().parent
    while parent != parent.parent and parent.is_relative_to(root):
        if parent.is_symlink():
            return True
        parent = parent.parent
    return False


def _display(path: Path, root: Path) -> str:
    absolute = path.absolute()
    return absolute.relative_to(root).as_posix() if absolute.is_relative_to(root) else str(path)


def render_report(migration: Migration) -> str:
    """Markdown: what was rewritten, and every finding left for a person with the reason."""
    changed = migration.changed_files
    n_changes = sum(len(f.changes) for f in changed)
    out = ["# opscope migrate", "",
           f"Root: `{migration.root}`. {n_changes} safe rewrite(s) in {len(changed)} file(s); "
           f"apply with `git apply opscope-migrate.patch` or `patch -p1 < opscope-migrate.patch` from the root.", ""]
    if changed:
        out += ["## Changed", "", "| file:line | rule | before | after |", "|---|---|---|---|"]
        for f in changed:
            for c in f.changes:
                out.append(f"| {f.rel}:{c.line} | {c.rule} | `{c.before}` | `{c.after}` |")
            if f.import_added:
                out.append(f"| {f.rel} | import-torch-npu | | `import torch_npu` |")
        out.append("")
    left = [(f, s) for f in migration.files for s in f.skipped]
    errors = [f for f in migration.files if f.error]
    if left or errors:
        out += ["## Not changed (needs judgement)", "", "| file:line | rule | API | why not | what to do |",
                "|---|---|---|---|---|"]
        for f in errors:
            out.append(f"| {_cell(f.rel)} | {f.error_kind} | | {_cell(f.error)} | |")
        for f, s in left:
            where = f"{f.rel}:{s.line}" if s.line else f.rel
            out.append(f"| {where} | {s.rule} | `{s.api}` | {_cell(s.reason)} | {_cell(s.replacement or '')} |")
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
