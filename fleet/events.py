"""Where an attempt's events go: journald entries under systemd, JSON lines in a terminal.

Invariant: every event passes through `Sink.emit` exactly once and is redacted there, before it
is written anywhere. Under journald each event is one entry with a readable MESSAGE (so that
`journalctl -u fleet-task@ID` reads as a transcript) and FLEET_* fields; in a terminal it is one
JSON object per line (without the raw line) in the shape the replay coder reads back, and, when
the Sink has an event log (fleet.eventlog), a record of `fleet logs` there. That echo on the
terminal is a courtesy: a reader that went away (`fleet-run ID | head -1`) or a full disk under
a redirection ends the echo on that stream, never the attempt, whose records go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping
from typing import NamedTuple, TextIO

from fleet.coders.base import Event, Kind
from fleet.eventlog import EventLog
from fleet.journal import Journal, Value, encode
from fleet.redact import Redactor
from fleet.timeutil import now_iso

MAX_MESSAGE = 64 << 10
# Event attributes written when set: as FLEET_<NAME> journal fields, or JSON keys.
OPTIONAL = (
    "tool",
    "session",
    "tokens_in",
    "tokens_out",
    "cost",
    "context",
    "rate_status",
    "resets_at",
    "utilization",
    "limit_type",
)
_JOURNAL_NAMES = tuple((name, f"FLEET_{name.upper()}") for name in OPTIONAL)
PRIORITY = {Kind.ERROR: 3, Kind.RATE_LIMIT: 4, Kind.RETRY: 4, Kind.RAW: 6}
# MESSAGE_IDs of lifecycle entries, explained by the catalog (systemd/fleet.catalog).
MSG_STARTED = "ff162ac1b9fe420e8fea69f54c0b0a1c"
MSG_ENDED = "7343cb85b5de44e6ab65578c11f6d67f"
MSG_REFUSED = "b473d560933a497d9ca056071cfba65a"
MSG_QUESTION = "5ad0b37d1e4b4e3c9c3f0e55a1a7c2d1"  # written by fleet-ask
MSG_ANSWER = "c0e8e02ee8a94a4e8f6a3a1b6f1d9b47"


_silenced: set[int] = set()  # the file descriptors whose echo has ended


def echo(stream: TextIO, text: str) -> None:
    """Write `text` on the runner's standard output or error, unless that echo has ended."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    if fd in _silenced:
        return
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        _silenced.add(fd)
        # What is still buffered, and every later write, goes to /dev/null instead, so that
        # neither a later event nor the interpreter's last flush fails on it again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        with contextlib.suppress(OSError):
            stream.flush()


class Context(NamedTuple):
    task: str
    attempt: int
    coder: str
    model: str | None


def message(event: Event) -> str:
    text = event.text
    if event.kind == Kind.TOOL_CALL:
        text = f"→ {event.tool or 'tool'}: {text}" if text else f"→ {event.tool or 'tool'}"
    elif event.kind == Kind.TOOL_RESULT:
        text = f"← {text}"
    elif event.kind == Kind.USAGE:
        text = text or f"tokens in {event.tokens_in} out {event.tokens_out}"
    elif event.kind == Kind.ERROR:
        text = f"error: {text}"
    elif event.kind == Kind.RESULT:
        text = f"result ({'error' if event.is_error else 'ok'}): {text}".rstrip(": ")
    elif event.kind == Kind.SESSION:
        text = text or f"session {event.session}"
    return text[:MAX_MESSAGE]


class Sink:
    def __init__(
        self,
        ctx: Context,
        redact: Redactor,
        journal: Journal | None,
        log: EventLog | None = None,
    ) -> None:
        self.ctx = ctx
        self.redact = redact
        self.journal = journal
        self.log = log  # off journald: where `fleet logs` finds the events
        self.count = 0
        self._raw: tuple[str, str] = ("", "")  # the last raw line and its redacted form
        # Per event kind, the encoded fields its entries share (ctx is fixed for a Sink's life).
        self._heads: dict[Kind, bytes] = {}

    def _redact_raw(self, raw: str) -> str:
        # A line often yields several events (text and usage, say): redact it once.
        if self._raw[0] is not raw:
            self._raw = (raw, self.redact(raw))
        return self._raw[1]

    def _head(self, kind: Kind) -> bytes:
        # These fields depend only on the attempt and the kind: encoded once, not per entry.
        fields: dict[str, Value] = {
            "PRIORITY": PRIORITY.get(kind, 6),
            "SYSLOG_IDENTIFIER": "fleet-run",
            "FLEET_TASK_ID": self.ctx.task,
            "FLEET_ATTEMPT": self.ctx.attempt,
            "FLEET_EVENT": str(kind),
            "FLEET_CODER": self.ctx.coder,
        }
        if self.ctx.model:
            fields["FLEET_MODEL"] = self.ctx.model
        head = self._heads[kind] = encode(fields)
        return head

    def emit(self, event: Event, raw: str | None) -> None:
        self.count += 1
        msg = self.redact(message(event))
        if self.journal is None:
            obj: dict[str, object] = {"event": str(event.kind), "text": self.redact(event.text)}
            for name in OPTIONAL:
                value = getattr(event, name)
                if value is not None:
                    obj[name] = value
            if event.is_error:
                obj["is_error"] = True
            if event.calls:
                obj["calls"] = [c._asdict() for c in event.calls]
            echo(sys.stdout, json.dumps(obj, ensure_ascii=False) + "\n")
            if self.log is not None:
                extra = {k: v for k, v in obj.items() if k in OPTIONAL}
                self._record(str(event.kind), msg, extra)
            return
        fields: dict[str, Value] = {"MESSAGE": msg, "FLEET_SEQ": self.count}
        for name, field in _JOURNAL_NAMES:
            value = getattr(event, name)
            if value is not None:
                fields[field] = value
        if raw is not None and raw != event.text:
            fields["FLEET_RAW"] = self._redact_raw(raw)
        self.journal.send(fields, self._heads.get(event.kind) or self._head(event.kind))

    def lifecycle(self, message_id: str | None, text: str, extra: Mapping[str, Value] = {}) -> None:
        """An entry about the attempt itself (started, ended: explained by the catalog under
        their MESSAGE_ID; a note such as the worktree used has none)."""
        if self.journal is None:
            from fleet.output import for_terminal

            echo(sys.stderr, for_terminal(f"fleet-run: {text}", lines=True) + "\n")
            self._record("lifecycle", text)
            return
        self.journal.send(
            {
                "MESSAGE": text,
                **({"MESSAGE_ID": message_id} if message_id else {}),
                "PRIORITY": 5,
                "SYSLOG_IDENTIFIER": "fleet-run",
                "FLEET_TASK_ID": self.ctx.task,
                "FLEET_ATTEMPT": self.ctx.attempt,
                "FLEET_EVENT": "lifecycle",
                "FLEET_CODER": self.ctx.coder,
                **extra,
            }
        )

    def _record(self, kind: str, text: str, extra: Mapping[str, object] = {}) -> None:
        """The entry as `fleet logs` shows it, in the event log (if there is one)."""
        if self.log is None:
            return
        record: dict[str, object] = {
            "time": now_iso(),
            "message": text,
            "attempt": self.ctx.attempt,
            "event": kind,
            **extra,
            "coder": self.ctx.coder,
        }
        if self.ctx.model:
            record["model"] = self.ctx.model
        self.log.append(record)
