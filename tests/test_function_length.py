"""No function of opscope is longer than 80 lines (issue 42): a long function does several jobs, and each job
is easier to read, test and change as a function of its own.

Length is the function's own span in the source, decorators excluded, docstring and nested functions included
(``end_lineno - lineno + 1`` of its ``ast`` node).  A function that cannot be split at once is listed in
``ALLOWED`` with the reason: the test fails on any other, and on an entry that is no longer over the limit or
no longer exists (the list only shrinks).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opscope"
MAX_LINES = 80

# "path in opscope/::qualified name" -> why it is still over MAX_LINES
ALLOWED: dict[str, str] = {}


def function_lengths(root: Path) -> dict[str, int]:
    """``path::Class.function`` -> its length in lines, for every function and method under ``root``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[f"{path}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", path)
            else:
                visit(child, prefix, path)

    for file in sorted(root.rglob("*.py")):
        visit(ast.parse(file.read_text(encoding="utf-8")), "", file.relative_to(root).as_posix())
    return out


def test_no_function_is_longer_than_the_limit():
    long = {name: n for name, n in function_lengths(PACKAGE).items() if n > MAX_LINES and name not in ALLOWED}
    assert not long, (f"over {MAX_LINES} lines (split into functions with one job each): "
                      + ", ".join(f"{name} ({n})" for name, n in sorted(long.items())))


def test_every_allowed_function_is_still_over_the_limit():
    lengths = function_lengths(PACKAGE)
    stale = sorted(name for name in ALLOWED if lengths.get(name, 0) <= MAX_LINES)
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): remove {stale} from ALLOWED"


def test_a_long_nested_function_is_found(tmp_path):
    body = "".join(f"            x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"class A:\n    def f(self):\n        def g():\n{body}        return g\n")
    lengths = function_lengths(tmp_path)
    assert lengths["m.py::A.f"] == MAX_LINES + 3 and lengths["m.py::A.f.g"] == MAX_LINES + 1
