"""Which rate-limit readings hold a coder back in fleet-claim, and until when.

Invariants:
- a refusal (status `rejected`) holds the coder whatever its window: the provider will refuse
  the next task too;
- a reading of use holds it only on a window its settings list (`coders.NAME.rate_limit_windows`,
  `*` for every one; five_hour by default) and only once it reaches the coder's percent
  (`coders.NAME.rate_limit_pct`, else `rate_limit_pct`): a warning alone, or one on a window
  not listed (seven_day by default), never holds it, since the hold lasts until that window
  resets, which for a weekly window may be days away;
- a hold lasts until the reset the provider announced, else `rate_limit_backoff_seconds`.
"""

from __future__ import annotations

from typing import NamedTuple

from fleet.coders.base import Event
from fleet.config import Config
from fleet.settings import CODER_BY_NAME

EVERY_WINDOW = "*"
UNNAMED = "default"  # the window of a reading that names none


class Policy(NamedTuple):
    """One coder's rate-limit settings."""

    windows: tuple[str, ...]
    pct: int
    backoff: float

    @classmethod
    def of(cls, config: Config, coder: str) -> Policy:
        def own(name: str) -> object:
            # A coder without a [coders.NAME] table has its settings' defaults.
            return config.values.get(f"coders.{coder}.{name}", CODER_BY_NAME[name].default)

        windows = own("rate_limit_windows")
        pct = own("rate_limit_pct")
        assert isinstance(windows, list) and isinstance(pct, int)
        return cls(
            tuple(windows),
            pct or config.get_int("rate_limit_pct"),
            float(config.get_int("rate_limit_backoff_seconds")),
        )

    def watches(self, window: str) -> bool:
        return EVERY_WINDOW in self.windows or window in self.windows


class Hold(NamedTuple):
    until: float  # epoch seconds
    window: str
    why: str


def window_of(event: Event) -> str:
    return event.limit_type or UNNAMED


def hold(event: Event, coder: str, policy: Policy, now: float) -> Hold | None:
    """How long the reading `event` holds `coder` back, or None if it does not."""
    window = window_of(event)
    near = (
        event.utilization is not None
        and event.utilization * 100 >= policy.pct
        and policy.watches(window)
    )
    if event.rate_status != "rejected" and not near:
        return None
    resets = event.resets_at
    until = resets if resets and resets > now else now + policy.backoff
    return Hold(until, window, f"{coder} {window} limit: {event.rate_status or 'near'}")
