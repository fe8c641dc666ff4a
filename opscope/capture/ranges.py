"""The script's own profiler ranges (``torch.profiler.record_function``): a step never ends inside one.

Stopping the profiler while a range it saw open is still running corrupts Kineto: the range's
exit writes into the stopped session's freed buffers and a later step dies of SIGSEGV.  Ranges
opened while a step records are tracked; a step that ends inside one (``Optimizer.step#...``,
around which the optimizer runs its post-hooks; a training loop that wraps each iteration in a
range of its own) is finished when the last of them closes.  Ranges opened before capture
began were never seen by a profiler session and are left alone.
"""
from __future__ import annotations

import threading

from opscope.capture.patches import Restore


def install_range_tracking(session) -> list:
    """Track ``record_function`` ranges the owner thread opens while ``session`` records.

    ``session.open_ranges`` maps id -> range; when the last one closes, ``session.safe_point()``
    ends a step that became due inside it.  Returns the patches to undo.
    """
    from torch.autograd.profiler import record_function
    orig_enter, orig_exit = record_function.__enter__, record_function.__exit__
    owner = threading.get_ident()
    open_ranges = session.open_ranges

    def enter(rf):
        out = orig_enter(rf)
        if session.prof is not None and threading.get_ident() == owner:
            open_ranges[id(rf)] = rf
        return out

    def exit_(rf, exc_type, exc_value, traceback):
        try:
            return orig_exit(rf, exc_type, exc_value, traceback)
        finally:
            if open_ranges.pop(id(rf), None) is not None and not open_ranges:
                session.safe_point()   # a step that became due inside the range ends here

    record_function.__enter__ = enter   # type: ignore[method-assign]
    record_function.__exit__ = exit_    # type: ignore[method-assign]
    return [Restore(record_function, "__enter__", orig_enter), Restore(record_function, "__exit__", orig_exit)]
