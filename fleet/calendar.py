"""Calendar specifications (systemd.time(7) OnCalendar=), read by systemd itself.

Invariant: fleet never parses a calendar specification of its own; `systemd-analyze calendar`
decides what a spec means and when it elapses, so the timer that systemd runs and the slot that
`fleet schedule fire` records always agree. Times are whole seconds since the epoch (UTC): a
slot is the second its spec elapsed, so two elapses within one second are one slot.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import NamedTuple

from fleet import chars
from fleet.errors import InputError
from fleet.proc import run

# "Next elapse: Wed 2026-12-02 03:21:25 UTC" and "Iter. #2: …", printed in UTC under TZ=UTC.
_ELAPSE = re.compile(r"^\s*(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$")
_NORMALIZED = re.compile(r"^\s*Normalized form: (.+)$")
# systemd-analyze prints at most this many elapses a call (its own limit is far higher).
BATCH = 100
MAX_LENGTH = 256


class Spec(NamedTuple):
    normalized: str  # systemd's normalized form of the spec, which the timer is written with
    next: int | None  # when it elapses next (None: never again)


def _analyze(spec: str, base: int | None, iterations: int) -> tuple[str, list[int]]:
    argv = ["systemd-analyze", "calendar", f"--iterations={iterations}"]
    if base is not None:
        argv.append(f"--base-time=@{base}")
    out = run([*argv, "--", spec], check=False, env={"TZ": "UTC", "LC_ALL": "C"})
    if out.returncode != 0:
        # systemd's own words: "Failed to parse calendar specification '…': Invalid argument".
        why = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise InputError(why, hint="see systemd.time(7), or try: systemd-analyze calendar SPEC")
    normalized, elapses = spec, []
    for line in out.stdout.splitlines():
        if m := _NORMALIZED.match(line):
            normalized = m.group(1).strip()
        elif m := _ELAPSE.match(line):
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            elapses.append(int(when.timestamp()))
    return normalized, elapses


def check(spec: str) -> Spec:
    """The spec as systemd reads it; a spec systemd refuses is an InputError with its message."""
    # % and \ mean something in a unit file (a specifier, a line continuation); no calendar
    # spec needs them, and the timer is written with systemd's normalized form anyway.
    if not spec.strip() or len(spec) > MAX_LENGTH or chars.LINE.search(spec) or "%" in spec:
        raise InputError(
            f"bad calendar specification {spec!r}: one line of up to {MAX_LENGTH} characters"
            " without %",
            hint="for example: daily, Mon..Fri 09:00, *:0/15 (see systemd.time(7))",
        )
    normalized, elapses = _analyze(spec.strip(), None, 1)
    if "\\" in normalized or "%" in normalized or chars.LINE.search(normalized):
        raise InputError(f"bad calendar specification {spec!r}")
    return Spec(normalized, elapses[0] if elapses else None)


def elapses(spec: str, after: int, count: int = 1) -> list[int]:
    """The first `count` times (at most BATCH) the spec elapses strictly after `after`."""
    return _analyze(spec, after, max(1, min(count, BATCH)))[1]


def latest(spec: str, after: int, now: float) -> int | None:
    """The last time the spec elapsed in (after, now], or None if it did not.

    One call covers up to BATCH elapses; beyond that (a frequent spec after a long time off),
    a bisection on the base time: the first elapse after a base never decreases as the base
    grows, so the last elapse <= now is the first elapse after the largest base whose first
    elapse is still <= now. Some 25 calls cover a year of seconds.
    """
    first = elapses(spec, after, BATCH)
    due = [t for t in first if t <= now]
    if not due:
        return None
    if len(due) < len(first) or len(first) < BATCH:
        return due[-1]
    # Invariant: the first elapse after `low` is `found` <= now; the first after `high` > now.
    low, high, found = due[-2], int(now), due[-1]
    while high - low > 1:
        middle = (low + high) // 2
        step = elapses(spec, middle)
        if step and step[0] <= now:
            low, found = middle, step[0]
        else:
            high = middle
    return found
