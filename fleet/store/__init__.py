"""The task store: the central queue, behind the narrow `Store` interface of `fleet.store.base`.

`open_store()` is the one way commands get a store, so a PostgreSQL backend can later be chosen
here without touching them.
"""

from __future__ import annotations

from fleet.paths import Paths
from fleet.store.base import Store, TaskFilter

__all__ = ["Store", "TaskFilter", "open_store"]


def open_store(paths: Paths) -> Store:
    from fleet.store.sqlite import SQLiteStore

    return SQLiteStore.open(paths)
