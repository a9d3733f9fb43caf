"""What one attempt spent: its tokens by kind and by model, and its cost, reported or estimated.

Invariants:
- everything here is the attempt's own share: the coders take the share out of what a CLI
  reports for a whole resumed session (fleet.coders), so nothing is counted twice;
- the four token kinds are disjoint (input is the prompt read neither from nor into a cache),
  and `tokens_in` is their input part, as the task and attempt records have always counted it;
- a cost the coder reported wins over an estimate; an estimate prices every call on its own
  (fleet.pricing); `source` says which one a figure is, and a cost that is neither is None.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from fleet.coders.base import Call, Tally
from fleet.model import AttemptEnd
from fleet.pricing import Table

REPORTED, ESTIMATED = "reported", "estimated"


class ModelSpend(NamedTuple):
    model: str  # "" when the coder did not say
    calls: int
    input: int
    output: int
    cache_read: int
    cache_write: int
    cost: float | None
    source: str | None  # reported, estimated, or None (unpriced)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class Spend(NamedTuple):
    tokens_in: int | None  # input, cache reads and cache writes together
    tokens_out: int | None
    cache_read: int | None  # None: the coder does not tell cached tokens apart
    cache_write: int | None
    cost: float | None
    source: str | None
    models: tuple[ModelSpend, ...] = ()

    @property
    def tokens(self) -> int:
        """Every token, for max_tokens: input (cached included) and output."""
        return (self.tokens_in or 0) + (self.tokens_out or 0)

    @property
    def model(self) -> str | None:
        """The model that did most of the work (most tokens), if the coder named one."""
        named = [m for m in self.models if m.model]
        if not named:
            return None
        return max(named, key=lambda m: m.input + m.output + m.cache_read + m.cache_write).model


NOTHING = Spend(None, None, None, None, None, None)


def by_model(calls: Iterable[Call], prices: Table, default: str | None) -> list[ModelSpend]:
    groups: dict[str, list[Call]] = {}
    for call in calls:
        groups.setdefault(call.model or default or "", []).append(call)
    out = []
    for model, group in sorted(groups.items()):
        reported = [c.cost for c in group]
        if all(c is not None for c in reported):
            cost: float | None = sum(c for c in reported if c is not None)
            source: str | None = REPORTED
        else:
            cost = prices.cost(c._replace(model=model) for c in group)
            source = ESTIMATED if cost is not None else None
        out.append(
            ModelSpend(
                model,
                sum(c.times for c in group),
                sum(c.input for c in group),
                sum(c.output for c in group),
                sum(c.cache_read for c in group),
                sum(c.cache_write for c in group),
                cost,
                source,
            )
        )
    return out


def of(tally: Tally, prices: Table, model: str | None) -> Spend:
    """The attempt's spend so far from what its coder said (`model`: the task's, for calls
    whose model the CLI did not name)."""
    models = by_model(tally.calls.values(), prices, model)
    if models:
        tokens_in: int | None = sum(m.input + m.cache_read + m.cache_write for m in models)
        tokens_out: int | None = sum(m.output for m in models)
        cache_read: int | None = sum(m.cache_read for m in models)
        cache_write: int | None = sum(m.cache_write for m in models)
    else:
        tokens_in, tokens_out = tally.tokens_in, tally.tokens_out
        cache_read = cache_write = None
    if tally.cost is not None:
        return Spend(
            tokens_in, tokens_out, cache_read, cache_write, tally.cost, REPORTED, tuple(models)
        )
    costs = [m.cost for m in models]
    if models and all(c is not None for c in costs):
        sources = {m.source for m in models}
        source = REPORTED if sources == {REPORTED} else ESTIMATED
        total = sum(c for c in costs if c is not None)
        return Spend(tokens_in, tokens_out, cache_read, cache_write, total, source, tuple(models))
    return Spend(tokens_in, tokens_out, cache_read, cache_write, None, None, tuple(models))


def describe(spend: Spend) -> str:
    """`$0.0123 (estimated)`, or `-` when there is no cost."""
    if spend.cost is None:
        return "-"
    return f"${spend.cost:.4f}" + (f" ({spend.source})" if spend.source else "")


def models_json(models: Sequence[ModelSpend]) -> list[dict[str, Any]]:
    return [m.to_json() for m in models]


def attempt_end(
    outcome: str,
    spent: Mapping[str, Any],
    exit_status: int | None,
    totals: Mapping[str, Any] | None = None,
) -> AttemptEnd:
    """The record of an attempt's end from its spend in the outcome file's names (tokens_in,
    tokens_out, cost, session, cache_read, cache_write, cost_source, model, usage)."""
    return AttemptEnd(
        outcome,
        exit_status=exit_status,
        tokens_in=spent.get("tokens_in"),
        tokens_out=spent.get("tokens_out"),
        cost=spent.get("cost"),
        session_id=spent.get("session"),
        cache_read=spent.get("cache_read"),
        cache_write=spent.get("cache_write"),
        cost_source=spent.get("cost_source"),
        model=spent.get("model"),
        usage=tuple(
            tuple(m.get(k) for k in ModelSpend._fields)
            for m in spent.get("usage") or ()
            if isinstance(m, dict)
        ),
        session_totals=json.dumps(totals) if totals else None,
    )
