"""Monkey-patches opscope installs in the script's process, undone the same way as torch hooks."""
from __future__ import annotations


class Restore:
    """A removable monkey-patch, with the same ``remove()`` as torch hook handles."""

    def __init__(self, owner, attr, original):
        self.owner, self.attr, self.original = owner, attr, original

    def remove(self):
        setattr(self.owner, self.attr, self.original)


class RestoreAll:
    """Removable patches gathered as they are made (a module's functions, wrapped when it is imported): all
    undone at once, the latest first."""

    def __init__(self, restores: list):
        self.restores = restores

    def remove(self) -> None:
        for restore in reversed(self.restores):
            restore.remove()
        self.restores.clear()

