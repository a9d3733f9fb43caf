"""Every failure a user can see is a FleetError with a one-line message and an optional hint.

Each subclass fixes the process exit status, so scripts can tell a missing task from a refused
transition without parsing text. The table of codes is documented in fleet(1). `guard` is the
one place, for `fleet` and the per-task programs alike, where an error becomes that line and
status: an OSError no code path expected (a full disk, a deleted directory) included.
"""

from __future__ import annotations

from collections.abc import Callable


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


def os_error(e: OSError) -> FleetError:
    """An error of the operating system that no code path expected (a full disk, a file
    made unreadable, a directory deleted underneath), as one line naming the file."""
    import errno

    name = e.filename
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return FleetError(
            f"the disk holding {name} is full" if name is not None else "the disk is full",
            hint="free some space on it and try again; the file was left as it was",
        )
    text = e.strerror or str(e) or type(e).__name__
    return FleetError(f"{name}: {text}" if name is not None else text[:1].lower() + text[1:])


def report(prog: str, error: FleetError) -> int:
    """Print `prog: error: …` (and `prog: hint: …`) on stderr, each one line whatever text they
    quote (fleet.output escapes it); the exit status to use."""
    import sys

    from fleet.output import for_terminal

    sys.stderr.write(f"{prog}: error: {for_terminal(error.message)}\n")
    if error.hint:
        sys.stderr.write(f"{prog}: hint: {for_terminal(error.hint)}\n")
    return error.exit_code


def guard(prog: str, action: Callable[[], object]) -> int:
    """Run `action` as program `prog` (fleet, fleet-run, …): the exit status for every way
    it can end. A FleetError or an OSError is one line (the traceback only with FLEET_DEBUG=1),
    ^C is 130, and a reader that went away (`fleet ls | head`) ends it quietly, 141."""
    import os
    import sys

    debug = os.environ.get("FLEET_DEBUG", "") not in ("", "0")
    try:
        result = action()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit fails no more
        return 141
    except (FleetError, OSError) as e:
        if debug:
            raise
        return report(prog, e if isinstance(e, FleetError) else os_error(e))
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    return result if isinstance(result, int) else 0


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
