"""Chrome-trace JSON from torch.profiler / export_chrome_trace (.json, .json.gz)."""
from __future__ import annotations

from pathlib import Path
from typing import overload

from opscope.model import Profile
from opscope.parsers.events import ProfileBuilder
from opscope.parsers.stream import TraceReader


@overload
def load_chrome_trace(path, file_step: int | None = None, builder: None = None) -> Profile: ...
@overload
def load_chrome_trace(path, file_step: int | None = None, builder: ProfileBuilder | None = None) -> Profile | None: ...


def load_chrome_trace(path, file_step: int | None = None, builder: ProfileBuilder | None = None) -> Profile | None:
    """Parse one trace; pass ``builder`` to merge several files (one per step) into one Profile."""
    path = Path(path)
    own = builder is None
    builder = builder or ProfileBuilder("chrome-trace", path)
    reader = TraceReader(path)
    builder.add(reader, file_step=file_step)
    builder.header = builder.header or reader.header
    if not own:
        return None
    prof = builder.build()
    dist = reader.header.get("distributedInfo") or {}
    if isinstance(dist, dict):
        prof.rank = valid_rank(dist.get("rank"))
    return prof


def valid_rank(value) -> int | None:
    """A rank from a trace header or profiler_info file: an integer 0 <= rank < 2**31, else unknown."""
    if isinstance(value, str) and value.strip().isdigit() and len(value) < 12:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31:
        return value
    return None
