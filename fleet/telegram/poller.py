"""fleet-telegram: long-poll the bot's updates and act on them; send what the outbox holds.

Invariants:
- one poller per bot token, whichever host it runs on: it holds the store's lease
  `telegram:<bot id>` (renewed every cycle; another owner's lease in force makes it refuse,
  with exit status 75) and, on its host, an exclusive lock on `telegram.lock`; so two of them
  never fight over getUpdates with 409s;
- the update offset is the lease's value in the store, advanced right after each update is
  handled: a restart goes on after the last update handled, and SIGTERM is held back while
  an update is being handled, so a stop neither loses nor repeats one;
- the configuration (chats, users, token file, API URL, the /new defaults) is read again every
  cycle, so a change takes effect without a restart;
- a second thread sends what the outbox holds and edits settled questions' messages whenever
  the store commits (inotify on fleet.lock) and at least every OUTBOUND_EVERY seconds;
- every failure is one line on standard error (the unit's journal), said once until it
  changes, and retried with growing pauses.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from typing import Any

from fleet.config import Config
from fleet.errors import ConfigError, FleetError
from fleet.paths import Paths
from fleet.store import Actor, Store, open_store
from fleet.telegram import outbox, token
from fleet.telegram.api import ApiError, Bot

PROGRAM = "fleet-telegram"
OUTBOUND_EVERY = 30.0  # seconds between looks at the outbox when nothing wakes it
PAUSE_MAX = 30.0
LOCK_FILE = "telegram.lock"


class Refused(FleetError):
    """Another poller polls this bot; this one does not start."""

    exit_code = 75  # EX_TEMPFAIL; the unit does not restart on it


class _Stop(BaseException):
    """SIGTERM or SIGINT while waiting for updates."""


def lease_name(bot: Bot) -> str:
    return f"telegram:{bot.id}"


def say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{PROGRAM}: {line}\n")
        sys.stderr.flush()


class Poller:
    def __init__(self, paths: Paths) -> None:
        from fleet.host import owner
        from fleet.notify import Notifier

        self.paths = paths
        self.me = owner()
        self.store: Store = open_store(paths, Actor(PROGRAM, PROGRAM))
        self.stopping = threading.Event()
        self.busy = False
        self.lease: str | None = None
        self.value: str | None = None  # the lease's value: the update offset
        self.said = ""
        self.handled = 0
        self.systemd = Notifier()
        self._lock_fd = -1

    # -- set-up ------------------------------------------------------------------------------

    def config(self) -> Config:
        from fleet.config import load_or_last_good

        return load_or_last_good(self.paths)

    def bot(self, config: Config) -> Bot:
        if not token.configured(config):
            raise ConfigError(
                "Telegram is not configured: telegram_token_file and telegram_chats are needed",
                hint="fleet config set telegram_token_file=FILE telegram_chats='[CHAT_ID]'",
            )
        timeout = config.get_int("notify_timeout_seconds")
        return Bot(token.load(config), config.get_str("telegram_api_url"), timeout)

    def hold(self, bot: Bot, config: Config) -> None:
        """Take or renew the bot's lease (switching leases if the token changed); Refused if
        another poller holds it."""
        name = lease_name(bot)
        if self.lease and self.lease != name:
            self.store.drop_lease(self.lease, self.me)
            self.lease = None
        seconds = max(3 * config.get_int("telegram_poll_seconds"), 90)
        lease = self.store.take_lease(name, self.me, seconds)
        self.value = lease.value
        if lease.owner != self.me:
            raise Refused(
                f"another fleet-telegram ({lease.owner}) polls this bot until {lease.until}",
                hint="one poller per bot: stop that one first, or let its lease run out",
            )
        if self.lease is None:
            self._lock_here()
        self.lease = name

    def _lock_here(self) -> None:
        if self._lock_fd >= 0:
            return
        path = self.paths.home / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Refused(
                f"another fleet-telegram runs on this host ({path} is locked)",
                hint="systemctl status fleet-telegram",
            ) from None
        self._lock_fd = fd

    def offset(self) -> int:
        """The first update not handled yet, as the lease's value keeps it."""
        value = self.value
        return int(value) if value and value.isdigit() else 0

    # -- the loop ----------------------------------------------------------------------------

    def warn(self, line: str) -> None:
        """Say `line` once, until something else is said."""
        if line != self.said:
            say(line)
            self.said = line

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        outbound = threading.Thread(target=self._outbound, name="outbound", daemon=True)
        pause = 1.0
        try:
            while not self.stopping.is_set():
                try:
                    self.cycle(outbound)
                    pause = 1.0
                except Refused:
                    raise
                except FleetError as e:
                    self.warn(e.message + (f" ({e.hint})" if e.hint else ""))
                    # Started all the same: it waits for the configuration, or for Telegram.
                    self.systemd.ready(f"waiting: {e.message}")
                    self._sleep(pause)
                    pause = min(pause * 2, PAUSE_MAX)
        except _Stop:
            pass
        finally:
            self.stopping.set()
            self.close()

    def cycle(self, outbound: threading.Thread) -> None:
        config = self.config()
        bot = self.bot(config)
        self.hold(bot, config)
        if not outbound.is_alive() and not self.stopping.is_set():
            me = bot.call("getMe", {})
            say(f"polling as @{me.get('username')} for chats {config.values['telegram_chats']}")
            self.systemd.ready(f"polling as @{me.get('username')}")
            outbound.start()
        poll = config.get_int("telegram_poll_seconds")
        params = {
            "offset": self.offset(),
            "timeout": poll,
            "allowed_updates": ["message", "callback_query"],
        }
        try:
            updates = bot.call("getUpdates", params, timeout=poll + bot.timeout)
        except ApiError as e:
            if e.code == 409:
                raise FleetError(
                    "another program polls this bot's updates (409 Conflict); not fighting it",
                    hint="stop the other bot program, or delete its webhook",
                ) from None
            raise
        if self.said:
            say("polling again")
            self.said = ""
        if isinstance(updates, list) and updates:
            # Read again: the poll may have waited long enough for the file to change.
            self.handle(bot, self.config(), updates)

    def handle(self, bot: Bot, config: Config, updates: list[Any]) -> None:
        from fleet.telegram.commands import Handler

        handler = Handler(self.paths, self.store, bot, config, say)
        self.busy = True
        try:
            for update in updates:
                if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
                    continue
                try:
                    handler.handle(update)
                except FleetError as e:
                    say(f"update {update['update_id']}: {e.message}")
                assert self.lease is not None
                after = str(update["update_id"] + 1)
                if not self.store.set_lease_value(self.lease, self.me, after):
                    raise Refused("this poller lost its lease on the bot; stopping")
                self.value = after
                self.handled += 1
                if self.stopping.is_set():
                    break
            self.systemd.status(f"polling; {self.handled} updates handled")
        finally:
            self.busy = False

    def _signal(self, signum: int, frame: object) -> None:
        self.stopping.set()
        if not self.busy:
            raise _Stop

    def _sleep(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def close(self) -> None:
        with contextlib.suppress(FleetError):
            if self.lease:
                self.store.drop_lease(self.lease, self.me)
        self.store.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- the outbound loop -------------------------------------------------------------------

    def _outbound(self) -> None:
        from inotify_simple import INotify
        from inotify_simple import flags as iflags

        store = open_store(self.paths, Actor(PROGRAM, PROGRAM))
        inotify = INotify()
        inotify.add_watch(self.paths.lock, iflags.ATTRIB)
        owner = f"{PROGRAM}:{self.me}:{os.getpid()}"
        try:
            while not self.stopping.is_set():
                try:
                    config = self.config()
                    bot = self.bot(config)
                    deadline = time.monotonic() + 2 * OUTBOUND_EVERY
                    retries = config.get_int("notify_retries")
                    outbox.send_due(store, bot, owner, retries, deadline, say)
                    outbox.settle(store, bot, say)
                except FleetError as e:
                    say(f"outbound: {e.message}")
                inotify.read(timeout=int(OUTBOUND_EVERY * 1000))
                inotify.read(timeout=20)  # a burst of commits is one wake-up
        finally:
            inotify.close()
            store.close()


def main() -> None:
    from fleet.paths import resolve

    poller = Poller(resolve())
    poller.run()
