"""User-facing errors: one line naming the problem and the fix, and an exit code.

Anything raised as ``UserError`` is printed by the CLI as ``opscope: error: ...``
without a traceback.  Exit codes are documented in README.md.
"""

EXIT_OK = 0
EXIT_USAGE = 2            # bad command line / bad input file
EXIT_SCRIPT_FAILED = 3    # the user's script raised, exited non-zero or was killed
EXIT_TIMEOUT = 4          # --timeout ended the script
EXIT_FAIL_UNDER = 5       # readiness score below --fail-under
EXIT_VERIFY_FAILED = 6    # verification found failing operators
EXIT_INTERNAL = 70        # a bug in opscope itself


class UserError(Exception):
    """An error caused by input the user can fix; printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code
