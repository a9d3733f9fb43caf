"""`fleet kill`, `pause`, `resume`, `wait` and `merge`: steer running and finished work
(and resume suspended tasks)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import click

from fleet.cli.app import SECONDS, TASK, App, cli, count, pass_app
from fleet.errors import Conflict, FleetError, InputError, TimedOut
from fleet.model import Status, Task
from fleet.timeutil import poll_ms


@cli.command()
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True, type=TASK)
@click.option("--no-block", is_flag=True, help="Return at once instead of waiting for the stop.")
@click.option(
    "-t",
    "--timeout",
    type=SECONDS,
    help="Fail after SECONDS if a task on another host still runs (default: lease_seconds +"
    " stop_grace_seconds + 15).",
)
@pass_app
def kill(app: App, task_ids: tuple[str, ...], no_block: bool, timeout: float | None) -> None:
    """Stop running tasks: the whole process tree of each agent ends, and the task is blocked
    as stopped by a person.

    A task running on this host is stopped through its unit. One running on another host (a
    PostgreSQL store) gets a kill request in the store, which that host's fleet-listen hears
    at once (or its runner at its next lease renewal, with wakeups = "poll"); the request is
    kept until then. Unless --no-block, it waits until every attempt has ended, and fails
    (exit status 124) if one still runs after --timeout.
    """
    kill_tasks(app, task_ids, block=not no_block, timeout=timeout)


KILL_SLACK_S = 15  # beyond the lease and the grace: the runner's end and its reaping


def kill_tasks(
    app: App, task_ids: Sequence[str], block: bool = True, timeout: float | None = None
) -> None:
    """Stop running tasks (all or none: Conflict if one is not running): this host's by their
    units, other hosts' by a kill request in the store."""
    from fleet import systemd
    from fleet.host import owner
    from fleet.store import POSTGRES_SCHEMES, store_url
    from fleet.store.base import is_merge_claim

    tasks = [app.store.get(t) for t in dict.fromkeys(task_ids)]
    idle = [t.id for t in tasks if t.claimed_by is None]
    if idle:
        raise Conflict(f"not running: {' '.join(idle)}", hint="only running tasks can be killed")
    me = owner()
    # A SQLite store is one host's: every claim in it is this host's (whatever its name was).
    shared = store_url(app.paths).startswith(POSTGRES_SCHEMES)
    elsewhere = [
        t for t in tasks if shared and t.claimed_by != me and not is_merge_claim(t.claimed_by)
    ]
    here = [t.id for t in tasks if t not in elsewhere]
    if elsewhere:
        app.store.request_kill([t.id for t in elsewhere])
    systemd.stop(systemd.scope_for(app.paths), here, block=block)
    if elsewhere and block:
        if timeout is None:
            config = app.config
            grace = config.get_int("stop_grace_seconds")
            timeout = config.get_int("lease_seconds") + grace + KILL_SLACK_S
        _await_ends(app, elsewhere, timeout)


def _await_ends(app: App, tasks: Sequence[Task], timeout: float) -> None:
    """Until each of these attempts (claimed elsewhere) has ended, by the store; TimedOut.

    A change on another host touches no file here for inotify to see, so this looks at the
    store, a little less often the longer it waits."""
    deadline = time.monotonic() + timeout
    left = {t.id: (t.claimed_by, t.attempts) for t in tasks}
    delay = 0.05
    while left:
        for task_id, held in list(left.items()):
            now = app.store.get(task_id)
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


@cli.command()
@click.option("-r", "--reason", help="Why, for `fleet ls` and the log.")
@pass_app
def pause(app: App, reason: str | None) -> None:
    """Stop starting new tasks; running tasks go on."""
    pause_queue(app, reason)


def pause_queue(app: App, reason: str | None) -> None:
    from fleet import inputs

    app.store.set_gate("pause", None, inputs.reason(reason) or None if reason else None)


@cli.command()
@click.argument("task_id", metavar="[ID]", required=False, type=TASK)
@click.option(
    "--from",
    "checkpoint",
    metavar="N",
    type=count(),
    help="With ID: resume from checkpoint N (default: the newest).",
)
@pass_app
def resume(app: App, task_id: str | None, checkpoint: int | None) -> None:
    """Without ID, start tasks again after `fleet pause`. With ID, make a suspended task ready
    again: its next attempt resumes the coder's session of the checkpoint (`fleet checkpoints
    ID`), or starts a fresh one whose prompt carries the checkpoint's summary.
    """
    if task_id is None:
        if checkpoint is not None:
            raise InputError(
                "--from needs the ID of a suspended task", hint="fleet resume ID --from N"
            )
        resume_queue(app)
        return
    resume_task(app, task_id, checkpoint)
    sys.stdout.write(task_id + "\n")


def resume_queue(app: App) -> None:
    """Lift the pause, and start what may start."""
    from fleet.claim import dispatch_or_wake

    app.store.clear_gate("pause")
    dispatch_or_wake(app.paths, app.store)


def resume_task(app: App, task_id: str, checkpoint: int | None) -> Task:
    """A suspended task ready again (from `checkpoint`, by default its newest)."""
    from fleet.claim import dispatch_or_wake

    task = app.store.resume_task(task_id, checkpoint)
    dispatch_or_wake(app.paths, app.store)
    return task


# Suspended, like blocked, waits for a person. A handed-off task is followed to its successor
# (`fleet wait`); one without a successor (none should be) counts as settled, never waited on.
SETTLED = (Status.DONE, Status.BLOCKED, Status.CANCELLED, Status.SUSPENDED, Status.HANDED_OFF)


def _settled(task: Task) -> bool:
    return task.status in SETTLED and not task.claimed_by


def _announce(app: App, tasks: list[Task]) -> None:
    """The "finished" notification of a batch, e.g. `3 tasks finished: 2 done, 1 blocked`."""
    from fleet import alerts
    from fleet.errors import FleetError

    tasks = list({t.id: t for t in tasks}.values())  # an id given twice counts once
    counts = {s: sum(t.status == s for t in tasks) for s in SETTLED}
    parts = [f"{n} {status}" for status, n in counts.items() if n]
    noun = "task" if len(tasks) == 1 else "tasks"
    message = f"{len(tasks)} {noun} finished: {', '.join(parts)}"
    try:
        config = app.config
    except FleetError as e:
        alerts.log(f'not sending the "finished" notification: {e.message}')
        return
    alerts.fire(app.paths, config, "finished", message, tasks=[t.id for t in tasks])


@cli.command("wait")
@click.argument("task_ids", metavar="[ID...]", nargs=-1, type=TASK)
@click.option(
    "-t", "--timeout", type=SECONDS, help="Give up after SECONDS (0 or more; none: wait forever)."
)
@click.option(
    "--schedule",
    metavar="NAME",
    help="Also wait for the tasks of the schedule's latest run that added any.",
)
@pass_app
def wait_cmd(
    app: App, task_ids: tuple[str, ...], timeout: float | None, schedule: str | None
) -> int:
    """Wait until each task is done, cancelled, blocked or suspended; for a task handed off,
    its last successor, which carries its work on (said on standard error).

    Exits 0 if all are done, 1 if any was not (cancelled, blocked, ...), 124 on timeout. It
    sleeps on inotify events of the store, so it costs nothing while it waits. When they have
    all settled (not on a timeout) it sends the "finished" notification (notify_* settings).
    """
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    if schedule is not None:
        task_ids = (*task_ids, *_latest_run(app, schedule))
    elif not task_ids:
        raise InputError("give task ids or --schedule NAME", hint="fleet wait ID... [-t SECONDS]")
    deadline = None if timeout is None else time.monotonic() + timeout
    tty = sys.stderr.isatty()
    inotify = INotify()
    # The store touches fleet.lock after every commit (see fleet.store.litestore).
    inotify.add_watch(app.paths.lock, iflags.ATTRIB)
    try:
        followed: dict[str, str] = {}  # a given id -> the successor it was handed off to
        while True:
            # A handoff while we wait moves the work on too: follow it each time.
            for given in task_ids:
                heir = app.store.heir(followed.get(given, given))
                if heir != followed.get(given, given):
                    followed[given] = heir
                    sys.stderr.write(f"{given} was handed off: waiting for {heir}\n")
            tasks = [app.store.get(followed.get(t, t)) for t in task_ids]
            settled = [t for t in tasks if _settled(t)]
            if tty:
                done = sum(t.status == Status.DONE for t in settled)
                sys.stderr.write(f"\r{len(settled)}/{len(tasks)} settled, {done} done ")
            if len(settled) == len(tasks):
                if tty:
                    sys.stderr.write("\n")
                _announce(app, tasks)
                return 0 if all(t.status == Status.DONE for t in tasks) else 1
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if tty:
                    sys.stderr.write("\n")
                waiting = " ".join(t.id for t in tasks if not _settled(t))
                raise TimedOut(f"timed out waiting for {waiting}")
            inotify.read(timeout=poll_ms(left))
    finally:
        inotify.close()


def _latest_run(app: App, name: str) -> tuple[str, ...]:
    from fleet.errors import NotFound

    app.store.schedule(name)
    runs = app.store.schedule_runs(name, 1, added=True)
    if not runs:
        raise NotFound(f"schedule {name} has added no tasks yet", hint=f"fleet schedule run {name}")
    return runs[0].tasks


@cli.command("merge")
@click.argument("task_id", metavar="ID", type=TASK)
@click.option(
    "--strategy",
    type=click.Choice(["merge", "rebase", "ff-only", "branch"]),
    help="Merge this way from now on instead of the task's own strategy (or merge_strategy).",
)
@pass_app
def merge_cmd(app: App, task_id: str, strategy: str | None) -> None:
    """Merge a worktree task's branch back into its base now.

    For a task that waits in merging (its base is checked out with uncommitted changes), that
    was blocked by a conflict once it has been resolved on its branch fleet/ID, or that is done
    without having been merged. Prints what happened; exits 1 if the task still waits or is
    blocked, with the reason.
    """
    from fleet.output import emit_text

    emit_text(merge_task(app, task_id, strategy))


def merge_task(app: App, task_id: str, strategy: str | None) -> str:
    """Merge a worktree task's branch back now; what happened, or FleetError if it still waits
    or is blocked."""
    from fleet import merge, wake

    task = merge.request(app.paths, app.store, app.config, task_id, strategy)
    if task.status == Status.MERGING:
        raise FleetError(
            f"{task.id} still waits to merge: {task.merge_reason}",
            hint="every dispatch pass tries again; or run fleet merge again",
        )
    if task.status != Status.DONE:
        raise FleetError(
            f"{task.id} is {task.status}: {task.reason}",
            hint=f"once that is resolved on {task.branch}: fleet merge {task.id}",
        )
    wake.poke(app.paths)  # tasks that waited on this one may start
    if task.merge_state == "branch":
        return f"{task.id}: {task.merge_reason}"
    into = f"{task.base} is at {(task.merged_commit or '')[:12]}"
    return f"{task.id}: merged, {into}" + (f" ({task.merge_reason})" if task.merge_reason else "")
