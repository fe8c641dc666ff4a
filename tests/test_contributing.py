"""CONTRIBUTING.md's "where things live" map names every package, so a new one gets its line."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_map_names_every_package_and_folder():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^\| `([^`]+)`", text, re.M))
    packages = {f"opscope/{p.name}/" for p in (ROOT / "opscope").iterdir() if (p / "__init__.py").exists()}
    folders = {"support_matrix/", "reports/templates/", "bench/", "tests/"}
    missing = sorted(p for p in packages | folders if not any(n.startswith(p.rstrip("/")) for n in named))
    assert not missing, f"add a line for {missing} to CONTRIBUTING.md"
    gone = sorted(name for name in named if not (ROOT / name).exists())   # and every path it names exists
    assert not gone, f"CONTRIBUTING.md names paths that do not exist: {gone}"
