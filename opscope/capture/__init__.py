"""opscope.capture: run a script (or a block of code) under the profiler and record its operators.

The package itself is callable, so ``opscope.capture(out=...)`` is the in-process API
(``opscope.api.capture``, which sits above the pipeline) even after its submodules have
been imported; this lazy hook is the one place capture names something above it.
"""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from opscope.api import capture
        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
