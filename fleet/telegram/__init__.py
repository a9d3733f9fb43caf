"""Telegram: notifications to chats, and answers and commands from them (fleet-telegram).

Outbound, every notification fleet fires is spooled in the store's outbox by `fire` itself,
one message per allowed chat (`outbox`, `delivery`), and sent by fleet-telegram's outbound
loop (woken by the commit) or the delivery process of fleet.alerts, whichever comes first;
inbound, fleet-telegram long-polls getUpdates (`poller`) and acts through the same functions
as the command line (`commands`).

The Bot API is spoken over plain HTTPS with the standard library (`api`), not through
python-telegram-bot. Why: fleet needs five methods (getMe, getUpdates, sendMessage,
editMessageText and answerCallbackQuery) and nothing of the rest; the update offset has to live
in fleet's store and its retries, spool and 409 handling are fleet's own policy, so the library's
Application (its updater, persistence and retry layers) would be bypassed anyway; the library
is asyncio-only while the delivery process runs its notifiers in threads; and importing it
costs 0.13 to 0.25 s on the path from a question to its message, whose goal is 0.5 s. urllib
gives the same HTTPS (the system's certificates), timeouts on every call, and one place where
the answers of the API are read (`api.Bot.call`), so nothing is lost by doing without it.

Invariants: the token is read from a 0600 file or a systemd credential (`token`) and appears
in no message, log line or spooled row; every text that came from an agent or a person is
escaped for Telegram's HTML parse mode and clipped to the message limit (`text`).
"""
