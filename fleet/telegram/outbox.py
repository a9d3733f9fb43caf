"""Telegram's side of the outbox: spool a notification for every allowed chat, send what is
due, and edit a question's messages once the question is settled.

Invariants: a notification is in the store (one row per chat) before any send is tried, and a
row leaves the spool only once Telegram has accepted the message; a send that fails stays
spooled with its error and is tried again by the next delivery (the delivery process of the
next notification, or fleet-telegram's outbound loop), pausing longer after each failure; a
question's messages, in every chat and wherever the question was answered, are edited to
show the answer (or the expiry) and lose their buttons.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleet.model import Question, QuestionStatus
from fleet.store.base import Outgoing, OutgoingSpec, Store
from fleet.telegram import text
from fleet.telegram.api import ApiError, Bot

CHANNEL = "telegram"
BATCH = 50  # messages one delivery takes from the spool at a time
LATER_FIRST, LATER_MAX = 30.0, 3600.0  # seconds before a failed send is due again

Log = Callable[[str], None]


def spool(
    store: Store, event: Mapping[str, Any], chats: Sequence[int], question: Question | None
) -> list[Outgoing]:
    """Spool `event` for each chat."""
    if not chats:
        return []
    body = text.body(event, question)
    kind, task = str(event.get("event")), event.get("task")
    return store.spool(
        [
            OutgoingSpec(
                CHANNEL,
                str(chat),
                kind,
                body,
                str(task) if task else None,
                question.id if question else None,
            )
            for chat in chats
        ]
    )


def later(tries: int) -> float:
    """When a message that failed `tries` times is due again."""
    return time.time() + min(LATER_FIRST * (1 << min(tries, 16)), LATER_MAX)


def params(item: Outgoing) -> dict[str, Any]:
    out: dict[str, Any] = {
        "chat_id": int(item.target),
        "text": text.html_of(item.body),
        "parse_mode": "HTML",
        "link_preview_options": {"is_disabled": True},
    }
    if item.body.get("reply_markup"):
        out["reply_markup"] = item.body["reply_markup"]
    return out


def _current(store: Store, item: Outgoing) -> dict[str, Any]:
    """What to send for `item` now: a question settled while its message waited in the spool
    is sent as settled, without buttons (and needs no edit afterwards)."""
    if item.question is None:
        return params(item)
    q = store.question(item.question)
    if q.status == QuestionStatus.PENDING:
        return params(item)
    store.settle_message(item.id)
    out = params(item)
    out.pop("reply_markup", None)
    out["text"] = text.settled(item.body, q)
    return out


def send_due(
    store: Store,
    bot: Bot,
    owner: str,
    retries: int,
    deadline: float,
    log: Log,
    first: Sequence[int] = (),
) -> int:
    """Send the messages `first`, then whatever else is due and whatever was spooled before
    them (a new notification is the occasion to try those again), until `deadline`
    (time.monotonic()); returns how many were sent. Failures are logged one line each."""
    sent = 0
    claim = max(deadline - time.monotonic(), 1.0) + 30
    batches = [list(first), []] if first else [[]]
    for ids in batches:
        while time.monotonic() < deadline:
            items = store.take_spooled(CHANNEL, owner, claim, BATCH, ids, min(first, default=0))
            for item in items:
                if time.monotonic() >= deadline:
                    store.spool_failed(item.id, owner, "gave up: out of time", time.time())
                    continue
                try:
                    answer = bot.send("sendMessage", _current(store, item), retries, deadline)
                except ApiError as e:
                    store.spool_failed(item.id, owner, e.message, later(item.tries))
                    n = item.tries + 1
                    log(
                        f"chat {item.target}: {e.message}; the {item.event} message stays"
                        f" spooled for the next delivery (tried by {n} so far)"
                    )
                    continue
                store.spool_sent(item.id, owner, str(answer.get("message_id")))
                sent += 1
            if ids or len(items) < BATCH:
                break
    return sent


def settle(store: Store, bot: Bot, log: Log) -> None:
    """Edit the messages of questions that are no longer pending to say how they ended."""
    for item in store.unsettled(CHANNEL):
        q = store.question(str(item.question))
        try:
            bot.call(
                "editMessageText",
                {
                    "chat_id": int(item.target),
                    "message_id": int(str(item.ref)),
                    "text": text.settled(item.body, q),
                    "parse_mode": "HTML",
                    "link_preview_options": {"is_disabled": True},
                    "reply_markup": {"inline_keyboard": []},
                },
            )
        except ApiError as e:
            if e.transient:
                continue  # tried again next time
            if "not modified" not in e.description:
                log(f"chat {item.target}: cannot show how {q.id} ended: {e.message}")
        store.settle_message(item.id)


def show_picked(store: Store, bot: Bot, item: Outgoing, q: Question) -> None:
    """Redraw a multi-select question's keyboard with the options picked so far."""
    bot.call(
        "editMessageText",
        {
            "chat_id": int(item.target),
            "message_id": int(str(item.ref)),
            "text": text.html_of(item.body),
            "parse_mode": "HTML",
            "link_preview_options": {"is_disabled": True},
            "reply_markup": text.keyboard(q, item.picked),
        },
    )
