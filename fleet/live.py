"""What a running attempt is doing right now: `$FLEET_HOME/live/ID.json`, one file per task.

Invariants:
- only the runner of the task's current attempt writes its file (temp then rename, without
  fsync: it is rewritten whenever the status line changes, and a crash loses only a moment of
  it); a reader sees a whole file or none;
- a file names its attempt, and a reader ignores one of another attempt than the task's;
- `fleet status` reads the files of running tasks, `fleet status --watch` watches the directory
  with inotify, and fleet-reap takes the spend of an attempt whose runner died without an
  outcome from its file, then removes it;
- beside them, `FLEET_HOME/claim.last` says what the last dispatch pass did (written by
  fleet-claim's pass at its end, whether it worked or failed).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from fleet.fsutil import write_atomic
from fleet.paths import Paths, ensure_dir

DIR = "live"
LAST_PASS = "claim.last"


def directory(paths: Paths) -> Path:
    return paths.home / DIR


def path(paths: Paths, task_id: str) -> Path:
    return directory(paths) / f"{task_id}.json"


def write(paths: Paths, task_id: str, figures: dict[str, Any]) -> None:
    """Replace the task's live figures; a full disk costs the display, never the attempt."""
    with contextlib.suppress(OSError):
        ensure_dir(directory(paths))
        data = json.dumps(figures, ensure_ascii=False).encode("utf-8")
        write_atomic(path(paths, task_id), data, durable=False)


def read(paths: Paths, task_id: str, attempt: int | None = None) -> dict[str, Any] | None:
    """The task's live figures (of `attempt`, if given), or None."""
    try:
        obj = json.loads(path(paths, task_id).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or (attempt is not None and obj.get("attempt") != attempt):
        return None
    return obj


def spent(paths: Paths, task_id: str, attempt: int) -> dict[str, Any]:
    """The attempt's spend as its live figures last had it, in the outcome file's names; empty
    if it published none."""
    figures = read(paths, task_id, attempt) or {}
    names = ("tokens_in", "tokens_out", "cost", "cache_read", "cache_write", "cost_source")
    found = {name: figures.get(name) for name in (*names, "model", "usage")}
    found["session"] = figures.get("session")
    return found


def remove(paths: Paths, task_id: str) -> None:
    with contextlib.suppress(OSError):
        path(paths, task_id).unlink()


def record_pass(paths: Paths, what: dict[str, Any]) -> None:
    """Note the dispatch pass that just ended (a failure to write it is no failure of the
    pass)."""
    from fleet.timeutil import now_iso

    data = json.dumps({"at": now_iso(), "error": None, **what}).encode()
    with contextlib.suppress(OSError):
        write_atomic(paths.home / LAST_PASS, data, durable=False)


def last_pass(paths: Paths) -> dict[str, Any] | None:
    """What the last dispatch pass did: at, started, recovered, running, error; or None."""
    try:
        found = json.loads((paths.home / LAST_PASS).read_bytes())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
