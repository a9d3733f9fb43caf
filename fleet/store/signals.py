"""What a host learns from the store about the attempts it runs, for a person's command given
on another host: kills requested, and questions no longer pending.

Invariants:
- a kill request names the attempt it is for (task, attempt number) and the host that holds
  it, and is kept: the request of attempt N never stops attempt N+1, and a host whose listener
  was down finds it when it catches up (`KILLS_OF`), or its runner at the next renewal in
  poll-only mode (`kill_requested`);
- requesting again re-records the request (and notifies again, fleet.store.pgnotify);
- only a claimed attempt takes a request: the ids returned are those that were running.

The interface is `Signalling` (part of `fleet.store.base.Store`); `SQLSignals` is its
implementation on either backend's transactions and audit trail. `KILLS_OF` and
`SETTLED_OF` (and `UNREAD_OF`, of fleet.store.coord's messages) are what fleet-listen asks
after every (re)connection, on its own connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from fleet.timeutil import now_iso

if TYPE_CHECKING:
    from fleet.store.dialect import Conn

# The tasks of `owner` (?) whose running attempt a person asked to stop.
KILLS_OF = (
    "SELECT t.id FROM tasks t JOIN kill_requests k ON k.task = t.id AND k.attempt = t.attempts"
    " WHERE t.claimed_by = ? ORDER BY t.id"
)
# The tasks of `owner` (?) whose running attempt has asked a question that is settled now:
# an agent may be waiting for its answer.
SETTLED_OF = (
    "SELECT DISTINCT t.id FROM tasks t JOIN questions q ON q.task = t.id AND q.attempt ="
    " t.attempts WHERE t.claimed_by = ? AND q.status <> 'pending' ORDER BY t.id"
)

# The tasks of `owner` (?) with a message their agent has not read: its `.mail` may be due.
UNREAD_OF = (
    "SELECT DISTINCT t.id FROM tasks t JOIN messages m ON m.recipient = t.id AND m.read_at IS NULL"
    " WHERE t.claimed_by = ? ORDER BY t.id"
)


class Signalling(Protocol):
    def request_kill(self, task_ids: Sequence[str]) -> list[tuple[str, str]]:
        """Ask the hosts running these tasks to stop their attempts; (id, host) of each that
        was claimed (the others are left alone)."""
        ...

    def kill_requested(self, task_id: str, attempt: int) -> bool:
        """Whether a person asked to stop attempt `attempt` of the task."""
        ...


class SQLSignals:
    """`Signalling` for fleet.store.sql's store."""

    actor: Any

    def _write(self, shared: bool = False) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _audit(self, db: Conn, task_id: str, action: str, **detail: Any) -> None:
        raise NotImplementedError

    def request_kill(self, task_ids: Sequence[str]) -> list[tuple[str, str]]:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        with self._write() as db:
            # Deleted and inserted anew, in one statement each: the insert is what notifies.
            db.execute(f"DELETE FROM kill_requests WHERE task IN ({marks})", ids)
            rows = db.execute(
                "INSERT INTO kill_requests (task, attempt, owner, requested_by, requested_at)"
                " SELECT id, attempts, claimed_by, ?, ? FROM tasks"
                f" WHERE id IN ({marks}) AND claimed_by IS NOT NULL RETURNING task, owner",
                (self.actor.by, now_iso(), *ids),
            ).fetchall()
            found = sorted((str(r[0]), str(r[1])) for r in rows)
            for task_id, host in found:
                self._audit(db, task_id, "kill-requested", host=host)
            return found

    def kill_requested(self, task_id: str, attempt: int) -> bool:
        with self._read() as db:
            row = db.execute(
                "SELECT 1 FROM kill_requests WHERE task = ? AND attempt = ?", (task_id, attempt)
            ).fetchone()
            return row is not None
