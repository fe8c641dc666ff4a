"""Spreadsheet cells from untrusted text: every XLSX and CSV writer goes through here.

Captured text (a script's error message with ANSI colours, a file name, a label from the
command line) may hold control characters, which openpyxl refuses with
IllegalCharacterError, or start like a formula (``=HYPERLINK(...)``, ``@SUM``, ``+1``,
``-1``, tab, CR), which Excel and LibreOffice would evaluate.  Numbers beyond what a
spreadsheet stores exactly (``10**400``, inf, NaN) become their text.
"""
from __future__ import annotations

import math

from opscope.text import printable

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
MAX_CELL = 32_767                      # Excel's limit on characters in a cell
MAX_EXACT = 2 ** 53                    # integers beyond lose digits as a spreadsheet number


def clean_text(text: str) -> str:
    """Text without terminal escape sequences or characters XML cannot hold."""
    text = printable(text)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def is_formula_like(text) -> bool:
    return isinstance(text, str) and text.startswith(FORMULA_STARTS)


def cell_value(value):
    """``value`` as something openpyxl stores faithfully: clean text or an exact finite number."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) < MAX_EXACT:
            return value
        return str(value) if abs(value) < 10 ** 4000 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return clean_text(value if isinstance(value, str) else str(value))


def set_cell(cell, value) -> None:
    """Store ``value`` in an openpyxl cell: text stays text (quote-prefixed when formula-like)."""
    value = cell_value(value)
    cell.value = value
    if isinstance(value, str):
        cell.data_type = "s"
        if is_formula_like(value):
            cell.quotePrefix = True


def csv_text(value):
    """A CSV field a spreadsheet opens as text: formula-like text gets a leading apostrophe
    (OWASP's advice for CSV injection); other values are written as they are."""
    if isinstance(value, str):
        value = clean_text(value)
        return "'" + value if is_formula_like(value) else value
    return value
