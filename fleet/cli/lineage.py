"""`fleet handoff`, `merge-tasks`, `tree` and `history`: move work between tasks, and see how
it moved.

A handoff changes the store first and stops the original's running attempt after, so that the
attempt, when it ends, finds the task handed off and counts as nothing (fleet-reap's
`handed-off` outcome); a refused handoff changes nothing at all.
"""

from __future__ import annotations

import sys

import click

from fleet.cli.app import SECONDS, TASK, App, cli, coder_options, pass_app
from fleet.errors import InputError
from fleet.model import Task, TaskSpec
from fleet.output import (
    emit_object,
    emit_objects,
    emit_table,
    emit_text,
    fmt_of,
    output_options,
    shorten,
)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option(
    "--to", "to", required=True, metavar="CODER[:MODEL]", help="The coder (and model) to take over."
)
@click.option(
    "--context",
    metavar="TEXT|@FILE|-",
    help="What the successor should know: what is done, what is left.",
)
@click.option(
    "--offer",
    is_flag=True,
    help="Only offer it: nothing changes until the offer is accepted (fleet accept, the"
    " handoff_offers policy, or an agent of that coder); prints the offer's number.",
)
@click.option(
    "--expires",
    type=SECONDS,
    metavar="SECONDS",
    help="With --offer: how long it waits (default: handoff_offer_seconds).",
)
@click.option("--no-block", is_flag=True, help="Return at once instead of waiting for the stop.")
@click.option("--json", "as_json", is_flag=True, help="Print the successor (or offer) as JSON.")
@pass_app
def handoff(
    app: App,
    task_id: str,
    to: str,
    context: str | None,
    offer: bool,
    expires: float | None,
    no_block: bool,
    as_json: bool,
) -> None:
    """Hand a task over to another coder or model: if that coder is configured and installed
    here, a successor task is added (same title, description and directory; a worktree
    task's successor starts from its branch) whose prompt carries the context and the latest
    checkpoint summary, and the original ends as handed-off (a running attempt is stopped).
    Tasks that waited for the original wait for the successor (so do tasks added later with
    --after ID), which is claimed only once the original's attempt has ended. Prints the
    successor's id;
    a refused handoff changes nothing and exits non-zero.
    """
    from fleet import inputs

    text = inputs.description(context) if context is not None else None
    if offer:
        offer_task(app, task_id, to, text, expires, not no_block, as_json)
        return
    if expires is not None:
        raise InputError("--expires goes with --offer", hint="add --offer, or leave it out")
    successor = handoff_task(app, task_id, to, text, block=not no_block)
    if as_json:
        emit_object(successor.to_json())
    else:
        sys.stdout.write(successor.id + "\n")


def handoff_task(app: App, task_id: str, to: str, context: str | None, block: bool = True) -> Task:
    """Hand the task over to `to` (CODER[:MODEL]) with `context` (checked text); the
    successor. A running attempt of the original is stopped."""
    from fleet import lineage, wake
    from fleet.cli.suspend import _stop

    coder, model = lineage.target(to)
    successor = lineage.handoff(app.store, app.config, task_id, coder, model, context)
    if app.store.get(task_id).claimed_by is not None:
        _stop(app, task_id, block=block)
    wake.poke(app.paths)
    return successor


def offer_task(
    app: App,
    task_id: str,
    to: str,
    context: str | None,
    expires: float | None,
    block: bool,
    as_json: bool,
) -> None:
    from fleet import lineage, offers, wake
    from fleet.cli.suspend import _stop

    if expires is not None and expires < 1:
        raise InputError("--expires must be at least 1 second")
    coder, model = lineage.target(to)
    made = offers.offer(app.store, app.paths, app.config, task_id, coder, model, context, expires)
    if made.status == "accepted" and made.successor:  # the handoff_offers policy accepted it
        if app.store.get(task_id).claimed_by is not None:
            _stop(app, task_id, block=block)
        wake.poke(app.paths)
    if as_json:
        emit_object(made.to_json())
    else:
        sys.stdout.write(f"{made.successor if made.status == 'accepted' else made.id}\n")


@cli.command("merge-tasks")
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True, type=TASK)
@click.option("--title", required=True, help="The merge task's title.")
@click.option(
    "-d", "--description", metavar="TEXT|@FILE|-", help="More instructions for its agent."
)
@click.option("--cwd", metavar="DIR", help="Where it works [default: the tasks' directory].")
@coder_options
@click.option("--json", "as_json", is_flag=True, help="Print the new task as JSON.")
@pass_app
def merge_tasks(
    app: App,
    task_ids: tuple[str, ...],
    title: str,
    description: str | None,
    cwd: str | None,
    coder: str | None,
    model: str | None,
    priority: int,
    as_json: bool,
) -> None:
    """Add a task that consolidates the work of other tasks: its prompt says where each one's
    work is (already merged into its base, or on its branch fleet/ID) and lists their artifact
    directories, it runs once they are all done (for a task handed
    off, once its successor is), and it records where it came from (merged_from; see
    `fleet tree`). It works in a git worktree of its own if any of them did. Prints its id.
    """
    from fleet import inputs, lineage
    from fleet.claim import dispatch_or_wake
    from fleet.cli.add import isolate

    merged = tuple(dict.fromkeys(task_ids))
    if len(merged) < 2:
        raise InputError("give at least two different tasks to merge")
    tasks = [app.store.get(t) for t in merged]
    if cwd is not None:
        directory = inputs.cwd(cwd)
    elif len({t.cwd for t in tasks}) == 1:
        directory = tasks[0].cwd
    else:
        raise InputError("the tasks work in different directories", hint="say where with --cwd DIR")
    isolated = next((t for t in tasks if t.isolated and t.cwd == directory), None)
    if isolated is not None:
        isolation, base, merge = "worktree", isolated.base, isolated.merge
    else:
        (isolation, base), merge = isolate(app, directory, None, None, None, "--"), None
    spec = TaskSpec(
        title=inputs.title(title),
        cwd=directory,
        description=inputs.description(description),
        coder=app.config.check_coder(inputs.name("coder", coder)) if coder else None,
        model=inputs.name("model", model) if model else None,
        priority=priority,
        after=tuple(lineage.sources(app.store, merged)),
        isolation=isolation,
        base=base,
        merge=merge,
        merged_from=merged,
    )
    (task,) = app.store.add([spec])
    dispatch_or_wake(app.paths, app.store)
    if as_json:
        emit_object(task.to_json())
    else:
        sys.stdout.write(task.id + "\n")


@cli.command("tree")
@click.argument("task_id", metavar="[ID]", required=False, type=TASK)
@click.option("--json", "as_json", is_flag=True, help="Print the trees as JSON.")
@pass_app
def tree_cmd(app: App, task_id: str | None, as_json: bool) -> None:
    """Draw the lineage of tasks with each one's status: under a task, its subtasks, the
    successor it was handed off to and the merge tasks it goes into; on its line, what it
    merges and what it runs after. With ID, the tree that holds that task; without, every
    task in the queue (done and cancelled ones too).
    """
    from fleet import tree
    from fleet.store import TaskFilter

    tasks = list(app.store.tasks(TaskFilter(include_final=True)))
    nodes = tree.forest(tasks)
    if task_id is not None:
        root = tree.root_of(tasks, task_id)
        nodes = [n for n in nodes if n.task.id == root]
    if as_json:
        import json

        sys.stdout.write(json.dumps([n.to_json() for n in nodes], ensure_ascii=False, indent=2))
        sys.stdout.write("\n")
        return
    rows = tree.render(nodes)
    if rows:
        emit_text("\n".join(rows))


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@output_options
@pass_app
def history(app: App, task_id: str, fmt: str | None) -> None:
    """List a task's audit trail, oldest first: every action on it (added, claimed, started,
    ended, checkpointed, suspended, resumed, spawned, handed-off, merged, asked, answered,
    closed, blocked, cancelled, retried, edited, kill-requested), when, and who or what did it.
    It is kept in the store, so it outlives the journal.
    """
    entries = app.store.history(task_id)
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((e.to_json() for e in entries), out)
        return

    def detail(values: dict[str, object]) -> str:
        parts = []
        for key, value in values.items():
            text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            parts.append(f"{key}={text}")
        return shorten(" ".join(parts), 70)

    emit_table(
        ("AT", "ACTION", "BY", "DETAIL"),
        [(e.at, e.action, e.by, detail(e.detail) or "-") for e in entries],
    )
