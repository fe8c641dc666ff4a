"""Stream the events of a Chrome trace without loading the whole document.

Real traces are hundreds of MB; ``json.load`` would hold the text *and* every event
dict at once.  We read the file in chunks and decode one event at a time with the C
scanner (``JSONDecoder.raw_decode``), so the caller keeps only what it needs.
Accepts ``{"traceEvents": [...], ...}`` (torch) and a bare ``[...]`` (Ascend
``trace_view.json``), plain or gzip-compressed.

Memory ceiling: one event may span at most ``MAX_EVENT_CHARS`` (64 Mi characters);
the buffer never holds more than that plus one chunk, whatever the file holds.
Nesting deeper than the C scanner allows is a format error, not a RecursionError.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from opscope.parsers.base import FormatError

CHUNK = 1 << 20
MAX_EVENT_CHARS = 64 * CHUNK
_SKIP = re.compile(r"[\s,]*")
_KEY = re.compile(r'"traceEvents"\s*:\s*\[')


class TraceFormatError(FormatError):
    """The file is not a (complete) Chrome trace; the message says what was found."""


def _open_text(path: Path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


class TraceReader:
    """Iterate the events of one trace; ``header`` holds the top-level keys seen before them."""

    def __init__(self, path):
        self.path = Path(path)
        self.header: dict = {}

    def __iter__(self) -> Iterator[dict]:
        decode = json.JSONDecoder().raw_decode
        skip = _SKIP.match
        index = 0
        try:
            with _open_text(self.path) as fh:
                buf, pos = self._find_array(fh)
                eof = False
                while True:
                    pos = skip(buf, pos).end()   # type: ignore[union-attr]  # _SKIP matches the empty string
                    if pos >= len(buf) - 1 and not eof:
                        buf, pos, eof = self._more(fh, buf, pos, index)
                        continue
                    if pos < len(buf) and buf[pos] == "]":
                        return
                    try:
                        event, end = decode(buf, pos)
                    except json.JSONDecodeError as exc:
                        if eof:
                            raise TraceFormatError(f"truncated or corrupt JSON near character ~{exc.pos}",
                                                   where=f"event {index}") from None
                        buf, pos, eof = self._more(fh, buf, pos, index)
                        continue
                    except RecursionError:
                        raise TraceFormatError("nested too deeply to be a trace event",
                                               where=f"event {index}") from None
                    pos = end
                    if not isinstance(event, dict):
                        raise TraceFormatError(f"expected an event object, found {type(event).__name__}",
                                               where=f"event {index}")
                    yield event
                    index += 1
                    if len(buf) - pos < 65536 and not eof:
                        buf, pos, eof = self._more(fh, buf, pos, index)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise TraceFormatError(f"cannot read ({exc})", where=f"event {index}") from None

    @staticmethod
    def _more(fh, buf: str, pos: int, index: int) -> tuple[str, int, bool]:
        """Append the next chunk to the unconsumed rest; refuse an event beyond the ceiling."""
        if len(buf) - pos > MAX_EVENT_CHARS:
            raise TraceFormatError(f"one event spans more than {MAX_EVENT_CHARS >> 20} Mi characters "
                                   "(not a trace, or corrupt)", where=f"event {index}")
        more = fh.read(CHUNK)
        return buf[pos:] + more, 0, not more

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
            if not more or len(buf) > MAX_EVENT_CHARS:
                raise TraceFormatError("no \"traceEvents\" array")
            buf += more

    def _parse_header(self, text: str) -> None:
        head = text.rstrip().rstrip(",")
        try:
            header = json.loads(head + "}") if head.lstrip().startswith("{") else {}
        except (json.JSONDecodeError, RecursionError):
            header = {}
        self.header = header if isinstance(header, dict) else {}
