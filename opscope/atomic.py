"""Write output files atomically (temp file + rename): a reader never sees half a file, a
crash leaves the old file, and a symbolic link at the destination is replaced, never
written through to whatever it points at."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path, data: str | bytes, encoding: str = "utf-8", newline: str | None = None) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    def writer(tmp: Path) -> None:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            with open(tmp, "w", encoding=encoding, newline=newline) as fh:
                fh.write(data)
    return write_via_temp(path, writer)


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
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


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
    """The one-line UserError for an output that could not be written."""
    from opscope.errors import UserError

    return UserError(f"cannot write {path} ({exc.strerror or exc}); choose a writable output folder")
