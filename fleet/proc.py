"""The one way fleet runs a short-lived helper program (systemctl, journalctl, git, …).

Every call has an explicit argv, stdin from /dev/null unless input is given, text output
captured, a timeout, and `NOTIFY_SOCKET` removed from the child's environment so that no helper
can speak to systemd on the runner's behalf. A missing program or a failure with check=True
becomes a FleetError with the program's own last line of stderr.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence

from fleet.errors import FleetError

HIDDEN = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN}
    if extra:
        env.update(extra)
    return env


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            list(argv),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=child_env(env),
            timeout=timeout,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError:
        raise FleetError(f"{argv[0]} is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise FleetError(f"{argv[0]} did not finish within {timeout:.0f} s") from None
    if check and result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise FleetError(f"{' '.join(argv[:2])} failed: {last}")
    return result


@contextlib.contextmanager
def reading(argv: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A long-running program (journalctl -f) whose standard output the caller reads as it
    comes, stopped when the block ends."""
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=child_env()
        )
    except FileNotFoundError:
        raise FleetError(f"{argv[0]} is not installed or not on PATH") from None
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def stream(argv: Sequence[str]) -> Iterator[str]:
    """The lines a long-running program prints (journalctl -f), until it exits or we stop."""
    with reading(argv) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            yield raw.decode("utf-8", "replace")
