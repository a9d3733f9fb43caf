"""`fleet ls`, `fleet ready` and `fleet show`: read the queue, as tables or as JSON."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from fleet.cli.app import TASK, App, cli, count, pass_app
from fleet.model import Status, Task
from fleet.output import (
    emit_json_texts,
    emit_object,
    emit_objects,
    emit_pairs,
    emit_table,
    emit_text,
    fmt_of,
    output_options,
    shorten,
)

STATUS_CHOICE = click.Choice([s.value for s in Status])


def _state(task: Task) -> str:
    if task.status == Status.READY and task.waiting_on:
        return "waiting"
    if task.status == Status.RUNNING and task.question:
        return "asking"  # its agent waits for a person's answer
    return str(task.status)


def live_units(app: App, tasks: Iterable[Task]) -> dict[str, tuple[str, str]]:
    """(ActiveState, status line) of the units of claimed tasks; empty without systemd."""
    claimed = [t.id for t in tasks if t.claimed_by]
    if not claimed:
        return {}  # and spare `fleet ls` importing systemd, proc and subprocess
    from fleet import systemd
    from fleet.errors import FleetError

    try:
        return systemd.states(systemd.scope_for(app.paths), claimed)
    except FleetError:
        return {}


def _table(app: App, tasks: Iterable[Task]) -> None:
    from fleet.timeutil import ago

    tasks = list(tasks)
    units = live_units(app, tasks)

    def unit(t: Task) -> str:
        state, status = units.get(t.id, ("", ""))
        return shorten(f"{state}: {status}" if status else state, 50) if state else "-"

    rows = [
        (
            t.id,
            _state(t),
            t.priority,
            t.coder or "-",
            ago(t.updated_at),
            tokens(t),
            shorten(t.title, 50),
            unit(t),
        )
        for t in tasks
    ]
    emit_table(("ID", "STATUS", "P", "CODER", "UPDATED", "TOKENS", "TITLE", "UNIT"), rows)


def tokens(t: Task) -> str:
    """`in/out` in thousands, for tables."""
    if t.tokens_in is None and t.tokens_out is None:
        return "-"
    return f"{(t.tokens_in or 0) / 1000:.1f}k/{(t.tokens_out or 0) / 1000:.1f}k"


@cli.command("ls")
@click.option(
    "-s",
    "--status",
    "statuses",
    type=STATUS_CHOICE,
    multiple=True,
    help="Only tasks in this status (repeatable).",
)
@click.option("--label", metavar="LABEL", help="Only tasks with this label.")
@click.option("--cwd", metavar="DIR", help="Only tasks working in DIR or below it.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Include done and cancelled tasks.")
@output_options
@pass_app
def ls(
    app: App,
    statuses: tuple[str, ...],
    label: str | None,
    cwd: str | None,
    show_all: bool,
    fmt: str | None,
) -> None:
    """List tasks, oldest first (by default those not done or cancelled)."""
    from fleet import inputs
    from fleet.store import TaskFilter

    flt = TaskFilter(
        statuses=tuple(Status(s) for s in statuses),
        include_final=show_all,
        label=inputs.label(label) if label is not None else None,
        cwd=inputs.cwd(cwd) if cwd is not None else None,
    )
    out = fmt_of(fmt)
    if out == "table":
        _table(app, app.store.tasks(flt))
    else:
        emit_json_texts(app.store.list_json(flt), out)


@cli.command()
@click.option("-n", "--limit", type=count(), help="Show at most N tasks.")
@output_options
@pass_app
def ready(app: App, limit: int | None, fmt: str | None) -> None:
    """List the tasks that would be claimed next, in claim order.

    Claim order is priority (0 first), then age; a task whose dependencies are not all done is
    not ready.
    """
    tasks = app.store.ready(limit)
    out = fmt_of(fmt)
    if out == "table":
        _table(app, tasks)
    else:
        emit_objects((t.to_json() for t in tasks), out)


def _isolation_rows(task: Task) -> list[tuple[str, object]]:
    """base, branch, worktree, commits ahead (asked of git now, else as last counted) and the
    merge-back of a worktree task."""
    if not task.isolated:
        return []
    import os

    ahead = None
    if task.branch and task.base:
        from fleet import worktree

        ahead = worktree.commits_ahead(task.worktree or task.cwd, task.base, task.branch)
        if ahead is None and task.worktree:  # the worktree was deleted: ask the repository
            ahead = worktree.commits_ahead(task.cwd, task.base, task.branch)
    counted = "" if ahead is not None or task.ahead is None else " as last counted"
    ahead = task.ahead if ahead is None else ahead
    tree = task.worktree or "-"
    if task.worktree and not os.path.isdir(task.worktree):
        tree += " (removed)"
    state = task.merge_state or "-"
    if task.merge_reason:
        state += f": {task.merge_reason}"
    return [
        ("base", task.base or "-"),
        ("branch", task.branch or "(created by the first attempt)"),
        ("worktree", tree),
        ("commits ahead", "-" if ahead is None else f"{ahead} (of {task.base}){counted}"),
        ("merge", task.merge or "(the merge_strategy setting)"),
        ("merge state", state),
        ("merged commit", task.merged_commit or "-"),
    ]


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("--json", "as_json", is_flag=True, help="Print the task and its attempts as JSON.")
@pass_app
def show(app: App, task_id: str, as_json: bool) -> None:
    """Show one task in full, with its attempts."""
    task = app.store.get(task_id)
    attempts = app.store.attempts(task_id)
    if as_json:
        obj: dict[str, Any] = task.to_json()
        obj["attempt_log"] = [a.to_json() for a in attempts]
        emit_object(obj)
        return

    def opt(value: object) -> str:
        return "-" if value in (None, "", ()) else str(value)

    state = _state(task)
    if task.waiting_on:
        state += " on " + ", ".join(task.waiting_on)
    claim = f"{task.claimed_by} until {task.lease_until}" if task.claimed_by else None
    unit_state, unit_status = live_units(app, [task]).get(task.id, ("", ""))
    emit_pairs(
        [
            ("id", task.id),
            ("title", task.title),
            ("status", state),
            ("reason", opt(task.reason)),
            ("priority", task.priority),
            ("cwd", task.cwd),
            ("coder", task.coder or "(default_coder when first claimed)"),
            ("model", task.model or "(the coder's default)"),
            ("labels", opt(", ".join(task.labels))),
            ("after", opt(", ".join(task.after))),
            ("parent", opt(task.parent)),
            ("predecessor", opt(task.predecessor)),
            ("merged from", opt(", ".join(task.merged_from))),
            ("isolation", task.isolation or "none"),
            *_isolation_rows(task),
            ("attempts", f"{task.attempts} (failures {task.failures}, no-close {task.noclose})"),
            ("tokens", tokens(task) + ("" if task.cost is None else f", ${task.cost:.4f}")),
            ("question", opt(task.question and f"{task.question} (fleet questions)")),
            ("claim", opt(claim)),
            ("unit", opt(f"{unit_state}: {unit_status}" if unit_state else "")),
            ("created", task.created_at),
            ("updated", task.updated_at),
            ("started", opt(task.started_at)),
            ("finished", opt(task.finished_at)),
        ]
    )
    if task.description:
        emit_text("\n" + task.description.rstrip("\n"))
    if attempts:
        emit_text()
        emit_table(
            ("#", "OUTCOME", "EXIT", "STARTED", "ENDED", "TOKENS IN/OUT", "COST"),
            [
                (
                    a.n,
                    a.outcome or "running",
                    opt(a.exit_status),
                    a.started_at,
                    opt(a.ended_at),
                    f"{opt(a.tokens_in)}/{opt(a.tokens_out)}",
                    "-" if a.cost is None else f"${a.cost:.4f}",
                )
                for a in attempts
            ],
        )
