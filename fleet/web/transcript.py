"""A task's transcript for the browser: the last entries, then every new one as it comes.

Invariants:
- the entries are those of `fleet logs`: the task's journal entries (FLEET_TASK_ID) and the
  records of attempts run by hand (tasks/ID/events.jsonl, fleet.eventlog), merged by time;
- a `Position` is where a reader stands in both: the journal cursor and the event log cursor
  of the last entry it has, written `JOURNAL FILE` (`-` for none) as the SSE event id, so a
  browser that reconnects (Last-Event-ID) or reloads (the page's own position) goes on after
  exactly that entry: no gap, no repeat;
- following never polls: `journalctl --follow` (through fleet.proc) and an inotify watch of
  the task's directory are read by the event loop when they have something, and both stop
  when the stream ends or the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from fleet.errors import FleetError
from fleet.paths import Paths

BACKLOG = 500  # entries a page shows when it opens (fleet logs ID has them all)


class Position(NamedTuple):
    journal: str | None = None
    file: str | None = None

    def text(self) -> str:
        return f"{self.journal or '-'} {self.file or '-'}"

    @classmethod
    def parse(cls, text: str | None) -> Position:
        """The position an event id (or the page's `after`) names; empty if it names none."""
        parts = (text or "").split()
        if len(parts) != 2 or any("\n" in p or len(p) > 500 for p in parts):
            return cls()
        journal, file = (None if p == "-" else p for p in parts)
        return cls(journal, file)

    def after(self, record: dict[str, Any]) -> Position:
        from fleet import eventlog

        cursor = record.get("cursor")
        if not isinstance(cursor, str):
            return self
        if cursor.startswith(eventlog.CURSOR):
            return self._replace(file=cursor)
        return self._replace(journal=cursor)


def _argv(
    paths: Paths, task_id: str, lines: int | None, follow: bool, cursor: str | None
) -> list[str]:
    from fleet import systemd
    from fleet.cli.logs import journal_argv
    from fleet.config import load_or_last_good

    # As `fleet logs`: a central journal-remote's files when journal_dir names them.
    remote = load_or_last_good(paths).get_str("journal_dir")
    return journal_argv(systemd.scope_for(paths), task_id, None, lines, follow, cursor, remote)


def backlog(
    paths: Paths, task_id: str, limit: int = BACKLOG
) -> tuple[list[dict[str, Any]], Position, bool]:
    """The last `limit` entries, the position after the newest of each source, and whether
    older entries were left out."""
    import heapq

    from fleet import eventlog, taskdir
    from fleet.cli.logs import entry
    from fleet.proc import run

    journal: list[dict[str, Any]] = []
    try:
        out = run(_argv(paths, task_id, limit + 1, False, None), check=False, timeout=20).stdout
        journal = [entry(json.loads(line)) for line in out.splitlines() if line.startswith("{")]
    except FleetError:
        pass  # no journal here: the event log alone
    by_hand = eventlog.records(taskdir.task_dir(paths, task_id))
    merged = list(heapq.merge(journal, by_hand, key=lambda r: str(r["time"])))
    position = Position()
    for record in merged:
        position = position.after(record)
    return merged[-limit:], position, len(merged) > limit


async def follow(
    paths: Paths, task_id: str, start: Position, stopping: asyncio.Future[Any] | None = None
) -> AsyncIterator[tuple[list[dict[str, Any]], Position]]:
    """Every entry after `start`, in batches as they come, with the position after each
    batch; ends when `stopping` is done (the server stops) or the caller stops reading."""
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    from fleet import eventlog, taskdir
    from fleet.cli.logs import entry, kept
    from fleet.paths import ensure_dir
    from fleet.proc import reading

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    directory = taskdir.task_dir(paths, task_id)
    position = start
    with contextlib.ExitStack() as stack:
        inotify = stack.enter_context(contextlib.closing(INotify()))
        with contextlib.suppress(OSError, FleetError):
            mask = iflags.MODIFY | iflags.CREATE | iflags.MOVED_TO | iflags.CLOSE_WRITE
            inotify.add_watch(ensure_dir(directory), mask)
        tail = eventlog.Tail(directory)
        stack.callback(tail.close)
        first = eventlog.records(directory, (eventlog.OLD,)) + tail.new()
        found = kept(first, start.file, None, None)

        def file_readable() -> None:
            inotify.read(timeout=0)
            new = tail.new()
            if new:
                queue.put_nowait(new)

        loop.add_reader(inotify.fileno(), file_readable)
        stack.callback(loop.remove_reader, inotify.fileno())
        try:
            proc = stack.enter_context(reading(_argv(paths, task_id, None, True, start.journal)))
        except FleetError:
            proc = None
        if proc is not None and proc.stdout is not None:
            fd = proc.stdout.fileno()
            os.set_blocking(fd, False)
            rest = [b""]

            def journal_readable() -> None:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    return
                if not chunk:
                    loop.remove_reader(fd)  # journalctl ended: the event log goes on
                    return
                *complete, rest[0] = (rest[0] + chunk).split(b"\n")
                records = [
                    entry(json.loads(raw.decode("utf-8", "replace")))
                    for raw in complete
                    if raw.startswith(b"{")
                ]
                if records:
                    queue.put_nowait(records)

            loop.add_reader(fd, journal_readable)
            stack.callback(_forget, loop, fd)
        if found:
            for record in found:
                position = position.after(record)
            yield found, position
        while True:
            getting = asyncio.ensure_future(queue.get())
            waits: set[asyncio.Future[Any]] = {getting}
            if stopping is not None:
                waits.add(stopping)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                return
            batch = getting.result()
            while not queue.empty():
                batch += queue.get_nowait()
            batch.sort(key=lambda r: str(r["time"]))
            for record in batch:
                position = position.after(record)
            yield batch, position


def _forget(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(fd)
