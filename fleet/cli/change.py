"""`fleet edit`, `close`, `block`, `retry`, `cancel`: a person's changes to one task.

Each prints the task id on success (or the task with --json) and fails with exit status 4 when
the task's current status does not allow the change.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from fleet.cli.app import TASK, App, cli, pass_app
from fleet.errors import Conflict, InputError
from fleet.model import MAX_PRIORITY, MIN_PRIORITY, Status, Task, TaskEdit


def _done(task: Task, as_json: bool) -> None:
    from fleet.output import emit_object

    if as_json:
        emit_object(task.to_json())
    else:
        sys.stdout.write(task.id + "\n")


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the changed task as JSON."
)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("--title", help="New title.")
@click.option("-d", "--description", metavar="TEXT|@FILE|-", help="New description.")
@click.option(
    "--cwd",
    metavar="DIR",
    help="New project directory (of a task that runs only on another host: one of that host).",
)
@click.option("--coder", metavar="NAME", help="New coder (empty: back to default_coder).")
@click.option("--model", metavar="NAME", help="New model (empty: back to the default).")
@click.option(
    "-p",
    "--priority",
    type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
    help="New priority: 0 is claimed first, 4 last.",
)
@click.option("--label", "labels", multiple=True, metavar="LABEL", help="Add a label.")
@click.option("--unlabel", multiple=True, metavar="LABEL", help="Remove a label.")
@click.option("--after", multiple=True, type=TASK, help="Add a dependency.")
@click.option("--not-after", multiple=True, type=TASK, help="Remove a dependency.")
@click.option("--parent", type=TASK, help="Set the parent task.")
@click.option(
    "--max-cost",
    metavar="USD",
    help="New budget in US dollars over all attempts (0: none; empty: back to max_cost_usd);"
    " a running attempt keeps the one it started with.",
)
@click.option(
    "--max-tokens",
    metavar="N",
    help="New budget in tokens over all attempts (0: none; empty: back to max_tokens).",
)
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a resource limit of the task's own, as `fleet add --limit` does (KEY=: remove"
    " it, back to its coder's, labels' or the setting); repeatable; not while it runs.",
)
@click.option(
    "--host",
    metavar="NAME",
    help="Run the task only on this host from now on (empty: on any host).",
)
@click.option("--needs", multiple=True, metavar="LABEL", help="Add a label its host must have.")
@click.option("--not-needs", multiple=True, metavar="LABEL", help="No longer need this host label.")
@json_option
@pass_app
def edit(
    app: App,
    task_id: str,
    title: str | None,
    description: str | None,
    cwd: str | None,
    coder: str | None,
    model: str | None,
    priority: int | None,
    labels: tuple[str, ...],
    unlabel: tuple[str, ...],
    after: tuple[str, ...],
    not_after: tuple[str, ...],
    parent: str | None,
    max_cost: str | None,
    max_tokens: str | None,
    limits: tuple[str, ...],
    host: str | None,
    needs: tuple[str, ...],
    not_needs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change a task's fields, labels, dependencies, budgets, limits and where it may run.

    The directory, coder, model and limits cannot change while an attempt is running.
    """
    from fleet import inputs

    text = inputs.description(description) if description is not None else None
    # A task that runs only on another host may move to a directory only that host has.
    where = host if host is not None or cwd is None else app.store.get(task_id).pinned_host
    change = edit_of(
        app, title, text, cwd, coder, model, priority, labels, unlabel, after, not_after, parent,
        max_cost, max_tokens, limits, host, needs, not_needs, where or None,
    )  # fmt: skip
    _done(edit_task(app, task_id, change), as_json)


def edit_of(
    app: App,
    title: str | None,
    description: str | None,
    cwd: str | None,
    coder: str | None,
    model: str | None,
    priority: int | None,
    labels: Sequence[str] = (),
    unlabel: Sequence[str] = (),
    after: Sequence[str] = (),
    not_after: Sequence[str] = (),
    parent: str | None = None,
    max_cost: str | None = None,
    max_tokens: str | None = None,
    limits: Sequence[str] = (),
    host: str | None = None,
    needs: Sequence[str] = (),
    not_needs: Sequence[str] = (),
    cwd_host: str | None = None,
) -> TaskEdit:
    """The change `fleet edit` makes of its options, each checked (None leaves a field alone,
    "" clears coder, model, the budgets and the host); `description` is the text itself;
    `cwd` is checked here unless `cwd_host` names another host (fleet.cli.add.where)."""
    from fleet import affinity, inputs
    from fleet.cli import add
    from fleet.limits import pairs

    emptied = (
        ("coder", coder),
        ("model", model),
        ("max_cost_usd", max_cost),
        ("max_tokens", max_tokens),
        ("pinned_host", host),
    )
    clear = frozenset(name for name, value in emptied if value == "")
    change = TaskEdit(
        title=inputs.title(title) if title is not None else None,
        description=description,
        cwd=add.where(cwd, cwd_host) if cwd is not None else None,
        coder=app.config.check_coder(inputs.name("coder", coder)) if coder else None,
        model=inputs.name("model", model) if model else None,
        priority=priority,
        parent=parent,
        add_labels=tuple(inputs.label(x) for x in labels),
        remove_labels=tuple(unlabel),
        add_after=tuple(after),
        remove_after=tuple(not_after),
        clear=clear,
        max_cost_usd=inputs.amount("--max-cost", max_cost) if max_cost else None,
        max_tokens=inputs.count("--max-tokens", max_tokens) if max_tokens else None,
        limits=pairs(limits, removable=True) if limits else None,
        pinned_host=affinity.host_name(host) if host else None,
        add_needs=affinity.labels(needs),
        remove_needs=tuple(not_needs),
    )
    return change


def edit_task(app: App, task_id: str, change: TaskEdit) -> Task:
    if change == TaskEdit(clear=frozenset()):
        raise InputError("nothing to change", hint="see `fleet edit --help` for the options")
    return app.store.edit(task_id, change)


@cli.command("close")
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("-r", "--reason", help="What was done, for the record.")
@json_option
@pass_app
def close(app: App, task_id: str, reason: str | None, as_json: bool) -> None:
    """Mark a task done (agents run this when they finish: `fleet close $FLEET_TASK_ID`).

    An agent's reason is redacted like its transcript (see AGENTS AND TEXT in fleet(1)).
    """
    from fleet import inputs

    try:
        task = app.store.close_task(task_id, inputs.reason(reason) if reason else None)
    except Conflict as e:
        raise _pointed(app, task_id, "close", e) from None
    _done(task, as_json)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("-r", "--reason", required=True, help="What the task is waiting for.")
@json_option
@pass_app
def block(app: App, task_id: str, reason: str, as_json: bool) -> None:
    """Block a task until a person retries it; the reason says why.

    An agent that blocks its own task ends its attempt as `blocked`, which counts as nothing;
    its reason is redacted like its transcript (see AGENTS AND TEXT in fleet(1)).
    """
    from fleet import inputs

    text = inputs.reason(reason)
    if not text:
        raise InputError("the reason is empty", hint="say what the task is waiting for")
    _done(app.store.block(task_id, text), as_json)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@json_option
@pass_app
def retry(app: App, task_id: str, as_json: bool) -> None:
    """Put a blocked, done or cancelled task back to ready, with its counters reset."""
    _done(retry_task(app, task_id), as_json)


def retry_task(app: App, task_id: str) -> Task:
    from fleet.claim import dispatch_or_wake

    try:
        task = app.store.retry(task_id)
    except Conflict as e:
        raise _pointed(app, task_id, "retry", e) from None
    dispatch_or_wake(app.paths, app.store)
    return task


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("-r", "--reason", help="Why it is withdrawn.")
@json_option
@pass_app
def cancel(app: App, task_id: str, reason: str | None, as_json: bool) -> None:
    """Withdraw a task: it is never claimed again unless retried. A running attempt is
    stopped, by the host that runs it (another host's through the store, as `fleet kill`)."""
    _done(cancel_task(app, task_id, reason), as_json)


def cancel_task(app: App, task_id: str, reason: str | None, block: bool = True) -> Task:
    from fleet import inputs, stopping

    task = app.store.cancel(task_id, inputs.reason(reason) if reason else None)
    if task.claimed_by is not None:
        stopping.stop(app.paths, app.store, [task], block=block)  # on the host that runs it
        task = app.store.get(task.id)
    return task


def _pointed(app: App, task_id: str, verb: str, refused: Conflict) -> Conflict:
    """The store's refusal (its rule, its message), with a hint at what to run instead: a
    suspended task is resumed, a handed-off one's work goes on in its last successor."""
    task = app.store.get(task_id)
    if task.status == Status.SUSPENDED and verb == "retry":
        return Conflict(refused.message, hint=f"fleet resume {task_id}")
    if task.status == Status.HANDED_OFF:
        heir = app.store.heir(task_id)
        return Conflict(
            f"{refused.message}; its work goes on in {heir}", hint=f"fleet {verb} {heir}"
        )
    return refused
