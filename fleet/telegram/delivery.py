"""Telegram in fleet.alerts: spool one notification (in `fire`, or else in the delivery
process), and send what is due (in the delivery process).

Invariants: the event is spooled (one row per chat) before the delivery's job starts, so that
whatever happens to that process the message waits in the store; the job then sends this
event's messages first (unless fleet-telegram took them first) and whatever was spooled
before them, within the delivery's bound, and edits the messages of questions settled
meanwhile. What could not be sent is said in one line and stays spooled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleet.store.base import Outgoing, Store

if TYPE_CHECKING:
    from fleet.alerts import Notifiers

PROGRAM = "fleet-notify"


def _store(home: str | None) -> Store:
    from fleet.paths import resolve
    from fleet.store import Actor, open_store

    env = {**os.environ, "FLEET_HOME": home} if home else None
    return open_store(resolve(env=env), Actor(PROGRAM, PROGRAM))


def owner() -> str:
    from fleet.host import owner as host

    return f"{PROGRAM}:{host()}:{os.getpid()}"


def spool_event(home: str | None, obj: Mapping[str, Any], chats: Sequence[int]) -> list[Outgoing]:
    from fleet.telegram import outbox

    store = _store(home)
    try:
        question = None
        if obj.get("event") == "question" and obj.get("question"):
            question = store.question(str(obj["question"]))
        return outbox.spool(store, obj, chats, question)
    finally:
        store.close()


def send(
    home: str | None, notifiers: Notifiers, spooled: Sequence[int], deadline: float
) -> str | None:
    """Send the messages `spooled`, then anything else due; None if all went, else one line
    saying why."""
    from fleet.errors import FleetError
    from fleet.telegram import outbox, token
    from fleet.telegram.api import Bot

    failures: list[str] = []
    store = _store(home)
    try:
        try:
            secret = token.read(notifiers.telegram_token_file, notifiers.telegram_credential)
        except FleetError as e:
            waiting = store.spooled(outbox.CHANNEL)
            return f"{e.message}; {waiting} {'message waits' if waiting == 1 else 'messages wait'}"
        bot = Bot(secret, notifiers.telegram_api, notifiers.timeout)
        me = owner()
        outbox.send_due(store, bot, me, notifiers.retries, deadline, failures.append, spooled)
        outbox.settle(store, bot, failures.append)
    finally:
        store.close()
    return "; ".join(failures) or None
