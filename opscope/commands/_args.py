"""argparse value types shared by the commands: a bad option is argparse's one-line usage
error (exit 2) before any work, never a NaN timeout or an empty version string."""
from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, tolerances): rejects 0, negatives, nan and inf."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number greater than 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (an absolute or relative tolerance may be exactly 0)."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def finite_float(text: str) -> float:
    """Any finite number (a score threshold): rejects nan and inf."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def non_empty(text: str) -> str:
    """A string with something in it besides spaces (a version, an operator, a label)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if any(ord(c) < 32 for c in text):
        raise argparse.ArgumentTypeError("must not hold control characters")
    return text
