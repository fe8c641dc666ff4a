"""Process helpers of the parent's launchers: ``runner`` (one capture child) and ``distributed``
(one child per rank) both start, watch and stop children with these, so neither imports the other.
"""
from __future__ import annotations

import os
import select
import signal
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


class EarlyChild:
    """A capture child started before its plan exists.

    ``opscope scan`` starts it before it even reads its command line (``opscope.cli``): it
    imports torch (most of a child's start-up: ~1 s) while the parent imports its own modules,
    checks the options, resolves the target, takes the run folder and writes the plan;
    ``runner.run_script`` then hands it the plan's path over a pipe.  The parent's own start-up
    (~0.2 s a scan) then costs no wall time on a machine with a core to spare.  A child whose
    plan turns out to need another environment (a launcher's, a distributed one) is discarded,
    as is one the command never hands a plan to (a usage error, Ctrl-C); if the parent dies, the
    pipe closes and the child ends without touching the run folder.
    """

    def __init__(self, env: dict):
        self.env = env
        read, self._handshake = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "opscope.scan_child", "--plan-fd", str(read)],
                                         cwd=os.getcwd(), env=env, start_new_session=True, stderr=subprocess.PIPE,
                                         pass_fds=(read,))
        except BaseException:
            os.close(self._handshake)
            raise
        finally:
            os.close(read)

    @classmethod
    def start(cls) -> EarlyChild | None:
        """Start one with the environment ``run_script`` gives a plain launch; None where it cannot start."""
        try:
            return cls(child_environment(None))
        except (OSError, ValueError):   # no process or pipe to spare, no pass_fds: started with its plan
            return None

    def hand_over(self, config_path) -> subprocess.Popen:
        try:   # the path's bytes as the file system has them (any name), ended by closing the pipe
            os.write(self._handshake, os.fsencode(str(config_path)))
        except BrokenPipeError:   # it died starting (torch failed to import): its stderr and status say why
            pass
        os.close(self._handshake)
        self._handshake = -1
        return self.proc

    def discard(self) -> None:
        """End it (it has written nothing) and reap it."""
        if self._handshake >= 0:
            os.close(self._handshake)
            self._handshake = -1
            signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()


def child_environment(env: dict | None) -> dict:
    """The capture child's environment: ours, the launch's ``env`` on top, unbuffered output."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    return child_env


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
        self.identity: tuple = ()

    def count(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                stat = os.fstat(fh.fileno())
                if (stat.st_dev, stat.st_ino) != self.identity or stat.st_size < self.offset:
                    self.offset, self.lines = 0, 0   # another file by that name (or written anew): from the start
                    self.identity = (stat.st_dev, stat.st_ino)
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
        poller = select.poll()   # not select.select: no limit on the descriptor's number
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return False
        self.proc.wait()
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
