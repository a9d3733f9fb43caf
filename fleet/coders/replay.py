"""The `replay` coder: plays back a recorded stream of fleet events, with its timing.

The task's description names a JSON-lines file (relative to the task's directory). Each line is
printed as the agent's output, except directives, which the player carries out instead:
`{"sleep": SECONDS}`, `{"exit": STATUS}`, `{"run": [ARGV...]}` (e.g. `fleet close`), and
`{"ignore": "TERM"}` (ignore a signal from then on); `$VARS` in `run` arguments are
expanded. Printed lines are parsed as the JSON events
that `fleet-run` itself prints: `{"event": KIND, "text": …, "tool": …, "tokens_in": …}`, a
usage event's model calls in `calls` (each with its model and its own input, output, cache_read
and cache_write tokens, and optionally the cost the agent reported). It
exercises the whole runner with a real child process and no model, for tests and demos.

Run as a program (`python -m fleet.coders.replay FILE`) it is the player.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from fleet.coders.base import Call, Coder, CoderSettings, Event, Kind, RunSpec

_TEXT = ("text", "tool", "session", "rate_status", "limit_type")
_INT = ("tokens_in", "tokens_out", "context")
_REAL = ("cost", "resets_at", "utilization")


class ReplayCoder(Coder):
    name = "replay"
    default_binary = sys.executable

    def argv(self, run: RunSpec) -> list[str]:
        path = (run.description or run.title).strip().splitlines()[0]
        return [self.binary, "-m", "fleet.coders.replay", *self.settings.args, path]

    def __init__(self, settings: CoderSettings) -> None:
        super().__init__(settings)
        self._calls = 0

    def parse(self, line: str) -> Sequence[Event]:
        events = parse_event(line)
        if any(not c.id for e in events for c in e.calls):
            events = [e._replace(calls=tuple(self._numbered(c) for c in e.calls)) for e in events]
        return events

    def _numbered(self, call: Call) -> Call:
        """A call without an id is a call of its own, not one told again."""
        if call.id:
            return call
        self._calls += 1
        return call._replace(id=f"call-{self._calls}")


def parse_event(line: str) -> Sequence[Event]:
    """A fleet event line back into an Event; anything else is a `raw` event."""
    try:
        obj = json.loads(line)
    except ValueError:
        return (Event(Kind.RAW, line),)
    if not isinstance(obj, dict) or obj.get("event") not in Kind.__members__.values():
        return (Event(Kind.RAW, line),)
    values: dict[str, Any] = {"is_error": obj.get("is_error") is True, "calls": _calls(obj)}
    for name in _TEXT:
        value = obj.get(name)
        values[name] = value if isinstance(value, str) else "" if name == "text" else None
    for name in _INT:
        value = obj.get(name)
        values[name] = value if isinstance(value, int) and not isinstance(value, bool) else None
    for name in _REAL:
        value = obj.get(name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        values[name] = float(value) if number and value is not None else None
    return (Event(Kind(obj["event"]), **values),)


def _calls(obj: dict[str, Any]) -> tuple[Call, ...]:
    """`"calls": [{"model": M, "input": N, "output": N, "cache_read": N, "cache_write": N,
    "cost": X}, ...]`: model calls and their own tokens (an id, if given, names the call)."""
    found = obj.get("calls")
    if not isinstance(found, list):
        return ()
    calls = []
    for call in found:
        if not isinstance(call, dict):
            continue
        counts = {
            k: v
            for k in ("input", "output", "cache_read", "cache_write", "times")
            if isinstance(v := call.get(k), int) and not isinstance(v, bool) and v >= 0
        }
        cost = call.get("cost")
        priced = isinstance(cost, int | float) and not isinstance(cost, bool)
        model = call.get("model")
        calls.append(
            Call(
                str(call.get("id") or ""),
                model if isinstance(model, str) else None,
                cost=float(cost) if priced and cost is not None else None,
                **counts,
            )
        )
    return tuple(calls)


def play(path: str) -> int:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        lines = f.read().splitlines()
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and len(obj) == 1:
            ((key, value),) = obj.items()
            if key == "sleep":
                sys.stdout.flush()
                time.sleep(float(value))
                continue
            if key == "exit":
                sys.stdout.flush()
                return int(value)
            if key == "run":
                sys.stdout.flush()
                subprocess.run([os.path.expandvars(str(a)) for a in value], check=False)
                continue
            if key == "ignore":
                signal.signal(getattr(signal, f"SIG{value}"), signal.SIG_IGN)
                continue
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fleet.coders.replay FILE")
    os.environ.pop("NOTIFY_SOCKET", None)
    sys.exit(play(sys.argv[1]))
