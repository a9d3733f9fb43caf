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
    return _setting(paths, "store")


def _setting(paths: Paths, name: str) -> str:
    """A setting of the store's: its variable, else the configuration file's.

    Most commands read no configuration, and loading it (fleet.config, fleet.settings) costs a
    listing a tenth of its time: the file is only loaded, and checked, when one of its lines
    sets `name`."""
    variable = "FLEET_" + name.upper()
    if variable in os.environ:
        return os.environ[variable].strip()
    try:
        text = paths.config_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""  # no file (a file fleet cannot read is reported by whatever loads it)
    if not any(_sets(line, name) for line in text.splitlines()):
        return ""
    from fleet.config import load_or_last_good

    return load_or_last_good(paths).get_str(name).strip()


def _sets(line: str, name: str) -> bool:
    """Whether a line of TOML may set the key `name` (a comment does not)."""
    key, eq, _ = line.partition("=")
    return bool(eq) and key.strip().strip("\"'") == name


def open_store(paths: Paths, actor: Actor | None = None, url: str | None = None) -> Store:
    """The store, whose changes the audit trail puts down to `actor` (by default whoever runs
    `fleet` here: the agent of a task, or the person)."""
    from fleet.audit import who

    actor = actor or Actor(who(), "fleet")
    url = store_url(paths) if url is None else url
    if url.startswith(POSTGRES_SCHEMES):
        from fleet.store import pgauth
        from fleet.store.pgstore import PGStore

        passfile = pgauth.passfile(os.path.expanduser(_setting(paths, "store_passfile")))
        return PGStore.connect(pgauth.with_passfile(url, passfile), paths, actor)
    if url:
        # Not SQLite by surprise: a host that took this for SQLite would run a queue of its own.
        from fleet.errors import StoreError
        from fleet.settings import shown

        raise StoreError(
            f"the store setting {shown('store', url)!r} is neither empty nor a PostgreSQL URL",
            hint="postgresql://USER@HOST:PORT/DATABASE, or empty for SQLite in the state"
            " directory (FLEET_STORE, or store in the configuration file)",
        )
    from fleet.store.litestore import SQLiteStore

    return SQLiteStore.open(paths, actor)
