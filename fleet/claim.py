"""fleet-claim: one dispatch pass, then exit.

Under an exclusive lock (so concurrent passes on a host never exceed the cap): consume the wake
poke, recover stale claims (lease expired and unit not alive: back to ready, attempt recorded as
lost), then claim up to `max_concurrent` minus this host's live claims, honouring the pause and
per-coder gates, and start a fleet-task@ID unit for each. Claims whose unit cannot be started
are released at once, so no task is stranded.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fleet import systemd, wake
from fleet.config import Config
from fleet.errors import FleetError
from fleet.host import owner
from fleet.model import AttemptEnd
from fleet.paths import Paths, Scope
from fleet.store import Store
from fleet.timeutil import now_iso


@dataclass(frozen=True)
class Pass:
    recovered: list[str]
    started: list[str]
    running: int


@contextmanager
def dispatch_lock(paths: Paths) -> Iterator[None]:
    fd = os.open(paths.home / "claim.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def recover(store: Store, scope: Scope, me: str) -> list[str]:
    now = now_iso()
    stale = [t for t in store.claims(me) if t.lease_until is not None and t.lease_until < now]
    if not stale:
        return []
    alive = systemd.states(scope, (t.id for t in stale))
    recovered = []
    for task in stale:
        if alive.get(task.id, ("inactive", ""))[0] in systemd.ALIVE:
            continue
        store.release(task.id, me, AttemptEnd("lost"))
        recovered.append(task.id)
    return recovered


def dispatch(paths: Paths, store: Store, config: Config, scope: Scope) -> Pass:
    me = owner()
    with dispatch_lock(paths):
        wake.consume(paths)
        recovered = recover(store, scope, me)
        running = len(store.claims(me))
        free = config.get_int("max_concurrent") - running
        claimed = store.claim(
            free,
            me,
            config.get_int("lease_seconds"),
            config.get_str("default_coder"),
            config.get_str("default_model"),
        )
        ids = [t.id for t in claimed]
        try:
            systemd.start(scope, ids)
        except FleetError as e:
            for task_id in ids:
                store.release(task_id, me, AttemptEnd("not-started"))
            sys.stderr.write(f"fleet-claim: cannot start units, released {len(ids)}: {e}\n")
            raise
        return Pass(recovered, ids, running + len(ids))
