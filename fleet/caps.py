"""Global caps per coder: `coders.NAME.global_max_concurrent` bounds how many tasks of that
coder run at once on all the hosts of a shared queue together (a provider's rate limits are
per account, not per host), where `max_concurrent` bounds each host.

Invariant: every claim under caps counts the running tasks of the capped coders and claims in
one transaction that holds the store's cap lock (PostgreSQL: an advisory lock of its own key;
SQLite: the write lock every write holds), so concurrent claimers on any number of hosts
never exceed a cap. A host enforces the caps of its own configuration: give each the same.
"""

from __future__ import annotations

from fleet.config import Config

KEY = "global_max_concurrent"


def global_caps(config: Config) -> dict[str, int]:
    """Coder -> its global cap, for the coders that have one (0 is none)."""
    out = {}
    for key, value in config.values.items():
        if key.startswith("coders.") and key.endswith(f".{KEY}") and value:
            out[key.split(".")[1]] = int(value)
    return out
