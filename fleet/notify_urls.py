"""The `notify_urls` notifier: one apprise URL (Slack, Discord, Matrix, ntfy, e-mail, …) per
service, each tried like the webhook.

Invariants: apprise is imported only here, and only by the delivery process; a URL's secrets
(tokens, passwords) never appear in a log line, which names the URL as apprise prints it in
privacy mode; each try is bounded by the notifier timeout (apprise's connect and read
timeouts), a failed try is repeated up to `notify_retries` times with the webhook's pauses, and
what went wrong is said in one line, taken from apprise's own log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any


def shown(url: str) -> str:
    """The URL as it may be logged: its scheme and host, secrets masked by apprise."""
    try:
        import apprise

        found = apprise.Apprise.instantiate(url, suppress_exceptions=True)
        if found:
            return str(found.url(privacy=True))
    except Exception:
        pass
    return url.split("://", 1)[0] + "://…"


class _Last(logging.Handler):
    """Keeps the last warning apprise logged: the reason of a failed notification."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.line = " ".join(record.getMessage().split())


def send(url: str, obj: Mapping[str, Any], timeout: int, retries: int) -> str | None:
    """Notify `url` of the event; None once apprise reports success, else why not."""
    import apprise

    from fleet.alerts import pause, summary

    plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if not plugin:
        return "not a URL apprise knows (see apprise's list of services)"
    plugin.socket_connect_timeout = float(timeout)
    plugin.socket_read_timeout = float(timeout)
    notifier = apprise.Apprise()
    notifier.add(plugin)
    last = _Last()
    logger = logging.getLogger("apprise")
    logger.addHandler(last)
    try:
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(pause(attempt - 1))
            if notifier.notify(body=str(obj.get("message") or summary(obj)), title=summary(obj)):
                return None
    finally:
        logger.removeHandler(last)
    tries = retries + 1
    return (
        f"{last.line or 'apprise reported a failure'} ({tries} {'try' if tries == 1 else 'tries'})"
    )
