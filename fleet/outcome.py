"""The outcome file of an attempt: what fleet-run saw, for fleet-reap to classify.

`tasks/<id>/outcome.json` is written atomically once per attempt, tagged with the attempt
number and systemd's invocation id, so the reaper never mistakes an older attempt's file for
the current one. A runner that dies before writing it leaves the previous file (or none), and
the reaper then knows the attempt was lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from fleet.fsutil import write_atomic

FILE = "outcome.json"
LEASE_LOST = "lease-lost"  # stopped_by: the runner's claim may have run out (fleet.run)


class Outcome(NamedTuple):
    task: str
    attempt: int
    invocation: str
    # success, failure, killed, rate-limited, context-pressure, budget, refused, error,
    # unstartable (the coder's program cannot be started)
    verdict: str
    reason: str = ""
    exit_status: int | None = None
    signal: str | None = None
    stopped_by: str | None = None  # kill-file, signal, lease-lost
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    session: str | None = None
    closes_on_success: bool = False
    resets_at: float | None = None  # rate-limited: when the provider's window resets
    # The attempt's own spend (fleet.usage): cached tokens, where the cost came from, the main
    # model, tokens and cost by model, and what the CLI said of its whole session.
    cache_read: int | None = None
    cache_write: int | None = None
    cost_source: str | None = None
    model: str | None = None
    usage: list[dict[str, Any]] | None = None
    session_totals: dict[str, Any] | None = None


def write(task_dir: Path, outcome: Outcome) -> None:
    data = json.dumps(outcome._asdict(), ensure_ascii=False, indent=1) + "\n"
    write_atomic(task_dir / FILE, data.encode("utf-8"))


def read(task_dir: Path) -> Outcome | None:
    try:
        obj = json.loads((task_dir / FILE).read_text(encoding="utf-8"))
        return Outcome(**obj)
    except (OSError, ValueError, TypeError):
        return None
