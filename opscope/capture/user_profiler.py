"""The script's own profiler (``torch.profiler.profile``, ``torch.autograd.profiler.profile``) during a scan.

Kineto keeps one profiling session per process: a script that starts its own profiler while opscope's
records a step ends or corrupts opscope's session, and the process dies of SIGSEGV.  While the scan runs,
the script's profiler is a stand-in with the same API (``with``, ``start``/``stop``/``step``,
``key_averages()``, ``events()``, ``export_chrome_trace()``) that records nothing: opscope's own
profiler records every operator the script's would have.  Its construction is a run-time finding at the
script's line (``script-profiler``), which says how to profile on the NPU.
"""
from __future__ import annotations

import json

from opscope.capture.patches import Restore


def _empty_events():
    from torch.autograd.profiler_util import EventList
    return EventList()


class _ScriptProfiler:
    """What ``torch.profiler.profile(...)`` gives the script during a scan: the API, no recording."""

    def __init__(self, *args, **kwargs):
        self.on_trace_ready = kwargs.get("on_trace_ready")
        self.step_num = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self):
        pass

    def stop(self):
        pass

    def step(self):
        self.step_num += 1

    def key_averages(self, *args, **kwargs):
        return _empty_events()

    def events(self):
        return _empty_events()

    def table(self, *args, **kwargs) -> str:
        return ""

    def total_average(self):
        return _empty_events().total_average()

    def export_chrome_trace(self, path: str):
        with open(path, "w", encoding="utf-8") as out:   # the script's own file, where it asked for it
            json.dump({"traceEvents": [], "opscope": "recorded by opscope's scan, not here"}, out)

    def export_stacks(self, *args, **kwargs):
        pass

    def export_memory_timeline(self, *args, **kwargs):
        pass

    def add_metadata(self, *args, **kwargs):
        pass

    def add_metadata_json(self, *args, **kwargs):
        pass


def install_script_profiler_stand_in(findings) -> list:
    """Replace the profiler classes a script reaches by name; returns the patches to undo.

    opscope's session keeps the real ``torch.autograd.profiler.profile`` it took before this ran.
    """
    import torch.autograd.profiler as autograd_profiler
    import torch.profiler
    import torch.profiler.profiler as profiler_module

    def stand_in(name: str) -> type:
        class profile(_ScriptProfiler):
            def __init__(self, *args, **kwargs):
                findings.record("script-profiler", f"{name}()", depth=2)
                super().__init__(*args, **kwargs)
        return profile

    kineto, legacy = stand_in("torch.profiler.profile"), stand_in("torch.autograd.profiler.profile")
    patches = []
    for owner, attr, value in ((torch.profiler, "profile", kineto), (profiler_module, "profile", kineto),
                               (autograd_profiler, "profile", legacy)):
        patches.append(Restore(owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)
    return patches
