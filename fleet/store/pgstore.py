"""The PostgreSQL task store: one queue that several hosts share, with `fleet.store.sql`'s
semantics. The only module that imports psycopg (3), so a SQLite store never loads it.

Invariants:
- one connection per store, in autocommit mode: a read sees what is committed, and every write
  is one transaction (`_write`) that holds an advisory lock for its whole length, exclusive
  for most writes and shared for claims, renewals and ends of attempts, whose UPDATEs are
  compare-and-set on rows they lock (a claim picks with FOR UPDATE SKIP LOCKED). So writes are
  as serial as on SQLite, except that claimers, on any host, pass each other;
- values are bound on the client (psycopg's ClientCursor), as SQLite binds them, so the shared
  SQL's untyped parameters (`? IS NULL`) mean what they mean there; a statement run over and
  over (a claim's) runs by a plan the connection keeps (PREPARE, then EXECUTE of the values
  bound the same way), named by its statement's digest, and the plain way wherever the server
  lost or refused the plan (`_Conn.repeated`);
- leases and deadlines use the database's clock (fleet.store.dialect);
- after every commit the store touches the local `fleet.lock`, as SQLite's does, so watchers
  on this host wake up;
- an error names the database by host, port and name, never by its URL: a password in the URL
  is never printed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict

from fleet import audit
from fleet.errors import StoreError
from fleet.paths import Paths, state_dir
from fleet.store.dialect import POSTGRES, Conn, Cursor, Replan, pg_sql
from fleet.store.pgschema import MIGRATIONS, VERSION
from fleet.store.sql import SQLStore

# The advisory lock every write holds ("flt" again, as SQLite's application id).
LOCK_KEY = 0x666C7400
CONNECT_TIMEOUT_S = 10
_BEGIN = f"BEGIN; SELECT pg_advisory_xact_lock({LOCK_KEY})".encode()
_BEGIN_SHARED = f"BEGIN; SELECT pg_advisory_xact_lock_shared({LOCK_KEY})".encode()
# The plans a connection keeps at most (`_Conn.repeated`: a claim's statements differ by how
# many tasks they take and which caps are full, so a few per host).
KEPT_PLANS = 64


class _Number(Loader):
    """NUMERIC (what PostgreSQL sums BIGINTs to) as SQLite returns it: int, or float."""

    def load(self, data: Buffer) -> int | float:
        text = bytes(data).decode()
        return int(text) if text.lstrip("-").isdigit() else float(text)


class _Conn:
    """A psycopg connection that speaks the shared SQL (`?` placeholders) and saves round
    trips: a write's BEGIN and lock go with its first statement, the statements of an
    executemany go as one, and what is left for the commit goes with it."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._binder = psycopg.ClientCursor(conn)
        self.begin = b""  # a write's BEGIN, until its first statement carries it
        self.begun = False  # whether the server has the write's transaction open
        self.keeps = True  # whether plans are kept at all (`repeated`)
        self._kept: dict[str, str] = {}  # statement -> the name of the plan the server keeps
        self._plain: set[str] = set()  # statements whose plan the server would not make

    def _bound(self, sql: str, parameters: Any) -> bytes:
        return self._binder.mogrify(pg_sql(sql), parameters).encode()

    def _send(self, query: bytes) -> psycopg.Cursor[Any]:
        if not self.begin:
            return self._conn.execute(query)
        query, self.begin, self.begun = self.begin + b"; " + query, b"", True
        cur = self._conn.execute(query)
        while cur.nextset():  # the result that matters is the last statement's
            pass
        return cur

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        return self._send(self._bound(sql, parameters))

    def repeated(self, sql: str, parameters: Sequence[Any]) -> list[Any]:
        """The rows of `sql`, run by a plan the server keeps for this connection (PREPARE),
        made in the statement's first run, in its round trip. A plan is named by a digest of
        its statement, so one name always means one statement, whichever client of a pooled
        server connection made it. Raises Replan, to make the transaction again, where the
        server lost the plan (a PgBouncer in transaction pooling hands out another server
        connection: from then on this connection keeps no plans) or would not make it (that
        statement is then always run the plain way)."""
        name = self._kept.get(sql)
        if name is None and (not self.keeps or sql in self._plain or len(self._kept) >= KEPT_PLANS):
            return self.execute(sql, parameters).fetchall()
        make = b""
        if name is None:
            digest = hashlib.blake2b(f"{len(parameters)} {sql}".encode(), digest_size=12)
            name = "fleet_" + digest.hexdigest()
            kinds = ", ".join(["unknown"] * len(parameters))  # each inferred where it is used
            make = f"PREPARE {name} ({kinds}) AS {_numbered(sql)}; ".encode()
        marks = f"({', '.join(['%s'] * len(parameters))})" if parameters else ""  # () is wrong
        run = self._binder.mogrify(f"EXECUTE {name}{marks}", parameters).encode()
        try:
            cur = self._send(make + run)
            while cur.nextset():  # the rows are the EXECUTE's, after the PREPARE's result
                pass
            rows = cur.fetchall()
        except psycopg.Error as e:
            state = e.sqlstate or ""
            if state == "26000":  # no such plan on this server connection
                self.keeps = False
                self._kept.clear()
            elif state == "42P05":  # made already, by this name: of this statement
                self._kept[sql] = name
            elif make and state.startswith("42"):  # it cannot be made (types, syntax)
                self._plain.add(sql)
            else:
                raise
            raise Replan(f"{state}: {_first_line(str(e))}") from None
        self._kept[sql] = name
        return rows

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any:
        rows = [self._bound(sql, p) for p in parameters]
        if rows:
            self._send(b"; ".join(rows))

    def commit(self, later: list[tuple[str, tuple[Any, ...]]]) -> None:
        statements = [self._bound(sql, args) for sql, args in later]
        if self.begin and not statements:
            self.begin = b""  # the transaction did nothing: nothing to begin or commit
            return
        self._send(b"; ".join([*statements, b"COMMIT"]))
        self.begun = False

    def rollback(self) -> None:
        self.begin = b""
        if self.begun and not self._conn.closed:
            self.begun = False
            with suppress(psycopg.Error):
                self._conn.execute(b"ROLLBACK")


def _numbered(sql: str) -> str:
    """A statement of the shared store with PREPARE's placeholders ($1, $2, …)."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


def describe(url: str) -> tuple[str, str | None]:
    """The database as errors name it (`host:port/name`), and the password to keep out of them."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as e:
        from fleet.store.pgauth import scrub

        raise StoreError(
            "the store setting is not a valid PostgreSQL connection URL: "
            + scrub(_first_line(str(e)), url),
            hint="it looks like postgresql://USER@HOST:PORT/DATABASE",
        ) from None
    host = str(info.get("host") or os.environ.get("PGHOST") or "the local socket")
    port = str(info.get("port") or os.environ.get("PGPORT") or "5432")
    name = str(info.get("dbname") or os.environ.get("PGDATABASE") or info.get("user") or "")
    password = info.get("password")
    return f"{host}:{port}/{name}", str(password) if password else None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "unknown error")


class PGStore(SQLStore):
    dialect = POSTGRES

    def __init__(self, url: str, where: str, secret: str | None, actor: audit.Actor) -> None:
        self._url = url
        self._site = where
        self._secret = secret
        self._conn = self._connect(url, where, secret, actor.program)
        self._db = _Conn(self._conn)
        self._lock_fd = -1
        self.actor = actor
        self._trail = []
        self._later = []

    @classmethod
    def _connect(
        cls, url: str, where: str, secret: str | None, program: str
    ) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {}
        if "connect_timeout" not in url:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            conn = psycopg.connect(
                url,
                autocommit=True,
                cursor_factory=psycopg.ClientCursor,
                application_name=program,
                # Its own bookkeeping of statements to prepare costs every statement, and a
                # client-bound one is never prepared by it (see `_Conn.repeated`).
                prepare_threshold=None,
                **extra,
            )
        except psycopg.Error as e:
            text = cls._scrub(e, secret)
            refused = "password" in text and ("authentication failed" in text or "no " in text)
            raise StoreError(
                f"cannot reach the task store at {where}: {text}",
                hint="check the password libpq finds for it: ~/.pgpass, PGPASSFILE, the"
                " store_passfile setting or the service file"
                if refused
                else "check that PostgreSQL runs there and accepts this host, and the store"
                " setting (FLEET_STORE)",
            ) from None
        conn.adapters.register_loader("numeric", _Number)
        # JIT compiling a listing's JSON expression costs more than running it: three
        # quarters of `fleet ls --json` on 20,000 tasks went to it.
        conn.execute(b"SET jit = off")
        return conn

    def _usable(self) -> None:
        """A connection that broke (the server restarted, the network went) is made anew by
        the next call, so a long-lived program outlives an outage of the database."""
        if self._conn.broken or self._conn.closed:
            self._conn.close()
            self._conn = self._connect(self._url, self._site, self._secret, self.actor.program)
            self._db = _Conn(self._conn)

    @classmethod
    def connect(cls, url: str, paths: Paths | None, actor: audit.Actor) -> PGStore:
        where, secret = describe(url)
        store = cls(url, where, secret, actor)
        try:
            if paths is not None:
                state_dir(paths.home)
                store._lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            store._prepare()
        except BaseException:
            store.close()
            raise
        return store

    def rest(self) -> None:
        self._conn.close()  # `_usable` connects again when the store is next used

    def close(self) -> None:
        self._conn.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @staticmethod
    def _scrub(e: BaseException, secret: str | None) -> str:
        """The first line of libpq's message, less psycopg's wrapping and any password."""
        text = _first_line(str(e))
        for wrapping in ("connection is bad: ", "connection failed: "):
            text = text.removeprefix(wrapping)
        return text.replace(secret, "***") if secret else text

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except psycopg.OperationalError as e:
            raise StoreError(
                f"lost the task store at {self._site}: {self._scrub(e, self._secret)}",
                hint="check that PostgreSQL runs there; nothing of this command was committed",
            ) from None
        except psycopg.Error as e:
            raise StoreError(f"task store {self._site}: {self._scrub(e, self._secret)}") from e

    # -- schema ------------------------------------------------------------------------------

    def _prepare(self) -> None:
        with self._errors():
            if self._version() == VERSION:
                return
            with self._conn.transaction():
                # Hosts that start together migrate one after the other.
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                version = self._version()
                for statements in MIGRATIONS[version:]:
                    for sql in statements:
                        self._conn.execute(sql.encode())
                if version == 0:
                    self._conn.execute("CREATE TABLE fleet_schema (version INTEGER NOT NULL)")
                    self._conn.execute("INSERT INTO fleet_schema VALUES (0)")
                self._conn.execute("UPDATE fleet_schema SET version = %s", (VERSION,))

    def _version(self) -> int:
        found = self._conn.execute("SELECT to_regclass('fleet_schema') IS NOT NULL").fetchone()
        if not (found and found[0]):
            other = self._conn.execute(
                "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() LIMIT 1"
            ).fetchone()
            if other:
                raise StoreError(
                    f"the database {self._site} holds tables but not fleet's",
                    hint="give fleet a database of its own (createdb fleet)",
                )
            return 0
        row = self._conn.execute("SELECT version FROM fleet_schema").fetchone()
        version = int(row[0]) if row else 0
        if version > VERSION:
            raise StoreError(
                f"the task store {self._site} has schema version {version}; this fleet"
                f" knows up to {VERSION}",
                hint="it was written by a newer fleet: upgrade fleet on this host",
            )
        return version

    def _grew(self) -> None:
        # Until autovacuum gets to it, a table that grew by thousands of ready tasks looks
        # nearly empty to the planner, which then reads every ready task (a bitmap scan and a
        # sort) for each claim instead of the first ones in index order.
        self._usable()
        with self._errors():
            self._conn.execute(b"ANALYZE tasks, deps")

    # -- transactions ------------------------------------------------------------------------

    def _repeated(self, db: Conn, sql: str, args: tuple[Any, ...]) -> list[Any]:
        # Planning a claim's statement took twice as long as running it.
        return self._db.repeated(sql, args)

    @contextmanager
    def _write(self, shared: bool = False) -> Iterator[Conn]:
        self._usable()
        with self._errors():
            self._db.begin = _BEGIN_SHARED if shared else _BEGIN
            self._trail, self._later = [], []
            try:
                yield self._db
                self._db.commit(self._later)
            except BaseException:
                self._trail, self._later = [], []
                self._db.rollback()
                raise
            if self._lock_fd >= 0:
                os.utime(self._lock_fd)
        trail, self._trail = self._trail, []
        audit.journal(trail, self.actor.program)

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        self._usable()
        with self._errors():
            yield self._db
