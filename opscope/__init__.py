"""opscope: before porting a PyTorch training job to Ascend NPUs, find what will break.

Pipeline: ``capture`` (run a script, collect operator events) -> ``model`` (plain
dataclasses) -> ``analysis`` (pure functions) -> ``report`` (HTML, XLSX, JSON, terminal).
"""
# ``opscope.capture(out="runs/x", steps=5)`` is the in-process API: the package is callable.
from opscope import capture  # noqa: E402,F401  (light: no torch import until called)
from opscope.version import __version__  # noqa: E402,F401


def load(run_dir):
    """A scan's run folder as DataFrames: ``opscope.load("runs/cnn").operators`` (see ``opscope.dataframes``)."""
    from opscope.dataframes import load as _load
    return _load(run_dir)


def load_diff(a, b, **options):
    """``opscope diff A B`` as DataFrames (see ``opscope.dataframes.Diff``)."""
    from opscope.dataframes import load_diff as _load_diff
    return _load_diff(a, b, **options)
