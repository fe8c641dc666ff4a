"""opscope: before porting a PyTorch training job to Ascend NPUs, find what will break.

Pipeline: ``capture`` (run a script, collect operator events) -> ``model`` (plain
dataclasses) -> ``analysis`` (pure functions) -> ``report`` (HTML, XLSX, JSON, terminal).
"""
# ``opscope.capture(out="runs/x", steps=5)`` is the in-process API: the package is callable.
from opscope import capture  # noqa: E402,F401  (light: no torch import until called)
from opscope.version import __version__  # noqa: E402,F401


def scan(script, *script_args, **options):
    """``opscope scan`` from Python: run ``script`` with ``script_args`` for a few steps in a capture child
    under the profiler, analyse it and write the run folder; returns the ``ScanResult``.

    ``options`` are the command's options by their long names (``out="runs/x"``, ``steps=3``, ``warmup``,
    ``device``, ``timeout``, ``step_marker``, ``launcher``, ``world_size``, ``ranks``, ``target``, ``chip``,
    ``calibration``, ``formats=("html",)``, ``traces=False`` for ``--no-traces``, ``keep_compile``,
    ``max_step_calls``, ``max_capture_mb``, ``max_memory``, ``mode``; see ``opscope.scanning.ScanOptions``).
    A bad option raises ``opscope.errors.UserError`` with the command's message and ``exit_code``; a script
    that failed or timed out still returns its result, with ``result.complete`` False.
    """
    from opscope.scanning import scan as _scan
    return _scan(script, *script_args, **options)


def load(run_dir):
    """A scan's run folder as DataFrames: ``opscope.load("runs/cnn").operators`` (see ``opscope.dataframes``)."""
    from opscope.dataframes import load as _load
    return _load(run_dir)


def load_diff(a, b, **options):
    """``opscope diff A B`` as DataFrames (see ``opscope.dataframes.Diff``)."""
    from opscope.dataframes import load_diff as _load_diff
    return _load_diff(a, b, **options)
