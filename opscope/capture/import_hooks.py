"""Run code on a module right after Python imports it (or now, if it already has).

The scan observes some libraries from the inside: the functions of a compiled extension
(``extension_calls.py``), the constructors of the collators that set batch shapes (``loaders.py``).
Their modules are imported by the user's script after the session starts, often lazily
(transformers' ``_LazyModule``), so the change is made as the module finishes loading: the module is
found as Python would find it, and its loader runs the callback after executing it.
"""
from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable

Callback = Callable[[object], None]


class _AfterLoader(importlib.abc.Loader):
    def __init__(self, loader, callback: Callback):
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.callback(module)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, callbacks: dict[str, Callback]):
        self.callbacks = callbacks

    def find_spec(self, fullname, path=None, target=None):
        callback = self.callbacks.get(fullname)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterLoader(spec.loader, callback)
                return spec
        return None


def after_import(callbacks: dict[str, Callback]) -> list:
    """Call ``callbacks[name](module)`` once each named module is imported; the undo handles."""
    if not callbacks:
        return []
    for name, callback in callbacks.items():
        if name in sys.modules:
            callback(sys.modules[name])
    return first_finder(_AfterImportFinder(callbacks))


def first_finder(finder) -> list:
    """Put ``finder`` first on ``sys.meta_path``; the undo handle (``remove()``) in a list, as hooks are kept."""
    sys.meta_path.insert(0, finder)

    class _Undo:
        def remove(self):
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
    return [_Undo()]
