"""Shared knowledge read from ``support_matrix/`` (data, not code), loaded once.

Several stages need the same facts — capture folds backend-private kernels, the
verdict engine judges them through their parent, the diff folds them too — so the
facts live in one yaml file each and one predicate each, here.
"""
from __future__ import annotations

import fnmatch
from functools import lru_cache

from opscope.resources import support_matrix_dir


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    import yaml
    with open(support_matrix_dir() / name, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def backend_private_patterns() -> list[str]:
    """fnmatch patterns (without ``aten::``) of backend-private ATen kernels."""
    return list(load("backend_private_ops.yaml").get("patterns") or [])


@lru_cache(maxsize=4096)
def is_backend_private(name: str) -> str | None:
    """The matching pattern when ``aten::mkldnn_convolution`` & co. are backend-private."""
    ns, _, base = name.rpartition("::")
    if ns not in ("aten", ""):
        return None
    return next((p for p in backend_private_patterns() if fnmatch.fnmatchcase(base, p)), None)
