"""Where in the user's code an error came from: the ``file:line`` of a script's one-line error.

Shared by the capture child (``child.py``) and its spawned ranks (``ranks.py``); it sits below
both so neither imports the other.
"""
from __future__ import annotations

import os
import traceback


def user_frame_summary(exc: BaseException, script: str) -> str:
    """'file:line' of the innermost frame in the user's script tree, for the one-line error."""
    tb = traceback.extract_tb(exc.__traceback__)
    root = os.path.dirname(os.path.abspath(script))
    for frame in reversed(tb):
        if os.path.abspath(frame.filename).startswith(root + os.sep):
            return f"{os.path.relpath(frame.filename, root)}:{frame.lineno}"
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"
