"""The glossary every report and the docs share (``support_matrix/glossary.yaml``).

One file of terms, so the HTML report's verdict and evidence cells and the docs' glossary page
(built by ``docs/hooks/opscope_docs.py`` from these functions) say the same thing.
"""
from __future__ import annotations

import re

from opscope.knowledge import load


def term_anchor(term: str) -> str:
    """The anchor of a term, the same in the report and the docs (``g-cpu-fallback``)."""
    return "g-" + re.sub(r"[^a-z0-9]+", "-", term.lower()).strip("-")


def terms() -> list[dict]:
    """Every term: ``term``, ``kind`` (verdict, root-cause, concept), ``says``, ``page``, ``anchor``."""
    return [{**entry, "says": " ".join(str(entry["says"]).split()), "anchor": term_anchor(entry["term"])}
            for entry in load("glossary.yaml")["terms"]]
