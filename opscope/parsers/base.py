"""The error every profile loader raises for bad content, with the place it was found.

``opscope.parsers.load_profile`` (the one interface) turns it into an ``InputError``
naming the file, so each loader only says what is wrong and where.
"""
from __future__ import annotations


class FormatError(ValueError):
    """Bad content: ``where`` is an event index, a table row or a JSON path (or None)."""

    def __init__(self, problem: str, where: str | None = None):
        super().__init__(problem)
        self.problem, self.where = problem, where
