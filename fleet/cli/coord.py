"""`fleet claims`, `message`, `messages`, `accept`, `decline` and `offers`: what the agents
coordinate with, for a person to see and take part in (fleet.coordination, fleet.offers,
fleet.store.coord)."""

from __future__ import annotations

import click

from fleet.cli.app import TASK, App, cli, count, pass_app
from fleet.output import emit_objects, emit_table, emit_text, fmt_of, output_options, shorten


@cli.command("claims")
@click.option(
    "--dir",
    "directory",
    metavar="DIR",
    help="Only the leases in this task directory (as the tasks name it).",
)
@output_options
@pass_app
def claims_cmd(app: App, directory: str | None, fmt: str | None) -> None:
    """List the advisory leases in force: which task's agent holds which resource (a path, a
    module, a name), with its note and when it runs out. Agents take them with fleet-ask's
    claim tool; a lease ends at its time, on release, or when its attempt ends."""
    from fleet.timeutil import ago

    held = app.store.resource_claims(scope=directory)
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((c.to_json() for c in held), out)
        return
    emit_table(
        ("RESOURCE", "TASK", "SINCE", "LEFT", "NOTE", "DIR"),
        [
            (
                shorten(c.resource, 40),
                c.task,
                ago(c.claimed_at),
                f"{int(c.left())}s",
                shorten(c.note, 40) or "-",
                shorten(c.scope, 40),
            )
            for c in held
        ],
    )


@cli.command("message")
@click.argument("words", nargs=-1, metavar="ID|--all TEXT")
@click.option("--all", "to_all", is_flag=True, help="Send to every running task.")
@click.option("--json", "as_json", is_flag=True, help="Print the messages sent as JSON.")
@pass_app
def message_cmd(app: App, words: tuple[str, ...], to_all: bool, as_json: bool) -> None:
    """Send TEXT to the agent of task ID (whatever its status: it reads it when it runs), or
    with --all to every running task's. A running agent sees it with the result of its next
    fleet tool call. TEXT may be @FILE, or - for standard input. Prints each message's number.
    """
    from fleet import coordination, inputs
    from fleet.audit import agent_task
    from fleet.errors import InputError

    wanted = 1 if to_all else 2
    if len(words) != wanted:
        usage = "fleet message --all TEXT" if to_all else "fleet message ID TEXT"
        raise InputError(f"give {'TEXT' if to_all else 'ID and TEXT'}", hint=f"`{usage}`")
    to = "all" if to_all else words[0]
    text = inputs.read_arg(words[-1], "message", inputs.MAX_REASON)
    sender_task = agent_task()
    sent = coordination.send(app.store, app.paths, app.store.actor.by, sender_task, to, text)
    if as_json:
        emit_objects((m.to_json() for m in sent), "json")
        return
    for m in sent:
        emit_text(f"{m.id}")


@cli.command("messages")
@click.argument("task_id", metavar="[ID]", required=False, type=TASK)
@click.option(
    "-n", "--limit", type=count(), default=100, show_default=True, help="The newest this many."
)
@output_options
@pass_app
def messages_cmd(app: App, task_id: str | None, limit: int, fmt: str | None) -> None:
    """List the messages to or from task ID (or everyone's), oldest first, with whether its
    agent has seen each. Reading them here marks nothing read."""
    from fleet.timeutil import ago

    found = app.store.messages(task_id, limit)
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((m.to_json() for m in found), out)
        return
    emit_table(
        ("N", "SENT", "FROM", "TO", "SEEN", "TEXT"),
        [
            (
                m.id,
                ago(m.sent_at),
                shorten(m.sender, 30),
                m.recipient,
                ago(m.read_at) if m.read_at else "no",
                shorten(" ".join(m.text.split()), 60),
            )
            for m in found
        ],
    )


@cli.command("accept")
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("--no-block", is_flag=True, help="Return at once instead of waiting for the stop.")
@click.option("--json", "as_json", is_flag=True, help="Print the successor task as JSON.")
@pass_app
def accept_cmd(app: App, task_id: str, no_block: bool, as_json: bool) -> None:
    """Accept task ID's open handoff offer: the handoff it offered happens now (the successor
    added, the original handed off and its running attempt stopped). Prints the successor's
    id; an offer already decided or expired is refused."""
    import sys

    from fleet import offers, wake
    from fleet.cli.suspend import _stop

    successor = offers.accept(app.store, app.config, task_id)
    if app.store.get(task_id).claimed_by is not None:
        _stop(app, task_id, block=not no_block)
    wake.poke(app.paths)
    if as_json:
        emit_objects([successor.to_json()], "json")
    else:
        sys.stdout.write(successor.id + "\n")


@cli.command("decline")
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("--reason", required=True, metavar="TEXT", help="Why (its agent is told).")
@pass_app
def decline_cmd(app: App, task_id: str, reason: str) -> None:
    """Decline task ID's open handoff offer: the task goes on as it was, and its running
    agent gets the reason as a message."""
    from fleet import offers
    from fleet.audit import agent_task

    made = offers.decline(app.store, app.paths, task_id, reason, agent_task())
    emit_text(f"{made.id}")


@cli.command("offers")
@click.argument("task_id", metavar="[ID]", required=False, type=TASK)
@click.option("--open", "open_only", is_flag=True, help="Only the offers still open.")
@output_options
@pass_app
def offers_cmd(app: App, task_id: str | None, open_only: bool, fmt: str | None) -> None:
    """List handoff offers (of task ID), oldest first: to whom, until when, and how each was
    settled (accepted, declined, expired, failed)."""
    from fleet.timeutil import ago

    found = app.store.offers(task_id, open_only)
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((o.to_json() for o in found), out)
        return
    emit_table(
        ("N", "TASK", "TO", "OFFERED", "BY", "STATUS", "DECIDED BY", "NOTE"),
        [
            (
                o.id,
                o.task,
                o.coder + (f":{o.model}" if o.model else ""),
                ago(o.offered_at),
                shorten(o.offered_by, 24),
                o.status,
                shorten(o.decided_by or "-", 24),
                shorten(o.reason or o.successor or f"until {o.expires_at}", 40),
            )
            for o in found
        ],
    )
