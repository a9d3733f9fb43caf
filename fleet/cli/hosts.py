"""`fleet hosts`: the hosts that share this queue, alive or silent, with what each runs."""

from __future__ import annotations

from fleet.cli.app import App, cli, pass_app
from fleet.output import emit_objects, emit_table, fmt_of, output_options


@cli.command("hosts")
@output_options
@pass_app
def hosts(app: App, fmt: str | None) -> None:
    """List the hosts that share this queue: alive, or silent longer than host_dead_after
    (another host then recovers their claims once the leases have run out); when each was
    last seen (its last dispatch pass or lease renewal, by the store's clock); its running
    attempts out of its max_concurrent; its host_labels, boot and machine id.

    A host appears once it has made a dispatch pass on the queue.
    """
    from fleet.config import dead_after
    from fleet.timeutil import span

    found = app.store.hosts(dead_after(app.config))
    out = fmt_of(fmt)
    if out != "table":
        emit_objects((h.to_json() for h in found), out)
        return
    emit_table(
        ("HOST", "STATE", "LAST SEEN", "RUNNING", "LABELS", "BOOT", "MACHINE"),
        [
            (
                h.name,
                "alive" if h.alive else "silent",
                span(h.silent_s) + " ago",
                f"{h.running}/{h.max_concurrent}",
                ", ".join(h.labels) or "-",
                (h.boot_id or "-")[:8],
                (h.machine_id or "-")[:8],
            )
            for h in found
        ],
    )
