"""The SQLite task store (WAL mode): the queue on one host, with `fleet.store.sql`'s semantics.

Invariants:
- every write runs as BEGIN IMMEDIATE while holding an exclusive flock on `fleet.lock`, so
  fleet's own writers queue in the kernel (woken at once, no busy-wait back-off) and SQLite's
  busy timeout is only a fallback for foreign processes such as the sqlite3 shell;
- every committed write then touches `fleet.lock` (IN_ATTRIB), so a watcher woken by it
  always sees the new state.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from fleet import audit
from fleet.errors import StoreError
from fleet.paths import Paths, state_dir
from fleet.store.dialect import SQLITE, Conn
from fleet.store.schema import APPLICATION_ID, MIGRATIONS, VERSION
from fleet.store.sql import SQLStore

BUSY_TIMEOUT_S = 60.0


# SQLite's primary result codes (the low byte of an extended one) that a full disk gives: a
# write that finds no room says FULL, but growing the -shm index (which every first reader
# of a WAL database does) or a file fails as IOERR, and creating one as CANTOPEN.
_SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 13, 14


class DiskFull(StoreError):
    """The disk holding the store has no room left for a write."""


def _disk_full(path: object) -> DiskFull:
    return DiskFull(
        f"the disk holding the task store {path} is full; nothing was changed",
        hint="free some space on it; `fleet ls` and `fleet show` still work meanwhile",
    )


def _is_full(e: sqlite3.Error, path: object) -> bool:
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    if code == _SQLITE_FULL:
        return True
    if code not in (_SQLITE_IOERR, _SQLITE_CANTOPEN):
        return False
    from fleet.fsutil import nearly_full

    return nearly_full(os.path.dirname(str(path)))


@contextmanager
def _db_errors(path: object) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as e:
        text = str(e)
        if "locked" in text or "busy" in text:
            raise StoreError(
                f"the task store {path} stayed locked for {BUSY_TIMEOUT_S:.0f} s",
                hint="another program holds a long write transaction on it",
            ) from e
        if _is_full(e, path):
            raise _disk_full(path) from e
        raise StoreError(f"task store {path}: {text}") from e
    except sqlite3.DatabaseError as e:
        if _is_full(e, path):
            raise _disk_full(path) from e
        raise StoreError(
            f"{path} is not a usable fleet database: {e}",
            hint="move it aside; fleet creates a new, empty store",
        ) from e


class SQLiteStore(SQLStore):
    dialect = SQLITE

    def __init__(
        self, db: sqlite3.Connection, lock_fd: int, path: object, actor: audit.Actor
    ) -> None:
        self._db = db
        self._lock_fd = lock_fd
        self._path = path
        self.actor = actor
        self._trail: list[audit.Row] = []  # the audit rows of the open write transaction
        self._later: list[tuple[str, tuple[Any, ...]]] = []
        self._read_only = False  # opened for reading only, because the disk is full

    @classmethod
    def open(cls, paths: Paths, actor: audit.Actor) -> SQLiteStore:
        state_dir(paths.home)
        try:
            lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            # SQLite would create the database with the umask's mode (0644); its -wal and
            # -shm files take the database's mode, so creating it 0600 first covers all three.
            new = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            with suppress(FileExistsError):
                os.close(os.open(paths.db, new, 0o600))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _disk_full(paths.db) from e
            raise StoreError(f"cannot open {e.filename}: {e.strerror}") from e
        with _db_errors(paths.db):
            db = sqlite3.connect(
                paths.db, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        store = cls(db, lock_fd, paths.db, actor)
        try:
            try:
                store._prepare()
            except DiskFull:
                store._db.close()
                store._db = store._reader(paths)
                store._read_only = True
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def _reader(paths: Paths) -> sqlite3.Connection:
        """On a full disk, the store for reading only: SQLite's first reader of a WAL database
        must create and grow its -shm index, which needs room. Without a -wal file the
        database file holds every commit, and SQLite reads it as it is (immutable=1, no
        index); with one, some commits are only there, so nothing can be read."""
        from urllib.parse import quote

        wal = f"{paths.db}-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise _disk_full(paths.db)
        with _db_errors(paths.db):
            db = sqlite3.connect(
                f"file:{quote(str(paths.db))}?immutable=1",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            if int(db.execute("PRAGMA user_version").fetchone()[0]) != VERSION:
                db.close()
                raise _disk_full(paths.db)  # no room to migrate it
        return db

    def rest(self) -> None:
        pass

    def close(self) -> None:
        self._db.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- connection set-up and migrations ------------------------------------------------

    def _prepare(self) -> None:
        with _db_errors(self._path):
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA synchronous = NORMAL")
            if self._version() == VERSION and self._journal_mode() == "wal":
                return
            with self._locked():
                # WAL mode is persistent and cannot change inside a transaction.
                if self._journal_mode() != "wal":
                    self._db.execute("PRAGMA journal_mode = WAL")
                # Nor can foreign key enforcement: off, so a migration may rebuild a table that
                # others refer to; checked as a whole before the commit instead.
                self._db.execute("PRAGMA foreign_keys = OFF")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    version = self._version()
                    for statements in MIGRATIONS[version:]:
                        for sql in statements:
                            self._db.execute(sql)
                    broken = self._db.execute("PRAGMA foreign_key_check").fetchone()
                    if broken is not None:
                        raise StoreError(
                            f"{self._path}: migrating to schema version {VERSION} would leave"
                            f" a dangling reference in table {broken[0]}",
                            hint="the store was not changed; report this as a bug",
                        )
                    self._db.execute(f"PRAGMA user_version = {VERSION}")
                    # A migration may rewrite schema text (see schema.py), which SQLite does
                    # not announce: the new cookie makes other connections re-read it.
                    cookie = int(self._db.execute("PRAGMA schema_version").fetchone()[0])
                    self._db.execute(f"PRAGMA schema_version = {cookie + 1}")
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                finally:
                    self._db.execute("PRAGMA foreign_keys = ON")

    def _journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower()

    def _version(self) -> int:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        app = int(self._db.execute("PRAGMA application_id").fetchone()[0])
        # Migration 1 sets the id first thing: a database without it is fleet's only while
        # it is empty (just created), and another program's whatever its version says.
        if app != APPLICATION_ID and (
            version or app or self._db.execute("SELECT 1 FROM sqlite_schema").fetchone()
        ):
            raise StoreError(
                f"{self._path} is a SQLite database but not fleet's",
                hint="point FLEET_HOME at another directory",
            )
        if version > VERSION:
            raise StoreError(
                f"{self._path} has schema version {version}; this fleet knows up to {VERSION}",
                hint="it was written by a newer fleet: upgrade fleet to use it",
            )
        return version

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def _write(self, shared: bool = False) -> Iterator[Conn]:
        with _db_errors(self._path), self._locked():
            if self._read_only:
                raise _disk_full(self._path)
            self._db.execute("BEGIN IMMEDIATE")
            self._trail, self._later = [], []
            try:
                yield self._db
                for sql, args in self._later:
                    self._db.execute(sql, args)
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (a full disk): a second ROLLBACK
                # would fail and hide the error that matters.
                if self._db.in_transaction:
                    with suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                self._trail, self._later = [], []
                raise
            # Announce the commit: the WAL's last write comes before the commit is visible
            # (that happens in shared memory, which inotify cannot see); this comes after.
            os.utime(self._lock_fd)
        trail, self._trail = self._trail, []
        audit.journal(trail, self.actor.program)

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        with _db_errors(self._path):
            yield self._db
