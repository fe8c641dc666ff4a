"""The "where things live" map of docs/internals/architecture.md names every package, so a new one gets its line."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "internals" / "architecture.md"


def _named_paths() -> list[str]:
    """Every path in the first column of the map's table (the section "Where things live")."""
    text = MAP.read_text(encoding="utf-8")
    section = re.search(r"^## Where things live\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"{MAP.relative_to(ROOT)} has no '## Where things live' section"
    first_cells = re.findall(r"^\| (`[^|]+`) \|", section.group(1), re.M)
    return [name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)]


def test_the_map_names_every_package_and_folder():
    named = _named_paths()
    packages = {f"opscope/{p.name}/" for p in (ROOT / "opscope").iterdir() if (p / "__init__.py").exists()}
    folders = {"support_matrix/", "reports/templates/", "bench/", "tests/"}
    missing = sorted(p for p in packages | folders if not any(n.startswith(p.rstrip("/")) for n in named))
    assert not missing, f"add a line for {missing} to {MAP.relative_to(ROOT)}"
    gone = sorted(name for name in named if not (ROOT / name).exists())   # and every path it names exists
    assert not gone, f"{MAP.relative_to(ROOT)} names paths that do not exist: {gone}"


def test_every_package_is_installed():
    """A package left out of ``[tool.setuptools] packages`` works in a checkout (``pip install -e``) and is
    missing from a wheel: ``opscope.report.formats`` was, so a plain ``pip install .`` wrote no report."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "opscope").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert found - listed == set(), f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_the_map_names_every_analysis_subpackage():
    row = next(line for line in MAP.read_text().splitlines() if line.startswith("| `opscope/analysis/` |"))
    subpackages = sorted(p.parent.name for p in (ROOT / "opscope" / "analysis").glob("*/__init__.py"))
    assert subpackages, "opscope/analysis has no subpackages"
    missing = [name for name in subpackages if f"`{name}/`" not in row]
    assert not missing, f"name {missing} in the opscope/analysis/ row of {MAP.relative_to(ROOT)}"
