"""Find every CUDA-specific API in a project's source without running it.

The part of opscope that works when the script cannot run.  Python files are parsed
with ``ast``; imports and simple aliases are resolved per scope, so ``t.cuda.synchronize()``
after ``import torch as t`` is found while a user function that is merely called
``cuda`` is not.  Whether a ``'cuda'`` string names a device is decided by where it flows
(``static_flow``: into a torch call, ``.to()``, a ``device=`` keyword, or a variable / attribute /
dict key / argparse option read so), so a TVM target or a log message is no finding and a
comparison is only advice; ``**kwargs`` dicts are followed the same way into the calls a rule
tests (``DataLoader(**kwargs)`` with ``pin_memory=True`` inside).
What counts as CUDA-specific, and what replaces it, is data:
``support_matrix/cuda_api_rules.yaml`` (``load_rules``; the migrate command and the
SARIF writer read the same rule set).
C/C++/CUDA sources are checked for CUDA kernels and custom-op registrations.

The parts, one job each: ``static_rules`` (the rule set, data), ``static_scopes`` (name
binding and resolution), ``static_flow`` (where literals flow), ``static_match`` (the rule
pass, each match rendered with its edits); this module walks files and folders.

``scan_source`` returns ``Hit`` objects that also carry the exact edits a safe
mechanical rewrite would make; ``opscope.analysis.static.migrate`` applies those.
"""
from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

from opscope.analysis.static.flow import Flow
from opscope.analysis.static.match import Edit, Finder, Hit
from opscope.analysis.static.rules import RULES_FILE, Rule, RuleSet, load_rules
from opscope.analysis.static.scopes import Binder
from opscope.model import Finding

# the names other modules import from here (the rules and hits live in the modules above)
__all__ = ["CPP_SUFFIXES", "PARALLEL_MIN_FILES", "PY_SUFFIXES", "RULES_FILE", "SKIP_DIRS", "Edit", "Hit", "Rule",
           "RuleSet", "iter_source_files", "load_rules", "scan_cpp", "scan_file", "scan_paths", "scan_source"]

PY_SUFFIXES = (".py",)
CPP_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx")
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", "node_modules",
                       ".tox", ".nox", ".eggs", ".mypy_cache", ".pytest_cache", "site-packages", "build", "dist"})


def scan_source(source: bytes | str, path: str = "<string>", rules: RuleSet | None = None) -> list[Hit]:
    """Hits for one Python source (raises SyntaxError/ValueError when it does not parse)."""
    rules = rules or load_rules()
    data = _as_utf8(source)
    tree = ast.parse(data, filename=path)
    binder = Binder()
    binder.visit(tree)
    scopes = binder.finish()

    def make_flow():
        flow = Flow(rules.flow, scopes, binder.functions)
        flow.visit(tree)
        return flow.finish()
    finder = Finder(rules, scopes, data.splitlines(), make_flow)
    finder.visit(tree)
    hits = _apply_context(finder.hits)
    unique: dict[tuple, Hit] = {}
    for hit in hits:
        unique.setdefault((hit.rule.id, hit.line, hit.column), hit)
    return sorted(unique.values(), key=lambda h: (h.line, h.column, h.rule.id))


def _as_utf8(source: bytes | str) -> bytes:
    """UTF-8 bytes without a BOM: the AST's column offsets count UTF-8 bytes of the decoded text."""
    if isinstance(source, bytes):
        if source.startswith(b"\xef\xbb\xbf"):
            return source[3:]
        head = source[:400]
        if b"coding" in head:
            import io
            import tokenize
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
            if encoding not in ("utf-8", "utf-8-sig"):
                return source.decode(encoding).encode("utf-8")
        return source
    return source.lstrip("\ufeff").encode("utf-8")


def _apply_context(hits: list[Hit]) -> list[Hit]:
    """Drop `context: ported-file` advice in files with no other CUDA finding."""
    if any(h.rule.context != "ported-file" for h in hits):
        return hits
    return []


_CPP_BLOCK = re.compile(r"\b(TORCH_LIBRARY(?:_FRAGMENT)?|PYBIND11_MODULE)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{")
_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>]+\s+)*?(\w+)\s*\(")


def scan_cpp(text: str, path: str, rules: RuleSet | None = None) -> list[Hit]:
    """CUDA kernels (.cu) and ops registered with TORCH_LIBRARY / PYBIND11_MODULE."""
    rules = rules or load_rules()
    hits: list[Hit] = []
    name = os.path.basename(path)
    for rule in rules.rules:
        if rule.files and any(Path(name).match(p) for p in rule.files):
            kernels = sorted(set(_GLOBAL_KERNEL.findall(text)))
            listed = f" (kernels: {', '.join(kernels[:12])}{', ...' if len(kernels) > 12 else ''})" if kernels else ""
            hits.append(Hit(rule=rule, line=1, column=1, api=name, message=rule.render(rule.message, kernels=listed),
                            replacement=rule.replacement, unsafe_reason="a CUDA kernel needs an NPU implementation"))
            break
    op_rule = next((r for r in rules.rules if r.cpp), None)
    if op_rule is None:
        return hits
    for block in _CPP_BLOCK.finditer(text):
        macro, namespace, var = block.groups()
        body = _brace_body(text, block.end() - 1)
        for op in re.finditer(rf"\b{re.escape(var)}\s*\.\s*(?:def|impl)\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(\s*)?\"([^\"(]+)",
                              body):
            qual = f"{namespace}::{op.group(1).strip()}" if macro.startswith("TORCH_LIBRARY") else \
                f"{namespace}.{op.group(1).strip()}"
            offset = block.end() + op.start()
            line = text.count("\n", 0, offset) + 1
            col = offset - (text.rfind("\n", 0, offset) + 1) + 1
            hits.append(Hit(rule=op_rule, line=line, column=col, api=qual,
                            message=op_rule.render(op_rule.message, value=qual),
                            replacement=op_rule.replacement, unsafe_reason="a custom op needs an NPU kernel"))
    return hits


def _brace_body(text: str, open_at: int) -> str:
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return text[open_at + 1:]


def iter_source_files(paths, contained: bool = False) -> list[Path]:
    """Python and C/C++/CUDA files under ``paths`` (files or folders), skipping venvs and VCS dirs.

    Links to folders are never walked (no loops).  With ``contained``, a file inside a folder
    whose symbolic link leads out of it is left out (a project's link to ``/etc`` or a home
    folder is not the project), and so is anything but a regular file (a FIFO named ``x.py``
    would block forever); ``migrate`` lists them itself to say why it did not follow them.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.append(path)
            continue
        root = path.resolve()
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            for fname in sorted(filenames):
                if fname.endswith(PY_SUFFIXES) or fname.endswith(CPP_SUFFIXES):
                    candidate = Path(dirpath) / fname
                    if not contained or _inside_regular_file(candidate, root):
                        found.append(candidate)
    return found


def _inside_regular_file(path: Path, root: Path) -> bool:
    try:
        real = path.resolve(strict=True)
        return real.is_relative_to(root) and stat.S_ISREG(real.stat().st_mode)
    except (OSError, RuntimeError):   # dangling link, loop
        return False


def scan_file(path: Path, rules: RuleSet | None = None) -> list[Finding]:
    """Findings for one file; a file that does not parse gives one `parse-error` finding."""
    rules = rules or load_rules()
    path = Path(path)
    display = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [_problem(display, None, f"could not read the file ({exc.strerror}); it was not scanned")]
    if path.suffix in CPP_SUFFIXES:
        text = data.decode("utf-8", "replace")
        if path.suffix not in (".cu", ".cuh") and "TORCH_LIBRARY" not in text and "PYBIND11_MODULE" not in text:
            return []
        lines = text.splitlines()
        return [h.to_finding(display, lines) for h in scan_cpp(text, display, rules)]
    if not rules.keywords.search(data.decode("latin-1")):
        return []  # no rule can match: skip the parse (keeps a 500-file project in seconds)
    try:
        hits = scan_source(data, display, rules)
    except (SyntaxError, ValueError, LookupError) as exc:  # LookupError: unknown coding cookie
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", None) or str(exc)
        return [_problem(display, line, f"could not parse ({msg}); this file was not scanned")]
    try:
        lines = _as_utf8(data).decode("utf-8", "replace").splitlines()
    except (LookupError, UnicodeDecodeError):
        lines = data.decode("utf-8", "replace").splitlines()
    return [h.to_finding(display, lines) for h in hits]


def _problem(file: str, line: int | None, message: str) -> Finding:
    return Finding(rule="parse-error", file=file, line=line, column=None, api="(file)", message=message,
                   replacement="fix the syntax (Python 3) so the file can be checked", severity="warning",
                   origin="static")


PARALLEL_MIN_FILES = 200   # below this, starting worker processes costs more than it saves


def scan_paths(paths, rules: RuleSet | None = None, jobs: int | None = None, progress=None) -> list[Finding]:
    """Static findings for files and/or project folders, in file then line order.

    ``file`` is each path as given (or joined onto the given folder), so relative
    arguments give paths relative to the current directory.  Big trees are parsed in
    ``jobs`` worker processes (default: one per CPU).  ``progress(done, total)`` is
    called as files are scanned.
    """
    rules = rules or load_rules()
    files, seen = [], set()
    for path in iter_source_files(paths, contained=True):
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            files.append(path)
    jobs = jobs or os.cpu_count() or 1
    if progress is not None:
        progress(0, len(files))
    if jobs > 1 and len(files) >= PARALLEL_MIN_FILES and rules is load_rules():
        results = _scan_parallel(files, jobs, progress)
        if results is not None:
            return [f for chunk in results for f in chunk]
    findings: list[Finding] = []
    for i, path in enumerate(files, 1):
        findings.extend(scan_file(path, rules))
        if progress is not None:
            progress(i, len(files))
    return findings


def _scan_chunk(paths: list) -> list:
    rules = load_rules()
    return [scan_file(p, rules) for p in paths]


def _scan_parallel(files: list[Path], jobs: int, progress=None):
    """Scan in worker processes (fork where available: no re-import); None if they cannot start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    try:
        context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
            else multiprocessing.get_context()
        size = max(8, len(files) // (jobs * 8))
        chunks = [files[i:i + size] for i in range(0, len(files), size)]
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            results, done = [], 0
            for chunk, found in zip(chunks, pool.map(_scan_chunk, chunks), strict=True):
                results.extend(found)
                done += len(chunk)
                if progress is not None:
                    progress(done, len(files))
            return results
    except (OSError, RuntimeError, ImportError):  # no process support (sandbox): scan in-process
        return None
