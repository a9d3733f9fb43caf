"""What the fleet did over a time window: outcomes, durations, throughput, tokens, cost, gates.

Invariants:
- `compute()` is the one place the figures are made, from the store alone (attempts with
  their own tokens and cost, tasks finished, the gate timeline), as a plain JSON-able dict
  whose keys are `FIELDS` (documented in fleet(1), only ever added to): `fleet stats` prints
  it, `--json` dumps it, `--csv` writes its rows, `fleet metrics` and the dashboard read it;
- an attempt belongs to the window its end falls in, a task to the window it was done in, a
  gate's time to the window as far as it lies within it (until now, at most);
- every cost figure is split into what coders reported and what the price table estimated;
- the store's queries are plain SQL (fleet.store); durations, groups and percentiles are
  worked out here, so another backend needs no date arithmetic of its own.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from fleet.errors import InputError
from fleet.model import Field
from fleet.timeutil import iso, parse

if TYPE_CHECKING:
    from fleet.store import Store

DIMENSIONS = ("coder", "model", "cwd", "label", "day", "hour")
# The outcome classes always listed (others appear when they occur), in this order.
CLASSES = (
    "success",
    "no-close",
    "failure",
    "rate-limited",
    "context-pressure",
    "budget",
    "killed",
    "timeout",
    "oom",
    "watchdog",
    "lost",
)
# Outcomes that say nothing about the agent's work: left out of attempts and success rates.
UNCOUNTED = frozenset({"not-started", "unstartable"})
NAMES = {"noclose": "no-close"}  # the store's outcome -> its class here
UNKNOWN_MODEL = "(default)"
NO_LABEL = "(none)"

FIELDS: tuple[Field, ...] = (
    Field("generated_at", "text", "UTC ISO 8601 time the figures were made"),
    Field("since", "text", "start of the window (UTC ISO 8601), or null: from the beginning"),
    Field("until", "text", "end of the window (UTC ISO 8601, not included), or null: now"),
    Field("hours", "real", "length of the window in hours (from the first attempt if no since)"),
    Field("by", "list", "the --by dimensions of `groups`, in order"),
    Field("tasks.finished", "int", "tasks done within the window"),
    Field("tasks.per_hour", "real", "tasks done per hour of the window"),
    Field("tasks.per_day", "real", "tasks done per day of the window"),
    Field(
        "tasks.attempts_per_finished",
        "real",
        "attempts the tasks done within the window took, on average (null: none done)",
    ),
    Field(
        "attempts.total",
        "int",
        "attempts that ended within the window (not-started and unstartable aside)",
    ),
    Field(
        "attempts.outcomes",
        "object",
        "attempts by outcome class: success, no-close, failure, rate-limited, context-pressure,"
        " budget, killed, timeout, oom, watchdog, lost (always there), and any other that"
        " occurred (interrupted, suspended, handed-off, waiting)",
    ),
    Field("attempts.success_rate", "real", "success / total, from 0 to 1 (null: no attempts)"),
    Field("attempts.duration_median_s", "real", "median attempt duration in seconds, or null"),
    Field("attempts.duration_p90_s", "real", "90th percentile of attempt durations, or null"),
    Field("attempts.duration_total_s", "real", "all attempts' durations added up, seconds"),
    Field(
        "tokens",
        "object",
        "tokens of the attempts, by kind, disjoint: input (read neither from nor into a cache;"
        " an attempt whose coder does not tell cached tokens apart counts all its input here),"
        " output, cache_read, cache_write, and their total",
    ),
    Field("cost.total", "real", "US dollars, reported and estimated together"),
    Field("cost.reported", "real", "the part the coders reported"),
    Field("cost.estimated", "real", "the part estimated from the price table, call by call"),
    Field(
        "cost.unpriced_attempts",
        "int",
        "attempts with tokens but no cost (a model the price table does not know)",
    ),
    Field("gates.held_s", "real", "seconds any coder was held back by a gate, added up per coder"),
    Field("gates.by_coder", "object", "coder -> seconds held (rate limits and budgets)"),
    Field("gates.paused_s", "real", "seconds the whole fleet was paused"),
    Field(
        "gates.timeline",
        "array",
        "every gate open within the window, oldest first: coder (null for the pause), kind, start,"
        " end (null: still open), seconds (within the window), reason, window",
    ),
    Field(
        "leaderboard.coder",
        "array",
        "one row per coder, most successes first: name, attempts, success, success_rate,"
        " median_duration_s, cost, cost_per_finished (its cost over its successful attempts,"
        " each of which finished a task), tokens",
    ),
    Field(
        "leaderboard.model",
        "array",
        "the same rows per model (the model that did most of an attempt)",
    ),
    Field(
        "models",
        "array",
        "tokens and cost by model, from each attempt's calls: model, calls, input, output,"
        " cache_read, cache_write, cost, reported, estimated",
    ),
    Field(
        "daily",
        "array",
        "one row per local day of the window that has attempts or finished tasks: day"
        " (YYYY-MM-DD), attempts, success, finished, cost",
    ),
    Field(
        "groups",
        "array",
        "with --by, one row per group: key (dimension -> value), attempts, success,"
        " success_rate, outcomes, duration_median_s, duration_p90_s, tokens (by kind), cost,"
        " cost_reported, cost_estimated",
    ),
)


class Window(NamedTuple):
    since: str | None = None  # UTC ISO 8601, None: from the beginning
    until: str | None = None  # UTC ISO 8601 (excluded), None: now


EVER = Window()


def point(text: str, now: float | None = None) -> str:
    """A --since/--until value as UTC ISO 8601: a duration back from now (`90m`, `36h`, `7d`,
    `2w`), a date (`2026-11-30`, local midnight) or a date and time (local unless it says)."""
    raw = text.strip()
    now = time.time() if now is None else now
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if raw[-1:] in units and raw[:-1].replace(".", "", 1).isdigit():
        return iso(now - float(raw[:-1]) * units[raw[-1]])
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"cannot read {text!r} as a time",
            hint="give a duration back from now (90m, 36h, 7d, 2w) or a date (2026-11-30)",
        ) from None
    return iso(at.timestamp())


def seconds(text: str) -> float:
    """Epoch seconds of the store's fixed-width UTC ISO 8601 text (fast: no datetime object
    for each of 100,000 attempts, only one per day)."""
    day = _DAYS.get(text[:10])
    if day is None:
        day = _DAYS[text[:10]] = parse(text[:10] + "T00:00:00+00:00")
    return day + int(text[11:13]) * 3600 + int(text[14:16]) * 60 + float(text[17:23])


_DAYS: dict[str, float] = {}


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of sorted `values`, linearly interpolated; None if empty."""
    if not values:
        return None
    pos = (len(values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


class _Acc:
    """The figures of one group of attempts."""

    __slots__ = (
        "attempts",
        "cache_read",
        "cache_write",
        "cost",
        "durations",
        "estimated",
        "input",
        "outcomes",
        "output",
        "reported",
        "success",
        "unpriced",
    )

    def __init__(self) -> None:
        self.attempts = self.success = self.unpriced = 0
        self.input = self.output = self.cache_read = self.cache_write = 0
        self.cost = self.reported = self.estimated = 0.0
        self.durations: list[float] = []
        self.outcomes: dict[str, int] = {}

    def add(self, outcome: str, duration: float, row: Sequence[Any]) -> None:
        self.attempts += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome == "success":
            self.success += 1
        self.durations.append(duration)
        tokens_in, tokens_out, read, written, cost, source = row[7:13]
        read, written = read or 0, written or 0
        self.input += (tokens_in or 0) - read - written
        self.output += tokens_out or 0
        self.cache_read += read
        self.cache_write += written
        if cost is not None:
            self.cost += cost
            if source == "estimated":
                self.estimated += cost
            else:
                self.reported += cost
        elif tokens_in or tokens_out:
            self.unpriced += 1

    def add_sums(self, outcome: str, sums: Sequence[Any]) -> None:
        """Add what the store summed: count, tokens_in, tokens_out, cache_read, cache_write,
        cost, estimated cost, attempts with tokens but no cost (a first start may follow)."""
        n, tokens_in, tokens_out, read, written, cost, estimated, unpriced = sums[:8]
        outcome = NAMES.get(outcome or "", outcome or "?")
        self.attempts += n
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
        if outcome == "success":
            self.success += n
        read, written = read or 0, written or 0
        self.input += (tokens_in or 0) - read - written
        self.output += tokens_out or 0
        self.cache_read += read
        self.cache_write += written
        self.cost += cost or 0.0
        self.estimated += estimated or 0.0
        self.reported += (cost or 0.0) - (estimated or 0.0)
        self.unpriced += unpriced or 0

    def tokens(self) -> dict[str, int]:
        kinds = {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
        }
        return {**kinds, "total": sum(kinds.values())}

    def rate(self) -> float | None:
        return self.success / self.attempts if self.attempts else None


def _local(epoch: float, hour: bool) -> str:
    return time.strftime("%Y-%m-%d %H:00" if hour else "%Y-%m-%d", time.localtime(epoch))


def _keys(
    by: Sequence[str], row: Sequence[Any], ended: float, labels: list[str]
) -> Iterable[tuple[str, ...]]:
    """The groups an attempt falls in (one per label of its task, with `label`)."""
    values: list[list[str]] = []
    for dim in by:
        if dim == "coder":
            values.append([row[5] or row[15] or "?"])
        elif dim == "model":
            values.append([row[6] or row[16] or UNKNOWN_MODEL])
        elif dim == "cwd":
            values.append([row[13]])
        elif dim == "label":
            values.append(labels or [NO_LABEL])
        else:
            values.append([_local(ended, dim == "hour")])
    keys: list[tuple[str, ...]] = [()]
    for options in values:
        keys = [(*k, v) for k in keys for v in options]
    return keys


def _merged(accs: Iterable[_Acc]) -> _Acc:
    out = _Acc()
    for acc in accs:
        for name in _Acc.__slots__:
            if name == "durations":
                out.durations += acc.durations
            elif name == "outcomes":
                for k, v in acc.outcomes.items():
                    out.outcomes[k] = out.outcomes.get(k, 0) + v
            else:
                setattr(out, name, getattr(out, name) + getattr(acc, name))
    return out


def _by(pairs: dict[tuple[str, str], _Acc], part: int) -> dict[str, _Acc]:
    names: dict[str, list[_Acc]] = {}
    for key, acc in pairs.items():
        names.setdefault(key[part], []).append(acc)
    return {name: _merged(accs) for name, accs in names.items()}


def _local_days(hourly: dict[str, list[float]]) -> dict[str, list[float]]:
    """Rows by UTC hour (`2026-12-01T23`) summed by local day."""
    days: dict[str, list[float]] = {}
    for hour, values in hourly.items():
        day = _local(parse(hour + ":00:00+00:00"), False)
        into = days.setdefault(day, [0, 0, 0, 0.0])
        for i, value in enumerate(values):
            into[i] += value
    return days


def _durations(acc: _Acc) -> tuple[float | None, float | None]:
    acc.durations.sort()
    median = quantile(acc.durations, 0.5)
    p90 = quantile(acc.durations, 0.9)
    return (
        None if median is None else round(median, 3),
        None if p90 is None else round(p90, 3),
    )


def _board(groups: dict[str, _Acc]) -> list[dict[str, Any]]:
    rows = []
    for name, acc in groups.items():
        median, _ = _durations(acc)
        rows.append(
            {
                "name": name,
                "attempts": acc.attempts,
                "success": acc.success,
                "success_rate": _round(acc.rate()),
                "median_duration_s": median,
                "cost": round(acc.cost, 6),
                "cost_per_finished": round(acc.cost / acc.success, 6) if acc.success else None,
                "tokens": acc.tokens()["total"],
            }
        )
    return sorted(rows, key=lambda r: (-r["success"], -r["attempts"], r["name"]))


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _timeline(store: Store, window: Window, start: float, end: float) -> dict[str, Any]:
    timeline = []
    by_coder: dict[str, float] = {}
    paused = 0.0
    for gate in store.gate_log(window.since, window.until):
        opened = seconds(gate["start"])
        closed = seconds(gate["end"]) if gate["end"] else None
        within = max(0.0, min(closed if closed is not None else end, end) - max(opened, start))
        coder = gate["name"][6:] if gate["name"].startswith("coder:") else None
        if coder is None:
            paused += within
        else:
            by_coder[coder] = by_coder.get(coder, 0.0) + within
        timeline.append(
            {
                "coder": coder,
                "kind": gate["kind"],
                "start": gate["start"],
                "end": gate["end"] if closed is not None and closed <= time.time() else None,
                "seconds": round(within, 3),
                "reason": gate["reason"],
                "window": gate["window"],
            }
        )
    return {
        "held_s": round(sum(by_coder.values()), 3),
        "by_coder": {k: round(v, 3) for k, v in sorted(by_coder.items())},
        "paused_s": round(paused, 3),
        "timeline": timeline,
    }


def compute(
    store: Store,
    window: Window = EVER,
    by: Sequence[str] = (),
    now: float | None = None,
) -> dict[str, Any]:
    """The figures of `window`, with groups by `by` (DIMENSIONS) when given."""
    for dim in by:
        if dim not in DIMENSIONS:
            raise InputError(f"cannot group by {dim!r}", hint="by: " + ", ".join(DIMENSIONS))
    now = time.time() if now is None else now
    since, until = window
    # Sums by coder and model in the store, then merged into the coders', the models' and the
    # totals; the attempts one by one only for their durations and the hour they ended in.
    pairs: dict[tuple[str, str], _Acc] = {}
    first: str | None = None
    for coder, model, outcome, *sums in store.attempt_sums(since, until, ("coder", "model")):
        key = (coder or "?", model or UNKNOWN_MODEL)
        (pairs.get(key) or pairs.setdefault(key, _Acc())).add_sums(outcome, sums)
        first = sums[-1] if first is None or (sums[-1] and sums[-1] < first) else first
    hourly: dict[str, list[float]] = {}  # UTC hour -> attempts, success, finished, cost
    for coder, model, outcome, duration, hour, cost in store.attempt_durations(
        since, until, ("coder", "model")
    ):
        pairs[(coder or "?", model or UNKNOWN_MODEL)].durations.append(max(0.0, duration))
        row = hourly.get(hour)
        if row is None:
            row = hourly[hour] = [0, 0, 0, 0.0]
        row[0] += 1
        row[1] += outcome == "success"
        row[3] += cost or 0.0
    total = _merged(pairs.values())
    coders, models = _by(pairs, 0), _by(pairs, 1)
    done = done_attempts = 0
    for hour, tasks, attempts in store.finished_by_hour(since, until):
        hourly.setdefault(hour, [0, 0, 0, 0.0])[2] += tasks
        done, done_attempts = done + tasks, done_attempts + (attempts or 0)
    daily = _local_days(hourly)
    groups = _groups(store, window, by) if by else {}
    start = seconds(since) if since else (seconds(first) if first else now)
    end = min(now, seconds(until)) if until else now
    hours = max(0.0, end - start) / 3600
    median, p90 = _durations(total)
    outcomes = {c: total.outcomes.get(c, 0) for c in CLASSES}
    outcomes.update({k: v for k, v in sorted(total.outcomes.items()) if k not in outcomes})
    return {
        "generated_at": iso(now),
        "since": since,
        "until": until,
        "hours": round(hours, 4),
        "by": list(by),
        "tasks": {
            "finished": done,
            "per_hour": round(done / hours, 4) if hours else None,
            "per_day": round(24 * done / hours, 4) if hours else None,
            "attempts_per_finished": round(done_attempts / done, 4) if done else None,
        },
        "attempts": {
            "total": total.attempts,
            "outcomes": outcomes,
            "success_rate": _round(total.rate()),
            "duration_median_s": median,
            "duration_p90_s": p90,
            "duration_total_s": round(sum(total.durations), 3),
        },
        "tokens": total.tokens(),
        "cost": {
            "total": round(total.cost, 6),
            "reported": round(total.reported, 6),
            "estimated": round(total.estimated, 6),
            "unpriced_attempts": total.unpriced,
        },
        "gates": _timeline(store, window, start, end),
        "leaderboard": {"coder": _board(coders), "model": _board(models)},
        "models": _models(store, window),
        "daily": [
            {
                "day": day,
                "attempts": int(v[0]),
                "success": int(v[1]),
                "finished": int(v[2]),
                "cost": round(v[3], 6),
            }
            for day, v in sorted(daily.items())
        ],
        "groups": [_group(by, key, acc) for key, acc in sorted(groups.items())],
    }


def _groups(store: Store, window: Window, by: Sequence[str]) -> dict[tuple[str, ...], _Acc]:
    """The --by groups: summed by the store, but for `label` (an attempt is in each label of
    its task), which takes every attempt's row. `day` and `hour` are local: the store sums by
    UTC hour, each then put in its local day or hour (an hour of a zone that is not a whole
    number of hours from UTC goes to the local hour it starts in)."""
    groups: dict[tuple[str, ...], _Acc] = {}
    if "label" in by:
        labels_of: dict[str, list[str]] = {}
        for row in store.attempt_rows(window.since, window.until, tasks=True):
            outcome = NAMES.get(row[4] or "", row[4] or "?")
            if outcome in UNCOUNTED:
                continue
            ended = seconds(row[3])
            duration = max(0.0, ended - seconds(row[2]))
            found = labels_of.get(row[14])
            if found is None:
                found = labels_of[row[14]] = list(json.loads(row[14] or "[]"))
            for key in _keys(by, row, ended, found):
                (groups.get(key) or groups.setdefault(key, _Acc())).add(outcome, duration, row)
        return groups
    dims = list(dict.fromkeys("hour" if d in ("day", "hour") else d for d in by))

    keys: dict[tuple[Any, ...], tuple[str, ...]] = {}

    def key_of(values: Sequence[Any]) -> tuple[str, ...]:
        known = keys.get(tuple(values))
        if known is None:
            known = keys[tuple(values)] = make_key(values)
        return known

    def make_key(values: Sequence[Any]) -> tuple[str, ...]:
        found = dict(zip(dims, values, strict=True))
        out = []
        for d in by:
            if d in ("day", "hour"):
                out.append(_local(parse(str(found["hour"]) + ":00:00+00:00"), d == "hour"))
            elif d == "model":
                out.append(found[d] or UNKNOWN_MODEL)
            else:
                out.append(found[d] or "?")
        return tuple(out)

    for *values, outcome, n, tin, tout, cr, cw, cost, est, unpriced, _ in store.attempt_sums(
        window.since, window.until, dims
    ):
        key = key_of(values)
        acc = groups.get(key) or groups.setdefault(key, _Acc())
        acc.add_sums(outcome, [n, tin, tout, cr, cw, cost, est, unpriced])
    for *values, _, duration, _, _ in store.attempt_durations(window.since, window.until, dims):
        groups[key_of(values)].durations.append(max(0.0, duration))
    return groups


def _group(by: Sequence[str], key: tuple[str, ...], acc: _Acc) -> dict[str, Any]:
    median, p90 = _durations(acc)
    return {
        "key": dict(zip(by, key, strict=True)),
        "attempts": acc.attempts,
        "success": acc.success,
        "success_rate": _round(acc.rate()),
        "outcomes": dict(sorted(acc.outcomes.items())),
        "duration_median_s": median,
        "duration_p90_s": p90,
        "tokens": acc.tokens(),
        "cost": round(acc.cost, 6),
        "cost_reported": round(acc.reported, 6),
        "cost_estimated": round(acc.estimated, 6),
    }


def _models(store: Store, window: Window) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for model, calls, uncached, output, read, written, cost, estimated in store.usage_sums(*window):
        name = model or UNKNOWN_MODEL
        entry = found.setdefault(
            name,
            {
                "model": name,
                "calls": 0,
                "input": 0,
                "output": 0,
                "cache_read": 0,
                "cache_write": 0,
                "cost": 0.0,
                "reported": 0.0,
                "estimated": 0.0,
            },
        )
        entry["calls"] += calls or 0
        entry["input"] += uncached or 0
        entry["output"] += output or 0
        entry["cache_read"] += read or 0
        entry["cache_write"] += written or 0
        entry["cost"] += cost or 0.0
        entry["estimated"] += estimated or 0.0
        entry["reported"] += (cost or 0.0) - (estimated or 0.0)
    for entry in found.values():
        for name in ("cost", "reported", "estimated"):
            entry[name] = round(entry[name], 6)
    return sorted(found.values(), key=lambda e: (-e["cost"], e["model"]))
