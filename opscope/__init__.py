"""opscope: before porting a PyTorch training job to Ascend NPUs, find what will break.

Pipeline: ``capture`` (run a script, collect operator events) -> ``model`` (plain
dataclasses) -> ``analysis`` (pure functions) -> ``report`` (HTML, XLSX, JSON, terminal).
"""
__version__ = "0.1.0"


def capture(*args, **kwargs):
    """In-process capture: ``with opscope.capture(out="runs/x") as cap: ... cap.step()``."""
    from opscope.capture.inprocess import capture as _capture
    return _capture(*args, **kwargs)
