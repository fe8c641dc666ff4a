"""User-facing errors: one line naming the problem and the fix, and an exit code.

Anything raised as ``UserError`` is printed by the CLI as ``opscope: error: ...``
without a traceback.  Exit codes are documented in README.md.
"""
import re

EXIT_OK = 0
EXIT_USAGE = 2            # bad command line / bad input file
EXIT_SCRIPT_FAILED = 3    # the user's script raised, exited non-zero or was killed
EXIT_TIMEOUT = 4          # --timeout ended the script
EXIT_FAIL_UNDER = 5       # readiness score below --fail-under
EXIT_VERIFY_FAILED = 6    # verification found failing operators
EXIT_WRITE_FAILED = 7     # the run folder could not be written (disk full, quota, I/O error): what fit is kept
EXIT_INTERNAL = 70        # a bug in opscope itself


MAX_MESSAGE = 600          # characters of an error line; longer input excerpts are cut

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f-\x9f]")


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as a single printable line: control characters (newlines, ANSI escapes)
    that came from an input file must not break or recolour the terminal."""
    text = _CONTROL.sub(" ", str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def excerpt(value, limit: int = 60) -> str:
    """A short ``repr`` of a bad value for an error message (never the whole of a huge one)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return f"a {len(str(abs(value))) if abs(value) < 10 ** 4000 else 'huge'}-digit integer"
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class UserError(Exception):
    """An error caused by input the user can fix; printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class InputError(UserError):
    """An input file opscope cannot use, as one line: the file, the place in it (event
    index, table row, JSON path), what is wrong there and what to do about it.

    Every loader raises this (and only this) for bad content, so the CLI turns any
    broken or hostile file into exit 2 instead of a traceback.
    """

    def __init__(self, path, problem: str, where: str | None = None, fix: str | None = None):
        self.path, self.where, self.problem, self.fix = str(path), where, problem, fix
        text = self.path + (f": {where}" if where else "") + f": {problem}" + (f"; {fix}" if fix else "")
        super().__init__(one_line(text), EXIT_USAGE)
