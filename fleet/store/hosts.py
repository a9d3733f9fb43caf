"""The hosts that share one queue, in the store: who each is, and when it was last heard from.

Invariants:
- a host is its name (fleet.host.owner, the claims' `claimed_by`), one row per name; each
  dispatch pass upserts it (`heartbeat`) and each lease renewal refreshes its `last_seen` in the
  renewal's own transaction (fleet.store.sql), both by the store's clock (the database's on
  PostgreSQL), so every host judges silence by the same clock;
- a name is one machine's at a time: a heartbeat from another machine id under a name whose
  host is still alive (heard from within `dead_after`) changes nothing and is refused with a
  Conflict; once that host has been silent that long, the new machine takes the name over;
- a claim of another host is orphaned (`orphaned_claims`) only when its lease has run out AND
  its host has been silent longer than `dead_after`; a claim whose host never wrote a row
  (a fleet before hosts were recorded) counts as silent since its lease ran out. Releasing it
  stays fenced by owner and attempt (fleet.store.sql), so two hosts that recover it at once
  release it once.

Why both conditions: a renewal refreshes its host's last_seen in its own transaction, so a
runner's last renewal is never later than its host's last_seen, and its lease ends at most
lease_seconds after that; a runner that cannot renew stops its agent when its lease ends
(fleet.run), within stop_grace_seconds. With host_dead_after longer than a lease, the renew
period and that grace together (fleet.config), a host silent that long has no agent left
running on any claim whose lease ran out: the task runs again elsewhere, never twice at once.

The interface is `Hosting` (part of `fleet.store.base.Store`); `SQLHosts` is its implementation,
mixed into the SQL store of either backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from fleet.errors import Conflict
from fleet.model import Field, Task

if TYPE_CHECKING:
    from fleet.store.dialect import Conn, Dialect

HOST_FIELDS = (
    Field("name", "text", "the host's name (its node name), which its claims carry"),
    Field("alive", "bool", "heard from within host_dead_after (false: silent)"),
    Field("last_seen", "text", "UTC ISO 8601 time of its last dispatch pass or lease renewal"),
    Field("silent_s", "real", "seconds since then, by the store's clock"),
    Field("running", "int", "the attempts it holds claims for now"),
    Field("max_concurrent", "int", "how many tasks it runs at once (its max_concurrent)"),
    Field("labels", "list", "the labels it advertises (its host_labels)"),
    Field("boot_id", "text", "the kernel's id of the boot it last ran in, or null"),
    Field("machine_id", "text", "its /etc/machine-id, or null"),
)


class HostInfo(NamedTuple):
    """What a host says of itself on each heartbeat."""

    name: str
    machine_id: str | None
    boot_id: str | None
    labels: tuple[str, ...]
    max_concurrent: int


class Host(NamedTuple):
    name: str
    alive: bool
    last_seen: str
    silent_s: float
    running: int
    max_concurrent: int
    labels: tuple[str, ...]
    boot_id: str | None
    machine_id: str | None

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "labels": list(self.labels)}


class Hosting(Protocol):
    def heartbeat(self, info: HostInfo, dead_after: float) -> None:
        """Upsert this host's row, last seen now (the store's clock); Conflict if another
        machine holds the name and was heard from within `dead_after` seconds."""
        ...

    def hosts(self, dead_after: float) -> list[Host]:
        """Every host that ever heartbeat, by name, alive if heard from within `dead_after`."""
        ...

    def orphaned_claims(self, owner: str, dead_after: float) -> list[Task]:
        """Claims of hosts other than `owner` whose lease ran out and whose host has been
        silent longer than `dead_after` seconds (by the store's clock), oldest first."""
        ...


# A host row is alive while its last_seen is at or after `time_sql` bound to -dead_after.
_HEARD = "h.last_seen >= {since}"
# How running counts a host's claims (a merge-back's claim is no host's: fleet.store.base).
_RUNNING = (
    "(SELECT count(*) FROM tasks t WHERE t.claimed_by = h.name AND t.lease_until IS NOT NULL)"
)


class SQLHosts:
    """`Hosting` on the SQL store's connection (mixed into fleet.store.sql.SQLStore)."""

    if TYPE_CHECKING:
        dialect: ClassVar[Dialect]

        def _write(self, shared: bool = False) -> AbstractContextManager[Conn]: ...

        def _read(self) -> AbstractContextManager[Conn]: ...

        def _tasks_where(self, db: Conn, where: str, args: Sequence[Any]) -> list[Task]: ...

    def heartbeat(self, info: HostInfo, dead_after: float) -> None:
        d = self.dialect
        with self._write() as db:
            row = db.execute(
                "INSERT INTO hosts AS h (name, machine_id, boot_id, labels, max_concurrent,"
                f" last_seen) VALUES (?, ?, ?, ?, ?, {d.time_sql}) ON CONFLICT (name) DO UPDATE"
                " SET machine_id = excluded.machine_id, boot_id = excluded.boot_id,"
                " labels = excluded.labels, max_concurrent = excluded.max_concurrent,"
                " last_seen = excluded.last_seen"
                # The same machine (or one that cannot tell), or the name's host is dead.
                " WHERE h.machine_id IS NULL OR excluded.machine_id IS NULL"
                " OR h.machine_id = excluded.machine_id"
                f" OR NOT ({_HEARD.format(since=d.time_sql)}) RETURNING name",
                (
                    info.name,
                    info.machine_id,
                    info.boot_id,
                    json.dumps(list(info.labels)),
                    info.max_concurrent,
                    d.time_arg(0),
                    d.time_arg(-dead_after),
                ),
            ).fetchone()
            if row is not None:
                return
            held = db.execute(
                "SELECT machine_id, last_seen FROM hosts WHERE name = ?", (info.name,)
            ).fetchone()
        raise Conflict(
            f"host name {info.name} is in use by another machine (machine id {held[0]}, last"
            f" seen {held[1]}); this one is {info.machine_id}",
            hint="give each host a unique hostname (hostnamectl set-hostname NAME): a host's"
            " claims are known by its name",
        )

    @staticmethod
    def _seen(db: Conn, d: Dialect, name: str, machine_id: str | None) -> None:
        """Refresh `name`'s last_seen in the open transaction (a renewal's), unless another
        machine has taken the name over."""
        db.execute(
            f"UPDATE hosts SET last_seen = {d.time_sql} WHERE name = ?"
            " AND (machine_id IS NULL OR ? IS NULL OR machine_id = ?)",
            (d.time_arg(0), name, machine_id, machine_id),
        )

    def hosts(self, dead_after: float) -> list[Host]:
        d = self.dialect
        with self._read() as db:
            rows = db.execute(
                f"SELECT h.name, CASE WHEN {_HEARD.format(since=d.time_sql)} THEN 1 ELSE 0 END,"
                f" h.last_seen, {d.seconds_between(d.time_sql, 'h.last_seen')}, {_RUNNING},"
                " h.max_concurrent, h.labels, h.boot_id, h.machine_id FROM hosts h ORDER BY h.name",
                (d.time_arg(-dead_after), d.time_arg(0)),
            ).fetchall()
        return [
            Host(
                str(name),
                bool(alive),
                str(seen),
                max(0.0, float(silent)),
                int(running),
                int(cap),
                tuple(json.loads(labels)),
                boot,
                machine,
            )
            for name, alive, seen, silent, running, cap, labels, boot, machine in rows
        ]

    def orphaned_claims(self, owner: str, dead_after: float) -> list[Task]:
        d = self.dialect
        # Only leased claims (a merge-back's has none), of another host, the lease run out.
        where = (
            f"t.claimed_by IS NOT NULL AND t.claimed_by <> ? AND t.lease_until IS NOT NULL"
            f" AND t.lease_until < {d.time_sql}"
            f" AND NOT EXISTS (SELECT 1 FROM hosts h WHERE h.name = t.claimed_by"
            f" AND {_HEARD.format(since=d.time_sql)})"
            # No row at all: silent, by what is known, since its lease ran out.
            " AND (EXISTS (SELECT 1 FROM hosts h WHERE h.name = t.claimed_by)"
            f" OR t.lease_until < {d.time_sql})"
        )
        ago = d.time_arg(-dead_after)
        with self._read() as db:
            return self._tasks_where(db, where, (owner, d.time_arg(0), ago, ago))
