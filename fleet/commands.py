"""The per-task programs that systemd runs: fleet-claim, fleet-run, fleet-reap, fleet-ask.

Each is a click command run through the same error handler as `fleet`, so a failure is one
line on stderr (which journald keeps) and a documented exit status. fleet-ask is declared
here so its man page exists; it fails with exit status 69 until its issue lands.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from fleet.cli.app import run
from fleet.errors import NotYet

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("fleet-claim", context_settings=_SETTINGS)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing when nothing was started.")
def claim(quiet: bool) -> None:
    """Run one dispatch pass: recover stale claims, then claim ready tasks up to the cap and
    start a fleet-task@ID unit for each.

    systemd runs it from fleet-claim.service whenever fleet-claim.path sees a wake-up (a task
    was added, retried or finished) or the configuration changes, and from fleet-claim.timer
    as a safety net. Running it by hand is safe: passes on one host take turns.
    """
    from fleet.claim import dispatch
    from fleet.config import load_or_last_good
    from fleet.paths import resolve
    from fleet.store import open_store
    from fleet.systemd import current_scope

    paths = resolve()
    store = open_store(paths)
    try:
        result = dispatch(paths, store, load_or_last_good(paths), current_scope())
    finally:
        store.close()
    if result.started or result.recovered or not quiet:
        click.echo(
            f"started {len(result.started)}"
            + (f": {' '.join(result.started)}" if result.started else "")
            + f"; recovered {len(result.recovered)}; running {result.running}"
        )


@click.command("fleet-run", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def run_cmd(task_id: str) -> int:
    """Run one attempt of task ID: spawn its coder in the task's directory and turn its output
    into events.

    Under systemd (fleet-task@ID.service) the events go to the journal and the exit status is
    read by fleet-reap. Run by hand for a claimable task, it claims it, prints the events as
    JSON lines, and applies the outcome itself. Exit status: 0 success, 1 failure, 3 stopped,
    4 not claimable, 5 the coder could not start.
    """
    import os

    from fleet.config import load_or_last_good
    from fleet.paths import resolve
    from fleet.reap import settle
    from fleet.run import attempt, full_id
    from fleet.store import open_store

    task_id = full_id(task_id)
    code = attempt(task_id)
    if not os.environ.get("INVOCATION_ID"):
        paths = resolve()
        store = open_store(paths)
        try:
            kind = settle(paths, store, load_or_last_good(paths), task_id)
            if kind:
                click.echo(f"fleet-run: {task_id}: {kind} → {store.get(task_id).status}", err=True)
        finally:
            store.close()
    return code


@click.command("fleet-reap", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def reap(task_id: str) -> None:
    """Classify how the last attempt of task ID ended and apply the retry policy.

    systemd runs it as ExecStopPost= of fleet-task@ID.service, with $SERVICE_RESULT,
    $EXIT_CODE and $EXIT_STATUS describing the runner's end.
    """
    from fleet.config import load_or_last_good
    from fleet.paths import resolve
    from fleet.reap import settle
    from fleet.run import full_id
    from fleet.store import open_store

    task_id = full_id(task_id)
    paths = resolve()
    store = open_store(paths)
    try:
        kind = settle(paths, store, load_or_last_good(paths), task_id)
        task = store.get(task_id)
    finally:
        store.close()
    if kind:
        click.echo(
            f"{task_id}: {kind} → {task.status}" + (f" ({task.reason})" if task.reason else "")
        )
    else:
        click.echo(f"{task_id}: no attempt of this unit to reap")


@click.command("fleet-ask", context_settings=_SETTINGS)
def ask() -> None:
    """Serve the agent's tools (ask a human, notify, close the task) as a stdio MCP server."""
    raise NotYet(
        "fleet-ask is not implemented yet",
        hint="the agent's MCP tools arrive with the human-in-the-loop issue",
    )


PROGRAMS: dict[str, click.Command] = {
    "fleet-claim": claim,
    "fleet-run": run_cmd,
    "fleet-reap": reap,
    "fleet-ask": ask,
}


def _main(prog: str, argv: Sequence[str] | None = None) -> int:
    return run(PROGRAMS[prog], prog, argv)


def claim_main(argv: Sequence[str] | None = None) -> int:
    return _main("fleet-claim", argv)


def run_main(argv: Sequence[str] | None = None) -> int:
    return _main("fleet-run", argv)


def reap_main(argv: Sequence[str] | None = None) -> int:
    return _main("fleet-reap", argv)


def ask_main(argv: Sequence[str] | None = None) -> int:
    return _main("fleet-ask", argv)
