"""Timestamps are stored and printed as fixed-width UTC ISO 8601 strings (millisecond precision).

Fixed width makes string order equal time order, so the store compares them directly in SQL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

# poll(2) takes a C int of milliseconds (some 24.8 days): a longer wait polls again.
MAX_POLL_MS = 2**31 - 1


def poll_ms(left: float | None) -> int | None:
    """`left` seconds (None: forever) as a poll timeout: rounded up, so a wait never ends
    early and spins, and at most MAX_POLL_MS."""
    return None if left is None else min(int(left * 1000) + 1, MAX_POLL_MS)


def iso(ts: float) -> str:
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def now_iso() -> str:
    return iso(time.time())


def parse(text: str) -> float:
    # Since Python 3.11 fromisoformat reads the trailing Z as UTC, ten times faster than strptime.
    return datetime.fromisoformat(text).timestamp()


def ago(text: str | None, now: float | None = None) -> str:
    """A short human age such as `5s`, `3m`, `2h`, `4d` for tables."""
    if not text:
        return "-"
    return span(max(0.0, (time.time() if now is None else now) - parse(text)))


def span(seconds: float) -> str:
    """`seconds` as `ago` shows an age: `5s`, `3m`, `2h`, `4d`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
