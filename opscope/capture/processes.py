"""Process helpers of the parent's launchers: ``runner`` (one capture child) and ``distributed``
(one child per rank) both start, watch and stop children with these, so neither imports the other.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def relay_stderr(stream, capture_dir=None) -> None:
    """Pass the script's stderr through, minus the profiler's own lines: counted, with the first
    of each kind, into ``capture_dir/noise.json`` (opscope.capture.noise) for scan.json's notes."""
    from opscope.capture.noise import Noise
    noise = Noise(capture_dir)
    out = getattr(sys.stderr, "buffer", None)
    for line in iter(stream.readline, b""):
        if noise.profiler_line(line):
            continue
        line = noise.after_progress_bar(line)
        if out is not None:
            out.write(line)
            out.flush()
        else:  # pragma: no cover - stderr replaced by a text stream (tests)
            sys.stderr.write(line.decode(errors="replace"))
    stream.close()
    noise.save()


def signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0
