"""The pipeline's direction: capture -> model -> analysis -> report; nothing imports back up.

Every package of opscope is covered, imports inside functions included, ``from opscope import X``
is resolved to the module it names, and modules started by name (``python -m opscope.scan_child``)
are checked like any other.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opscope"
TOP = ("opscope.commands", "opscope.pipeline", "opscope.scanning", "opscope.mode_probe", "opscope.cli", "opscope.api",
       "opscope.dataframes", "opscope.config", "opscope.scan_child", "opscope.__main__")
BASE = ("opscope.capture", "opscope.analysis", "opscope.report", "opscope.parsers", "opscope.replay",
        "opscope.fleet", "opscope.matrix") + TOP
# package or module -> what it must never import (also inside functions)
FORBIDDEN = {
    "capture": ("opscope.analysis", "opscope.report", "opscope.replay", "opscope.fleet") + TOP,
    "analysis": ("opscope.capture", "opscope.report", "opscope.replay", "opscope.fleet") + TOP,
    "report": ("opscope.capture", "opscope.replay", "opscope.fleet") + TOP,
    "parsers": ("opscope.capture", "opscope.analysis", "opscope.report", "opscope.replay", "opscope.fleet",
                "opscope.matrix") + TOP,
    "matrix": ("opscope.capture", "opscope.analysis", "opscope.report", "opscope.parsers", "opscope.replay",
               "opscope.fleet") + TOP,
    "replay": ("opscope.report", "opscope.fleet") + TOP,
    "fleet": ("opscope.capture", "opscope.analysis", "opscope.report", "opscope.replay") + TOP,
    # the data model and the leaf helpers sit below every layer
    **{leaf: BASE for leaf in ("model.py", "schema.py", "knowledge.py", "errors.py", "version.py", "atomic.py",
                               "text.py", "resources.py", "typed.py", "torch_support.py", "overloads.py")},
}
# the callable-package hook: ``opscope.capture(...)`` is the in-process API above the pipeline
ALLOWED = {("capture/__init__.py", "opscope.api"),
           # torch-free: a fleet retry waits for the run folder's lock of the attempt it replaces
           ("fleet/engine.py", "opscope.capture.run_folder")}
# names ``opscope/__init__`` defines for users; code below the CLI takes them from their own modules
ROOT_NAMES = {"scan", "load", "load_diff", "__version__"}


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "opscope":
                for alias in node.names:
                    yield ("opscope" if alias.name in ROOT_NAMES else f"opscope.{alias.name}"), node.lineno
            else:
                yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def _files(key: str) -> list[Path]:
    target = PACKAGE / key
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def test_every_package_is_covered():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(FORBIDDEN) | {"commands", "support_matrix", "templates"}, packages - set(FORBIDDEN)


def test_no_layer_imports_back_up_the_pipeline():
    bad = []
    for key, forbidden in FORBIDDEN.items():
        for path in _files(key):
            rel = path.relative_to(PACKAGE).as_posix()
            for module, line in _imports(path):
                if module.startswith(forbidden) and (rel, module) not in ALLOWED:
                    bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_nothing_below_the_cli_takes_names_from_the_package_root():
    """``from opscope import __version__`` runs ``opscope/__init__``, which reaches analysis and report."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("__init__.py", "cli.py", "__main__.py"):
            continue
        bad += [f"{rel}:{line}" for module, line in _imports(path) if module == "opscope"]
    assert not bad, "\n".join(bad)


def test_modules_started_by_name_exist_and_obey_the_layers():
    """A child started as ``python -m opscope.X`` is invisible to an import graph: find it by its name."""
    started = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        started |= set(re.findall(r'"-m",\s*"(opscope(?:\.\w+)+)"', path.read_text(encoding="utf-8")))
    assert "opscope.scan_child" in started
    for name in started:
        path = PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")
        assert path.exists(), name
        # a child entry is a top-level module: it may use the pipeline, but never the CLI's commands
        assert not [m for m, _ in _imports(path) if m.startswith(("opscope.commands", "opscope.cli"))], name


# the scan's two processes: they share capture/protocol.py (the plan), outcomes.py, run_folder.py and
# the model; neither side imports the other, even through a third module
PARENT_SIDE = ("runner", "distributed", "processes")
CHILD_SIDE = ("child", "ranks", "session", "remap", "remap_dist", "events", "source", "fake_mode")


def _capture_reach(module: str) -> set[str]:
    """Every module of ``opscope.capture`` that ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        tree = ast.parse((PACKAGE / "capture" / f"{todo.pop()}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module == "opscope.capture":   # from opscope.capture import x
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opscope.capture."):
                names = [node.module.split(".")[2]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[2] for a in node.names if a.name.startswith("opscope.capture.")]
            for name in names:
                if name not in seen and (PACKAGE / "capture" / f"{name}.py").exists():
                    seen.add(name)
                    todo.append(name)
    return seen


def test_the_scan_parent_and_child_import_only_what_they_share():
    bad = [f"capture/{m}.py reaches capture/{other}.py" for side, others in ((CHILD_SIDE, PARENT_SIDE),
                                                                            (PARENT_SIDE, CHILD_SIDE))
           for m in side for other in sorted(_capture_reach(m) & set(others))]
    assert not bad, "\n".join(bad)
    assert {"protocol", "run_folder"} <= _capture_reach("child") & _capture_reach("runner")
