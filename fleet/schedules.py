"""Schedules: a batch of `fleet add` arguments that a systemd timer adds on a calendar.

Invariants:
- a schedule fires at most once per slot: the store records each (schedule, slot) under a
  unique key in the transaction that adds its tasks, so a catch-up after a missed run
  (Persistent=), a second host firing the same slot, or a retry of a failed fire never adds
  the batch twice;
- a timer slot is the last second the calendar spec elapsed, as systemd computes it
  (fleet.calendar); `fleet schedule run` fires a manual slot of its own, always new;
- with overlap `skip` a slot adds nothing (recorded as skipped) while a task of the run before
  is open (ready, running or merging, following handoffs); with `queue` its tasks wait for
  those; with `allow` it adds regardless;
- every task a schedule adds carries the label `schedule:NAME`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from fleet.errors import InputError

OVERLAPS = ("skip", "queue", "allow")
LABEL = "schedule:"
MANUAL = "run:"  # the prefix of a manual slot, which no calendar slot has
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


class Schedule(NamedTuple):
    name: str
    on_calendar: str  # systemd's normalized form
    overlap: str  # one of OVERLAPS
    persistent: bool  # Persistent=: a slot missed while the machine was off fires at boot
    args: tuple[str, ...]  # `fleet add` arguments, read in `cwd` when the schedule fires
    cwd: str
    created_at: str

    def to_json(self) -> dict[str, object]:
        return {**self._asdict(), "args": list(self.args)}


class ScheduleRun(NamedTuple):
    schedule: str
    slot: str  # the ISO time the spec elapsed, or MANUAL + the time of `fleet schedule run`
    fired_at: str
    by: str
    outcome: str  # added, or skipped (overlap skip: the run before was still open)
    tasks: tuple[str, ...]
    fresh: bool = True  # False: this slot had fired before; nothing was added now

    def to_json(self) -> dict[str, object]:
        return {**self._asdict(), "tasks": list(self.tasks)}


def check_name(name: str) -> str:
    """A schedule name, which is also the instance of its timer unit: no escaping needed."""
    if not _NAME.fullmatch(name):
        raise InputError(
            f"bad schedule name {name!r}",
            hint="letters, digits, - and _, starting with a letter or digit, up to 63",
        )
    return name


def label(name: str) -> str:
    return LABEL + name


def timer(name: str) -> str:
    return f"fleet-schedule@{name}.timer"


def service(name: str) -> str:
    return f"fleet-schedule@{name}.service"
