"""`fleet claims`: what the agents coordinate with, for a person to see (fleet.store.coord)."""

from __future__ import annotations

import click

from fleet.cli.app import App, cli, pass_app
from fleet.output import emit_objects, emit_table, fmt_of, output_options, shorten


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
