"""Riding out an outage of the store (a PostgreSQL restart, a network cut) while an agent runs.

Invariant: an agent never stops because the store is unreachable, except when its claim may
have run out (fleet.run stops it then, as for a lease it cannot renew). Whatever its runner
would write meanwhile is kept, in order, one entry per kind (a newer session id replaces the
one still waiting), and written again every RETRY_S until the store takes it; what is still
kept when the attempt ends is said in one line. Nothing kept is needed for the attempt's
record: its outcome file holds the session, the spend and the usage, and the attempt is
settled from that file once the store is back (`settled`, fleet.claim's recovery), so nothing
is lost and, every write being fenced by owner and attempt, nothing is done twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from fleet.errors import StoreError

RETRY_S = 2.0  # how soon a write the store could not take is tried again
# How long a runner whose agent has ended waits for the store to settle the attempt itself
# (systemd's watchdog is pushed out meanwhile); after that the outcome file waits for the
# next dispatch pass.
SETTLE_WAIT_S = 240.0
T = TypeVar("T")


class Kept:
    """The writes an attempt could not make yet, by kind."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say  # a lifecycle line in the attempt's transcript
        self._waiting: dict[str, Callable[[], object]] = {}
        self.due = float("inf")  # when to try them again (time.monotonic())

    def do(self, kind: str, write: Callable[[], object]) -> None:
        """`write` now if the store is there (and nothing of `kind` waits before it), else
        keep it."""
        if kind in self._waiting:
            self._waiting[kind] = write
            return
        try:
            write()
        except StoreError as e:
            if not self._waiting:
                self._say(f"the store is unreachable, keeping {kind} for later: {e.message}")
            self._waiting[kind] = write
            self.due = min(self.due, time.monotonic() + RETRY_S)

    def retry(self) -> None:
        """Write what is kept, in order, until the store refuses one."""
        while self._waiting:
            kind, write = next(iter(self._waiting.items()))
            try:
                write()
            except StoreError:
                self.due = time.monotonic() + RETRY_S
                return
            del self._waiting[kind]
        self.due = float("inf")
        self._say("the store is back: every kept write is made")

    def left(self) -> list[str]:
        """The kinds still kept (at the end of the attempt: never written)."""
        return list(self._waiting)


def settled(attempt: Callable[[], T], deadline: float, wait: Callable[[float], None]) -> T:
    """`attempt()`, tried again every RETRY_S while the store is unreachable, until
    `deadline` (time.monotonic()); `wait(seconds)` passes the time between tries."""
    while True:
        try:
            return attempt()
        except StoreError:
            if time.monotonic() + RETRY_S > deadline:
                raise
            wait(RETRY_S)
