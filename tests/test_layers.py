"""The pipeline's direction: capture -> model -> analysis -> report; nothing imports back up."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opscope"
# layer -> packages it must never import (also inside functions)
FORBIDDEN = {
    "capture": ("opscope.analysis", "opscope.report", "opscope.commands", "opscope.pipeline"),
    "analysis": ("opscope.capture", "opscope.commands", "opscope.report", "opscope.pipeline"),
    "report": ("opscope.capture", "opscope.commands", "opscope.pipeline"),
    "parsers": ("opscope.capture", "opscope.commands", "opscope.report", "opscope.pipeline"),
}
# the callable-package hook: ``opscope.capture(...)`` is the in-process API above the pipeline
ALLOWED = {("capture/__init__.py", "opscope.api")}


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def test_no_layer_imports_back_up_the_pipeline():
    bad = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            for module, line in _imports(path):
                if module.startswith(forbidden) and (rel, module) not in ALLOWED:
                    bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "\n".join(bad)
