"""An attempt's events in its task directory (`events.jsonl`), for attempts outside journald.

Under systemd the journal holds the transcript. An attempt run by hand (`fleet-run ID` in a
terminal, no journal on its streams) also appends each entry to `tasks/<id>/events.jsonl`,
written by fleet-run and fleet-ask alike, so that `fleet logs ID` finds it. Invariants:
- a line is one record in the schema of `fleet logs --json` (time, message, attempt, event,
  and the optional fields), plus a `cursor` that names it uniquely, already redacted;
- a record is one write(2) to a file opened O_APPEND, so two writers never interleave lines;
- bounded: once the file holds MAX_BYTES it becomes `events.old.jsonl` (replacing the one
  before) and a new file begins, so a task keeps at most twice that;
- appending never fails the attempt: a record that cannot be written is dropped, and a line
  that cannot be read (cut short by a crash, say) is skipped.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE = "events.jsonl"
OLD = "events.old.jsonl"
MAX_BYTES = 8 << 20
CURSOR = "fleet-events:"  # a record's cursor: this, its time, the writer's pid and a serial

_serial = itertools.count()


class EventLog:
    """The writer of one task's events.jsonl."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE

    def append(self, record: dict[str, Any]) -> None:
        """Write `record` (time, message, attempt, event, …) with a cursor of its own."""
        cursor = f"{CURSOR}{record['time']}:{os.getpid()}.{next(_serial)}"
        line = json.dumps({**record, "cursor": cursor}, ensure_ascii=False) + "\n"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            # Unless another writer has just rotated it (the name is a new file by now).
            if st.st_size >= MAX_BYTES and os.stat(self.path).st_ino == st.st_ino:
                os.replace(self.path, self.path.with_name(OLD))
                os.close(fd)
                fd = os.open(self.path, flags, 0o600)
            os.write(fd, line.encode("utf-8"))
        except OSError:
            pass
        finally:
            os.close(fd)


def records(directory: Path, names: tuple[str, ...] = (OLD, FILE)) -> list[dict[str, Any]]:
    """The records kept for a task (in `names`), oldest first."""
    found: list[dict[str, Any]] = []
    for name in names:
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with open(fd, encoding="utf-8", errors="replace") as f:
            found += parse(f.read())
    return found


def after(found: list[dict[str, Any]], cursor: str | None) -> list[dict[str, Any]]:
    """The records of `found` after the one whose cursor is `cursor` (all without one; once
    that record was rotated away, those of a later time)."""
    if cursor is None:
        return found
    for i, record in enumerate(found):
        if record.get("cursor") == cursor:
            return found[i + 1 :]
    when = cursor.removeprefix(CURSOR).rsplit(":", 1)[0]
    return [r for r in found if str(r.get("time", "")) > when]


def parse(text: str) -> Iterator[dict[str, Any]]:
    """The records of complete, readable lines of `text`."""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            return  # being written, or cut short
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("time"), str):
            yield record


class Tail:
    """Follows a task's events.jsonl as it grows, across rotations: the first `new` returns
    what the file holds (not events.old.jsonl), each later one what was written since."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self._fd: int | None = None
        self._rest = b""
        self._open()

    def _open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def _drain(self) -> list[dict[str, Any]]:
        assert self._fd is not None
        data = b""
        while chunk := os.read(self._fd, 1 << 16):
            data += chunk
        complete, newline, self._rest = (self._rest + data).rpartition(b"\n")
        return list(parse((complete + newline).decode("utf-8", "replace")))

    def new(self) -> list[dict[str, Any]]:
        """The records written since the last call."""
        found: list[dict[str, Any]] = []
        if self._fd is not None:
            found = self._drain()
            try:
                moved = os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
            except OSError:
                moved = True
            if not moved:
                return found
            os.close(self._fd)
            self._rest = b""
        self._open()  # the file begun since (created, or after a rotation)
        return found + (self._drain() if self._fd is not None else [])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
