"""No import cycles between the modules of opscope, imports inside functions included.

A function-level import hides a cycle from Python (it runs late, after both modules loaded) but not
from a reader: two modules that import each other are one module to change.  The graph below has an
edge for every ``import`` / ``from ... import`` anywhere in a module (``from pkg import sub`` points
at ``pkg.sub`` when that is a module).  Plug-ins found by listing a package (report formats, CLI
commands) are loaded by name and are not edges.

A cycle that cannot be broken at once is listed in ``ALLOWED`` (one import, with the reason): the
test fails on any other cycle, and on an entry that no longer closes a cycle (the list only shrinks).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opscope"

# (importer, imported): an import that closes a cycle not broken yet, each with a comment saying why
# it stays.  Empty: every cycle issue 21 found is broken (shared names moved to a lower module).
ALLOWED: set[tuple[str, str]] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package: first line importing it}."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:   # relative: from . import x, from ..pkg import y
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in targets:
                if target in paths and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph, component) -> str:
    return "cycle: " + ", ".join(f"{a} -> {b} (line {line})" for a in component
                                 for b, line in sorted(graph[a].items()) if b in component)


def _without_allowed(graph):
    return {a: {b: line for b, line in edges.items() if (a, b) not in ALLOWED} for a, edges in graph.items()}


def test_no_import_cycles_besides_the_listed_ones():
    graph = _without_allowed(import_graph(PACKAGE))
    assert not cycles(graph), "\n".join(_describe(graph, c) for c in cycles(graph))


def test_every_listed_import_still_closes_a_cycle():
    graph = import_graph(PACKAGE)
    stale = [edge for edge in ALLOWED
             if edge[1] not in graph.get(edge[0], {}) or not any(set(edge) <= set(c) for c in cycles(graph))]
    assert not stale, f"no longer a cycle: remove {stale} from ALLOWED"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (root / "c.py").write_text("import os\n\n\ndef g():\n    from pkg import a\n    return a\n")
    (root / "d.py").write_text("from pkg import a\n")   # imports into the cycle, not part of it
    graph = import_graph(root)
    assert graph["pkg.sub.b"] == {"pkg.c": 2}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert "pkg.c -> pkg.a (line 5)" in _describe(graph, cycles(graph)[0])


def private_imports_across_packages(root: Path) -> list[str]:
    """``from opscope.a.b import _name`` in a module outside package ``opscope.a`` (aliases ``as _x`` of a
    public name are fine): a private name is its package's to change."""
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opscope")):
                continue
            home = node.module.split(".")[:2]
            if importer.split(".")[:2] == home:
                continue   # the same package (or the same top-level module)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{importer}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_no_private_name_is_imported_from_another_package():
    assert private_imports_across_packages(PACKAGE) == []


def test_no_module_imports_another_modules_private_name():
    """A helper two modules need is public in a module that owns it (commands/_common.py for the commands):
    ``commands/verify.py`` had imported ``commands/scan.py``'s ``_check_compiles``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opscope") \
                    and node.module != importer:
                found += [f"{importer}:{node.lineno} imports {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []
