"""`fleet stats`: what the fleet did over a time window (fleet.stats), as tables, JSON or CSV."""

from __future__ import annotations

import sys

import click

from fleet.cli.app import App, cli, pass_app
from fleet.stats import DIMENSIONS


@cli.command("stats")
@click.option(
    "--since",
    metavar="DURATION|DATE",
    help="Only attempts that ended since then: a duration back from now (90m, 36h, 7d, 2w), a"
    " date (2026-11-30, local midnight) or a date and time [default: from the first].",
)
@click.option("--until", metavar="DURATION|DATE", help="Only attempts that ended before then.")
@click.option(
    "--by",
    "by",
    type=click.Choice(DIMENSIONS),
    multiple=True,
    help="Also give the figures per group (repeatable: --by coder --by day groups by both).",
)
@click.option("--json", "fmt", flag_value="json", help="Print the figures as one JSON object.")
@click.option(
    "--csv",
    "fmt",
    flag_value="csv",
    help="Print CSV: one row per --by group, or one row for the whole window.",
)
@pass_app
def stats(
    app: App, since: str | None, until: str | None, by: tuple[str, ...], fmt: str | None
) -> None:
    """Show what the fleet did: tasks finished and throughput, attempts by outcome class and the
    success rate, attempt durations (median, p90), attempts per finished task, tokens by kind,
    cost (what coders reported and what the price table estimated, call by call), the time
    gates held coders back and their timeline, the coders and models side by side, tokens and
    cost by model, and tasks finished and cost per day.

    Every figure comes from the attempts' own records: a resumed session's earlier share is
    never counted twice. The JSON object's fields are in fleet(1) under JSON OUTPUT.
    """
    from fleet import report
    from fleet import stats as fleet_stats
    from fleet.errors import InputError
    from fleet.output import emit_csv, emit_object

    window = fleet_stats.Window(
        fleet_stats.point(since) if since else None, fleet_stats.point(until) if until else None
    )
    if window.since and window.until and window.since >= window.until:
        raise InputError("--since must come before --until")
    figures = fleet_stats.compute(app.store, window, by)
    if fmt == "json":
        emit_object(figures)
    elif fmt == "csv":
        emit_csv(*report.csv_rows(figures))
    else:
        sys.stdout.write(report.text(figures))
