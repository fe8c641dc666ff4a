"""opscope.capture: run a script (or a block of code) under the profiler and record its operators.

The package itself is callable, so ``opscope.capture(out=...)`` is the in-process API
(see ``inprocess.py``) even after its submodules have been imported.
"""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from opscope.capture.inprocess import capture
        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
