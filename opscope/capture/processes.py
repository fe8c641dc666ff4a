"""Process helpers of the parent's launchers: ``runner`` (one capture child) and ``distributed``
(one child per rank) both start, watch and stop children with these, so neither imports the other.
"""
from __future__ import annotations

import os
import select
import subprocess
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


class LineCounter:
    """Whole lines in a file that only grows (``steps.jsonl``), reading only what was added.

    The parent shows progress four times a second while the child writes a step's calls
    there: re-reading the whole file each time took CPU from the script on a 2-core machine.
    """

    def __init__(self, path: Path):
        self.path, self.offset, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.offset:   # written anew: count from the start
                    self.offset, self.lines = 0, 0
                fh.seek(self.offset)
                added = fh.read()
        except OSError:
            return self.lines
        whole = added.rfind(b"\n") + 1   # a line still being written is counted once it ends
        self.lines += added.count(b"\n", 0, whole)
        self.offset += whole
        return self.lines


class ExitWatch:
    """Waits for a child process, waking the moment it ends.

    ``Popen.wait(timeout)`` polls in sleeps of up to 50 ms, so a scan ended on average 25 ms
    after its child did; a pidfd (Linux 5.3+) becomes readable exactly when the process exits.
    Where there is none, ``wait`` falls back to ``Popen.wait``.
    """

    def __init__(self, proc):
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):   # not Linux, an old kernel, or the process is gone
            self.fd = None

    def wait(self, timeout: float) -> bool:
        """True once the child has ended (reaped: ``returncode`` is set), False after ``timeout`` s."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        self.proc.wait()
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
