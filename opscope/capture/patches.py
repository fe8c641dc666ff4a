"""Monkey-patches opscope installs in the script's process, undone the same way as torch hooks."""
from __future__ import annotations


class Restore:
    """A removable monkey-patch, with the same ``remove()`` as torch hook handles."""

    def __init__(self, owner, attr, original):
        self.owner, self.attr, self.original = owner, attr, original

    def remove(self):
        setattr(self.owner, self.attr, self.original)
