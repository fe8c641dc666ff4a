"""Write output files atomically (temp file + rename): a reader never sees half a file, a
crash leaves the old file, and a symbolic link at the destination is replaced, never
written through to whatever it points at."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path, data: str | bytes, encoding: str = "utf-8", newline: str | None = None) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if isinstance(data, bytes):
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        else:
            with os.fdopen(fd, "w", encoding=encoding, newline=newline) as fh:
                fh.write(data)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
