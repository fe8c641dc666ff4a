"""Captured text made safe to show: no terminal escape sequences, no control characters.

A script's error message (torch's ``weights_only`` error has ANSI colours), a file name or
a label may hold bytes that break XML (XLSX), confuse a browser or a terminal.  Used by the
capture child when it records a script's error, and by every reporter.
"""
from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")   # what XML 1.0 / openpyxl refuse


def printable(text: str, replacement: str = "\ufffd") -> str:
    """``text`` without escape sequences; other control characters become ``replacement``."""
    return ILLEGAL.sub(replacement, ANSI.sub("", text))
