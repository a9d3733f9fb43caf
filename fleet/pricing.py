"""Estimated costs: the price table, and the price of one model call.

Invariants:
- a cost is estimated per call, never on a total: a long prompt moves its whole call into a
  dearer tier (`long_above`), which a sum of many calls would wrongly reach or miss;
- the four token counts of a call are disjoint (input, output, cache read, cache write) and each
  has its own rate;
- a model the table does not know gets no estimate (None), never a neighbour's price;
- the table is the one shipped with fleet (fleet/prices.toml) with the `prices` setting laid over
  it entry by entry, so an entry in config.toml replaces the shipped one of the same key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fleet.errors import ConfigError

if TYPE_CHECKING:
    from fleet.coders.base import Call
    from fleet.config import Config

SHIPPED = Path(__file__).with_name("prices.toml")
RATES = ("input", "output", "cache_read", "cache_write")
LONG_RATES = tuple(f"long_{r}" for r in RATES)
KEYS = (*RATES, "long_above", *LONG_RATES)
PER = 1_000_000  # the table's rates are per million tokens


class Rates(NamedTuple):
    input: float
    output: float
    cache_read: float
    cache_write: float


class Price(NamedTuple):
    """One entry of the table: its rates, and those of calls whose prompt is longer than
    `long_above` tokens."""

    rates: Rates
    long_above: int | None = None
    long: Rates | None = None

    def of(self, call: Call) -> float:
        """The cost of `call` (all `call.count` calls of it) in US dollars."""
        long = self.long is not None and self.long_above is not None
        rates = self.long if long and call.prompt > (self.long_above or 0) else self.rates
        assert rates is not None
        return (
            call.input * rates.input
            + call.output * rates.output
            + call.cache_read * rates.cache_read
            + call.cache_write * rates.cache_write
        ) / PER


def _number(name: str, value: object, where: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise ConfigError(f"{where}: {name} must be a number of dollars, at least 0")
    return float(value)  # type: ignore[arg-type]


def entry(key: str, obj: object, where: str) -> Price:
    """A table entry from its TOML table; ConfigError naming `where` if it is not one."""
    here = f"{where}: prices.{key}"
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{here} must be a table such as {{input = 3.0, output = 15.0}}")
    unknown = sorted(set(obj) - set(KEYS))
    if unknown:
        raise ConfigError(f"{here}: unknown key {unknown[0]!r}", hint="keys: " + ", ".join(KEYS))
    for name in ("input", "output"):
        if name not in obj:
            raise ConfigError(f"{here}: {name} is missing", hint="give input and output at least")
    base = {n: _number(n, obj[n], here) for n in RATES if n in obj}
    for name in ("cache_read", "cache_write"):
        base.setdefault(name, base["input"])
    rates = Rates(**base)
    above = obj.get("long_above")
    if above is None:
        if any(n in obj for n in LONG_RATES):
            raise ConfigError(f"{here}: long_* rates need long_above (the prompt size, tokens)")
        return Price(rates)
    if not isinstance(above, int) or isinstance(above, bool) or above <= 0:
        raise ConfigError(f"{here}: long_above must be a whole number of tokens above 0")
    long = {n: _number(f"long_{n}", obj[f"long_{n}"], here) for n in RATES if f"long_{n}" in obj}
    for name in RATES:
        long.setdefault(name, getattr(rates, name))
    return Price(rates, above, Rates(**long))


def _contains(name: str, key: str) -> bool:
    """Whether `name` contains `key`, a `*` in which stands for any characters."""
    if "*" not in key:
        return key in name
    return re.search(".*".join(re.escape(part) for part in key.split("*")), name) is not None


class Table:
    """Prices by model-name part, looked up by the longest part a model's name contains (a
    `*` in a key stands for any characters and does not count toward its length)."""

    def __init__(self, entries: Mapping[str, Price]) -> None:
        self.entries = {k.lower(): v for k, v in entries.items()}
        self._found: dict[str, Price | None] = {}

    def lookup(self, model: str | None) -> Price | None:
        if not model:
            return None
        if model not in self._found:
            name = model.lower()
            keys = [k for k in self.entries if _contains(name, k)]
            best = max(keys, key=lambda k: len(k.replace("*", ""))) if keys else None
            self._found[model] = self.entries[best] if best is not None else None
        return self._found[model]

    def cost(self, calls: Iterable[Call]) -> float | None:
        """The estimated cost of these calls; None if any of them is of an unknown model."""
        total = 0.0
        for call in calls:
            price = self.lookup(call.model)
            if price is None:
                return None
            total += price.of(call)
        return total


def shipped() -> dict[str, Any]:
    import tomllib

    with SHIPPED.open("rb") as f:
        return tomllib.load(f)


def table(overrides: Mapping[str, Any] | None = None) -> Table:
    """The shipped table with `overrides` (the `prices` setting) laid over it."""
    raw: dict[str, Any] = {**shipped(), **(overrides or {})}
    where = {k: "prices setting" if overrides and k in overrides else str(SHIPPED) for k in raw}
    return Table({k: entry(k, v, where[k]) for k, v in raw.items()})


def of_config(config: Config) -> Table:
    return table(config.values.get("prices") or {})
