"""`fleet checkpoint`, `checkpoints` and `suspend` (and `fleet resume ID`, in control): stop a
task in a state it can be picked up from, and pick it up.

A suspend is a checkpoint, then the status `suspended` (which fleet-claim never claims), then
the stop of a running attempt, in that order: the checkpoint names the session of the attempt
that is still alive, and the attempt, when it ends, finds the task suspended and counts as
nothing (fleet-reap's `suspended` outcome).
"""

from __future__ import annotations

import sys

import click

from fleet.cli.app import TASK, App, cli, pass_app
from fleet.errors import Conflict
from fleet.model import Checkpoint, Status
from fleet.output import (
    emit_object,
    emit_objects,
    emit_table,
    emit_text,
    fmt_of,
    output_options,
    shorten,
)

summary_option = click.option(
    "-s",
    "--summary",
    metavar="TEXT",
    help="Where the work stands and what comes next, for the attempt that resumes"
    " (`-` reads it from standard input).",
)


def _summary(given: str | None, default: str) -> str:
    from fleet import checkpoints

    if given == "-":
        given = sys.stdin.read()
    return checkpoints.check_summary(default if given is None else given)


def _said(cp: Checkpoint) -> None:
    """The checkpoint's number on standard output; a missing ref said on standard error."""
    sys.stdout.write(f"{cp.n}\n")
    if cp.ref is None:
        emit_text(f"fleet: checkpoint {cp.n} of {cp.task} has no git ref: {cp.note}", err=True)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@summary_option
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoint as JSON.")
@pass_app
def checkpoint(app: App, task_id: str, summary: str | None, as_json: bool) -> None:
    """Record a checkpoint of a task: its work in progress as the git ref
    refs/fleet/ID/checkpoints/N (made without touching the work tree or the index; none if the
    task's directory is not in a git repository), the summary, the coder's session of its
    current or last attempt, and its pending questions. Prints N.
    """
    from fleet import checkpoints
    from fleet.audit import who

    by = who()
    cp = checkpoints.take(app.store, task_id, by, _summary(summary, f"checkpoint by {by}"))
    if as_json:
        emit_object(cp.to_json())
    else:
        _said(cp)


@cli.command("checkpoints")
@click.argument("task_id", metavar="ID", type=TASK)
@output_options
@pass_app
def checkpoints_cmd(app: App, task_id: str, fmt: str | None) -> None:
    """List a task's checkpoints, oldest first."""
    from fleet.timeutil import ago

    taken = app.store.checkpoints(task_id)
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((cp.to_json() for cp in taken), out)
        return
    emit_table(
        ("N", "TAKEN", "BY", "ATTEMPT", "SESSION", "REF", "SUMMARY"),
        [
            (
                cp.n,
                ago(cp.created_at),
                cp.by,
                cp.attempt,
                cp.session_id or "-",
                cp.ref or f"- ({shorten(cp.note or '', 40)})",
                shorten(cp.summary, 50),
            )
            for cp in taken
        ],
    )


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@summary_option
@click.option("--no-block", is_flag=True, help="Return at once instead of waiting for the stop.")
@pass_app
def suspend(app: App, task_id: str, summary: str | None, no_block: bool) -> None:
    """Checkpoint a ready or running task and suspend it: a running attempt is stopped (it
    counts as no failure; on another host, through the store, as `fleet kill` stops it), and
    the task is never claimed until `fleet resume ID`, whose next attempt resumes the coder's
    own session where it can. Prints the checkpoint's number.
    """
    by = app.store.actor.by
    _said(suspend_task(app, task_id, _summary(summary, f"suspended by {by}"), not no_block))


def suspend_task(app: App, task_id: str, summary: str, block: bool = True) -> Checkpoint:
    """Checkpoint the task with `summary` (checked), suspend it, stop a running attempt."""
    from fleet import checkpoints

    task = app.store.get(task_id)
    if task.status not in (Status.READY, Status.RUNNING):
        raise Conflict(
            f"cannot suspend {task_id}: it is {task.status}",
            hint="only ready and running tasks can be suspended",
        )
    by = app.store.actor.by  # who() for the command line, web:USER for the dashboard
    cp = checkpoints.take(app.store, task_id, by, checkpoints.check_summary(summary))
    task = app.store.suspend(task_id, f"suspended by {by} at checkpoint {cp.n}", cp.n)
    if task.claimed_by is not None:
        _stop(app, task_id, block=block)
    return cp


def _stop(app: App, task_id: str, block: bool) -> None:
    """Stop the running attempt: its unit, or a runner started by hand through its `.kill`
    sentinel; on another host, by a kill request (fleet.stopping)."""
    from fleet import stopping, systemd, taskdir
    from fleet.errors import FleetError

    remote = stopping.request_elsewhere(app.paths, app.store, [app.store.get(task_id)])
    if remote:
        if block:
            stopping.await_ends(app.store, remote, stopping.default_timeout(app.config))
        return

    try:
        scope = systemd.scope_for(app.paths)
        alive = systemd.states(scope, [task_id]).get(task_id, ("inactive", ""))[0]
    except FleetError:
        alive = "inactive"
    if alive in systemd.ALIVE:
        systemd.stop(scope, [task_id], block=block)
        return
    from fleet.paths import ensure_dir

    taskdir.ring(ensure_dir(taskdir.task_dir(app.paths, task_id)), taskdir.KILL)
