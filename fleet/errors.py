"""Every failure a user can see is a FleetError with a one-line message and an optional hint.

Each subclass fixes the process exit status, so scripts can tell a missing task from a refused
transition without parsing text. The table of codes is documented in fleet(1).
"""

from __future__ import annotations


class FleetError(Exception):
    """Something went wrong that the user can act on."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(FleetError):
    """The command line or an input file is wrong (bad id, bad value, missing file)."""

    exit_code = 2


class NotFound(FleetError):
    """A task or question named on the command line does not exist."""

    exit_code = 3


class Conflict(FleetError):
    """The request is valid but the task's current state does not allow it."""

    exit_code = 4


class ConfigError(FleetError):
    """The configuration file or a configuration value is unusable."""

    exit_code = 5


class StoreError(FleetError):
    """The task store cannot be used (newer schema, corrupt file, unwritable directory)."""

    exit_code = 6


class TimedOut(FleetError):
    """A wait ran out of time (the status timeout(1) uses)."""

    exit_code = 124


def report(prog: str, error: FleetError) -> int:
    """Print `prog: error: …` (and `prog: hint: …`) on stderr, each one line whatever text they
    quote (fleet.output escapes it); the exit status to use."""
    import sys

    from fleet.output import for_terminal

    sys.stderr.write(f"{prog}: error: {for_terminal(error.message)}\n")
    if error.hint:
        sys.stderr.write(f"{prog}: hint: {for_terminal(error.hint)}\n")
    return error.exit_code


# The documented exit statuses, in one place, for fleet(1) and the README.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "general failure"),
    (InputError.exit_code, "bad usage or bad input"),
    (NotFound.exit_code, "no such task or question"),
    (Conflict.exit_code, "the task's state does not allow this (conflict)"),
    (ConfigError.exit_code, "unusable configuration"),
    (StoreError.exit_code, "the task store cannot be used"),
    (TimedOut.exit_code, "timed out (fleet wait --timeout)"),
    (130, "interrupted"),
)
