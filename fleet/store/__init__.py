"""The task store: the central queue, behind the narrow `Store` interface of `fleet.store.base`.

`open_store()` is the one way commands get a store, so a PostgreSQL backend can later be chosen
here without touching them.
"""

from __future__ import annotations

from fleet.audit import Actor
from fleet.paths import Paths
from fleet.store.base import Store, TaskFilter

__all__ = ["Actor", "Store", "TaskFilter", "open_store"]


def open_store(paths: Paths, actor: Actor | None = None) -> Store:
    """The store, whose changes the audit trail puts down to `actor` (by default whoever runs
    `fleet` here: the agent of a task, or the person)."""
    from fleet.audit import who
    from fleet.store.sqlite import SQLiteStore

    return SQLiteStore.open(paths, actor or Actor(who(), "fleet"))
