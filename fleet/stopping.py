"""Stopping running attempts wherever they run: this host's through their units (systemd's
stop, which the runner turns into the coder's stop signal) or, for a caller that may not stop
units, their `.kill` sentinel; another host's through a kill request in the shared store
(fleet.store.signals), which that host's fleet-listen, or its runner's next renewal in
poll-only mode, turns into the task's `.kill`.

Invariant: an attempt is stopped by the host that runs it, never by another (no host can
signal another's processes); on a SQLite store every claim is this host's, whatever name the
host had when it claimed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fleet.errors import TimedOut

if TYPE_CHECKING:
    from fleet.config import Config
    from fleet.model import Task
    from fleet.paths import Paths
    from fleet.store import Store

SLACK_S = 15  # beyond the lease and the grace: the runner's end and its reaping


def elsewhere(paths: Paths, tasks: Sequence[Task]) -> list[Task]:
    """Those of `tasks` that another host runs."""
    from fleet.host import owner
    from fleet.store import POSTGRES_SCHEMES, store_url
    from fleet.store.base import is_merge_claim

    if not store_url(paths).startswith(POSTGRES_SCHEMES):
        return []
    me = owner()
    return [
        t
        for t in tasks
        if t.claimed_by is not None and t.claimed_by != me and not is_merge_claim(t.claimed_by)
    ]


def request_elsewhere(paths: Paths, store: Store, tasks: Sequence[Task]) -> list[Task]:
    """A kill request for each of `tasks` that another host runs; returns those. This host's
    own are the caller's to stop."""
    remote = elsewhere(paths, tasks)
    if remote:
        store.request_kill([t.id for t in remote])
    return remote


def stop(paths: Paths, store: Store, tasks: Sequence[Task], block: bool) -> list[Task]:
    """Stop the attempts of `tasks` (claimed ones): this host's by their units (waiting for
    their end if `block`), the others' by a kill request; returns the latter."""
    from fleet import systemd

    remote = request_elsewhere(paths, store, tasks)
    here = [t.id for t in tasks if t.claimed_by is not None and t not in remote]
    systemd.stop(systemd.scope_for(paths), here, block=block)
    return remote


def ring(paths: Paths, store: Store, tasks: Sequence[Task]) -> list[Task]:
    """Stop the attempts of `tasks` (claimed ones) without touching a unit: this host's by
    their `.kill` sentinel, which their runners turn into the coder's stop signal, the
    others' by a kill request; returns the latter. For a caller that may not stop units:
    an agent's fleet-ask, which may run as the agent's own user."""
    from fleet import taskdir

    remote = request_elsewhere(paths, store, tasks)
    for task in tasks:
        if task.claimed_by is not None and task not in remote:
            taskdir.ring(taskdir.task_dir(paths, task.id), taskdir.KILL)
    return remote


def default_timeout(config: Config) -> float:
    """How long a stop on another host may take: its runner hears of it within the renewal
    period (poll-only) or at once, then has the grace, then its reaping."""
    return config.get_int("lease_seconds") + config.get_int("stop_grace_seconds") + SLACK_S


def await_ends(store: Store, tasks: Sequence[Task], timeout: float) -> None:
    """Until each of these attempts (claimed elsewhere) has ended, by the store; TimedOut.

    A change on another host touches no file here for inotify to see, so this looks at the
    store, a little less often the longer it waits."""
    deadline = time.monotonic() + timeout
    left = {t.id: (t.claimed_by, t.attempts) for t in tasks}
    delay = 0.05
    while left:
        for task_id, held in list(left.items()):
            now = store.get(task_id)
            if (now.claimed_by, now.attempts) != held:
                del left[task_id]
        if not left:
            return
        if time.monotonic() >= deadline:
            hosts = sorted({str(host) for host, _ in left.values()})
            raise TimedOut(
                f"still running after {timeout:g} s: {' '.join(left)} (on {', '.join(hosts)})",
                hint="the kill request is kept: the host stops it once its fleet-listen or"
                " runner hears it (is fleet-listen running there?); fleet show ID says more",
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)
