"""How agents coordinate through the store: advisory leases on resources, messages, each
agent's focus, and handoff offers.

A lease (`ResourceClaim`) is an agent's word that it works on a resource — a path, a module,
"db-migrations", any name — within its task's directory (the lease's `scope`). Invariants:
- a resource has at most one holder: a claim is one INSERT … ON CONFLICT DO UPDATE whose
  WHERE takes the row over only if it is the claimer's own or no longer in force, so however
  many claimers race, exactly one wins (compare-and-set, the same on any SQL backend);
- a lease is in force until `until`, its release, or the end of the attempt that took it (the
  attempt's row has `ended_at`): nothing has to clean up after a dead agent, and `finish`
  needs no change. Its time, like an offer's expiry, is set and compared by the store's clock
  (fleet.store.dialect: the database's, on PostgreSQL), as a task's lease is;
- a checkpoint saves the task's leases in force (`checkpoint_claims`), with the seconds each
  had left, so that the attempt that resumes from it can take them again where still free;
- a message is one row per recipient, written with its audit row (`messaged`, on the
  recipient's trail) in one transaction; `take_messages` hands each unread one out once (it
  marks them read in the statement that returns them), so two readers never both get it;
- a focus belongs to the attempt that set it, and like a lease is shown only while that
  attempt runs;
- a handoff offer leaves `offered` exactly once (accepted, declined, expired or failed), by
  compare-and-set, so of two deciders only the first wins; an offer past its time is expired
  (with its audit row) by the first look at it, and is never accepted.

The interface is `Coordinating` (part of `fleet.store.base.Store`); `SQLCoordination` is its
implementation, mixed into the SQL store (fleet.store.sql) of either backend, on that store's
transactions and audit trail.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from fleet.errors import Conflict, NotFound
from fleet.model import Field
from fleet.timeutil import now_iso, parse

if TYPE_CHECKING:
    from fleet.model import Task
    from fleet.store.dialect import Conn, Dialect

CLAIM_FIELDS = (
    Field("scope", "text", "The directory of the holder's task: leases are per directory."),
    Field("resource", "text", "What is claimed: a path, a module, or any agreed name."),
    Field("task", "text", "The task whose agent holds the lease."),
    Field("attempt", "int", "The attempt that took it; the lease ends with that attempt."),
    Field("note", "text", "What the holder said it does with the resource (may be empty)."),
    Field("claimed_at", "text", "When the holder first took it (UTC ISO 8601)."),
    Field("until", "text", "When the lease runs out unless renewed or released."),
)


class ResourceClaim(NamedTuple):
    scope: str  # the holder's task directory
    resource: str
    task: str
    attempt: int
    note: str
    claimed_at: str
    until: str

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    def left(self, now: float | None = None) -> float:
        """Seconds until the lease runs out."""
        return max(0.0, parse(self.until) - (time.time() if now is None else now))


MESSAGE_FIELDS = (
    Field("id", "int", "The message's number; later messages have higher ones."),
    Field("recipient", "text", "The task whose agent the message is for."),
    Field("sender", "text", "Who sent it: a task id (its agent), or a person (user@host)."),
    Field("sender_task", "text", "The sending task, or null for a person."),
    Field("text", "text", "The message (an agent's redacted, as all it writes)."),
    Field("sent_at", "text", "When it was sent (UTC ISO 8601)."),
    Field("read_at", "text", "When the recipient's agent was shown it, or null."),
)


class Message(NamedTuple):
    id: int
    recipient: str
    sender: str
    sender_task: str | None
    text: str
    sent_at: str
    read_at: str | None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


OFFER_FIELDS = (
    Field("id", "int", "The offer's number."),
    Field("task", "text", "The task offered for handoff."),
    Field("coder", "text", "The coder offered to take it over."),
    Field("model", "text", "The model, or null for the coder's default."),
    Field("context", "text", "What the offer says is done and left, or null."),
    Field("offered_by", "text", "Who offered it: a person, or the task's agent."),
    Field("offered_at", "text", "When (UTC ISO 8601)."),
    Field("expires_at", "text", "When an offer nobody decided on expires."),
    Field("status", "text", "offered, accepted, declined, expired or failed."),
    Field("decided_by", "text", "Who accepted or declined it (or the policy), or null."),
    Field("decided_at", "text", "When it was decided or expired, or null."),
    Field("reason", "text", "Why it was declined or failed, or null."),
    Field("successor", "text", "The successor task once accepted, or null."),
)


class Offer(NamedTuple):
    id: int
    task: str
    coder: str
    model: str | None
    context: str | None
    offered_by: str
    offered_at: str
    expires_at: str
    status: str
    decided_by: str | None
    decided_at: str | None
    reason: str | None
    successor: str | None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class Claimed(NamedTuple):
    """What a claim found: whether the claimer holds the resource now, and who does."""

    won: bool
    holder: ResourceClaim


class SavedClaim(NamedTuple):
    resource: str
    note: str
    seconds: float  # what the lease had left when the checkpoint was taken


class Coordinating(Protocol):
    def claim_resource(self, task_id: str, resource: str, seconds: float, note: str) -> Claimed:
        """Take (or renew) the lease on `resource` in the task's directory for `seconds`,
        for its running attempt, unless another task's lease is in force; Conflict if the task
        is not running."""
        ...

    def release_resource(self, task_id: str, resource: str) -> bool:
        """End the task's lease on `resource`; whether it held one in force."""
        ...

    def resource_claims(
        self, scope: str | None = None, task_id: str | None = None
    ) -> list[ResourceClaim]:
        """Leases in force (in `scope`, of `task_id`), by directory, then oldest first."""
        ...

    def save_claims(self, task_id: str, n: int) -> list[SavedClaim]:
        """Record with checkpoint `n` the task's leases in force."""
        ...

    def saved_claims(self, task_id: str, n: int) -> list[SavedClaim]: ...

    def send_messages(
        self, recipients: Sequence[str], text: str, sender: str, sender_task: str | None
    ) -> list[Message]:
        """One message to each of `recipients` (full ids), all or none."""
        ...

    def has_messages(self, task_id: str) -> bool:
        """Whether the task has unread messages (a read: no write lock when it has none)."""
        ...

    def take_messages(self, task_id: str) -> list[Message]:
        """The task's unread messages, oldest first, marked read."""
        ...

    def messages(self, task_id: str | None = None, limit: int = 100) -> list[Message]:
        """The newest `limit` messages to or from the task (of anyone's), oldest first."""
        ...

    def set_focus(self, task_id: str, text: str) -> None:
        """The running attempt's focus (Conflict if the task is not running)."""
        ...

    def focuses(self) -> dict[str, tuple[str, str]]:
        """task id -> (focus, when set) of the attempts running now."""
        ...

    def offer_handoff(
        self, task_id: str, coder: str, model: str | None, context: str | None, seconds: float
    ) -> Offer:
        """Offer the task to `coder` for `seconds`; Conflict if it is finished or already has
        an open offer."""
        ...

    def offers(self, task_id: str | None = None, open_only: bool = False) -> list[Offer]:
        """Offers (of the task), oldest first; expires the open ones past their time first."""
        ...

    def decide_offer(
        self,
        offer_id: int,
        status: str,
        reason: str | None = None,
        successor: str | None = None,
        expect: str = "offered",
    ) -> Offer:
        """Move an offer from `expect` to `status` (accepted, declined, failed), as this
        connection's actor; Conflict naming how it was settled if it is no longer in
        `expect` (or has expired)."""
        ...


# A lease in force: not run out by the store's clock ({now}: the dialect's time_sql, one
# parameter), and its attempt still going.
IN_FORCE = (
    "c.until > {now} AND EXISTS (SELECT 1 FROM attempts a"
    " WHERE a.task = c.task AND a.n = c.attempt AND a.ended_at IS NULL)"
)
MINE = "(c.task = excluded.task AND c.attempt = excluded.attempt)"  # a renewal
OFFER_COLUMNS = (
    "id, task, coder, model, context, offered_by, offered_at, expires_at, status, decided_by,"
    " decided_at, reason, successor"
)
MESSAGE_COLUMNS = "id, recipient, sender, sender_task, text, sent_at, read_at"
CLAIM_COLUMNS = "c.scope, c.resource, c.task, c.attempt, c.note, c.claimed_at, c.until"


class SQLCoordination:
    """`Coordinating` on the SQL store's connection (mixed into fleet.store.sql.SQLStore)."""

    if TYPE_CHECKING:
        dialect: ClassVar[Dialect]

        def _write(self) -> AbstractContextManager[Conn]: ...

        def _read(self) -> AbstractContextManager[Conn]: ...

        def _fetch(self, db: Conn, task_id: str) -> Task: ...

        def _audit(self, db: Conn, task_id: str, action: str, **detail: Any) -> None: ...

        actor: Any

    def _in_force(self) -> str:
        return IN_FORCE.format(now=self.dialect.time_sql)

    def claim_resource(self, task_id: str, resource: str, seconds: float, note: str) -> Claimed:
        d = self.dialect
        with self._write() as db:
            task = self._fetch(db, task_id)
            if task.status != "running" or not task.claimed_by:
                raise Conflict(
                    f"{task_id} is {task.status}, not running: only a running task holds leases"
                )
            db.execute(
                "INSERT INTO resource_claims AS c"
                " (scope, resource, task, attempt, note, claimed_at, until)"
                f" VALUES (?, ?, ?, ?, ?, {d.time_sql}, {d.time_sql})"
                " ON CONFLICT (scope, resource) DO UPDATE SET"
                " task = excluded.task, attempt = excluded.attempt, note = excluded.note,"
                f" claimed_at = CASE WHEN {MINE} THEN c.claimed_at ELSE excluded.claimed_at END,"
                f" until = excluded.until WHERE {MINE} OR NOT ({self._in_force()})",
                (
                    task.cwd,
                    resource,
                    task_id,
                    task.attempts,
                    note,
                    d.time_arg(0),
                    d.time_arg(seconds),
                    d.time_arg(0),
                ),
            )
            row = db.execute(
                f"SELECT {CLAIM_COLUMNS} FROM resource_claims c"
                " WHERE c.scope = ? AND c.resource = ?",
                (task.cwd, resource),
            ).fetchone()
            holder = ResourceClaim(*row)
            won = holder.task == task_id and holder.attempt == task.attempts
            if won:
                self._audit(
                    db, task_id, "leased", resource=resource, until=holder.until, note=note or None
                )
        return Claimed(won, holder)

    def release_resource(self, task_id: str, resource: str) -> bool:
        with self._write() as db:
            task = self._fetch(db, task_id)
            gone = db.execute(
                f"DELETE FROM resource_claims AS c WHERE c.scope = ? AND c.resource = ?"
                f" AND c.task = ? AND {self._in_force()} RETURNING resource",
                (task.cwd, resource, task_id, self.dialect.time_arg(0)),
            ).fetchone()
            # A lease that ran out (or whose attempt ended) is gone all the same.
            db.execute(
                "DELETE FROM resource_claims WHERE scope = ? AND resource = ? AND task = ?",
                (task.cwd, resource, task_id),
            )
            if gone is not None:
                self._audit(db, task_id, "lease-released", resource=resource)
        return gone is not None

    def resource_claims(
        self, scope: str | None = None, task_id: str | None = None
    ) -> list[ResourceClaim]:
        where, args = [self._in_force()], [self.dialect.time_arg(0)]
        if scope is not None:
            where.append("c.scope = ?")
            args.append(scope)
        if task_id is not None:
            where.append("c.task = ?")
            args.append(task_id)
        with self._read() as db:
            rows = db.execute(
                f"SELECT {CLAIM_COLUMNS} FROM resource_claims c WHERE {' AND '.join(where)}"
                " ORDER BY c.scope, c.claimed_at, c.resource",
                args,
            ).fetchall()
        return [ResourceClaim(*r) for r in rows]

    def save_claims(self, task_id: str, n: int) -> list[SavedClaim]:
        now = time.time()
        held = self.resource_claims(task_id=task_id)
        saved = [SavedClaim(c.resource, c.note, round(c.left(now), 3)) for c in held]
        with self._write() as db:
            db.executemany(
                "INSERT INTO checkpoint_claims (task, n, resource, note, seconds)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (task, n, resource)"
                " DO UPDATE SET note = excluded.note, seconds = excluded.seconds",
                [(task_id, n, *s) for s in saved],
            )
        return saved

    def saved_claims(self, task_id: str, n: int) -> list[SavedClaim]:
        with self._read() as db:
            rows = db.execute(
                "SELECT resource, note, seconds FROM checkpoint_claims WHERE task = ? AND n = ?"
                " ORDER BY resource",
                (task_id, n),
            ).fetchall()
        return [SavedClaim(*r) for r in rows]

    def send_messages(
        self, recipients: Sequence[str], text: str, sender: str, sender_task: str | None
    ) -> list[Message]:
        now = now_iso()
        sent: list[Message] = []
        with self._write() as db:
            for recipient in recipients:
                self._fetch(db, recipient)  # NotFound rolls all of them back
                row = db.execute(
                    "INSERT INTO messages (recipient, sender, sender_task, text, sent_at)"
                    f" VALUES (?, ?, ?, ?, ?) RETURNING {MESSAGE_COLUMNS}",
                    (recipient, sender, sender_task, text, now),
                ).fetchone()
                sent.append(Message(*row))
                self._audit(db, recipient, "messaged", sender=sender, message=row[0])
        return sent

    def has_messages(self, task_id: str) -> bool:
        with self._read() as db:
            return (
                db.execute(
                    "SELECT 1 FROM messages WHERE recipient = ? AND read_at IS NULL LIMIT 1",
                    (task_id,),
                ).fetchone()
                is not None
            )

    def take_messages(self, task_id: str) -> list[Message]:
        with self._write() as db:
            rows = db.execute(
                "UPDATE messages SET read_at = ? WHERE recipient = ? AND read_at IS NULL"
                f" RETURNING {MESSAGE_COLUMNS}",
                (now_iso(), task_id),
            ).fetchall()
        return sorted((Message(*r) for r in rows), key=lambda m: m.id)

    def messages(self, task_id: str | None = None, limit: int = 100) -> list[Message]:
        where = ""
        args: list[Any] = [limit]
        if task_id is not None:
            where = "WHERE recipient = ? OR sender_task = ?"
            args = [task_id, task_id, limit]
        with self._read() as db:
            rows = db.execute(
                f"SELECT {MESSAGE_COLUMNS} FROM messages {where} ORDER BY id DESC LIMIT ?", args
            ).fetchall()
        return [Message(*r) for r in reversed(rows)]

    def set_focus(self, task_id: str, text: str) -> None:
        with self._write() as db:
            task = self._fetch(db, task_id)
            if task.status != "running" or not task.claimed_by:
                raise Conflict(f"{task_id} is {task.status}, not running: it has no focus")
            db.execute(
                "INSERT INTO task_focus (task, attempt, text, set_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (task) DO UPDATE SET attempt = excluded.attempt,"
                " text = excluded.text, set_at = excluded.set_at",
                (task_id, task.attempts, text, now_iso()),
            )

    def focuses(self) -> dict[str, tuple[str, str]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT f.task, f.text, f.set_at FROM task_focus f JOIN attempts a"
                " ON a.task = f.task AND a.n = f.attempt WHERE a.ended_at IS NULL"
            ).fetchall()
        return {task: (text, at) for task, text, at in rows}

    def offer_handoff(
        self, task_id: str, coder: str, model: str | None, context: str | None, seconds: float
    ) -> Offer:
        self._expire_offers()
        d = self.dialect
        with self._write() as db:
            task = self._fetch(db, task_id)
            if task.status.final:
                raise Conflict(f"{task_id} is {task.status}: there is nothing to hand off")
            held = db.execute(
                "SELECT id, coder FROM handoff_offers WHERE task = ? AND status = 'offered'",
                (task_id,),
            ).fetchone()
            if held is not None:
                raise Conflict(
                    f"{task_id} already has an open handoff offer ({held[0]}, to {held[1]})",
                    hint=f"`fleet accept {task_id}` or `fleet decline {task_id} --reason ...`",
                )
            row = db.execute(
                "INSERT INTO handoff_offers (task, coder, model, context, offered_by,"
                f" offered_at, expires_at) VALUES (?, ?, ?, ?, ?, {d.time_sql}, {d.time_sql})"
                f" RETURNING {OFFER_COLUMNS}",
                (
                    task_id,
                    coder,
                    model,
                    context,
                    self.actor.by,
                    d.time_arg(0),
                    d.time_arg(seconds),
                ),
            ).fetchone()
            offer = Offer(*row)
            self._audit(
                db,
                task_id,
                "handoff-offered",
                offer=offer.id,
                coder=coder,
                model=model,
                expires_at=offer.expires_at,
            )
        return offer

    def _expire_offers(self) -> None:
        """Expire the open offers past their time by the store's clock (a read first: no write
        lock if none)."""
        d = self.dialect
        due_sql = f"status = 'offered' AND expires_at <= {d.time_sql}"
        with self._read() as db:
            due = db.execute(
                f"SELECT 1 FROM handoff_offers WHERE {due_sql}", (d.time_arg(0),)
            ).fetchone()
        if due is None:
            return
        with self._write() as db:
            rows = db.execute(
                "UPDATE handoff_offers SET status = 'expired', decided_at = ?"
                f" WHERE {due_sql} RETURNING id, task",
                (now_iso(), d.time_arg(0)),
            ).fetchall()
            for offer_id, task_id in rows:
                self._audit(db, task_id, "handoff-expired", offer=offer_id)

    def offers(self, task_id: str | None = None, open_only: bool = False) -> list[Offer]:
        self._expire_offers()
        where, args = [], []
        if task_id is not None:
            where.append("task = ?")
            args.append(task_id)
        if open_only:
            where.append("status = 'offered'")
        sql = f"SELECT {OFFER_COLUMNS} FROM handoff_offers"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY id", args).fetchall()
        return [Offer(*r) for r in rows]

    def decide_offer(
        self,
        offer_id: int,
        status: str,
        reason: str | None = None,
        successor: str | None = None,
        expect: str = "offered",
    ) -> Offer:
        self._expire_offers()
        with self._write() as db:
            row = db.execute(
                "UPDATE handoff_offers SET status = ?, decided_by = COALESCE(decided_by, ?),"
                " decided_at = ?, reason = ?, successor = COALESCE(?, successor)"
                f" WHERE id = ? AND status = ? RETURNING {OFFER_COLUMNS}",
                (status, self.actor.by, now_iso(), reason, successor, offer_id, expect),
            ).fetchone()
            if row is None:
                cur = db.execute(
                    f"SELECT {OFFER_COLUMNS} FROM handoff_offers WHERE id = ?", (offer_id,)
                ).fetchone()
                if cur is None:
                    raise NotFound(f"no handoff offer {offer_id}")
                was = Offer(*cur)
                by = f" by {was.decided_by}" if was.decided_by else ""
                raise Conflict(
                    f"handoff offer {offer_id} of {was.task} was already {was.status}{by}"
                )
            offer = Offer(*row)
            if status != expect:  # a change of status, not of details (the successor)
                self._audit(
                    db,
                    offer.task,
                    f"handoff-{status}",
                    offer=offer.id,
                    coder=offer.coder,
                    reason=reason,
                    successor=successor,
                )
        return offer
