"""Locate data shipped with opscope (support matrix, report templates).

Works from a source checkout / editable install (top-level ``support_matrix/`` and
``reports/templates/``) and from an installed wheel (mapped into ``opscope.*``).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def package_parent() -> Path:
    """The folder holding the ``opscope`` package: its checkout when installed from one (``pip install -e``)."""
    return _ROOT


def support_matrix_dir() -> Path:
    local = _ROOT / "support_matrix"
    if local.is_dir():
        return local
    return Path(str(resources.files("opscope.support_matrix")))


def templates_dir() -> Path:
    local = _ROOT / "reports" / "templates"
    if local.is_dir():
        return local
    return Path(str(resources.files("opscope.templates")))
