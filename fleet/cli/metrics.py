"""`fleet metrics`: the fleet's figures in Prometheus text format (fleet.metrics)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fleet.cli.app import App, cli, pass_app


@cli.command("metrics")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to FILE (replaced atomically, as node_exporter's textfile collector needs; name"
    " it *.prom) instead of standard output.",
)
@pass_app
def metrics(app: App, output: Path | None) -> None:
    """Print the fleet's figures as Prometheus metrics (text exposition format).

    OpenTelemetry GenAI names where one fits: gen_ai_client_token_usage, a histogram of tokens
    by gen_ai_token_type (input, output) and gen_ai_response_model, one observation per
    attempt and model. The rest are fleet_*: fleet_tasks by state, fleet_running,
    fleet_max_concurrent, fleet_paused, fleet_questions_pending, fleet_attempts_total by coder
    and outcome, fleet_attempt_duration_seconds, fleet_tokens_total by coder, model and kind
    (input, output, cache_read, cache_write), fleet_cost_usd_total by coder, model and source
    (reported, estimated), fleet_gate_open and fleet_gate_seconds_total by coder and kind,
    fleet_rate_limit_utilization_ratio by coder and window.

    For node_exporter's textfile collector, run it from a timer, for example as user units:

    \b
    # ~/.config/systemd/user/fleet-metrics.service
    [Unit]
    Description=fleet metrics for node_exporter
    [Service]
    Type=oneshot
    ExecStart=fleet metrics -o /var/lib/node_exporter/textfile/fleet.prom

    \b
    # ~/.config/systemd/user/fleet-metrics.timer
    [Timer]
    OnBootSec=1min
    OnUnitActiveSec=1min
    [Install]
    WantedBy=timers.target

    and `systemctl --user enable --now fleet-metrics.timer`.
    """
    from fleet import metrics as fleet_metrics
    from fleet.errors import InputError

    data = fleet_metrics.exposition(app.paths, app.store, app.config)
    if output is None:
        sys.stdout.buffer.write(data)
        return
    from fleet.fsutil import write_atomic

    try:
        write_atomic(output, data, mode=0o644)
    except OSError as e:
        raise InputError(f"cannot write {output}: {e.strerror}") from None
