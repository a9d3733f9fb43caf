"""Daily budgets per coder: `coders.NAME.daily_cost_usd` closes that coder's gate for the day.

Invariants:
- a coder's day starts at `daily_budget_resets_at`, local time of this host; what it spent is
  the cost (reported or estimated) of its attempts that ended since then;
- every dispatch pass checks, before it claims: a coder at or over its budget gets a `budget`
  gate until its next day starts, unless a gate already holds it at least that long; a budget
  gate whose coder is back within its budget (it was raised, or the day began anew) is lifted;
- running attempts go on: the budget stops new work, as a rate limit does.
"""

from __future__ import annotations

import datetime as dt
import time

from fleet.config import Config
from fleet.store import Store
from fleet.timeutil import iso, parse

KIND = "budget"


def budgets(config: Config) -> dict[str, float]:
    """Coder -> its daily budget, for the coders that have one."""
    out = {}
    for key, value in config.values.items():
        if key.startswith("coders.") and key.endswith(".daily_cost_usd") and value:
            out[key.split(".")[1]] = float(value)
    return out


def day_bounds(config: Config, now: float | None = None) -> tuple[float, float]:
    """(start of the current budget day, start of the next one), epoch seconds."""
    now = time.time() if now is None else now
    hour, minute = (int(x) for x in config.get_str("daily_budget_resets_at").split(":"))
    local = dt.datetime.fromtimestamp(now)  # naive local time: days are calendar days
    start = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if start > local:
        start -= dt.timedelta(days=1)
    following = start + dt.timedelta(days=1)  # across a DST change too: same wall-clock time
    return start.astimezone().timestamp(), following.astimezone().timestamp()


def check(store: Store, config: Config, now: float | None = None) -> list[str]:
    """Close or lift the budget gates of the coders with daily budgets; the coders gated."""
    limits = budgets(config)
    gates = {g["name"]: g for g in store.open_gates()}
    held = [name[6:] for name, g in gates.items() if g["kind"] == KIND]
    if not limits and not held:
        return []
    start, following = day_bounds(config, now)
    spent = store.spent_since(iso(start))
    gated = []
    for coder in sorted({*limits, *held}):
        name = f"coder:{coder}"
        gate = gates.get(name)
        limit = limits.get(coder)
        used = spent.get(coder, 0.0)
        if limit is None or used < limit:
            if gate is not None and gate["kind"] == KIND:
                store.clear_gate(name)  # raised meanwhile, or a new day
            continue
        gated.append(coder)
        if gate is not None and (gate["until"] is None or parse(gate["until"]) >= following):
            continue  # held at least as long already
        reason = (
            f"daily budget: ${used:.2f} spent today of coders.{coder}.daily_cost_usd ${limit:g}"
        )
        store.set_gate(name, iso(following), reason, kind=KIND)
    return gated
