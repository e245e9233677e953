"""The exit codes every ``spotd`` command uses, and the code of an error.

A script can tell "fix what you gave" (2) from "try again later, or look at the
job" (1) by the code alone; docs/operations.md lists them.
"""

from __future__ import annotations

from enum import IntEnum

from spotd.core.errors import SpotdError

__all__ = ["ExitCode", "exit_code"]


class ExitCode(IntEnum):
    """What a command's exit status says."""

    OK = 0
    """It did what was asked."""
    FAILED = 1
    """It could not: no daemon answered, the job failed or was not found, a cloud or
    the database said no. The same command may pass later."""
    BAD_INPUT = 2
    """What it was given is wrong: an argument, a job file, the configuration, a
    scenario. It fails the same way until that is fixed."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT), as a shell reports it: 128 + 2."""


def exit_code(exc: BaseException) -> ExitCode:
    """The exit code of a command that ended on ``exc``: :attr:`ExitCode.BAD_INPUT` for
    an error in what the user gave (:attr:`SpotdError.bad_input`),
    :attr:`ExitCode.INTERRUPTED` for Ctrl-C, else :attr:`ExitCode.FAILED`."""
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, SpotdError) and exc.bad_input:
        return ExitCode.BAD_INPUT
    return ExitCode.FAILED
