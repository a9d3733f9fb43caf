"""The task store's semantics (`fleet.store.base`), written once for SQLite and PostgreSQL.

A backend (fleet.store.litestore, fleet.store.pgstore) supplies the connection, its locking and
its schema, and names its `Dialect` (fleet.store.dialect): the few fragments spelt differently.

Invariants:
- every write runs in `_write()`, one transaction the backend serializes with every other
  write, except those marked `shared` (claims, renewals and ends of attempts), which only
  run alongside each other, as their UPDATEs lock what they change;
- every transition's UPDATE carries the state it expects in its WHERE clause, so the code stays
  correct on a backend without a global write lock;
- a claim is one UPDATE of the tasks it picks (on PostgreSQL `FOR UPDATE SKIP LOCKED`), which
  sets the owner, counts the attempt and sets the lease by the store's clock; every later
  write of the attempt names the owner (and, given, the attempt number) it expects;
- tasks are read as JSON built by the database from `TASK_FIELDS`, so `--json` output and
  `Task` objects come from one expression (`_task_json_sql`; a listing without a limit reads
  every task's dependencies in one pass where the dialect can, in the same bytes);
- every change a person, an agent or a program makes writes its `audit` row (fleet.audit) in
  its own transaction, as `actor`; the rows are journaled only once committed;
- rows that nothing in their transaction reads back (audit rows, a claim's attempt rows) are
  written last, just before the commit (`_later`): on PostgreSQL in the commit's round trip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from fleet import audit, host, ids
from fleet.errors import Conflict, FleetError, InputError, NotFound, StoreError
from fleet.model import (
    ATTEMPT_FIELDS,
    AUDIT_FIELDS,
    CHECKPOINT_FIELDS,
    QUESTION_FIELDS,
    TASK_FIELDS,
    Attempt,
    AttemptEnd,
    AuditEntry,
    Checkpoint,
    CheckpointSpec,
    Field,
    MergeMark,
    Question,
    QuestionKind,
    QuestionStatus,
    Status,
    Task,
    TaskEdit,
    TaskSpec,
)
from fleet.questions import not_pending
from fleet.schedules import MANUAL, Schedule, ScheduleRun
from fleet.store import claiming, placement
from fleet.store.base import (
    MERGE_CLAIM,
    BadSpec,
    Count,
    Lease,
    Outgoing,
    OutgoingSpec,
    TaskFilter,
    is_merge_claim,
)
from fleet.store.claiming import ClaimRequest
from fleet.store.coord import SQLCoordination
from fleet.store.dialect import Conn, Dialect, Replan
from fleet.store.hosts import SQLHosts
from fleet.store.signals import SQLSignals
from fleet.timeutil import iso, now_iso

DONE_ACTION = {
    "close": "closed",
    "block": "blocked",
    "cancel": "cancelled",
    "retry": "retried",
    "suspend": "suspended",
}
FINAL = tuple(s.value for s in Status if s.final)
MERGE_CLAIMED = f"substr(claimed_by, 1, {len(MERGE_CLAIM)}) = '{MERGE_CLAIM}'"
NOT_MERGING = f"(claimed_by IS NULL OR NOT {MERGE_CLAIMED})"
MERGE_BUSY = "a merge-back is in progress; try again in a moment"
# The audit action of each merge-back verdict (`merged` is merge-tasks').
MERGE_ACTION = {
    "merged": "merged-back",
    "branch": "merged-back",
    "conflict": "merge-blocked",
    "failed": "merge-blocked",
    "pending": "merge-waits",
}


# A handed-off task whose attempt has not ended yet: its agent may still be writing, and its
# work reaches its branch only when its runner stops, so its successor may not start before.
STOPPING = (
    "EXISTS (SELECT 1 FROM tasks p WHERE p.id = {t}.predecessor AND p.claimed_by IS NOT NULL)"
)


def _compact(value: Any) -> str:
    """A JSON column's text as the store writes it: compact, so that both dialects embed it
    in a record as it is (fleet.store.dialect)."""
    return json.dumps(value, separators=(",", ":"))


def _real(d: Dialect, f: Field, expr: str) -> str:
    return d.real(expr) if f.kind == "real" else expr


def _task_json_sql(d: Dialect, t: str = "t", joined: bool = False) -> tuple[str, str]:
    """A task's JSON and what follows `tasks t` in FROM; `joined`, for a listing of many
    tasks where the dialect has `deps_joined`: `after` and `waiting_on` come from every
    task's dependencies gathered in one pass, not looked up task by task."""
    exprs = {
        "labels": d.json(f"{t}.labels"),
        "limits": d.json(f"{t}.limits"),
        "needs": (
            f"CASE WHEN {t}.needs IS NULL THEN {d.empty_array} ELSE {d.json(f'{t}.needs')} END"
        ),
        # Almost always empty: parsing '[]' on every row was a tenth of `fleet ls --json`.
        "merged_from": (
            f"CASE WHEN {t}.merged_from = '[]' THEN {d.empty_array}"
            f" ELSE {d.json(f'{t}.merged_from')} END"
        ),
        # Most tasks have no dependencies: an index probe is much cheaper than an aggregate.
        "after": (
            f"CASE WHEN EXISTS (SELECT 1 FROM deps d WHERE d.task = {t}.id) THEN"
            f" (SELECT {d.json_array_agg('d.after', 'd.after')} FROM deps d"
            f" WHERE d.task = {t}.id) ELSE {d.empty_array} END"
        ),
        # A successor also waits for its predecessor's attempt to end (see READY_WHERE).
        "waiting_on": (
            f"CASE WHEN EXISTS (SELECT 1 FROM deps d WHERE d.task = {t}.id) OR"
            f" ({t}.predecessor IS NOT NULL AND {STOPPING.format(t=t)}) THEN"
            f" (SELECT {d.json_array_agg('w', 'w')} FROM (SELECT d.after AS w FROM deps d"
            f" JOIN tasks u ON u.id = d.after WHERE d.task = {t}.id AND u.status != 'done'"
            f" UNION ALL SELECT p.id FROM tasks p WHERE p.id = {t}.predecessor"
            f" AND p.claimed_by IS NOT NULL) ws) ELSE {d.empty_array} END"
        ),
    }
    joins = ""
    if joined and d.deps_joined:
        joins = f" LEFT JOIN {d.deps_joined} dd ON dd.task = {t}.id"
        exprs["after"] = f"COALESCE(dd.after, {d.empty_array})"
        exprs["waiting_on"] = f"COALESCE(dd.waiting, {d.empty_array})"
    select, after_from = d.record(
        [(f.name, exprs.get(f.name, _real(d, f, f"{t}.{f.name}"))) for f in TASK_FIELDS], t
    )
    return select, joins + after_from


def _question_json_sql(d: Dialect) -> tuple[str, str]:
    def expr(f: Field) -> str:
        if f.kind == "list":
            return d.json(f"q.{f.name}")
        if f.kind == "bool":
            as_json = d.json(f"CASE q.{f.name} WHEN 0 THEN 'false' ELSE 'true' END")
            return f"CASE WHEN q.{f.name} IS NULL THEN NULL ELSE {as_json} END"
        return _real(d, f, f"q.{f.name}")

    return d.record([(f.name, expr(f)) for f in QUESTION_FIELDS], "q")


def _checkpoint_json_sql(d: Dialect) -> tuple[str, str]:
    return d.record(
        [
            (
                f.name,
                d.json(f'c."{f.name}"') if f.kind == "list" else _real(d, f, f'c."{f.name}"'),
            )
            for f in CHECKPOINT_FIELDS
        ],
        "c",
    )


def _marks(n: int) -> str:
    """The placeholders of an IN list of `n` values: none is an empty list (PostgreSQL has no
    `IN ()`)."""
    return ", ".join("?" * n) if n else "SELECT NULL WHERE 1 = 0"


class Queries:
    """The statements a dialect spells its own way, built once per dialect: each record's JSON
    as a select expression, and what its query puts after the table's alias (`tasks t`,
    `questions q`, `checkpoints c`) in FROM."""

    def __init__(self, d: Dialect) -> None:
        self.task_json, self.tasks = _task_json_sql(d)
        # For a listing without a limit, which reads most tasks (see `_list_sql`).
        self.listed_json, self.listed = _task_json_sql(d, joined=True)
        self.question_json, self.questions = _question_json_sql(d)
        self.checkpoint_json, self.checkpoints = _checkpoint_json_sql(d)


# The fence of a runner's write: its attempt, if it names one (bound twice: attempt, attempt).
ATTEMPT_IS = "(? IS NULL OR attempts = ?)"
# `predecessor IS NULL OR`: most tasks have none, and without it PostgreSQL may plan the test
# as an anti-join that reads every claimed task for each ready one.
READY_WHERE = (
    "t.status = 'ready' AND NOT EXISTS (SELECT 1 FROM deps d JOIN tasks u ON u.id = d.after"
    " WHERE d.task = t.id AND u.status != 'done') AND (t.predecessor IS NULL OR NOT "
    + STOPPING.format(t="t")
    + ")"
)
ATTEMPT_COLUMNS = ", ".join(f.name for f in ATTEMPT_FIELDS)
OUTBOX_COLUMNS = (
    "id, channel, target, event, body, task, question, created_at, tries, error, ref, settled,"
    " picked"
)
# How often a claim of one task is made again when the backend lost the plan it kept.
REPLANS = 3
BULK_ADD = 500  # tasks in one add() that make it a batch (see `_grew`)
KEEP_SENT_S = 30 * 86400  # how long a settled question's message still maps a late reply
AUDIT_COLUMNS = ", ".join(f.name for f in AUDIT_FIELDS)


# The columns `fleet stats` may group attempts by, and what each one is.
STAT_DIMENSIONS = {
    "coder": "a.coder",
    "model": "a.model",
    "cwd": "t.cwd",
    "hour": "substr(a.ended_at, 1, 13)",  # the UTC hour: 2026-12-01T23
}


class SQLStore(SQLCoordination, SQLHosts, SQLSignals):
    """The shared semantics; a backend subclass supplies `dialect`, `_write`, `_read`, `close`."""

    dialect: ClassVar[Dialect]
    q: ClassVar[Queries]
    actor: audit.Actor
    _trail: list[audit.Row]  # the audit rows of the open write transaction
    # Writes of the open transaction that nothing in it reads back (audit rows, attempt rows
    # of a claim): the backend sends them with its COMMIT (on PostgreSQL, in one round trip).
    _later: list[tuple[str, tuple[Any, ...]]]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.q = Queries(cls.dialect)

    def _write(self, shared: bool = False) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def now(self) -> str:
        """The store's clock, which leases are set and compared by (fleet.store.dialect)."""
        with self._read() as db:
            return str(
                db.execute(
                    f"SELECT {self.dialect.time_sql}", (self.dialect.time_arg(0),)
                ).fetchone()[0]
            )

    def _audit(self, db: Conn, task_id: str, action: str, **detail: Any) -> None:
        """Record `action` on `task_id` in the open write transaction."""
        detail = {k: v for k, v in detail.items() if v is not None}
        self._later.append(
            (
                "INSERT INTO audit (task, at, action, by, detail) VALUES (?, ?, ?, ?, ?)",
                (task_id, now_iso(), action, self.actor.by, json.dumps(detail, ensure_ascii=False)),
            )
        )
        self._trail.append(audit.Row(task_id, action, self.actor.by, detail))

    def note(self, task_id: str, action: str, **detail: Any) -> None:
        with self._write() as db:
            self._audit(db, task_id, action, **detail)

    def history(self, task_id: str) -> list[AuditEntry]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {AUDIT_COLUMNS} FROM audit WHERE task = ? ORDER BY id", (task_id,)
            ).fetchall()
        return [AuditEntry(n, t, at, act, by, json.loads(d)) for n, t, at, act, by, d in rows]

    def heir(self, task_id: str) -> str:
        with self._read() as db:
            return self._heir(db, task_id)

    def children(self, task_id: str) -> list[Task]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks}"
                " WHERE t.parent = ? ORDER BY t.seq",
                (task_id,),
            ).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    # -- reading ---------------------------------------------------------------------------

    def _fetch(self, db: Conn, task_id: str) -> Task:
        row = db.execute(
            f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE t.id = ?", (task_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"no task {task_id}", hint="`fleet ls --all` lists every task")
        return Task.from_json(json.loads(row[0]))

    def resolve(self, ref: str) -> str:
        full = ids.check_ref(ref)
        with self._read() as db:
            rows = db.execute(
                "SELECT id FROM tasks WHERE id >= ? AND id < ? ORDER BY id LIMIT 6",
                (full, full + "~"),
            ).fetchall()
        found = [r[0] for r in rows]
        if full in found:
            return full
        if not found:
            raise NotFound(f"no task {full}", hint="`fleet ls --all` lists every task")
        if len(found) > 1:
            more = ", …" if len(found) > 5 else ""
            raise InputError(
                f"{ref} is ambiguous: " + ", ".join(found[:5]) + more,
                hint="type more characters of the id",
            )
        return str(found[0])

    def get(self, task_id: str) -> Task:
        with self._read() as db:
            return self._fetch(db, task_id)

    def _where(self, flt: TaskFilter) -> tuple[str, list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        if flt.statuses:
            where.append(f"t.status IN ({_marks(len(flt.statuses))})")
            args.extend(s.value for s in flt.statuses)
        elif not flt.include_final:
            where.append(f"t.status NOT IN ({_marks(len(FINAL))})")
            args.extend(FINAL)
        if flt.label is not None:
            where.append(
                f"EXISTS (SELECT 1 FROM {self.dialect.json_each('t.labels')} WHERE value = ?)"
            )
            args.append(flt.label)
        if flt.cwd is not None:
            base = flt.cwd.rstrip("/") + "/"
            where.append("(t.cwd = ? OR substr(t.cwd, 1, ?) = ?)")
            args.extend((flt.cwd, len(base), base))
        if flt.coder is not None:
            where.append("coalesce(t.coder, ?) = ?")
            args.extend((flt.default_coder, flt.coder))
        for word in (flt.search or "").split():
            escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(f"t.title {self.dialect.like} ? ESCAPE '\\'")
            args.append(f"%{escaped}%")
        return (" WHERE " + " AND ".join(where)) if where else "", args

    def _list_sql(self, flt: TaskFilter) -> tuple[str, list[Any]]:
        where, args = self._where(flt)
        order = "DESC" if flt.newest_first else ""
        if flt.limit is None and not flt.offset:
            # Every task's dependencies in one pass: a probe per task was two fifths of the
            # database's work for `fleet ls --json` on 100,000 tasks. A page reads few tasks,
            # and its probes cost less than gathering all dependencies.
            return (
                f"SELECT {self.q.listed_json} FROM tasks t{self.q.listed}{where}"
                f" ORDER BY t.seq {order}",
                args,
            )
        sql = f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks}{where} ORDER BY t.seq {order}"
        if flt.limit is not None or flt.offset:
            limit = self.dialect.no_limit if flt.limit is None else flt.limit
            return sql + " LIMIT ? OFFSET ?", [*args, limit, flt.offset]
        return sql, args

    def count(self, flt: TaskFilter) -> int:
        where, args = self._where(flt)
        with self._read() as db:
            return int(db.execute(f"SELECT count(*) FROM tasks t{where}", args).fetchone()[0])

    def list_json(self, flt: TaskFilter) -> Iterator[str]:
        sql, args = self._list_sql(flt)
        with self._read() as db:
            cur = db.execute(sql, args)
            # A thousand rows at a time: a row at a time through psycopg's cursor was a fifth
            # of `fleet ls --json` on 100,000 tasks.
            while rows := cur.fetchmany(1000):
                for (text,) in rows:
                    yield text

    def tasks(self, flt: TaskFilter) -> Iterator[Task]:
        for text in self.list_json(flt):
            yield Task.from_json(json.loads(text))

    def ready(
        self,
        limit: int | None = None,
        coders: tuple[str, ...] | None = None,
        default_coder: str = "",
        among: bool = True,
        here: tuple[str, Sequence[str]] | None = None,
    ) -> list[Task]:
        where, args = READY_WHERE, []
        if coders is not None:
            where += (
                f" AND COALESCE(t.coder, ?) {'' if among else 'NOT '}IN ({_marks(len(coders))})"
            )
            args = [default_coder, *coders]
        if here is not None:
            where += f" AND {self._placed()}"
            args += self._placed_args(*here)
        sql = (
            f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE {where}"
            " ORDER BY t.priority, t.seq LIMIT ?"
        )
        with self._read() as db:
            rows = db.execute(
                sql, (*args, self.dialect.no_limit if limit is None else limit)
            ).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def attempts(self, task_id: str) -> list[Attempt]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE task = ? ORDER BY n", (task_id,)
            ).fetchall()
        return [Attempt(*row) for row in rows]

    def session_totals(self, task_id: str, session_id: str) -> dict[str, Any] | None:
        with self._read() as db:
            row = db.execute(
                "SELECT session_totals FROM attempts WHERE task = ? AND session_id = ?"
                " AND session_totals IS NOT NULL ORDER BY n DESC LIMIT 1",
                (task_id, session_id),
            ).fetchone()
        if row is None:
            return None
        try:
            found = json.loads(row[0])
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def ids_with_prefix(self, prefix: str, limit: int) -> list[tuple[str, str]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT id, title FROM tasks WHERE id >= ? AND id < ? ORDER BY seq DESC LIMIT ?",
                (prefix, prefix + "~", limit),
            ).fetchall()
        return [(str(a), str(b)) for a, b in rows]

    # -- a person's changes ----------------------------------------------------------------

    def add(self, specs: Sequence[TaskSpec]) -> list[Task]:
        with self._write() as db:
            added = self._add(db, specs)
        if len(specs) >= BULK_ADD:
            self._grew()
        return added

    def _grew(self) -> None:
        """The tasks table grew by a batch: a backend whose planner needs fresh statistics
        to keep claiming in index order (PostgreSQL) gathers them."""

    def _add(self, db: Conn, specs: Sequence[TaskSpec]) -> list[Task]:
        """`add` within the open write transaction `db`."""
        self._check_refs(specs)
        new_ids: list[str] = []
        now = now_iso()
        for i, spec in enumerate(specs):
            named = (*spec.after, *((spec.parent,) if spec.parent else ()), *spec.merged_from)
            for dep in named:
                if not dep.startswith("ref:") and not self._exists(db, dep):
                    raise BadSpec(i, f"no task {dep}")
            if spec.parent_waits and not spec.parent:
                raise BadSpec(i, "only a subtask's parent can wait for it")
        for spec in specs:
            new_ids.append(self._insert(db, spec, now))
        refs = {s.ref: new_ids[i] for i, s in enumerate(specs) if s.ref}

        def real(dep: str) -> str:
            return refs[dep[4:]] if dep.startswith("ref:") else dep

        for i, spec in enumerate(specs):
            if spec.parent:
                db.execute(
                    "UPDATE tasks SET parent = ? WHERE id = ?", (real(spec.parent), new_ids[i])
                )
            db.executemany(
                "INSERT INTO deps (task, after) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(new_ids[i], self._heir(db, real(dep))) for dep in spec.after],
            )
            if spec.merged_from:
                db.execute(
                    "UPDATE tasks SET merged_from = ? WHERE id = ?",
                    (_compact(list(spec.merged_from)), new_ids[i]),
                )
        for i, spec in enumerate(specs):
            self._audit_added(db, new_ids[i], spec, real(spec.parent) if spec.parent else None)
            if spec.parent and spec.parent_waits:
                try:
                    self._check_dependency(db, real(spec.parent), new_ids[i])
                except FleetError as e:
                    raise BadSpec(i, e.message, e.hint) from None
                db.execute(
                    "INSERT INTO deps (task, after) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (real(spec.parent), new_ids[i]),
                )
        if len(specs) > 50:
            # Re-reading thousands of rows one by one would dominate a batch add.
            rows = db.execute(
                f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE t.seq > "
                "(SELECT seq FROM tasks WHERE id = ?) - 1 ORDER BY t.seq",
                (new_ids[0],),
            ).fetchall()
            by_id = {t.id: t for t in (Task.from_json(json.loads(r[0])) for r in rows)}
            return [by_id[i] for i in new_ids]
        return [self._fetch(db, i) for i in new_ids]

    def _audit_added(self, db: Conn, task_id: str, spec: TaskSpec, parent: str | None) -> None:
        self._audit(db, task_id, "added", title=spec.title, parent=parent)
        if parent:
            self._audit(db, parent, "spawned", child=task_id, parent_waits=spec.parent_waits)
        if spec.merged_from:
            self._audit(db, task_id, "merged", **{"from": list(spec.merged_from)})
            for source in spec.merged_from:
                self._audit(db, source, "merged", into=task_id)

    @staticmethod
    def _check_refs(specs: Sequence[TaskSpec]) -> None:
        """Check batch-local references: defined once, all known, no cycle among them."""
        index: dict[str, int] = {}
        for i, spec in enumerate(specs):
            if spec.ref:
                if spec.ref in index:
                    raise BadSpec(i, f"ref {spec.ref!r} is already used by an earlier task")
                index[spec.ref] = i
        edges: dict[int, list[int]] = {}
        for i, spec in enumerate(specs):
            for dep in (*spec.after, spec.parent or ""):
                if dep.startswith("ref:"):
                    if dep[4:] not in index:
                        raise BadSpec(i, f"no task in this batch has ref {dep[4:]!r}")
                    if dep in spec.after:
                        edges.setdefault(i, []).append(index[dep[4:]])
        # Depth first, with a stack of its own: a chain of thousands of refs is a fine batch.
        state: dict[int, int] = {}  # 1: on the current path, 2: finished
        for start in list(edges):
            if start in state:
                continue
            state[start] = 1
            path = [(start, iter(edges.get(start, ())))]
            while path:
                node, nexts = path[-1]
                nxt = next(nexts, None)
                if nxt is None:
                    state[node] = 2
                    path.pop()
                elif state.get(nxt) == 1:
                    raise BadSpec(node, "dependency cycle within the batch")
                elif nxt not in state:
                    state[nxt] = 1
                    path.append((nxt, iter(edges.get(nxt, ()))))

    @staticmethod
    def _heir(db: Conn, task_id: str) -> str:
        """The task that carries `task_id`'s work on: its last successor if it was handed
        off (a dependency counts only once its task is done, which a handed-off one never
        is; `handoff` moves the dependencies that exist then the same way), else itself."""
        seen = {task_id}
        while True:
            row = db.execute(
                "SELECT s.id FROM tasks t JOIN tasks s ON s.predecessor = t.id"
                " WHERE t.id = ? AND t.status = 'handed-off'",
                (task_id,),
            ).fetchone()
            if row is None or row[0] in seen:
                return task_id
            task_id = row[0]
            seen.add(task_id)

    @staticmethod
    def _exists(db: Conn, task_id: str) -> bool:
        return db.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone() is not None

    @staticmethod
    def _insert(db: Conn, spec: TaskSpec, now: str) -> str:
        for _ in range(100):
            task_id = ids.new_id()
            # A collision with an id already taken inserts nothing: draw again.
            row = db.execute(
                "INSERT INTO tasks (id, title, description, priority, cwd, coder, model,"
                " labels, created_at, updated_at, isolation, base, merge, max_cost_usd,"
                " max_tokens, sandbox, limits, pinned_host, needs)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO NOTHING RETURNING seq",
                (
                    task_id,
                    spec.title,
                    spec.description,
                    spec.priority,
                    spec.cwd,
                    spec.coder,
                    spec.model,
                    _compact(list(spec.labels)),
                    now,
                    now,
                    spec.isolation,
                    spec.base,
                    spec.merge,
                    spec.max_cost_usd,
                    spec.max_tokens,
                    spec.sandbox,
                    _compact(spec.limits) if spec.limits else None,
                    spec.pinned_host,
                    placement.needs_value(spec.needs),
                ),
            ).fetchone()
            if row is not None:
                return task_id
        raise StoreError("could not draw a free task id in 100 tries")

    def edit(self, task_id: str, change: TaskEdit) -> Task:
        with self._write() as db:
            cur = self._fetch(db, task_id)
            if is_merge_claim(cur.claimed_by):
                raise Conflict(f"cannot edit {task_id}: {MERGE_BUSY}")
            if change.touches_run and cur.claimed_by is not None:
                raise Conflict(
                    f"{task_id} has an attempt running; its cwd, coder, model and limits are"
                    " frozen",
                    hint="stop it first, or change them after it ends",
                )
            if change.cwd is not None and cur.branch is not None and change.cwd != cur.cwd:
                raise Conflict(
                    f"{task_id} works on branch {cur.branch} of its repository; its cwd stays",
                    hint="add a new task for the other directory",
                )
            sets: dict[str, Any] = {}
            for name in (
                "title",
                "description",
                "cwd",
                "coder",
                "model",
                "priority",
                "max_cost_usd",
                "max_tokens",
                "pinned_host",
            ):
                value = getattr(change, name)
                if value is not None:
                    sets[name] = value
            for name in change.clear:
                sets[name] = None
            if change.limits is not None:
                table = {**(cur.limits or {}), **change.limits}
                table = {k: v for k, v in table.items() if v}
                sets["limits"] = _compact(table) if table else None
            if change.add_labels or change.remove_labels:
                labels = [x for x in cur.labels if x not in change.remove_labels]
                labels += [x for x in dict.fromkeys(change.add_labels) if x not in labels]
                sets["labels"] = _compact(labels)
            if change.add_needs or change.remove_needs:
                needs = [x for x in cur.needs if x not in change.remove_needs]
                needs += [x for x in dict.fromkeys(change.add_needs) if x not in needs]
                sets["needs"] = placement.needs_value(needs)
            if change.parent is not None:
                self._check_parent(db, task_id, change.parent)
                sets["parent"] = change.parent
            # A handed-off task's work goes on in its successor: depend on that (or no longer).
            add_after = [self._heir(db, d) for d in change.add_after]
            for dep in add_after:
                self._check_dependency(db, task_id, dep)
            db.executemany(
                "INSERT INTO deps (task, after) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(task_id, d) for d in add_after],
            )
            db.executemany(
                "DELETE FROM deps WHERE task = ? AND after = ?",
                [(task_id, d) for d in change.remove_after]
                + [(task_id, self._heir(db, d)) for d in change.remove_after],
            )
            changed = sorted(sets)
            if change.add_after or change.remove_after:
                changed.append("after")
            sets["updated_at"] = now_iso()
            db.execute(
                "UPDATE tasks SET " + ", ".join(f"{k} = ?" for k in sets) + " WHERE id = ?",
                (*sets.values(), task_id),
            )
            self._audit(db, task_id, "edited", fields=changed)
            return self._fetch(db, task_id)

    def _check_dependency(self, db: Conn, task_id: str, dep: str) -> None:
        if dep == task_id:
            raise InputError(f"{task_id} cannot depend on itself")
        if not self._exists(db, dep):
            raise NotFound(f"no task {dep}")
        # A new edge task -> dep closes a cycle iff task is already reachable from dep.
        cycle = db.execute(
            # The start row is the table's (it exists): both terms have the column's type.
            "WITH RECURSIVE r(id) AS (SELECT id FROM tasks WHERE id = ?"
            " UNION SELECT d.after FROM deps d JOIN r"
            " ON d.task = r.id) SELECT 1 FROM r WHERE id = ?",
            (dep, task_id),
        ).fetchone()
        if cycle:
            raise InputError(
                f"{task_id} after {dep} would make a dependency cycle",
                hint=f"`fleet show {dep}` shows what it depends on",
            )

    def _check_parent(self, db: Conn, task_id: str, parent: str) -> None:
        if parent == task_id:
            raise InputError(f"{task_id} cannot be its own parent")
        if not self._exists(db, parent):
            raise NotFound(f"no task {parent}")
        loop = db.execute(
            "WITH RECURSIVE r(id) AS (SELECT id FROM tasks WHERE id = ?"
            " UNION SELECT t.parent FROM tasks t JOIN r"
            " ON t.id = r.id WHERE t.parent IS NOT NULL) SELECT 1 FROM r WHERE id = ?",
            (parent, task_id),
        ).fetchone()
        if loop:
            raise InputError(f"{parent} descends from {task_id}; it cannot be its parent")

    def _transition(
        self,
        task_id: str,
        verb: str,
        allowed: tuple[Status, ...],
        sets: str,
        args: tuple[Any, ...],
        idle: bool = False,
        **detail: Any,
    ) -> Task:
        """Move `task_id` with `sets` iff its status is in `allowed` (and no attempt if idle),
        and no merge-back holds it (its verdict is about to be recorded)."""
        now = now_iso()
        cond = f"status IN ({_marks(len(allowed))}) AND {NOT_MERGING}"
        if idle:
            cond += " AND claimed_by IS NULL"
        with self._write() as db:
            row = db.execute(
                f"UPDATE tasks SET {sets}, updated_at = ? WHERE id = ? AND {cond} RETURNING id",
                (*args, now, task_id, *(s.value for s in allowed)),
            ).fetchone()
            if row is None:
                cur = self._fetch(db, task_id)
                if is_merge_claim(cur.claimed_by):
                    raise Conflict(f"cannot {verb} {task_id}: {MERGE_BUSY}")
                if idle and cur.claimed_by:
                    raise Conflict(
                        f"cannot {verb} {task_id}: an attempt is still running",
                        hint=f"wait for it to end, or stop it first (fleet kill {task_id})",
                    )
                raise Conflict(f"cannot {verb} {task_id}: it is {cur.status}")
            self._audit(db, task_id, DONE_ACTION[verb], **detail)
            return self._fetch(db, task_id)

    def close_task(self, task_id: str, reason: str | None) -> Task:
        allowed = (Status.READY, Status.RUNNING, Status.BLOCKED, Status.SUSPENDED)
        return self._transition(
            task_id,
            "close",
            allowed,
            "status = 'done', reason = ?, finished_at = ?",
            (reason, now_iso()),
            reason=reason,
        )

    def block(self, task_id: str, reason: str) -> Task:
        allowed = (Status.READY, Status.RUNNING, Status.MERGING, Status.BLOCKED, Status.SUSPENDED)
        return self._transition(
            task_id, "block", allowed, "status = 'blocked', reason = ?", (reason,), reason=reason
        )

    def cancel(self, task_id: str, reason: str | None) -> Task:
        allowed = (Status.READY, Status.RUNNING, Status.MERGING, Status.BLOCKED, Status.SUSPENDED)
        return self._transition(
            task_id,
            "cancel",
            allowed,
            "status = 'cancelled', reason = ?, finished_at = ?",
            (reason, now_iso()),
            reason=reason,
        )

    def retry(self, task_id: str) -> Task:
        allowed = (Status.READY, Status.MERGING, Status.BLOCKED, Status.DONE, Status.CANCELLED)
        return self._transition(
            task_id,
            "retry",
            allowed,
            "status = 'ready', reason = NULL, finished_at = NULL, failures = 0, noclose = 0,"
            " lost_streak = 0, merge_state = NULL, merge_reason = NULL, merged_commit = NULL",
            (),
            idle=True,
        )

    def suspend(self, task_id: str, reason: str, checkpoint: int | None = None) -> Task:
        # A running attempt goes on until its unit is stopped; `finish` then keeps `suspended`.
        allowed = (Status.READY, Status.RUNNING)
        return self._transition(
            task_id,
            "suspend",
            allowed,
            "status = 'suspended', reason = ?",
            (reason,),
            checkpoint=checkpoint,
        )

    def resume_task(self, task_id: str, checkpoint: int | None) -> Task:
        with self._write() as db:
            cur = self._fetch(db, task_id)
            if cur.status != Status.SUSPENDED:
                raise Conflict(
                    f"cannot resume {task_id}: it is {cur.status}, not suspended",
                    hint=f"`fleet suspend {task_id}` suspends it; `fleet resume` alone"
                    " lifts `fleet pause`",
                )
            if cur.claimed_by is not None:
                raise Conflict(
                    f"cannot resume {task_id}: its suspended attempt is still stopping",
                    hint="try again in a moment",
                )
            if checkpoint is None:
                row = db.execute(
                    "SELECT max(n) FROM checkpoints WHERE task = ?", (task_id,)
                ).fetchone()
                checkpoint = row[0]
            elif not db.execute(
                "SELECT 1 FROM checkpoints WHERE task = ? AND n = ?", (task_id, checkpoint)
            ).fetchone():
                raise NotFound(
                    f"{task_id} has no checkpoint {checkpoint}",
                    hint=f"`fleet checkpoints {task_id}` lists them",
                )
            db.execute(
                "UPDATE tasks SET status = 'ready', reason = NULL, resume_from = ?,"
                " updated_at = ? WHERE id = ? AND status = 'suspended' AND claimed_by IS NULL",
                (checkpoint, now_iso(), task_id),
            )
            self._audit(db, task_id, "resumed", checkpoint=checkpoint)
            return self._fetch(db, task_id)

    def handoff(self, task_id: str, successor: TaskSpec, context: str | None) -> Task:
        allowed = (Status.READY, Status.RUNNING, Status.BLOCKED, Status.SUSPENDED)
        now = now_iso()
        with self._write() as db:
            cur = self._fetch(db, task_id)
            if cur.status not in allowed:
                raise Conflict(
                    f"cannot hand {task_id} off: it is {cur.status}",
                    hint="only a ready, running, blocked or suspended task can be handed off",
                )
            new_id = self._insert(db, successor, now)
            db.execute(
                "UPDATE tasks SET predecessor = ?, handoff = ?, parent = ?, merged_from = ?"
                " WHERE id = ?",
                (
                    task_id,
                    context,
                    successor.parent,
                    _compact(list(successor.merged_from)),
                    new_id,
                ),
            )
            db.executemany(
                "INSERT INTO deps (task, after) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(new_id, dep) for dep in successor.after],
            )
            # Whoever waited for the original's work now waits for the successor's.
            db.execute(
                "INSERT INTO deps (task, after) SELECT task, ? FROM deps WHERE after = ?"
                " ON CONFLICT DO NOTHING",
                (new_id, task_id),
            )
            db.execute("DELETE FROM deps WHERE after = ?", (task_id,))
            coder = successor.coder or "the default coder"
            if successor.model:
                coder += f":{successor.model}"
            db.execute(
                "UPDATE tasks SET status = 'handed-off', reason = ?, finished_at = ?,"
                " updated_at = ? WHERE id = ?",
                (f"handed off to {new_id} ({coder})", now, now, task_id),
            )
            self._audit(
                db, task_id, "handed-off", to=new_id, coder=successor.coder, model=successor.model
            )
            self._audit(db, new_id, "added", title=successor.title, predecessor=task_id)
            return self._fetch(db, new_id)

    # -- checkpoints -----------------------------------------------------------------------

    def add_checkpoint(self, task_id: str, spec: CheckpointSpec) -> Checkpoint:
        with self._write() as db:
            task = self._fetch(db, task_id)
            (n,) = db.execute(
                "SELECT COALESCE(max(n), 0) + 1 FROM checkpoints WHERE task = ?", (task_id,)
            ).fetchone()
            # The session of the running attempt (recorded when it started), else the last one.
            row = db.execute(
                "SELECT session_id FROM attempts WHERE task = ? AND session_id IS NOT NULL"
                " ORDER BY n DESC LIMIT 1",
                (task_id,),
            ).fetchone()
            pending = db.execute(
                "SELECT id FROM questions WHERE task = ? AND status = 'pending'"
                " ORDER BY asked_at, id",
                (task_id,),
            ).fetchall()
            ref = f"{spec.ref_prefix}{n}" if spec.ref_prefix and spec.commit else None
            db.execute(
                'INSERT INTO checkpoints (task, n, attempt, created_at, by, summary, ref, "commit",'
                " repo, note, coder, session_id, questions)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task_id,
                    n,
                    task.attempts,
                    now_iso(),
                    spec.by,
                    spec.summary,
                    ref,
                    spec.commit if ref else None,
                    spec.repo,
                    spec.note,
                    task.coder,
                    row[0] if row else None,
                    _compact([q for (q,) in pending]),
                ),
            )
            self._audit(
                db,
                task_id,
                "checkpointed",
                checkpoint=n,
                attempt=task.attempts,
                ref=ref,
                session=row[0] if row else None,
            )
            return self._checkpoint(db, task_id, n)

    def drop_checkpoint_ref(self, task_id: str, n: int, note: str) -> Checkpoint:
        with self._write() as db:
            db.execute(
                'UPDATE checkpoints SET ref = NULL, "commit" = NULL, note = ?'
                " WHERE task = ? AND n = ?",
                (note, task_id, n),
            )
            return self._checkpoint(db, task_id, n)

    def _checkpoint(self, db: Conn, task_id: str, n: int) -> Checkpoint:
        row = db.execute(
            f"SELECT {self.q.checkpoint_json} FROM checkpoints c{self.q.checkpoints}"
            " WHERE c.task = ? AND c.n = ?",
            (task_id, n),
        ).fetchone()
        if row is None:
            raise NotFound(
                f"{task_id} has no checkpoint {n}", hint=f"`fleet checkpoints {task_id}` lists them"
            )
        return Checkpoint.from_json(json.loads(row[0]))

    def checkpoint(self, task_id: str, n: int) -> Checkpoint:
        with self._read() as db:
            return self._checkpoint(db, task_id, n)

    def checkpoints(self, task_id: str) -> list[Checkpoint]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self.q.checkpoint_json} FROM checkpoints c{self.q.checkpoints}"
                " WHERE c.task = ? ORDER BY c.n",
                (task_id,),
            ).fetchall()
        return [Checkpoint.from_json(json.loads(r[0])) for r in rows]

    # -- the runner's changes --------------------------------------------------------------

    def claim(
        self,
        n: int,
        owner: str,
        lease_s: float,
        default_coder: str,
        default_model: str | None,
        boot: str | None = None,
        labels: Sequence[str] = (),
        caps: Mapping[str, int] | None = None,
    ) -> list[Task]:
        if n <= 0:
            return []
        d = self.dialect
        # The gates are read in the claim's own statement: one round trip less.
        gate_open = f"(g.until IS NULL OR g.until > {d.time_sql})"
        where = (
            f"{READY_WHERE} AND NOT EXISTS (SELECT 1 FROM gates g WHERE g.name = 'pause'"
            f" AND {gate_open}) AND COALESCE(t.coder, ?) NOT IN (SELECT substr(g.name, 7)"
            f" FROM gates g WHERE substr(g.name, 1, 6) = 'coder:' AND {gate_open})"
            f" AND {placement.host_and_needs(d)} AND {placement.not_missing()}"
        )
        args = (
            d.time_arg(0),
            default_coder,
            d.time_arg(0),
            owner,
            placement.labels_arg(labels),
            owner,
        )
        req = ClaimRequest(
            owner, lease_s, default_coder, default_model, boot or host.boot_id(), caps, where, args
        )
        for _ in range(placement.ROUNDS):
            try:
                with self._write(shared=True) as db:
                    return self._claim_capped(db, req, n)
            except placement.Missing as e:
                self._note_missing(owner, e.found, req)
            except Replan:
                pass  # the connection no longer keeps that plan: claimed the plain way now
        return []

    def claim_task(
        self,
        task_id: str,
        owner: str,
        lease_s: float,
        default_coder: str,
        default_model: str | None,
        boot: str | None = None,
        labels: Sequence[str] = (),
        caps: Mapping[str, int] | None = None,
    ) -> Task | None:
        where = f"t.id = ? AND {READY_WHERE} AND {placement.host_and_needs(self.dialect)}"
        args = (task_id, owner, placement.labels_arg(labels))
        req = ClaimRequest(
            owner, lease_s, default_coder, default_model, boot or host.boot_id(), caps, where, args
        )
        for _ in range(REPLANS):
            try:
                with self._write(shared=True) as db:
                    claimed = self._claim_capped(db, req, 1)
                    if not claimed:
                        return None
                    # Its directory is here (again): no longer recorded as missing on this host.
                    self._later.append(
                        ("DELETE FROM cwd_missing WHERE task = ? AND host = ?", (task_id, owner))
                    )
                    return claimed[0]
            except placement.Missing as e:
                self._note_missing(owner, e.found)
                return None
            except Replan:
                pass  # as in `claim`
        return None

    def _claim_capped(self, db: Conn, req: ClaimRequest, n: int) -> list[Task]:
        """`_claim`, keeping to `req.caps` (coder -> how many of its tasks may run at once on
        all hosts): the running ones are counted under the dialect's cap lock, which every
        claim under caps takes, and each round claims no more than the fullest capped coder
        still has room for, in claim order, until `n` are claimed or nothing more may be."""
        caps = req.caps
        if not caps:
            return self._claim(db, req, n)
        if self.dialect.cap_lock:
            db.execute(self.dialect.cap_lock)
        capped = sorted(caps)
        running = dict(
            db.execute(
                "SELECT coder, count(*) FROM tasks WHERE claimed_by IS NOT NULL"
                f" AND lease_until IS NOT NULL AND coder IN ({_marks(len(capped))})"
                " GROUP BY coder",
                capped,
            ).fetchall()
        )
        room = {c: caps[c] - int(running.get(c, 0)) for c in capped}
        claimed: list[Task] = []
        while len(claimed) < n:
            full = [c for c, k in room.items() if k <= 0]
            limit = min([n - len(claimed), *(k for k in room.values() if k > 0)])
            narrow = req
            if full:
                narrow = req.narrowed(
                    f"COALESCE(t.coder, ?) NOT IN ({_marks(len(full))})", req.default_coder, *full
                )
            rows = self._claim(db, narrow, limit)
            claimed += rows
            for task in rows:
                if task.coder in room:
                    room[task.coder] -= 1
            if len(rows) < limit:
                break
        return claimed

    def _claim(self, db: Conn, req: ClaimRequest, n: int) -> list[Task]:
        """Claim the first `n` ready tasks `req` may take, in claim order, in one statement
        (fleet.store.claiming): the owner, the attempt, the lease, by the store's clock, and
        the boot of the owner's host the claim is made in (its dialect's lock lets concurrent
        claimers pass over each other's picks instead of waiting for them). The claimed
        tasks, in claim order; raises placement.Missing, before recording anything, if a
        directory is missing here."""
        now = now_iso()
        d = self.dialect
        picked, update = claiming.picked(d, req, n), claiming.stamp(d)
        values = claiming.values(d, req, now)
        if d.writes_in_with:
            return self._claim_at_once(db, req, f"{picked}, claimed AS ({update}", values, now)
        rows = db.execute(
            f"{picked} {update} RETURNING id, cwd, attempts, coder, model, priority, seq",
            values,
        ).fetchall()
        # The claiming host looks for each directory (the transaction is undone if one is
        # missing: see fleet.store.placement).
        missing = placement.lacking(rows)
        if missing:
            raise placement.Missing(missing)
        rows.sort(key=lambda r: (r[5], r[6]))  # RETURNING keeps no order
        if rows:  # one statement, sent with the commit (see _later)
            self._later.append(
                (
                    "INSERT INTO attempts (task, n, owner, started_at, coder, model) VALUES "
                    + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows)),
                    tuple(
                        x
                        for task_id, _, n, coder, model, *_ in rows
                        for x in (task_id, n, req.owner, now, coder, model)
                    ),
                )
            )
        for task_id, _, attempt, *_ in rows:
            self._audit(db, task_id, "claimed", attempt=attempt, owner=req.owner, boot=req.boot)
        return [self._fetch(db, r[0]) for r in rows]

    def _claim_at_once(
        self, db: Conn, req: ClaimRequest, claimed: str, values: tuple[Any, ...], now: str
    ) -> list[Task]:
        """`_claim` where a WITH may write (PostgreSQL): the claim (`claimed`, the WITH up to
        its UPDATE, binding `values`), its attempt rows, its audit rows and the claimed tasks'
        JSON in one statement, where three (claim, read back, attempts) made claimers wait on
        each other; run by a plan the connection keeps (`_repeated`). The commit is not sent
        with it: a claim under caps claims again in the same transaction, and one that took a
        task whose directory is missing on this host is undone (placement.Missing)."""
        # The audit detail as `_audit` writes it: {"attempt": N, "owner": …, "boot": …}.
        rest: dict[str, Any] = {"owner": req.owner}
        if req.boot is not None:
            rest["boot"] = req.boot
        detail_tail = ", " + json.dumps(rest, ensure_ascii=False)[1:]
        rows = self._repeated(
            db,
            f"{claimed} RETURNING *),"
            " attempt AS (INSERT INTO attempts (task, n, owner, started_at, coder, model)"
            " SELECT id, attempts, ?, ?, coder, model FROM claimed),"
            " noted AS (INSERT INTO audit (task, at, action, by, detail)"
            " SELECT id, ?, 'claimed', ?, '{\"attempt\": ' || attempts || ? FROM claimed)"
            f" SELECT {self.q.task_json} FROM claimed t{self.q.tasks} ORDER BY t.priority, t.seq",
            (*values, req.owner, now, now, self.actor.by, detail_tail),
        )
        tasks = [Task.from_json(json.loads(r[0])) for r in rows]
        missing = placement.lacking((t.id, t.cwd) for t in tasks)
        if missing:
            raise placement.Missing(missing)
        for task in tasks:
            detail = {"attempt": task.attempts, **rest}
            self._trail.append(audit.Row(task.id, "claimed", self.actor.by, detail))
        return tasks

    def _repeated(self, db: Conn, sql: str, args: tuple[Any, ...]) -> list[Any]:
        """The rows of `sql`, a statement this store runs over and over (a claim's): a backend
        may keep its plan (fleet.store.pgstore), raising Replan if it lost it."""
        return db.execute(sql, args).fetchall()

    def _note_missing(
        self, owner: str, found: list[tuple[str, str]], req: ClaimRequest | None = None
    ) -> None:
        """Record that host `owner` lacks the directories of `found` (task, cwd), and of
        the claimable tasks `req` may take just behind them (looked at now, outside any lock:
        a claim looks again at each task it takes)."""
        missing = dict(found)
        if req is not None:
            with self._read() as db:
                ahead = db.execute(
                    f"SELECT t.id, t.cwd FROM tasks t WHERE {req.where}"
                    " AND t.claimed_by IS NULL ORDER BY t.priority, t.seq LIMIT ?",
                    (*req.args, placement.LOOK_AHEAD),
                ).fetchall()
            missing.update(placement.lacking(ahead))
        now = now_iso()
        with self._write(shared=True) as db:
            # A record of another directory (the task's cwd was edited since) starts anew.
            db.executemany(
                "INSERT INTO cwd_missing (task, host, cwd, since) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (task, host) DO UPDATE SET cwd = excluded.cwd,"
                " since = excluded.since WHERE cwd_missing.cwd <> excluded.cwd",
                [(task_id, owner, cwd, now) for task_id, cwd in sorted(missing.items())],
            )

    def recheck_missing(self, owner: str) -> list[str]:
        with self._read() as db:
            rows = db.execute(
                "SELECT m.task, m.cwd, t.status, t.cwd FROM cwd_missing m JOIN tasks t"
                " ON t.id = m.task WHERE m.host = ?",
                (owner,),
            ).fetchall()
        if not rows:
            return []
        still = {task for task, _ in placement.lacking(rows)}
        # Found again, or no longer of use: the task moved to another directory or finished.
        drop = [
            str(task)
            for task, cwd, status, now_cwd in rows
            if task not in still or cwd != now_cwd or status in FINAL
        ]
        if drop:
            with self._write(shared=True) as db:
                db.executemany(
                    "DELETE FROM cwd_missing WHERE task = ? AND host = ?",
                    [(task, owner) for task in drop],
                )
        return [str(task) for task, _, status, _ in rows if task not in still and status == "ready"]

    def missing_ready(self) -> dict[str, tuple[str, ...]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT m.task, m.host FROM cwd_missing m JOIN tasks t ON t.id = m.task"
                " WHERE t.status = 'ready' AND m.cwd = t.cwd ORDER BY m.task, m.host"
            ).fetchall()
        out: dict[str, tuple[str, ...]] = {}
        for task_id, lacking in rows:
            out[str(task_id)] = (*out.get(str(task_id), ()), str(lacking))
        return out

    def placed_apart(self, limit: int) -> list[Task]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE t.status = 'ready'"
                " AND (t.pinned_host IS NOT NULL OR t.needs IS NOT NULL"
                " OR t.id IN (SELECT m.task FROM cwd_missing m)) ORDER BY t.seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def missing_on(self, task_id: str) -> list[tuple[str, str]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT m.host, m.since FROM cwd_missing m JOIN tasks t ON t.id = m.task"
                " WHERE m.task = ? AND m.cwd = t.cwd ORDER BY m.host",
                (task_id,),
            ).fetchall()
        return [(str(h), str(since)) for h, since in rows]

    def set_worktree(self, task_id: str, owner: str, branch: str, worktree: str) -> Task:
        with self._write() as db:
            row = db.execute(
                "UPDATE tasks SET branch = ?, worktree = ?, updated_at = ? WHERE id = ?"
                " AND claimed_by = ? AND isolation = 'worktree'"
                " AND (branch IS NULL OR branch = ?) RETURNING id",
                (branch, worktree, now_iso(), task_id, owner, branch),
            ).fetchone()
            if row is None:
                cur = self._fetch(db, task_id)
                raise Conflict(
                    f"cannot record the worktree of {task_id}: it is claimed by"
                    f" {cur.claimed_by or 'nobody'}, isolation {cur.isolation or 'none'},"
                    f" branch {cur.branch or 'none'}"
                )
            return self._fetch(db, task_id)

    def claims(self, owner: str | None = None) -> list[Task]:
        sql = f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE t.claimed_by IS NOT NULL"
        args: tuple[str, ...] = ()
        if owner is not None:
            sql += " AND t.claimed_by = ?"
            args = (owner,)
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY t.seq", args).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def _tasks_where(self, db: Conn, where: str, args: Sequence[Any]) -> list[Task]:
        rows = db.execute(
            f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE {where} ORDER BY t.seq",
            args,
        ).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def stale_claims(self, owner: str, boot: str | None) -> list[Task]:
        # Only leased claims (a merge's has none): made in a boot of this host other than
        # `boot`, or with the lease run out by the store's clock.
        d = self.dialect
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks} WHERE t.claimed_by = ?"
                f" AND t.lease_until IS NOT NULL AND (t.lease_until < {d.time_sql}"
                " OR (? IS NOT NULL AND t.claim_boot IS NOT NULL AND t.claim_boot <> ?))"
                " ORDER BY t.seq",
                (owner, d.time_arg(0), boot, boot),
            ).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def _open_gates(self, db: Conn) -> dict[str, tuple[str | None, str | None]]:
        rows = db.execute(
            "SELECT name, until, reason FROM gates"
            f" WHERE until IS NULL OR until > {self.dialect.time_sql}",
            (self.dialect.time_arg(0),),
        ).fetchall()
        return {name: (until, reason) for name, until, reason in rows}

    def gates(self) -> dict[str, tuple[str | None, str | None]]:
        with self._read() as db:
            return self._open_gates(db)

    def open_gates(self) -> list[dict[str, Any]]:
        keys = ("name", "until", "reason", "kind", "by", "window", "since")
        with self._read() as db:
            rows = db.execute(
                'SELECT name, until, reason, kind, by, "window", created_at FROM gates'
                f" WHERE until IS NULL OR until > {self.dialect.time_sql} ORDER BY name",
                (self.dialect.time_arg(0),),
            ).fetchall()
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def set_gate(
        self,
        name: str,
        until: str | None,
        reason: str | None,
        kind: str | None = None,
        window: str | None = None,
    ) -> None:
        now = now_iso()
        kind = kind or ("pause" if name == "pause" else "rate-limit")
        with self._write() as db:
            db.execute(
                'INSERT INTO gates (name, until, reason, created_at, by, kind, "window")'
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " until = excluded.until, reason = excluded.reason,"
                " created_at = excluded.created_at, by = excluded.by, kind = excluded.kind,"
                ' "window" = excluded."window"',
                (name, until, reason, now, self.actor.by, kind, window),
            )
            # The timeline: a gate still open is extended (or changed), else a new one opens.
            row = db.execute(
                'UPDATE gate_log SET until = ?, reason = ?, kind = ?, "window" = ? WHERE id ='
                " (SELECT max(id) FROM gate_log WHERE name = ? AND ended_at IS NULL"
                " AND (until IS NULL OR until > ?)) RETURNING id",
                (until, reason, kind, window, name, now),
            ).fetchone()
            if row is None:
                db.execute(
                    'INSERT INTO gate_log (name, kind, reason, by, "window", started_at, until)'
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (name, kind, reason, self.actor.by, window, now, until),
                )

    def clear_gate(self, name: str) -> bool:
        now = now_iso()
        with self._write() as db:
            db.execute(
                "UPDATE gate_log SET ended_at = ? WHERE name = ? AND ended_at IS NULL"
                " AND (until IS NULL OR until > ?)",
                (now, name, now),
            )
            return db.execute("DELETE FROM gates WHERE name = ?", (name,)).rowcount > 0

    # -- figures for fleet.status and fleet.stats (plain SQL a PostgreSQL store can run) -------

    def gate_log(self, since: str | None, until: str | None) -> list[dict[str, Any]]:
        """Every gate open at some time in [since, until), oldest first; `end` is when it was
        lifted, or its `until` (null: open, indefinitely)."""
        keys = ("name", "kind", "reason", "by", "window", "start", "end")
        with self._read() as db:
            rows = db.execute(
                'SELECT name, kind, reason, by, "window", started_at, COALESCE(ended_at, until)'
                " FROM gate_log WHERE (? IS NULL OR started_at < ?)"
                " AND (? IS NULL OR COALESCE(ended_at, until) IS NULL"
                " OR COALESCE(ended_at, until) > ?) ORDER BY started_at, id",
                (until, until, since, since),
            ).fetchall()
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def attempt_rows(
        self, since: str | None, until: str | None, tasks: bool = False
    ) -> list[tuple[Any, ...]]:
        """The attempts that ended in [since, until): (task, n, started_at, ended_at, outcome,
        coder, model, tokens_in, tokens_out, tokens_cache_read, tokens_cache_write, cost,
        cost_source, cwd, labels, task_coder, task_model), the last four their task's if
        `tasks` (a join that doubles the cost of reading 100,000 attempts), else null."""
        task_columns = "t.cwd, t.labels, t.coder, t.model" if tasks else "NULL, NULL, NULL, NULL"
        join = " JOIN tasks t ON t.id = a.task" if tasks else ""
        with self._read() as db:
            return db.execute(
                "SELECT a.task, a.n, a.started_at, a.ended_at, a.outcome, a.coder, a.model,"
                " a.tokens_in, a.tokens_out, a.tokens_cache_read, a.tokens_cache_write, a.cost,"
                f" a.cost_source, {task_columns} FROM attempts a{join}"
                " WHERE a.ended_at IS NOT NULL AND (? IS NULL OR a.ended_at >= ?)"
                " AND (? IS NULL OR a.ended_at < ?)",
                (since, since, until, until),
            ).fetchall()

    def _stat_sql(
        self, dims: Sequence[str], select: str, since: str | None, until: str | None
    ) -> tuple[str, tuple[Any, ...], str]:
        columns = [STAT_DIMENSIONS[d] for d in dims]
        join = " JOIN tasks t ON t.id = a.task" if "cwd" in dims else ""
        head = ", ".join([*columns, "a.outcome"])
        sql = (
            f"SELECT {head}, {select} FROM attempts a{join} WHERE a.ended_at IS NOT NULL"
            " AND a.outcome NOT IN ('not-started', 'unstartable')"
            " AND (? IS NULL OR a.ended_at >= ?) AND (? IS NULL OR a.ended_at < ?)"
        )
        return sql, (since, since, until, until), head

    def attempt_sums(
        self, since: str | None, until: str | None, dims: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        sql, args, head = self._stat_sql(
            dims,
            "count(*), sum(a.tokens_in), sum(a.tokens_out), sum(a.tokens_cache_read),"
            " sum(a.tokens_cache_write), sum(a.cost),"
            " sum(CASE WHEN a.cost_source = 'estimated' THEN a.cost END),"
            " sum(CASE WHEN a.cost IS NULL AND (a.tokens_in > 0 OR a.tokens_out > 0)"
            " THEN 1 ELSE 0 END), min(a.started_at)",
            since,
            until,
        )
        with self._read() as db:
            return db.execute(f"{sql} GROUP BY {head}", args).fetchall()

    def attempt_durations(
        self, since: str | None, until: str | None, dims: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        sql, args, _ = self._stat_sql(
            dims,
            f"{self.dialect.seconds_between('a.ended_at', 'a.started_at')},"
            " substr(a.ended_at, 1, 13), a.cost",
            since,
            until,
        )
        with self._read() as db:
            return db.execute(sql, args).fetchall()

    def usage_sums(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]:
        """Tokens and cost by model of the attempts that ended in [since, until): (model,
        calls, input, output, cache_read, cache_write, cost, estimated cost)."""
        window = since is not None or until is not None
        join = " JOIN attempts a ON a.task = u.task AND a.n = u.attempt" if window else ""
        where = " WHERE (? IS NULL OR a.ended_at >= ?) AND (? IS NULL OR a.ended_at < ?)"
        with self._read() as db:
            return db.execute(
                "SELECT u.model, sum(u.calls), sum(u.input), sum(u.output), sum(u.cache_read),"
                " sum(u.cache_write), sum(u.cost),"
                " sum(CASE WHEN u.cost_source = 'estimated' THEN u.cost END)"
                f" FROM attempt_usage u{join}{where if window else ''} GROUP BY u.model",
                (since, since, until, until) if window else (),
            ).fetchall()

    def usage_rows(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]:
        """Tokens and cost by model of the attempts that ended in [since, until): (task,
        attempt, coder, model, calls, input, output, cache_read, cache_write, cost,
        cost_source)."""
        with self._read() as db:
            return db.execute(
                "SELECT u.task, u.attempt, a.coder, u.model, u.calls, u.input, u.output,"
                " u.cache_read, u.cache_write, u.cost, u.cost_source"
                " FROM attempt_usage u JOIN attempts a ON a.task = u.task AND a.n = u.attempt"
                " WHERE (? IS NULL OR a.ended_at >= ?) AND (? IS NULL OR a.ended_at < ?)",
                (since, since, until, until),
            ).fetchall()

    def finished_by_hour(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]:
        """Tasks done in [since, until) by the UTC hour they were done in: (hour, tasks,
        their attempts)."""
        with self._read() as db:
            return db.execute(
                "SELECT substr(finished_at, 1, 13), count(*), sum(attempts) FROM tasks"
                " WHERE status = 'done' AND finished_at IS NOT NULL"
                " AND (? IS NULL OR finished_at >= ?) AND (? IS NULL OR finished_at < ?)"
                " GROUP BY substr(finished_at, 1, 13)",
                (since, since, until, until),
            ).fetchall()

    def status_counts(self) -> dict[str, int]:
        with self._read() as db:
            rows = db.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall()
        return {str(status): int(n) for status, n in rows}

    def _placed(self) -> str:
        """What host (name, labels) of `_placed_args` may claim (fleet.store.placement)."""
        return f"{placement.host_and_needs(self.dialect)} AND {placement.not_missing()}"

    @staticmethod
    def _placed_args(name: str, labels: Sequence[str]) -> list[Any]:
        return [name, placement.labels_arg(labels), name]

    def ready_by_coder(
        self, default_coder: str, here: tuple[str, Sequence[str]] | None = None
    ) -> dict[str, int]:
        # All ready tasks less those that wait (driven by the few dependencies, rather than a
        # probe of them per ready task: a third of the time on a big queue).
        waiting = (
            "t.id IN (SELECT d.task FROM deps d JOIN tasks u ON u.id = d.after"
            " WHERE u.status != 'done') OR t.id IN (SELECT w.id FROM tasks w JOIN tasks p"
            " ON p.id = w.predecessor WHERE w.predecessor IS NOT NULL"
            " AND p.claimed_by IS NOT NULL)"
        )
        placed, args = "", []
        if here is not None:
            placed, args = f" AND {self._placed()}", self._placed_args(*here)
        counts: dict[str, int] = {}
        with self._read() as db:
            for sign, where in ((1, ""), (-1, f" AND ({waiting})")):
                rows = db.execute(
                    "SELECT COALESCE(t.coder, ?), count(*) FROM tasks t"
                    f" WHERE t.status = 'ready'{placed}{where} GROUP BY COALESCE(t.coder, ?)",
                    (default_coder, *args, default_coder),
                ).fetchall()
                for coder, n in rows:
                    counts[str(coder)] = counts.get(str(coder), 0) + sign * int(n)
        return {coder: n for coder, n in counts.items() if n > 0}

    def spent_since(self, since: str) -> dict[str, float]:
        """Cost by coder of the attempts that ended at or after `since` (daily budgets)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT coder, sum(cost) FROM attempts WHERE ended_at >= ? AND cost IS NOT NULL"
                " GROUP BY coder",
                (since,),
            ).fetchall()
        return {str(coder): float(total) for coder, total in rows if coder}

    def attempt_usage(self, task_id: str) -> dict[int, list[dict[str, Any]]]:
        """Tokens and cost by model of each attempt of the task."""
        keys = ("model", "calls", "input", "output", "cache_read", "cache_write", "cost")
        with self._read() as db:
            rows = db.execute(
                "SELECT attempt, model, calls, input, output, cache_read, cache_write, cost,"
                " cost_source FROM attempt_usage WHERE task = ? ORDER BY attempt, model",
                (task_id,),
            ).fetchall()
        out: dict[int, list[dict[str, Any]]] = {}
        for attempt, *values in rows:
            entry = dict(zip((*keys, "cost_source"), values, strict=True))
            out.setdefault(int(attempt), []).append(entry)
        return out

    def record_gauge(
        self,
        coder: str,
        window: str,
        status: str | None,
        utilization: float | None,
        resets_at: float | None,
    ) -> None:
        with self._write() as db:
            db.execute(
                'INSERT INTO gauges (coder, "window", status, utilization, resets_at,'
                ' updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (coder, "window") DO UPDATE'
                " SET status = excluded.status, utilization = excluded.utilization,"
                " resets_at = excluded.resets_at, updated_at = excluded.updated_at",
                (
                    coder,
                    window,
                    status,
                    utilization,
                    iso(resets_at) if resets_at else None,
                    now_iso(),
                ),
            )

    def gauges(self) -> list[dict[str, Any]]:
        with self._read() as db:
            rows = db.execute(
                'SELECT coder, "window", status, utilization, resets_at, updated_at FROM gauges'
                ' ORDER BY coder, "window"'
            ).fetchall()
        keys = ("coder", "window", "status", "utilization", "resets_at", "updated_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def record_session(self, task_id: str, owner: str, attempt: int, session_id: str) -> None:
        with self._write(shared=True) as db:
            db.execute(
                "UPDATE attempts SET session_id = ? WHERE task = ? AND n = ? AND ended_at IS NULL"
                " AND EXISTS (SELECT 1 FROM tasks WHERE id = ? AND claimed_by = ?)",
                (session_id, task_id, attempt, task_id, owner),
            )

    def renew(self, task_id: str, owner: str, lease_s: float, attempt: int | None = None) -> bool:
        with self._write(shared=True) as db:
            row = db.execute(
                f"UPDATE tasks SET lease_until = {self.dialect.time_sql} WHERE id = ?"
                f" AND claimed_by = ? AND {ATTEMPT_IS} RETURNING id",
                (self.dialect.time_arg(lease_s), task_id, owner, attempt, attempt),
            ).fetchone()
            if row is not None:  # the host of a runner that renews is alive (fleet.store.hosts)
                self._seen(db, self.dialect, owner, host.machine_id())
            return row is not None

    def release(
        self, task_id: str, owner: str, end: AttemptEnd, attempt: int | None = None
    ) -> Task:
        return self.finish(task_id, owner, end, Status.READY, attempt=attempt)

    def finish(
        self,
        task_id: str,
        owner: str,
        end: AttemptEnd,
        status: Status,
        reason: str | None = None,
        count: Count | None = None,
        ahead: int | None = None,
        attempt: int | None = None,
    ) -> Task:
        with self._write(shared=True) as db:
            return self._end_attempt(db, task_id, owner, end, status, reason, count, ahead, attempt)

    def recover_lost(
        self, task_id: str, owner: str, end: AttemptEnd, attempt: int, max_lost: int, by: str
    ) -> Task:
        with self._write(shared=True) as db:
            after = self._end_attempt(
                db, task_id, owner, end, Status.READY, None, None, None, attempt
            )
            if by != owner:  # another host's claim: say who took it back, from which host
                self._audit(db, task_id, "recovered", attempt=attempt, host=owner, by_host=by)
            if end.outcome != "lost" or after.lost_streak < max_lost:
                return after
            hosts = [
                str(h)
                for (h,) in db.execute(
                    "SELECT owner FROM attempts WHERE task = ? ORDER BY n DESC LIMIT ?",
                    (task_id, after.lost_streak),
                ).fetchall()
            ]
            on = ", ".join(dict.fromkeys(reversed(hosts)))
            why = f"lost {after.lost_streak} times in a row (on {on})"
            if db.execute(
                "UPDATE tasks SET status = 'blocked', reason = ?, updated_at = ? WHERE id = ?"
                " AND status = 'ready' AND claimed_by IS NULL RETURNING id",
                (why, now_iso(), task_id),
            ).fetchone():
                self._audit(db, task_id, "blocked", reason=why)
            return self._fetch(db, task_id)

    def _end_attempt(
        self,
        db: Conn,
        task_id: str,
        owner: str,
        end: AttemptEnd,
        status: Status,
        reason: str | None,
        count: Count | None,
        ahead: int | None,
        attempt: int | None,
    ) -> Task:
        """`finish` within the open write transaction `db`."""
        now = now_iso()
        final = now if status.final else None
        # A person who closed, blocked or cancelled the task meanwhile keeps their status.
        row = db.execute(
            "UPDATE tasks SET"
            " reason = CASE WHEN status = 'running' THEN COALESCE(?, reason) ELSE reason END,"
            " finished_at = CASE WHEN status = 'running' THEN COALESCE(?, finished_at)"
            " ELSE finished_at END,"
            " status = CASE WHEN status = 'running' THEN ? ELSE status END,"
            " failures = failures + ?, noclose = noclose + ?,"
            " lost_streak = CASE WHEN ? = 'lost' THEN lost_streak + 1 ELSE 0 END,"
            # Totals over attempts, kept on the row so that listings need no aggregation.
            " tokens_in = CASE WHEN ? IS NULL THEN tokens_in"
            " ELSE COALESCE(tokens_in, 0) + ? END,"
            " tokens_out = CASE WHEN ? IS NULL THEN tokens_out"
            " ELSE COALESCE(tokens_out, 0) + ? END,"
            " cost = CASE WHEN ? IS NULL THEN cost ELSE COALESCE(cost, 0) + ? END,"
            " tokens_cache_read = CASE WHEN ? IS NULL THEN tokens_cache_read"
            " ELSE COALESCE(tokens_cache_read, 0) + ? END,"
            " tokens_cache_write = CASE WHEN ? IS NULL THEN tokens_cache_write"
            " ELSE COALESCE(tokens_cache_write, 0) + ? END,"
            " cost_source = CASE WHEN ? IS NULL THEN cost_source WHEN cost_source IS NULL"
            " OR cost_source = ? THEN ? ELSE 'mixed' END,"
            " ahead = COALESCE(?, ahead),"
            # The attempt that ends has used the checkpoint it was to resume from.
            " resume_from = CASE WHEN ? = 'not-started' THEN resume_from END,"
            " claimed_by = NULL, lease_until = NULL, claim_boot = NULL, updated_at = ?"
            f" WHERE id = ? AND claimed_by = ? AND {ATTEMPT_IS} RETURNING attempts",
            (
                reason,
                final,
                status.value,
                int(count == "failure"),
                int(count == "noclose"),
                end.outcome,
                end.tokens_in,
                end.tokens_in,
                end.tokens_out,
                end.tokens_out,
                end.cost,
                end.cost,
                end.cache_read,
                end.cache_read,
                end.cache_write,
                end.cache_write,
                end.cost_source,
                end.cost_source,
                end.cost_source,
                ahead,
                end.outcome,
                now,
                task_id,
                owner,
                attempt,
                attempt,
            ),
        ).fetchone()
        if row is None:
            cur = self._fetch(db, task_id)
            which = f" for attempt {attempt}" if attempt is not None else ""
            raise Conflict(
                f"{task_id} is not claimed by {owner}{which} (claimed by"
                f" {cur.claimed_by or 'nobody'}, attempt {cur.attempts})"
            )
        db.execute(
            "UPDATE attempts SET ended_at = ?, outcome = ?, exit_status = ?, tokens_in = ?,"
            " tokens_out = ?, cost = ?, session_id = COALESCE(?, session_id),"
            " tokens_cache_read = ?, tokens_cache_write = ?, cost_source = ?,"
            " model = COALESCE(?, model), session_totals = ?"
            " WHERE task = ? AND n = ?",
            (
                now,
                end.outcome,
                end.exit_status,
                end.tokens_in,
                end.tokens_out,
                end.cost,
                end.session_id,
                end.cache_read,
                end.cache_write,
                end.cost_source,
                end.model,
                end.session_totals,
                task_id,
                row[0],
            ),
        )
        db.executemany(
            "INSERT INTO attempt_usage (task, attempt, model, calls, input,"
            " output, cache_read, cache_write, cost, cost_source)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task, attempt, model)"
            " DO UPDATE SET calls = excluded.calls, input = excluded.input,"
            " output = excluded.output, cache_read = excluded.cache_read,"
            " cache_write = excluded.cache_write, cost = excluded.cost,"
            " cost_source = excluded.cost_source",
            [(task_id, row[0], *model) for model in end.usage],
        )
        if status == Status.MERGING:
            # The task was closed during the attempt (the agent's own close, usually):
            # that close is what asks for the merge-back, so it becomes merging too.
            db.execute(
                "UPDATE tasks SET status = 'merging', finished_at = NULL,"
                " merge_state = 'pending', merge_reason = NULL, merged_commit = NULL"
                " WHERE id = ? AND status IN ('merging', 'done')",
                (task_id,),
            )
        # The agent that asked is gone: nobody is left to receive an answer.
        self._end_pending(db, "task = ?", (task_id,), QuestionStatus.CANCELLED, now)
        after = self._fetch(db, task_id)
        self._audit(
            db,
            task_id,
            "ended",
            attempt=row[0],
            outcome=end.outcome,
            status=after.status.value,
            reason=after.reason,
        )
        return after

    # -- merge-back ----------------------------------------------------------------------------

    def pending_merges(self) -> list[Task]:
        # Served by the tasks_claim_order index (status first): cheap on every dispatch pass.
        sql = (
            f"SELECT {self.q.task_json} FROM tasks t{self.q.tasks}"
            " WHERE t.status = 'merging' ORDER BY t.seq"
        )
        with self._read() as db:
            rows = db.execute(sql).fetchall()
        return [Task.from_json(json.loads(r[0])) for r in rows]

    def request_merge(
        self, task_id: str, allowed: tuple[Status, ...], strategy: str | None
    ) -> Task:
        with self._write() as db:
            cond = f"status IN ({_marks(len(allowed))})"
            row = db.execute(
                "UPDATE tasks SET status = 'merging', merge = COALESCE(?, merge),"
                " merge_state = 'pending', merge_reason = NULL, finished_at = NULL,"
                f" updated_at = ? WHERE id = ? AND {cond}"
                # A merge claim may be there: the merge-back under way (or a dead one's, which
                # the merge-back that follows takes over) settles the task either way.
                f" AND (claimed_by IS NULL OR {MERGE_CLAIMED})"
                " AND isolation = 'worktree' AND branch IS NOT NULL"
                # A task blocked for another reason (the retry limit, its own agent) has no
                # work ready to go back; a merged one has none left to.
                " AND (status != 'blocked' OR merge_state IN ('conflict', 'failed'))"
                " AND merge_state IS DISTINCT FROM 'merged' RETURNING id",
                (strategy, now_iso(), task_id, *(s.value for s in allowed)),
            ).fetchone()
            if row is None:
                cur = self._fetch(db, task_id)
                raise Conflict(f"cannot merge {task_id}: it is {_state_words(cur)}")
            self._audit(db, task_id, "merge-requested", strategy=strategy)
            return self._fetch(db, task_id)

    def take_merge(self, task_id: str, owner: str) -> Task | None:
        with self._write() as db:
            row = db.execute(
                "UPDATE tasks SET claimed_by = ?, lease_until = NULL, claim_boot = NULL"
                " WHERE id = ? AND status = 'merging'"
                f" AND (claimed_by IS NULL OR {MERGE_CLAIMED}) RETURNING id",
                (owner, task_id),
            ).fetchone()
            return None if row is None else self._fetch(db, task_id)

    def record_merge(
        self,
        task_id: str,
        expected: Status,
        status: Status,
        mark: MergeMark,
        reason: str | None = None,
        owner: str | None = None,
    ) -> Task:
        now = now_iso()
        with self._write() as db:
            before = self._fetch(db, task_id)
            row = db.execute(
                "UPDATE tasks SET status = ?, merge_state = ?, merge_reason = ?,"
                " merged_commit = COALESCE(?, merged_commit), ahead = COALESCE(?, ahead),"
                " reason = COALESCE(?, reason), finished_at = ?, updated_at = ?,"
                " claimed_by = NULL, lease_until = NULL, claim_boot = NULL"
                " WHERE id = ? AND status = ? AND claimed_by IS NOT DISTINCT FROM ? RETURNING id",
                (
                    status.value,
                    mark.state,
                    mark.reason,
                    mark.commit,
                    mark.ahead,
                    reason,
                    now if status.final else None,
                    now,
                    task_id,
                    expected.value,
                    owner,
                ),
            ).fetchone()
            if row is None:
                raise Conflict(
                    f"cannot record the merge-back of {task_id}: it is {_state_words(before)}"
                )
            # A merge that waits is tried again on every dispatch pass: one row per new reason.
            again = mark.state == before.merge_state == "pending"
            if not (again and mark.reason == before.merge_reason):
                self._audit(
                    db,
                    task_id,
                    MERGE_ACTION.get(mark.state, "merged-back"),
                    state=mark.state,
                    commit=mark.commit,
                    ahead=mark.ahead,
                    reason=mark.reason,
                )
            return self._fetch(db, task_id)

    # -- questions ---------------------------------------------------------------------------

    def ask(
        self,
        task_id: str,
        kind: QuestionKind,
        text: str,
        options: Sequence[str],
        multi_select: bool,
        expires_at: str,
    ) -> Question:
        now = now_iso()
        with self._write() as db:
            task = self._fetch(db, task_id)
            if task.status != Status.RUNNING:
                raise Conflict(
                    f"{task_id} is {task.status}: only a running task's agent can ask",
                    hint="questions come from an agent through fleet-ask",
                )
            for _ in range(16):
                qid = ids.new_question_id()
                row = db.execute(
                    "INSERT INTO questions (id, task, attempt, kind, text, options,"
                    " multi_select, asked_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO NOTHING RETURNING id",
                    (
                        qid,
                        task_id,
                        task.attempts,
                        kind.value,
                        text,
                        _compact(list(options)),
                        int(multi_select),
                        now,
                        expires_at,
                    ),
                ).fetchone()
                if row is not None:
                    break
            else:
                raise StoreError("could not draw an unused question id")
            db.execute("UPDATE tasks SET question = ? WHERE id = ?", (qid, task_id))
            self._audit(db, task_id, "asked", question=qid, kind=kind.value)
            return self._question(db, qid)

    def _question(self, db: Conn, qid: str) -> Question:
        row = db.execute(
            f"SELECT {self.q.question_json} FROM questions q{self.q.questions} WHERE q.id = ?",
            (qid,),
        )
        found = row.fetchone()
        if found is None:
            raise NotFound(f"no question {qid}", hint="`fleet questions --all` lists them all")
        return Question.from_json(json.loads(found[0]))

    def question(self, qid: str) -> Question:
        with self._read() as db:
            return self._question(db, qid)

    def resolve_question(self, ref: str) -> str:
        ref = ref.strip().lower()
        with self._read() as db:
            rows = db.execute(
                "SELECT id FROM questions WHERE id >= ? AND id < ? ORDER BY id LIMIT 2",
                (ref, ref + "\uffff"),
            ).fetchall()
        if not rows:
            raise NotFound(f"no question {ref}", hint="`fleet questions --all` lists them all")
        if len(rows) > 1 and rows[0][0] != ref:
            raise InputError(f"{ref} names more than one question", hint="give more of the id")
        return str(rows[0][0])

    def questions(self, task_id: str | None = None, pending: bool = True) -> list[Question]:
        where, args = [], []
        if pending:
            where.append("q.status = 'pending'")
        if task_id is not None:
            where.append("q.task = ?")
            args.append(task_id)
        sql = f"SELECT {self.q.question_json} FROM questions q{self.q.questions}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY q.asked_at, q.id", args).fetchall()
        return [Question.from_json(json.loads(r[0])) for r in rows]

    def answer(
        self,
        qid: str,
        by: str,
        answer: str,
        choices: Sequence[str] = (),
        approved: bool | None = None,
        comment: str | None = None,
    ) -> Question:
        now = now_iso()
        with self._write() as db:
            row = db.execute(
                "UPDATE questions SET status = 'answered', answer = ?, choices = ?,"
                " approved = ?, comment = ?, answered_by = ?, answered_at = ?"
                " WHERE id = ? AND status = 'pending' RETURNING task",
                (
                    answer,
                    _compact(list(choices)),
                    None if approved is None else int(approved),
                    comment,
                    by,
                    now,
                    qid,
                ),
            ).fetchone()
            if row is None:
                raise not_pending(self._question(db, qid))
            self._point_at_pending(db, row[0])
            self._audit(db, row[0], "answered", question=qid)
            return self._question(db, qid)

    def end_question(self, qid: str, status: QuestionStatus) -> Question | None:
        """Expire or cancel a pending question; None if it was no longer pending."""
        with self._write() as db:
            ended = self._end_pending(db, "id = ?", (qid,), status, now_iso())
            return self._question(db, qid) if ended else None

    def _end_pending(
        self,
        db: Conn,
        where: str,
        args: tuple[Any, ...],
        status: QuestionStatus,
        now: str,
    ) -> bool:
        tasks = db.execute(
            f"UPDATE questions SET status = ?, answered_at = ? WHERE {where}"
            " AND status = 'pending' RETURNING task",
            (status.value, now, *args),
        ).fetchall()
        for task_id in {t for (t,) in tasks}:
            self._point_at_pending(db, task_id)
        return bool(tasks)

    @staticmethod
    def _point_at_pending(db: Conn, task_id: str) -> None:
        """Keep tasks.question on the newest question still pending (an agent may ask two)."""
        db.execute(
            "UPDATE tasks SET question = (SELECT q.id FROM questions q WHERE q.task = ?"
            " AND q.status = 'pending' ORDER BY q.asked_at DESC, q.id LIMIT 1) WHERE id = ?",
            (task_id, task_id),
        )

    # -- schedules ---------------------------------------------------------------------------

    def add_schedule(self, schedule: Schedule) -> Schedule:
        with self._write() as db:
            # A name already taken inserts nothing (no error, which would end a PostgreSQL
            # transaction).
            row = db.execute(
                "INSERT INTO schedules (name, on_calendar, overlap, persistent, args, cwd,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING"
                " RETURNING name",
                (
                    schedule.name,
                    schedule.on_calendar,
                    schedule.overlap,
                    int(schedule.persistent),
                    json.dumps(list(schedule.args)),
                    schedule.cwd,
                    schedule.created_at,
                ),
            ).fetchone()
            if row is None:
                raise Conflict(
                    f"schedule {schedule.name} exists",
                    hint=f"fleet schedule rm {schedule.name} first, or choose another name",
                )
        return schedule

    def schedules(self) -> list[Schedule]:
        with self._read() as db:
            rows = db.execute(f"SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name")
            return [_schedule(r) for r in rows.fetchall()]

    def schedule(self, name: str) -> Schedule:
        with self._read() as db:
            row = db.execute(
                f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = ?", (name,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no schedule {name}", hint="fleet schedule ls lists them")
        return _schedule(row)

    def drop_schedule(self, name: str) -> None:
        with self._write() as db:
            if not db.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount:
                raise NotFound(f"no schedule {name}", hint="fleet schedule ls lists them")

    def schedule_runs(
        self, name: str, limit: int = 1, manual: bool = True, added: bool = False
    ) -> list[ScheduleRun]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {RUN_COLUMNS} FROM schedule_runs WHERE schedule = ?"
                + ("" if manual else " AND manual = 0")
                + (" AND outcome = 'added'" if added else "")
                + " ORDER BY fired_at DESC, slot DESC LIMIT ?",
                (name, limit),
            ).fetchall()
        return [_run(r) for r in rows]

    def fire(self, name: str, slot: str, specs: Sequence[TaskSpec]) -> ScheduleRun:
        with self._write() as db:
            row = db.execute(
                f"SELECT {RUN_COLUMNS} FROM schedule_runs WHERE schedule = ? AND slot = ?",
                (name, slot),
            ).fetchone()
            if row is not None:
                return _run(row)._replace(fresh=False)
            found = db.execute("SELECT overlap FROM schedules WHERE name = ?", (name,)).fetchone()
            if found is None:
                raise NotFound(f"no schedule {name}", hint="fleet schedule ls lists them")
            overlap = str(found[0])
            # The run before: the newest that added tasks (a skipped one added none).
            before = db.execute(
                "SELECT tasks FROM schedule_runs WHERE schedule = ? AND outcome = 'added'"
                " ORDER BY fired_at DESC, slot DESC LIMIT 1",
                (name,),
            ).fetchone()
            open_ids: list[str] = []
            for task_id in json.loads(before[0]) if before else []:
                heir = self._heir(db, task_id)
                status = db.execute("SELECT status FROM tasks WHERE id = ?", (heir,)).fetchone()
                if status is not None and status[0] in OPEN_STATUSES:
                    open_ids.append(heir)
            outcome, task_ids = "added", []
            if open_ids and overlap == "skip":
                outcome = "skipped"
            else:
                if open_ids and overlap == "queue":
                    specs = [s._replace(after=(*s.after, *open_ids)) for s in specs]
                task_ids = [t.id for t in self._add(db, specs)]
            run = ScheduleRun(
                name, slot, now_iso(), self.actor.by, outcome, tuple(task_ids), fresh=True
            )
            db.execute(
                "INSERT INTO schedule_runs (schedule, slot, manual, fired_at, by, outcome, tasks)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    slot,
                    int(slot.startswith(MANUAL)),
                    run.fired_at,
                    run.by,
                    outcome,
                    json.dumps(task_ids),
                ),
            )
        if len(task_ids) >= BULK_ADD:
            self._grew()
        return run

    # -- the outbox and leases ------------------------------------------------------------

    def spool(self, specs: Sequence[OutgoingSpec]) -> list[Outgoing]:
        now = now_iso()
        with self._write() as db:
            # Settled messages are kept a while for replies that come late, then dropped.
            db.execute(
                "DELETE FROM outbox WHERE settled = 1 AND sent_at < ?",
                (iso(time.time() - KEEP_SENT_S),),
            )
            ids = [
                db.execute(
                    "INSERT INTO outbox (channel, target, event, task, question, body,"
                    " created_at, next_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        s.channel,
                        s.target,
                        s.event,
                        s.task,
                        s.question,
                        json.dumps(s.body, ensure_ascii=False),
                        now,
                        now,
                    ),
                ).fetchone()[0]
                for s in specs
            ]
            return self._outgoing(db, f"id IN ({_marks(len(ids))})", ids)

    @staticmethod
    def _outgoing(db: Conn, where: str, args: Sequence[Any]) -> list[Outgoing]:
        rows = db.execute(f"SELECT {OUTBOX_COLUMNS} FROM outbox WHERE {where} ORDER BY id", args)
        return [
            Outgoing(
                row[0],
                row[1],
                row[2],
                row[3],
                json.loads(row[4]),
                row[5],
                row[6],
                row[7],
                row[8],
                row[9],
                row[10],
                bool(row[11]),
                tuple(json.loads(row[12])),
            )
            for row in rows.fetchall()
        ]

    def take_spooled(
        self,
        channel: str,
        owner: str,
        seconds: float,
        limit: int,
        ids: Sequence[int] = (),
        before: int | None = None,
    ) -> list[Outgoing]:
        now = now_iso()
        d = self.dialect
        free = (
            f"ref IS NULL AND (claimed_until IS NULL OR claimed_until < {d.time_sql}"
            " OR claimed_by = ?)"
        )
        args: list[Any] = [channel, d.time_arg(0), owner]
        if ids:
            picked = f"id IN ({_marks(len(ids))})"
            args += ids
        else:
            picked = "(next_at <= ? OR id < ?)"
            args += [now, before or 0]
        where = f"channel = ? AND {free} AND {picked}"
        with self._read() as db:
            # Most calls find nothing: a read, which (unlike a write) wakes no watcher.
            if db.execute(f"SELECT 1 FROM outbox WHERE {where} LIMIT 1", args).fetchone() is None:
                return []
        with self._write() as db:
            taken = db.execute(
                f"UPDATE outbox SET claimed_by = ?, claimed_until = {d.time_sql} WHERE id IN"
                f" (SELECT id FROM outbox WHERE {where} ORDER BY id LIMIT ?) RETURNING id",
                (owner, d.time_arg(seconds), *args, limit),
            ).fetchall()
            found = [r[0] for r in taken]
            return self._outgoing(db, f"id IN ({_marks(len(found))})", found)

    def spool_sent(self, msg_id: int, owner: str, ref: str) -> None:
        with self._write() as db:
            db.execute(
                "DELETE FROM outbox WHERE id = ? AND claimed_by = ? AND question IS NULL",
                (msg_id, owner),
            )
            db.execute(
                "UPDATE outbox SET ref = ?, sent_at = ?, tries = tries + 1, error = NULL,"
                " claimed_by = NULL, claimed_until = NULL WHERE id = ? AND claimed_by = ?",
                (ref, now_iso(), msg_id, owner),
            )

    def spool_failed(self, msg_id: int, owner: str, error: str, next_at: float) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE outbox SET tries = tries + 1, error = ?, next_at = ?, claimed_by = NULL,"
                " claimed_until = NULL WHERE id = ? AND claimed_by = ? AND ref IS NULL",
                (error, iso(next_at), msg_id, owner),
            )

    def spooled(self, channel: str | None = None) -> int:
        where, args = (
            ("ref IS NULL", []) if channel is None else ("ref IS NULL AND channel = ?", [channel])
        )
        with self._read() as db:
            return int(db.execute(f"SELECT count(*) FROM outbox WHERE {where}", args).fetchone()[0])

    def sent_message(self, channel: str, target: str, ref: str) -> Outgoing | None:
        with self._read() as db:
            found = self._outgoing(
                db, "channel = ? AND target = ? AND ref = ?", (channel, target, ref)
            )
        return found[0] if found else None

    def unsettled(self, channel: str) -> list[Outgoing]:
        with self._read() as db:
            return self._outgoing(
                db,
                "channel = ? AND question IS NOT NULL AND ref IS NOT NULL AND settled = 0"
                " AND EXISTS (SELECT 1 FROM questions q WHERE q.id = outbox.question"
                " AND q.status != 'pending')",
                (channel,),
            )

    def settle_message(self, msg_id: int) -> None:
        with self._write() as db:
            db.execute("UPDATE outbox SET settled = 1 WHERE id = ?", (msg_id,))

    def pick(self, msg_id: int, picked: Sequence[str]) -> Outgoing:
        with self._write() as db:
            db.execute(
                "UPDATE outbox SET picked = ? WHERE id = ?",
                (json.dumps(list(picked), ensure_ascii=False), msg_id),
            )
            found = self._outgoing(db, "id = ?", (msg_id,))
        if not found:
            raise NotFound(f"no spooled message {msg_id}")
        return found[0]

    def take_lease(self, name: str, owner: str, seconds: float) -> Lease:
        d = self.dialect
        with self._write() as db:
            db.execute(
                f"INSERT INTO leases (name, owner, until) VALUES (?, ?, {d.time_sql})"
                " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, until = excluded.until"
                " WHERE leases.owner IS NULL OR leases.owner = excluded.owner"
                f" OR leases.until IS NULL OR leases.until < {d.time_sql}",
                (name, owner, d.time_arg(seconds), d.time_arg(0)),
            )
            row = db.execute(
                "SELECT name, owner, until, value FROM leases WHERE name = ?", (name,)
            ).fetchone()
        return Lease(*row)

    def drop_lease(self, name: str, owner: str) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE leases SET owner = NULL, until = NULL WHERE name = ? AND owner = ?",
                (name, owner),
            )

    def set_lease_value(self, name: str, owner: str, value: str) -> bool:
        with self._write() as db:
            return (
                db.execute(
                    "UPDATE leases SET value = ? WHERE name = ? AND owner = ?"
                    f" AND until >= {self.dialect.time_sql}",
                    (value, name, owner, self.dialect.time_arg(0)),
                ).rowcount
                > 0
            )


SCHEDULE_COLUMNS = "name, on_calendar, overlap, persistent, args, cwd, created_at"
RUN_COLUMNS = "schedule, slot, fired_at, by, outcome, tasks"
# A schedule's run is open while one of its tasks may still run (fleet.schedules).
OPEN_STATUSES = (Status.READY.value, Status.RUNNING.value, Status.MERGING.value)


def _schedule(row: Sequence[Any]) -> Schedule:
    name, spec, overlap, persistent, args, cwd, created = row
    return Schedule(name, spec, overlap, bool(persistent), tuple(json.loads(args)), cwd, created)


def _run(row: Sequence[Any]) -> ScheduleRun:
    schedule, slot, fired_at, by, outcome, tasks = row
    return ScheduleRun(schedule, slot, fired_at, by, outcome, tuple(json.loads(tasks)))


def _state_words(task: Task) -> str:
    if is_merge_claim(task.claimed_by):
        return "being merged back"
    if task.claimed_by:
        return "running"
    if not task.isolated or task.branch is None:
        return f"{task.status} and has no branch of its own"
    if task.merge_state == "merged":
        return f"{task.status} and already merged"
    if task.status == Status.BLOCKED and task.merge_state not in ("conflict", "failed"):
        return "blocked, and not by its merge-back"
    return str(task.status)
