"""The task store: the central queue, behind the narrow `Store` interface of `fleet.store.base`.

`open_store()` is the one way commands get a store. The `store` setting (or FLEET_STORE) picks
the backend: empty for SQLite in the state directory (fleet.store.litestore), a
`postgresql://` URL for a PostgreSQL database shared by several hosts (fleet.store.pgstore,
which alone imports psycopg).
"""

from __future__ import annotations

import os

from fleet.audit import Actor
from fleet.paths import Paths
from fleet.store.base import Store, TaskFilter

__all__ = ["Actor", "Store", "TaskFilter", "open_store", "store_url"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def store_url(paths: Paths) -> str:
    """The `store` setting: FLEET_STORE, else the configuration file's (empty: SQLite)."""
    if "FLEET_STORE" in os.environ:
        return os.environ["FLEET_STORE"].strip()
    from fleet.config import load_or_last_good

    return load_or_last_good(paths).get_str("store").strip()


def open_store(paths: Paths, actor: Actor | None = None, url: str | None = None) -> Store:
    """The store, whose changes the audit trail puts down to `actor` (by default whoever runs
    `fleet` here: the agent of a task, or the person)."""
    from fleet.audit import who

    actor = actor or Actor(who(), "fleet")
    url = store_url(paths) if url is None else url
    if url.startswith(POSTGRES_SCHEMES):
        from fleet.store.pgstore import PGStore

        return PGStore.connect(url, paths, actor)
    from fleet.store.litestore import SQLiteStore

    return SQLiteStore.open(paths, actor)
