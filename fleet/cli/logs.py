"""`fleet logs`: a task's transcript from the journal, across attempts, optionally followed."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fleet.cli.app import TASK, App, cli, pass_app
from fleet.errors import InputError

FIELDS = {
    "FLEET_ATTEMPT": "attempt",
    "FLEET_EVENT": "event",
    "FLEET_TOOL": "tool",
    "FLEET_SESSION": "session",
    "FLEET_TOKENS_IN": "tokens_in",
    "FLEET_TOKENS_OUT": "tokens_out",
    "FLEET_COST": "cost",
    "FLEET_CODER": "coder",
    "FLEET_MODEL": "model",
}
NUMBERS = ("attempt", "tokens_in", "tokens_out")


def entry(obj: dict[str, Any]) -> dict[str, Any]:
    """One journal entry as a fleet log record (the `--json` schema)."""
    us = int(obj.get("__REALTIME_TIMESTAMP", "0"))
    from fleet.timeutil import iso

    out: dict[str, Any] = {"time": iso(us / 1e6), "message": _text(obj.get("MESSAGE"))}
    for field, name in FIELDS.items():
        value = obj.get(field)
        if value is None:
            continue
        text = _text(value)
        out[name] = int(text) if name in NUMBERS and text.isdigit() else text
    out.setdefault("event", "output" if obj.get("SYSLOG_IDENTIFIER") != "fleet-run" else "log")
    out["cursor"] = obj.get("__CURSOR")
    return out


def _text(value: Any) -> str:
    if isinstance(value, list):  # journald sends undecodable fields as byte lists
        return bytes(value).decode("utf-8", "replace")
    return "" if value is None else str(value)


class Uninterrupted:
    """Holds SIGINT and SIGTERM back while an entry is printed and its cursor saved, so that an
    interrupted `fleet logs --cursor-file` never leaves a printed entry with an unsaved cursor
    (which the next run would print again)."""

    def __init__(self) -> None:
        self.busy = False
        self.pending = False
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: object) -> None:
        if self.busy:
            self.pending = True
        else:
            raise KeyboardInterrupt

    def __enter__(self) -> None:
        self.busy = True

    def __exit__(self, *exc: object) -> None:
        self.busy = False
        if self.pending:
            raise KeyboardInterrupt


def line(rec: dict[str, Any]) -> str:
    when = datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).astimezone()
    attempt = f"#{rec['attempt']}" if "attempt" in rec else "  "
    from fleet.output import for_terminal

    # The transcript is the agent's output and its tools': shown, never acted on.
    text = f"{when:%H:%M:%S} {attempt:>3} {rec['event']:<11} {rec['message']}"
    return for_terminal(text, lines=True)


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new entries as they come.")
@click.option("-a", "--attempt", type=click.IntRange(min=1), help="Only this attempt.")
@click.option("-n", "--lines", type=click.IntRange(min=0), help="Only the last N entries.")
@click.option(
    "--cursor-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Start after the cursor saved in FILE, and save each printed entry's cursor there.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per entry.")
@pass_app
def logs(
    app: App,
    task_id: str,
    follow: bool,
    attempt: int | None,
    lines: int | None,
    cursor_file: Path | None,
    as_json: bool,
) -> None:
    """Print a task's transcript: every event of every attempt, from the journal.

    With --cursor-file, an interrupted `fleet logs -f` started again with the same file goes
    on exactly where it stopped, neither repeating nor skipping an entry.
    """
    from fleet.fsutil import write_atomic
    from fleet.proc import stream

    argv = ["journalctl", "--no-pager", "--all", "-o", "json"]
    if app.paths.scope == "user" and os.getuid() != 0:
        argv.append("--user")
    if cursor_file is not None and cursor_file.exists():
        cursor = cursor_file.read_text().strip()
        if not cursor:
            raise InputError(f"{cursor_file} is empty")
        argv.append(f"--after-cursor={cursor}")
    if lines is not None:
        argv.append(f"--lines={lines}")
    if follow:
        # Alone, journalctl --follow starts with the last 10 entries; --no-tail shows them all.
        argv += ["--follow"] if lines is not None else ["--follow", "--no-tail"]
    argv.append(f"FLEET_TASK_ID={task_id}")
    if attempt is not None:
        argv.append(f"FLEET_ATTEMPT={attempt}")
    out = sys.stdout
    uninterrupted = Uninterrupted()
    for raw in stream(argv):
        if not raw.startswith("{"):
            continue
        rec = entry(json.loads(raw))
        cursor = rec.pop("cursor")
        with uninterrupted:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n" if as_json else line(rec) + "\n")
            out.flush()
            if cursor_file is not None and cursor:
                write_atomic(cursor_file, cursor.encode(), durable=False)
