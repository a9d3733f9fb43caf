"""The per-task programs that systemd runs: fleet-claim, fleet-run, fleet-reap, fleet-ask.

Their command lines are declared here, so their man pages and completions exist from the start.
Until the issue that implements each lands, running one fails with exit status 69 and says so;
nothing pretends to work.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from fleet.cli.app import run
from fleet.errors import NotYet

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _not_yet(prog: str) -> None:
    raise NotYet(
        f"{prog} is not implemented yet",
        hint="running tasks under systemd arrives with the fleet-claim/run/reap issue",
    )


@click.command("fleet-claim", context_settings=_SETTINGS)
def claim() -> None:
    """Run one dispatch pass: recover stale claims, then claim ready tasks up to the cap and
    start a fleet-task@ID unit for each."""
    _not_yet("fleet-claim")


@click.command("fleet-run", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def run_cmd(task_id: str) -> None:
    """Run one attempt of task ID: spawn its coder and turn its output into journal events."""
    _not_yet("fleet-run")


@click.command("fleet-reap", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def reap(task_id: str) -> None:
    """Classify how the attempt of task ID ended and apply the retry policy."""
    _not_yet("fleet-reap")


@click.command("fleet-ask", context_settings=_SETTINGS)
def ask() -> None:
    """Serve the agent's tools (ask a human, notify, close the task) as a stdio MCP server."""
    _not_yet("fleet-ask")


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
