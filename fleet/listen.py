"""fleet-listen: this host's ear on a PostgreSQL store shared by several hosts.

It holds one direct connection with LISTEN on fleet.store.pgnotify's channel and turns each
notification into the local file the single-host path already uses: the wake file
(fleet.wake) for `ready`, the task's `.question` sentinel for `answer`, its `.kill` for
`kill` and its `.mail` for `mail`, when this host holds the claim; and, for every
notification, it touches `fleet.lock` as a local commit does. So fleet-claim.path, the
runner, fleet-ask, `fleet wait` and the dashboard wait on inotify, and a coder's hook looks
for `.mail`, as they do on one host, and nothing here decides anything.

Work that may have become startable is the exception, for speed: on `ready` (and after a
catch-up) it runs the dispatch pass itself, as `fleet add` does (fleet.claim.dispatch_or_wake,
the same pass), in this process whose interpreter and imports are warm, instead of leaving it
to fleet-claim.service's new process and connection (a pass under way is waited for, up to
PASS_WAIT_S); where it cannot (units not installed or not its to start, a pass still under way
after that, an error) that pokes the wake file as before. Its store connection is let go
after each pass, so an idle host still holds one connection.

Invariants:
- it never misses a change for long: notifications sent while it is not listening are lost,
  so after every (re)connection, before it reports itself listening, it catches up from the
  tables (a poke; `.question` of this host's attempts with a settled question; `.kill` of
  those with a kill request; `.mail` of those with an unread message). A spurious ring costs
  its reader one look at the store;
- a connection that stops delivering is noticed within PING_S + PING_TIMEOUT_S: every PING_S
  it notifies itself on a channel of its own and must hear that back within PING_TIMEOUT_S,
  its queries are cut off after that long (the socket is shut down under them), and TCP
  keepalives and a user timeout are in the connection's parameters. Any failure closes the
  connection and reconnects, with a backoff (BACKOFF_MIN after a connection that listened,
  doubling to BACKOFF_MAX while connecting or listening fails);
- it pings systemd's watchdog only from its loop, so a listener stuck anywhere is restarted;
- it is the only connection an idle host keeps open.

A notification names task ids; one that is not a well-formed id is dropped, so a stranger's
NOTIFY on the channel can name no other file.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg

from fleet import questions, taskdir, wake
from fleet.claim import dispatch_or_wake
from fleet.errors import ConfigError, FleetError
from fleet.host import owner
from fleet.notify import Notifier
from fleet.paths import Paths
from fleet.store import Store, pgnotify, signals
from fleet.store.dialect import pg_sql

PING_S = 5.0  # how often the connection is proven to deliver
PING_TIMEOUT_S = 5.0  # how long a query or the ping's echo may take
# How long a dispatch pass here waits for one under way (fleet-claim.service's, after a task
# ended) before leaving the work to a new one: far below the watchdog's 30 s.
PASS_WAIT_S = 5.0
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0
CONNECT_TIMEOUT_S = 10
# libpq's TCP keepalives (ignored on a Unix socket): a silent peer is given up within ~20 s
# even between pings, and data left unacknowledged for 15 s ends the connection.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,
}


class Lost(Exception):
    """The connection stopped answering or delivering."""


def _log(text: str) -> None:
    sys.stderr.write(f"fleet-listen: {text}\n")
    sys.stderr.flush()


def _task_ids(words: Iterable[str]) -> list[str]:
    from fleet.ids import is_task_id

    return [w for w in words if is_task_id(w)]


@contextmanager
def _cut_after(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Run the block with the connection's socket shut down after `seconds`: a query to a
    server that went silent fails then (as Lost), instead of waiting on TCP's own timeouts."""
    fd = conn.fileno()
    cut = threading.Event()

    def shut() -> None:
        cut.set()
        with suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    timer = threading.Timer(seconds, shut)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.Error:
        if cut.is_set():
            raise Lost(f"no answer from the server within {seconds:g} s") from None
        raise
    finally:
        timer.cancel()


class Listener:
    def __init__(self, paths: Paths, url: str, notifier: Notifier | None = None) -> None:
        from fleet.store.pgstore import describe

        self.paths = paths
        self.url = url
        self.where, self._secret = describe(url)
        self.me = owner()
        self.notifier = notifier or Notifier()
        self._watchdog = self.notifier.watchdog_interval()
        self._next_watchdog = 0.0
        self.listened = False  # whether the current connection got as far as listening
        self._store: Store | None = None  # the dispatch passes', opened at the first

    def _scrub(self, e: BaseException) -> str:
        text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        return text.replace(self._secret, "***") if self._secret else text

    def _tick(self) -> None:
        """Ping systemd's watchdog when it is due."""
        now = time.monotonic()
        if self._watchdog and now >= self._next_watchdog:
            self.notifier.ping()
            self._next_watchdog = now + self._watchdog

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._tick()
            time.sleep(min(left, self._watchdog or left))

    def connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in self.url}
        if "connect_timeout" not in self.url:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        return psycopg.connect(self.url, autocommit=True, application_name="fleet-listen", **extra)

    def serve(self) -> None:
        """Listen until stopped, reconnecting after any failure."""
        self.notifier.ready(f"connecting to {self.where}")
        backoff = BACKOFF_MIN
        while True:
            try:
                conn = self.connect()
            except psycopg.Error as e:
                why = self._scrub(e)
            else:
                self.listened = False
                try:
                    self.session(conn)
                except (psycopg.Error, Lost, OSError) as e:
                    why = self._scrub(e)
                finally:
                    conn.close()
                if self.listened:
                    # It worked until now: try again soon. A connection that fails before it
                    # listens (LISTEN refused, a catch-up that fails) backs off further.
                    backoff = BACKOFF_MIN
            _log(f"not listening to {self.where}: {why}; again in {backoff:g} s")
            self.notifier.status(f"reconnecting to {self.where} in {backoff:g} s: {why}")
            self._sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def session(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN, catch up, then hear notifications and prove the connection until it
        fails (Lost or psycopg.Error)."""
        private = f"fleet_ping_{os.getpid()}_{secrets.token_hex(4)}"
        with _cut_after(conn, PING_TIMEOUT_S):
            conn.execute(f"LISTEN {pgnotify.CHANNEL}".encode())
            conn.execute(f"LISTEN {private}".encode())
        self.catch_up(conn)
        self.listened = True
        _log(f"listening to {self.where} as {self.me}")
        self.notifier.status(f"listening to {self.where} as {self.me}")
        token: str | None = None
        due = time.monotonic() + PING_S  # the next ping, or the echo's deadline
        while True:
            self._tick()
            wait = max(0.0, min(due, self._next_watchdog or due) - time.monotonic())
            got = list(conn.notifies(timeout=wait, stop_after=1))
            echoed = any(n.channel == private and n.payload == token for n in got)
            self.act(n.payload for n in got if n.channel == pgnotify.CHANNEL)
            if token is not None and echoed:
                token, due = None, time.monotonic() + PING_S
            elif time.monotonic() >= due:
                if token is not None:
                    raise Lost(f"no echo of the keepalive within {PING_TIMEOUT_S:g} s")
                token = secrets.token_hex(8)
                with _cut_after(conn, PING_TIMEOUT_S):
                    conn.execute(b"SELECT pg_notify(%s, %s)", (private, token))
                due = time.monotonic() + PING_TIMEOUT_S

    def catch_up(self, conn: psycopg.Connection[Any]) -> None:
        """What notifications may have been missed: a pass, and the sentinels of this host's
        attempts that a person's answer or kill request, or a message, concerns."""
        with _cut_after(conn, PING_TIMEOUT_S):
            kills = conn.execute(pg_sql(signals.KILLS_OF).encode(), (self.me,)).fetchall()
            settled = conn.execute(pg_sql(signals.SETTLED_OF).encode(), (self.me,)).fetchall()
            unread = conn.execute(pg_sql(signals.UNREAD_OF).encode(), (self.me,)).fetchall()
        with suppress(FileNotFoundError):
            os.utime(self.paths.lock)  # whatever changed meanwhile: watchers look again
        self.ring_questions(_task_ids(str(r[0]) for r in settled))
        self.ring_kills(_task_ids(str(r[0]) for r in kills))
        self.ring_mail(_task_ids(str(r[0]) for r in unread))
        self.dispatch()

    def act(self, payloads: Iterable[str]) -> None:
        """Ring what the notifications ask for, each file once however many asked."""
        heard = ready = False
        asked: dict[str, list[str]] = {"answer": [], "kill": [], "mail": [], "changed": []}
        for payload in payloads:
            note = pgnotify.parse(payload)
            if note is None:
                continue
            heard = True
            if note.kind == "ready":
                ready = True
            elif note.host == self.me:
                asked[note.kind].extend(_task_ids(note.ids))
        if heard:
            # What a local commit touches: this host's watchers of the store look again.
            with suppress(FileNotFoundError):
                os.utime(self.paths.lock)
        self.ring_questions(asked["answer"])
        self.ring_kills(asked["kill"])
        self.ring_mail(asked["mail"])
        if ready:
            self.dispatch()

    def dispatch(self) -> None:
        """A dispatch pass here and now, or once the pass under way is over (or the wake
        file, where this process cannot start the units); the store's connection is closed
        after it."""
        from fleet.audit import Actor
        from fleet.store import open_store

        self._tick()
        try:
            if self._store is None:
                self._store = open_store(self.paths, Actor("fleet-claim", "fleet-claim"))
        except FleetError as e:
            _log(f"cannot run a dispatch pass here, fleet-claim will: {e.message}")
            wake.poke(self.paths)
            return
        try:
            dispatch_or_wake(self.paths, self._store, within=PASS_WAIT_S)
        finally:
            self._store.rest()

    def ring_questions(self, task_ids: Iterable[str]) -> None:
        for task_id in dict.fromkeys(task_ids):
            questions.ring(taskdir.task_dir(self.paths, task_id))

    def ring_kills(self, task_ids: Iterable[str]) -> None:
        for task_id in dict.fromkeys(task_ids):
            if taskdir.ring(taskdir.task_dir(self.paths, task_id), taskdir.KILL):
                _log(f"{task_id}: a person asked to stop it; rang its {taskdir.KILL}")

    def ring_mail(self, task_ids: Iterable[str]) -> None:
        for task_id in dict.fromkeys(task_ids):
            taskdir.ring(taskdir.task_dir(self.paths, task_id), taskdir.MAIL)


def serve() -> None:
    """fleet-listen's work: listen to this FLEET_HOME's PostgreSQL store until stopped."""
    from fleet.paths import resolve
    from fleet.store import POSTGRES_SCHEMES, libpq_url, store_url

    paths = resolve()
    url = store_url(paths)
    if not url.startswith(POSTGRES_SCHEMES):
        raise ConfigError(
            "fleet-listen needs a PostgreSQL store: this host's queue is SQLite, whose"
            " wake-ups are local files already",
            hint='set store = "postgresql://…" (fleet config set store=…), then fleet setup',
        )
    Listener(paths, libpq_url(paths, url)).serve()
