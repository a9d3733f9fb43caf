"""The `replay` coder: plays back a recorded stream of fleet events, with its timing.

The task's description names a JSON-lines file (relative to the task's directory). Each line is
printed as the agent's output, except directives, which the player carries out instead:
`{"sleep": SECONDS}`, `{"exit": STATUS}`, `{"run": [ARGV...]}` (e.g. `fleet close`), and
`{"ignore": "TERM"}` (ignore a signal from then on); `$VARS` in `run` arguments are
expanded. Printed lines are parsed as the JSON events
that `fleet-run` itself prints: `{"event": KIND, "text": …, "tool": …, "tokens_in": …}`. It
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

from fleet.coders.base import Coder, Event, Kind, RunSpec

_TEXT = ("text", "tool", "session", "rate_status", "limit_type")
_INT = ("tokens_in", "tokens_out", "context")
_REAL = ("cost", "resets_at", "utilization")


class ReplayCoder(Coder):
    name = "replay"
    default_binary = sys.executable

    def argv(self, run: RunSpec) -> list[str]:
        path = (run.description or run.title).strip().splitlines()[0]
        return [self.binary, "-m", "fleet.coders.replay", *self.settings.args, path]

    def parse(self, line: str) -> Sequence[Event]:
        return parse_event(line)


def parse_event(line: str) -> Sequence[Event]:
    """A fleet event line back into an Event; anything else is a `raw` event."""
    try:
        obj = json.loads(line)
    except ValueError:
        return (Event(Kind.RAW, line),)
    if not isinstance(obj, dict) or obj.get("event") not in Kind.__members__.values():
        return (Event(Kind.RAW, line),)
    values: dict[str, Any] = {"is_error": obj.get("is_error") is True}
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
