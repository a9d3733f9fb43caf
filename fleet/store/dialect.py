"""What differs between the SQL of the two stores, in one place; everything else is shared.

`fleet.store.sql` writes its statements once, in SQLite's syntax where the two agree and with
`?` placeholders; a backend's connection translates placeholders (`PostgreSQL.sql`), and each
fragment below is spelt once per dialect: building JSON, matching labels and words, no limit,
date arithmetic, the locks a claim takes, and the clock. Upserts are `INSERT … ON CONFLICT`,
which both accept as it is.

JSON: a record's JSON text is the same bytes on both (what `fleet ls --json` prints as it comes
from the store): compact (`{"k":v,…}`, `["a","b"]`), keys in field order, strings escaped alike,
JSON columns embedded as stored (the store writes them compact), and a REAL as SQLite prints it
(`%!.15g`: `1.0`, `0.3`, `1.0e+20`; PostgreSQL's `fleet_json_real`, fleet.store.pgschema).

The clock: a lease or a deadline is `time_sql` bound to `time_arg(seconds)`: on SQLite the
host's time (one host shares the store), on PostgreSQL the database's (`now()`), so hosts whose
clocks disagree still agree on when a lease runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from fleet.timeutil import iso


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What the shared store needs of a connection: sqlite3's, or PostgreSQL's wrapped."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


class Dialect(NamedTuple):  # not a dataclass: importing dataclasses costs every command ~5 ms
    name: str
    # A row's JSON object from (key, SQL expression) pairs, for a query over the table aliased
    # as the second argument: (the select expression, what follows that table in FROM).
    record: Callable[[Sequence[tuple[str, str]], str], tuple[str, str]]
    real: Callable[[str], str]  # a REAL as a JSON number, as SQLite's json_object() prints it
    json: Callable[[str], str]  # JSON text in a column, as a JSON value
    empty_array: str
    json_array_agg: Callable[[str, str], str]  # (expression, order): '[]' over no rows
    json_each: Callable[[str], str]  # a FROM item: the elements of a JSON array, as `value`
    like: str  # case-insensitive LIKE
    no_limit: int | None  # a LIMIT that limits nothing
    seconds_between: Callable[[str, str], str]  # (later, earlier) ISO times
    skip_locked: str  # after a claim's SELECT: how concurrent claimers pass each other
    # (inner, outer) JSON arrays as text: whether every element of inner is one of outer's
    json_within: Callable[[str, str], str]
    # The statement a claim under global caps runs first, so that claimers of all hosts count
    # running tasks one after the other; empty where every write is serial already.
    cap_lock: str
    writes_in_with: bool  # whether a WITH may hold INSERTs and UPDATEs (a claim in one go)
    # A FROM item of every task's dependencies in one pass, as a task's JSON spells them:
    # (task, after, waiting_on), a row for each task with any; empty where a listing looks
    # them up task by task (SQLite, whose aggregates keep no order of their own).
    deps_joined: str
    time_sql: str  # an ISO time, `time_arg(seconds)` from now
    time_arg: Callable[[float], Any]


def _host_time(seconds: float) -> str:
    return iso(time.time() + seconds)


SQLITE = Dialect(
    name="sqlite",
    record=lambda pairs, alias: (
        "json_object(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")",
        "",
    ),
    real=lambda expr: expr,
    json=lambda expr: f"json({expr})",
    empty_array="json_array()",
    # Ordered by how the query reads the rows (deps by its primary key: task, after).
    json_array_agg=lambda expr, order: f"json_group_array({expr})",
    json_each=lambda expr: f"json_each({expr})",
    like="LIKE",  # SQLite's LIKE ignores the case of ASCII letters
    no_limit=-1,
    seconds_between=lambda a, b: f"(julianday({a}) - julianday({b})) * 86400.0",
    skip_locked="",  # a write holds the whole database
    json_within=lambda inner, outer: (
        f"NOT EXISTS (SELECT 1 FROM json_each({inner}) n WHERE n.value NOT IN"
        f" (SELECT o.value FROM json_each({outer}) o))"
    ),
    cap_lock="",  # the claim's write holds the whole database
    writes_in_with=False,
    deps_joined="",
    time_sql="?",
    time_arg=_host_time,
)

# The advisory lock of claims under global caps per coder: not the write lock (pgstore's
# 0x666C7400), which claims only share, but a key of its own that they take exclusively.
CAP_LOCK_KEY = 0x666C7401
# PostgreSQL's functions take at most 100 arguments: json_build_object 50 pairs.
_PG_MAX_PAIRS = 50
# The ISO format of fleet.timeutil, from the database's clock (now(): the transaction's start).
_PG_TIME = (
    "to_char((now() AT TIME ZONE 'UTC') + ? * interval '1 second',"
    ' \'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\')'
)


def _pg_record(pairs: Sequence[tuple[str, str]], alias: str) -> tuple[str, str]:
    # row_to_json over a lateral row, not json_build_object: half the cost on a long listing
    # (which looks up every argument's type on every row), compact like SQLite's, and no
    # limit of 50 pairs. The planner flattens the lateral row into the scan.
    columns = ", ".join(f'{v} AS "{k}"' for k, v in pairs)
    return f"row_to_json(_{alias})::text", f", LATERAL (SELECT {columns}) _{alias}"


# What `waiting_on` holds (fleet.store.sql: READY_WHERE): the dependencies not done, and the
# predecessor while its attempt has not ended; `after`, every dependency.
_PG_DEPS_JOINED = (
    "(SELECT x.task, ('[' || string_agg(to_json(x.w)::text, ',' ORDER BY x.w)"
    " FILTER (WHERE x.dep) || ']')::json AS after, ('[' || string_agg(to_json(x.w)::text, ','"
    " ORDER BY x.w) FILTER (WHERE x.waits) || ']')::json AS waiting FROM (SELECT d.task,"
    " d.after AS w, true AS dep, u.status != 'done' AS waits FROM deps d LEFT JOIN tasks u"
    " ON u.id = d.after UNION ALL SELECT s.id, s.predecessor, false, true FROM tasks s"
    " JOIN tasks p ON p.id = s.predecessor WHERE p.claimed_by IS NOT NULL) x GROUP BY x.task)"
)

POSTGRES = Dialect(
    name="postgresql",
    record=_pg_record,
    real=lambda expr: f"fleet_json_real({expr})",
    json=lambda expr: f"({expr})::json",
    empty_array="'[]'::json",
    # Not json_agg, which separates elements with ", ".
    json_array_agg=lambda expr, order: (
        f"COALESCE(('[' || string_agg(to_json({expr})::text, ',' ORDER BY {order}) || ']')::json,"
        " '[]'::json)"
    ),
    json_each=lambda expr: f"json_array_elements_text(({expr})::json) AS e(value)",
    like="ILIKE",
    no_limit=None,
    seconds_between=lambda a, b: (
        f"extract(epoch FROM ({a})::timestamptz - ({b})::timestamptz)::double precision"
    ),
    skip_locked=" FOR UPDATE OF t SKIP LOCKED",
    json_within=lambda inner, outer: f"({outer})::jsonb @> ({inner})::jsonb",
    cap_lock=f"SELECT pg_advisory_xact_lock({CAP_LOCK_KEY})",
    writes_in_with=True,
    deps_joined=_PG_DEPS_JOINED,
    time_sql=_PG_TIME,
    time_arg=lambda seconds: float(seconds),
)


@lru_cache(maxsize=1024)
def pg_sql(sql: str) -> str:
    """A statement of the shared store with psycopg's placeholders (`%s`; `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class Replan(Exception):
    """A statement's transaction must be made again, the plain way: the server no longer
    has (or would not make) the plan the connection kept for it (fleet.store.pgstore).
    Nothing of the transaction was committed."""
