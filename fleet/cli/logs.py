"""`fleet logs`: a task's transcript from the journal (and the event logs of attempts run by
hand, fleet.eventlog), across attempts, optionally followed."""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from fleet.cli.app import TASK, App, cli, count, pass_app
from fleet.errors import ConfigError, FleetError, InputError, NotFound

if TYPE_CHECKING:
    from fleet.paths import Scope

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


class Cursors(NamedTuple):
    """Where a `--cursor-file` says to go on: in the journal, and in the task's event log."""

    journal: str | None = None
    file: str | None = None

    @classmethod
    def load(cls, path: Path | None) -> Cursors:
        from fleet import eventlog

        if path is None or not path.exists():
            return cls()
        lines = path.read_text().split()
        if not lines:
            raise InputError(f"{path} is empty")
        files = [x for x in lines if x.startswith(eventlog.CURSOR)]
        journals = [x for x in lines if not x.startswith(eventlog.CURSOR)]
        return cls(journals[-1] if journals else None, files[-1] if files else None)

    def text(self) -> str:
        return "".join(c + "\n" for c in self if c)


class Printer:
    """Prints records (as lines or JSON), saving each one's cursor in the cursor file if any."""

    def __init__(self, as_json: bool, cursor_file: Path | None, saved: Cursors) -> None:
        self.as_json = as_json
        self.cursor_file = cursor_file
        self.saved = saved
        self.uninterrupted = Uninterrupted()

    def __call__(self, rec: dict[str, Any], source: str) -> None:
        from fleet.fsutil import write_atomic

        cursor = rec.pop("cursor", None)
        out = sys.stdout
        with self.uninterrupted:
            out.write(
                json.dumps(rec, ensure_ascii=False) + "\n" if self.as_json else line(rec) + "\n"
            )
            out.flush()
            if self.cursor_file is not None and cursor:
                self.saved = self.saved._replace(**{source: cursor})
                write_atomic(self.cursor_file, self.saved.text().encode(), durable=False)


def journal_argv(
    scope: Scope,
    task_id: str,
    attempt: int | None,
    lines: int | None,
    follow: bool,
    cursor: str | None,
    directory: str = "",
) -> list[str]:
    """journalctl's arguments for the task's entries: in `directory`'s journal files (the
    journal_dir setting: what a central systemd-journal-remote received) if there is one, else
    in `scope`'s journal on this host."""
    argv = ["journalctl", "--no-pager", "--all", "-o", "json"]
    if directory:
        argv.append(f"--directory={directory}")
    elif scope == "user" and os.getuid() != 0:
        argv.append("--user")
    if cursor is not None:
        argv.append(f"--after-cursor={cursor}")
    if lines is not None:
        argv.append(f"--lines={lines}")
    if follow:
        # Alone, journalctl --follow starts with the last 10 entries; --no-tail shows them all.
        argv += ["--follow"] if lines is not None else ["--follow", "--no-tail"]
    argv.append(f"FLEET_TASK_ID={task_id}")
    if attempt is not None:
        argv.append(f"FLEET_ATTEMPT={attempt}")
    return argv


def kept(
    found: list[dict[str, Any]], cursor: str | None, attempt: int | None, lines: int | None
) -> list[dict[str, Any]]:
    """The event log's records to print: after the cursor, of the attempt, the last `lines`."""
    from fleet import eventlog

    found = [r for r in eventlog.after(found, cursor) if attempt in (None, r.get("attempt"))]
    return found[-lines:] if lines else [] if lines == 0 else found


def journal_records(argv: list[str]) -> Iterator[dict[str, Any]]:
    from fleet.proc import stream

    for raw in stream(argv):
        if raw.startswith("{"):
            yield entry(json.loads(raw))


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new entries as they come.")
@click.option("-a", "--attempt", type=count(), help="Only this attempt.")
@click.option("-n", "--lines", type=count(0), help="Only the last N entries.")
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
    """Print a task's transcript: every event of every attempt, from the journal, and for an
    attempt run by hand outside journald (`fleet-run ID` in a terminal), from the events.jsonl
    it left in the task's directory.

    With --cursor-file, an interrupted `fleet logs -f` started again with the same file goes
    on exactly where it stopped, neither repeating nor skipping an entry.
    """
    from fleet import eventlog, taskdir

    saved = Cursors.load(cursor_file)
    directory = taskdir.task_dir(app.paths, task_id)
    remote = app.config.get_str("journal_dir")
    if remote:
        _check_journal_dir(remote)
    argv = journal_argv(app.paths.scope, task_id, attempt, lines, follow, saved.journal, remote)
    printer = Printer(as_json, cursor_file, saved)
    if follow:
        _follow(argv, directory, saved.file, attempt, lines, printer)
        return
    by_hand = kept(eventlog.records(directory), saved.file, attempt, lines)
    journal = journal_records(argv)
    try:
        first = next(journal, None)  # journalctl starts here
    except FleetError:
        if not by_hand:
            raise
        first, journal = None, iter(())
    both = heapq.merge(
        itertools.chain([first] if first else [], journal), by_hand, key=lambda r: r["time"]
    )
    printed = 0
    for rec in collections.deque(both, maxlen=lines) if lines is not None and by_hand else both:
        printer(rec, "file" if str(rec.get("cursor")).startswith(eventlog.CURSOR) else "journal")
        printed += 1
    if not printed and lines != 0 and cursor_file is None:
        _nothing(app, task_id, attempt, remote)


def _nothing(app: App, task_id: str, attempt: int | None, remote: str) -> None:
    """Nothing to print: an error when the transcript is elsewhere, not an empty one.

    Silence would read as "the task printed nothing", when most often the task ran on another
    host, whose journal this one cannot read, or that host has not uploaded it (yet)."""
    from fleet import host

    which = f"attempt {attempt} of task {task_id}" if attempt else f"task {task_id}"
    try:
        ran_on = app.store.get(task_id).host
    except FleetError:
        ran_on = None  # what the store cannot say changes only the message
    if remote:
        raise NotFound(
            f"journal_dir {remote} holds no entries of {which}"
            + (f", which ran on {ran_on}" if ran_on else ""),
            hint="the host that ran it uploads its journal with systemd-journal-upload"
            " (fleet setup --journal-upload URL); `systemctl status systemd-journal-upload`"
            " there says whether it runs",
        )
    if ran_on and ran_on != host.owner():
        raise NotFound(
            f"this host's journal holds no entries of {which}: it ran on {ran_on}",
            hint=f"run fleet logs on {ran_on}, or set journal_dir to the directory where a"
            " central systemd-journal-remote keeps every host's journal (TRANSCRIPTS ACROSS"
            " HOSTS in fleet(1))",
        )


def _check_journal_dir(remote: str) -> None:
    """journal_dir is a directory this user may read (journalctl alone would say only that
    it found no journal files)."""
    if not os.path.isdir(remote):
        raise ConfigError(
            f"journal_dir {remote} is not a directory",
            hint="set it to where systemd-journal-remote writes (its --output), or unset it:"
            " fleet config unset journal_dir",
        )
    if not os.access(remote, os.R_OK | os.X_OK):
        raise ConfigError(
            f"journal_dir {remote} cannot be read by this user",
            hint="journal-remote's files belong to systemd-journal-remote: join its group"
            " (or systemd-journal), or run fleet logs as root",
        )
    # journalctl --follow on a directory without journal files exits at once, as if the
    # transcript had ended: say what is missing instead.
    if not any(Path(remote).glob("*.journal*")):
        raise NotFound(
            f"journal_dir {remote} holds no journal files: no host has uploaded to it yet",
            hint="fleet setup --system --journal-upload URL on each host, URL naming the"
            " systemd-journal-remote that writes there",
        )


def _follow(
    argv: list[str],
    directory: Path,
    cursor: str | None,
    attempt: int | None,
    lines: int | None,
    printer: Printer,
) -> None:
    """What there is, then each new entry of the journal and of the event log as it comes."""
    import selectors

    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    from fleet import eventlog
    from fleet.paths import ensure_dir
    from fleet.proc import reading

    sel = selectors.DefaultSelector()
    inotify = INotify()
    mask = iflags.MODIFY | iflags.CREATE | iflags.MOVED_TO | iflags.CLOSE_WRITE
    # Watched even before a first attempt made it (where a person may create it).
    with contextlib.suppress(OSError, FleetError):
        inotify.add_watch(ensure_dir(directory), mask)
        sel.register(inotify.fileno(), selectors.EVENT_READ, "file")
    tail = eventlog.Tail(directory)
    try:
        backlog = eventlog.records(directory, (eventlog.OLD,)) + tail.new()
        for rec in kept(backlog, cursor, attempt, lines):
            printer(rec, "file")
        with contextlib.ExitStack() as stack:
            try:
                proc = stack.enter_context(reading(argv))
            except FleetError:
                if not sel.get_map():
                    raise  # no journalctl, and no event log to follow either
                proc = None
            if proc is not None and proc.stdout is not None:
                sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "journal")
            rest = b""
            while True:
                for key, _ in sel.select():
                    if key.data == "file":
                        inotify.read(timeout=0)
                        for rec in tail.new():
                            if attempt in (None, rec.get("attempt")):
                                printer(rec, "file")
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        return  # journalctl ended
                    *complete, rest = (rest + chunk).split(b"\n")
                    for raw in complete:
                        if raw.startswith(b"{"):
                            printer(entry(json.loads(raw.decode("utf-8", "replace"))), "journal")
    finally:
        tail.close()
        sel.close()
        inotify.close()
