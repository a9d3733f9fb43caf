"""Timestamps are stored and printed as fixed-width UTC ISO 8601 strings (millisecond precision).

Fixed width makes string order equal time order, so the store compares them directly in SQL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


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
    delta = max(0.0, (time.time() if now is None else now) - parse(text))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit}"
    return f"{int(delta)}s"
