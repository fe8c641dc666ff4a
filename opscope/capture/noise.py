"""Keep opscope's own noise off the user's stderr, and say in scan.json what was kept off.

Two sources: lines the profiler prints on the script's stderr (Kineto's "Toggling CPU
activity" for every pause of recording, start/stop chatter), filtered by the parent as it
relays the child's stderr (patterns: ``support_matrix/stderr_noise.yaml``); and Python
warnings raised from opscope's own code in the child (a deprecation that torch attributes
to opscope's wrapper of a torch call).  The script's own output and warnings pass through.
Each kind is counted with its first message in ``capture/noise.json``; ``notes`` turns that
into scan.json notes.
"""
from __future__ import annotations

import json
import os
import re
import threading
import warnings
from functools import lru_cache
from pathlib import Path

from opscope.atomic import write_atomic

NOISE_FILE = "noise.json"
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the opscope package
_lock = threading.Lock()


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[str, re.Pattern, bool]]:
    from opscope.knowledge import load
    return [(entry["kind"], re.compile(rb"(?:\[rank\d+\]:)?" + entry["pattern"].encode()), entry.get("note", True))
            for entry in load("stderr_noise.yaml").get("lines") or []]


class Noise:
    """Counts per kind, with the first message of each, saved into one capture folder."""

    def __init__(self, capture_dir: Path | str | None):
        self.capture_dir = Path(capture_dir) if capture_dir else None
        self.kinds: dict[str, dict] = {}

    def add(self, kind: str, message: str, note: bool = True) -> None:
        entry = self.kinds.setdefault(kind, {"count": 0, "first": message[:300], "note": note})
        entry["count"] += 1

    def profiler_line(self, line: bytes) -> bool:
        """True (and counted) when ``line`` is the profiler's, not the script's."""
        for kind, pattern, note in _patterns():
            if pattern.match(line):
                self.add(kind, line.decode(errors="replace").strip(), note)
                return True
        return False

    def after_progress_bar(self, line: bytes) -> bytes:
        """``line`` minus a profiler line that follows a progress bar's unfinished line (tqdm redraws
        with a carriage return and no newline, so the profiler's line lands on the same line): the
        bar is kept, the profiler's part counted and dropped."""
        for kind, pattern, note in _patterns():
            found = pattern.search(line, 1)
            if found is not None and b"\r" in line[:found.start()]:
                self.add(kind, line[found.start():].decode(errors="replace").strip(), note)
                return line[:found.start()]
        return line

    def save(self) -> None:
        """Merge the counts into ``capture/noise.json`` (several relays and the child share it)."""
        if self.capture_dir is None or not self.kinds:
            return
        path = self.capture_dir / NOISE_FILE
        with _lock:
            data = read(self.capture_dir)
            for kind, entry in self.kinds.items():
                known = data.setdefault(kind, dict(entry, count=0))
                known["count"] += entry["count"]
            try:
                write_atomic(path, json.dumps(data, indent=1))
            except OSError:   # a full or read-only disk: the notes are best effort, never the scan's failure
                return
        self.kinds = {}


def read(capture_dir: Path | str) -> dict:
    try:
        data = json.loads((Path(capture_dir) / NOISE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def notes(capture_dir: Path | str) -> list[str]:
    """One scan.json note per kind of noise kept off the terminal: how many, and the first one."""
    out = []
    for kind, entry in sorted(read(capture_dir).items()):
        if not isinstance(entry, dict) or not entry.get("note", True) or not entry.get("count"):
            continue
        out.append(f"kept off your terminal: {entry['count']} x {kind}; first: {entry.get('first', '')}")
    return out


def divert_own_warnings(capture_dir: Path | str) -> None:
    """In the child: warnings raised from opscope's own files go to ``noise.json``, not stderr."""
    original = warnings.showwarning
    noise = Noise(capture_dir)

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(str(filename)).startswith(_OWN_DIR + os.sep):
            where = os.path.relpath(os.path.abspath(str(filename)), os.path.dirname(_OWN_DIR))
            noise.add(f"{category.__name__} raised inside opscope (not your script)",
                      f"{where}:{lineno}: {message}")
            noise.save()
            return
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
