"""Write output files atomically (temp file + rename): a reader never sees half a file, a
crash leaves the old file, and a symbolic link at the destination is replaced, never
written through to whatever it points at.

This is the one writer of opscope's outputs, so it is also where a write failure can be
injected for the tests (``OPSCOPE_FAIL_WRITE``, see ``_injected``): every write site of a
scan fails the way a full disk makes it fail.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import tempfile
from pathlib import Path

FAIL_WRITE_ENV = "OPSCOPE_FAIL_WRITE"   # test hook: "PATTERN[@N][,...]" -> ENOSPC (or OPSCOPE_FAIL_WRITE_ERRNO)
_writes: dict[str, int] = {}


def _injected(path) -> None:
    """Raise the OSError a full disk would, when ``OPSCOPE_FAIL_WRITE`` names ``path``.

    Each comma-separated item is a glob matched against the end of the path
    (``traces/step_0004.json``, ``capture/steps.jsonl@4`` = from its 4th write on).
    """
    spec = os.environ.get(FAIL_WRITE_ENV)
    if not spec:
        return
    text = Path(path).as_posix()
    count = _writes[text] = _writes.get(text, 0) + 1
    for item in spec.split(","):
        pattern, _, nth = item.strip().partition("@")
        if pattern and (fnmatch.fnmatch(text, pattern) or fnmatch.fnmatch(text, "*/" + pattern)) \
                and count >= int(nth or 1):
            code = getattr(errno, os.environ.get("OPSCOPE_FAIL_WRITE_ERRNO", "ENOSPC"), errno.ENOSPC)
            raise OSError(code, os.strerror(code), str(path))


def write_atomic(path, data: str | bytes, encoding: str = "utf-8", newline: str | None = None) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    def writer(tmp: Path) -> None:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            with open(tmp, "w", encoding=encoding, newline=newline) as fh:
                fh.write(data)
    return write_via_temp(path, writer)


def write_in_place(path, writer, complete) -> Path:
    """For a writer that must be given the final name (Kineto records it inside the trace) and
    that does not report its own write errors: ``complete(path)`` checks the result, and an
    incomplete file is removed and reported as the OSError a full disk (or I/O error) is."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()   # replaced, never written through
    try:
        writer(path)
        _injected(path)
        if not complete(path):
            full = _free_bytes(path.parent) < 1 << 20
            code = errno.ENOSPC if full else errno.EIO
            raise OSError(code, os.strerror(code), str(path))
    except BaseException:
        for leftover in (path, path.with_name(path.name + ".tmp")):   # and the writer's own temp (Kineto's)
            try:
                leftover.unlink()
            except OSError:
                pass
        raise
    return path


def _free_bytes(folder) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_via_temp(path, writer) -> Path:
    """Call ``writer(tmp_path)`` for a writer that only takes a path (openpyxl, jinja), then
    rename the result over ``path``: the same guarantees as ``write_atomic``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        writer(Path(tmp))
        _injected(path)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


class AppendLog:
    """A line log (``capture/steps.jsonl``) that holds only whole lines: a line that fails to
    be written is cut off again, so a full disk never leaves half a record behind."""

    def __init__(self, path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644 & ~_umask())

    def append(self, line: str) -> None:
        data = line.encode("utf-8")
        size = os.fstat(self.fd).st_size
        try:
            view = memoryview(data)
            if os.environ.get(FAIL_WRITE_ENV):   # an injected failure strikes mid-line, as a full disk does
                view = view[os.write(self.fd, view[: len(data) // 2]):]
                _injected(self.path)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            try:
                os.ftruncate(self.fd, size)
            except OSError:
                pass
            raise

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def ensure_out_dir(path, option: str) -> Path:
    """Create an output folder or fail at once (exit 2), before any long work starts."""
    from opscope.errors import UserError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path} is a file; give a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {option} {path} ({exc.strerror or exc}); choose a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path} is not writable; choose a writable folder")
    return path


def write_failed(path, exc: OSError):
    """The one-line UserError for an output that could not be written (it keeps ``path`` and the
    OSError, so ``opscope scan`` can say what of the run was kept)."""
    from opscope.errors import UserError

    error = UserError(f"cannot write {path} ({exc.strerror or exc}); choose a writable output folder")
    error.path, error.os_error = Path(path), exc   # type: ignore[attr-defined]
    return error
