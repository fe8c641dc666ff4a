"""opscope: before porting a PyTorch training job to Ascend NPUs, find what will break.

Pipeline: ``capture`` (run a script, collect operator events) -> ``model`` (plain
dataclasses) -> ``analysis`` (pure functions) -> ``report`` (HTML, XLSX, JSON, terminal).
"""
__version__ = "0.1.0"

# ``opscope.capture(out="runs/x", steps=5)`` is the in-process API: the package is callable.
from opscope import capture  # noqa: E402,F401  (light: no torch import until called)
