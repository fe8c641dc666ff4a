"""Stream the events of a Chrome trace without loading the whole document.

Real traces are hundreds of MB; ``json.load`` would hold the text *and* every event
dict at once.  We read the file in chunks and decode one event at a time with the C
scanner (``JSONDecoder.raw_decode``), so the caller keeps only what it needs.
Accepts ``{"traceEvents": [...], ...}`` (torch) and a bare ``[...]`` (Ascend
``trace_view.json``), plain or gzip-compressed.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20
_SKIP = re.compile(r"[\s,]*")
_KEY = re.compile(r'"traceEvents"\s*:\s*\[')


class TraceFormatError(ValueError):
    """The file is not a (complete) Chrome trace; the message says what was found."""


def _open_text(path: Path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "r", encoding="utf-8", errors="replace")


class TraceReader:
    """Iterate the events of one trace; ``header`` holds the top-level keys seen before them."""

    def __init__(self, path):
        self.path = Path(path)
        self.header: dict = {}

    def __iter__(self) -> Iterator[dict]:
        decode = json.JSONDecoder().raw_decode
        skip = _SKIP.match
        try:
            with _open_text(self.path) as fh:
                buf, pos = self._find_array(fh)
                eof = False
                while True:
                    pos = skip(buf, pos).end()
                    if pos >= len(buf) - 1 and not eof:
                        more = fh.read(CHUNK)
                        buf, pos = buf[pos:] + more, 0
                        eof = not more
                        continue
                    if pos < len(buf) and buf[pos] == "]":
                        return
                    try:
                        event, end = decode(buf, pos)
                    except json.JSONDecodeError as exc:
                        if eof:
                            raise TraceFormatError(f"truncated or corrupt JSON near byte offset ~{exc.pos}") from None
                        more = fh.read(CHUNK)
                        buf, pos = buf[pos:] + more, 0
                        eof = not more
                        continue
                    pos = end
                    if isinstance(event, dict):
                        yield event
                    if len(buf) - pos < 65536 and not eof:
                        more = fh.read(CHUNK)
                        buf, pos = buf[pos:] + more, 0
                        eof = not more
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise TraceFormatError(f"cannot read ({exc})") from None

    def _find_array(self, fh) -> tuple[str, int]:
        """Position just after the '[' that opens the event list; parse the header keys."""
        buf = fh.read(CHUNK)
        stripped = buf.lstrip()
        if stripped.startswith("["):
            return buf, buf.index("[") + 1
        if not stripped.startswith("{"):
            raise TraceFormatError("not JSON (expected '{' or '[')")
        while True:
            match = _KEY.search(buf)
            if match:
                self._parse_header(buf[: match.start()])
                return buf, match.end()
            more = fh.read(CHUNK)
            if not more or len(buf) > 64 * CHUNK:
                raise TraceFormatError("no \"traceEvents\" array")
            buf += more

    def _parse_header(self, text: str) -> None:
        head = text.rstrip().rstrip(",")
        try:
            self.header = json.loads(head + "}") if head.lstrip().startswith("{") else {}
        except json.JSONDecodeError:
            self.header = {}


def iter_events(path) -> Iterator[dict]:
    """Shortcut: the events of a trace, one dict at a time."""
    return iter(TraceReader(path))
