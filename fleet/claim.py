"""fleet-claim: one dispatch pass, then exit.

Under an exclusive lock (so concurrent passes on a host never exceed the cap): consume the wake
poke, record this host's heartbeat in the store (fleet.store.hosts; refused if another machine
holds its name), recover stale claims (back to ready, attempt recorded as lost: made in an
earlier boot of this host, so lost the moment it is up again, or with the lease expired and the
unit not alive; and another host's, once its lease expired AND that host has been silent longer
than host_dead_after; a task lost max_lost times in a row is blocked instead), close the gates
of coders over their daily budget (fleet.budget), look again for the task directories this
host lacked (fleet.store.placement), then claim up to `max_concurrent` minus this host's live
claims, honouring the pause and per-coder gates, what this host may run (fleet.affinity: a
task's host and the labels it needs against `host_labels`) and the global caps per coder
(fleet.caps), and start a fleet-task@ID unit for each. Claims whose unit cannot be started are
released at once, so no task is stranded.

The commands that make work ready (`fleet add`, `fleet retry`, `fleet resume`) run the same pass
themselves when they can start this queue's units (`dispatch_or_wake`): that takes the path
unit and one interpreter start-up off the way from `fleet add` to a running agent. Whenever
they cannot (units not installed, no reachable manager, another pass holding the lock, a system
queue and a user who may not start its units) they poke the wake file instead, so the outcome is
the same pass, only run by fleet-claim.service. fleet-listen runs it the same way when another
host's commit made work ready, waiting a little for a pass under way rather than poking.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from fleet import budget, containment, live, systemd, wake
from fleet.affinity import host_labels
from fleet.caps import global_caps
from fleet.config import Config, dead_after
from fleet.errors import FleetError
from fleet.host import boot_id, machine_id, owner
from fleet.model import AttemptEnd, Task
from fleet.paths import Paths, Scope
from fleet.store import Store


class Pass(NamedTuple):
    recovered: list[str]
    started: list[str]
    running: int


class Busy(Exception):
    """Another dispatch pass holds the lock."""


LOCK_POLL_S = 0.01  # how often a pass given `within` seconds tries the lock again


@contextmanager
def dispatch_lock(paths: Paths, wait: bool = True, within: float = 0.0) -> Iterator[None]:
    """The lock of this host's passes; with `wait` false, Busy unless it is free within
    `within` seconds (never blocking longer)."""
    fd = os.open(paths.home / "claim.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if wait:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _lock_within(fd, within)
        yield
    finally:
        os.close(fd)


def _lock_within(fd: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Busy from None
        time.sleep(LOCK_POLL_S)


def heartbeat(store: Store, config: Config, me: str) -> None:
    """This host's row in the store, seen now: its machine, boot, labels and cap."""
    from fleet.store.hosts import HostInfo

    labels = host_labels(config.values["host_labels"])
    info = HostInfo(me, machine_id(), boot_id(), labels, config.get_int("max_concurrent"))
    store.heartbeat(info, dead_after(config))


def recover(
    store: Store,
    scope: Scope,
    me: str,
    paths: Paths | None = None,
    config: Config | None = None,
) -> list[str]:
    """Release the claims of this host whose attempt was lost (made in an earlier boot of it,
    or with the lease run out, and the unit gone), with what it spent as its live figures in
    `paths` last had it; and, given `config`, those of other hosts whose lease ran out and
    whose host has been silent longer than host_dead_after (no unit to ask: the silence is
    the evidence). Leases and silence are judged by the store's clock (the database's, on
    PostgreSQL). A task lost max_lost times in a row is blocked. An attempt of this host that
    did end, but whose runner and reaper found the store away (an outage), left its outcome
    file: it is settled from that file instead, once."""
    from fleet.errors import Conflict
    from fleet.usage import attempt_end

    max_lost = config.get_int("max_lost") if config else 0
    stale = store.stale_claims(me, boot_id())
    orphans = store.orphaned_claims(me, dead_after(config)) if config else []
    alive = systemd.states(scope, (t.id for t in stale)) if stale else {}
    recovered = []
    for task in [*stale, *orphans]:
        holder = task.claimed_by or me
        if holder == me and alive.get(task.id, ("inactive", ""))[0] in systemd.ALIVE:
            continue
        if holder == me and paths and config and settled_late(paths, store, config, task):
            recovered.append(task.id)
            continue
        # What the lost attempt spent, as far as its runner here published it (fleet.live).
        spent = live.spent(paths, task.id, task.attempts) if paths and holder == me else {}
        end = attempt_end("lost", spent, None)
        try:
            if max_lost:
                store.recover_lost(task.id, holder, end, task.attempts, max_lost, me)
            else:
                store.release(task.id, holder, end, attempt=task.attempts)
        except Conflict:
            continue  # another host recovered it first (or its runner came back and ended it)
        if paths and holder == me:
            live.remove(paths, task.id)
        recovered.append(task.id)
    return recovered


def settled_late(paths: Paths, store: Store, config: Config, task: Task) -> bool:
    """Settle the ended attempt of `task` from its outcome file, if it left one that its
    runner could have settled itself (fleet.programs: not a stop by systemd, which only
    fleet-reap can tell apart); whether it did."""
    from fleet import outcome, reap, taskdir

    found = outcome.read(taskdir.task_dir(paths, task.id))
    if (
        found is None
        or found.attempt != task.attempts
        or found.verdict == "refused"
        or (found.stopped_by or "").startswith("signal")
        or (found.signal and not found.stopped_by)
    ):
        return False
    return reap.settle(paths, store, config, task.id) is not None


def dispatch(
    paths: Paths,
    store: Store,
    config: Config,
    scope: Scope,
    wait: bool = True,
    within: float = 0.0,
) -> Pass:
    """One pass; with `wait=False`, raises Busy if another pass is still under way after
    `within` seconds (at once by default)."""
    me = owner()
    with dispatch_lock(paths, wait, within):
        wake.consume(paths)
        try:
            heartbeat(store, config, me)
            recovered = recover(store, scope, me, paths, config)
            budget.check(store, config)  # close the gates of coders over their daily budget
            running = len(store.claims(me))
            free = config.get_int("max_concurrent") - running
            if free > 0:
                store.recheck_missing(me)  # a directory that appears is taken again at once
            claimed = store.claim(
                free,
                me,
                config.get_int("lease_seconds"),
                config.get_str("default_coder"),
                config.get_str("default_model"),
                labels=host_labels(config.values["host_labels"]),
                caps=global_caps(config),
            )
            ids = [t.id for t in claimed]
            try:
                containment.install(paths, config, claimed, scope)
                systemd.start(scope, ids)
            except FleetError as e:
                for task in claimed:
                    store.release(task.id, me, AttemptEnd("not-started"), attempt=task.attempts)
                sys.stderr.write(f"fleet-claim: cannot start units, released {len(ids)}: {e}\n")
                raise
        except FleetError as e:
            live.record_pass(paths, {"error": e.message})
            raise
        done = Pass(recovered, ids, running + len(ids))
        what = {"started": len(ids), "recovered": len(recovered), "running": done.running}
        live.record_pass(paths, what)
        return done


def can_start_units(paths: Paths, scope: Scope) -> bool:
    """Whether this process can start the queue's units itself, judged without running
    anything: `fleet setup` has installed them for this FLEET_HOME, and the manager of that
    scope is up and ours to talk to."""
    if not (paths.home / systemd.SCOPE_FILE).exists():
        return False
    if scope == "system":
        # sd_booted(); and only root may start system units without asking polkit.
        return os.geteuid() == 0 and os.path.isdir("/run/systemd/system")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return bool(runtime) and os.path.exists(f"{runtime}/systemd/private")


def dispatch_or_wake(paths: Paths, store: Store, within: float = 0.0) -> None:
    """Start what is ready now, in this process, or leave that to fleet-claim.service.

    A pass under way is waited for up to `within` seconds (a long-lived caller, fleet-listen,
    whose pass then starts sooner than a new fleet-claim process would), else left to finish
    and the wake file poked. Never raises for the dispatch itself: the work is already in the
    queue, and the wake file makes sure a pass runs."""
    from fleet.config import load_or_last_good

    scope = systemd.scope_for(paths)
    if can_start_units(paths, scope):
        try:
            dispatch(paths, store, load_or_last_good(paths), scope, wait=False, within=within)
            return
        except Busy:
            pass  # the pass under way may have read the queue already: poke for another
        except FleetError as e:
            sys.stderr.write(f"fleet: could not start units here, fleet-claim will: {e.message}\n")
    wake.poke(paths)
