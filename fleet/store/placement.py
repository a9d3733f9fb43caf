"""The SQL of where a task may run (fleet.affinity), in pieces a claim adds to its WHERE.

Invariants:
- a host claims a task only if the task names no host or this one (`tasks.pinned_host`), and needs
  no label this host does not advertise (`tasks.needs` within the host's labels, compared by
  the dialect's JSON containment);
- a host never claims a task whose directory it lacks: the claim checks each task it takes
  on the claiming host, and if one's directory is missing there the whole claim is undone,
  the lack recorded (`cwd_missing`: task, host, the directory, since when) and the claim made
  again, passing over the tasks recorded, so the tasks behind them are not starved;
- a record holds only for the directory it names (an edited cwd is looked for anew) until
  the host finds the directory again (`SQLStore.recheck_missing`, once per dispatch pass).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from fleet.store.dialect import Dialect

# How many claimable tasks a host looks at ahead of a claim that met a missing directory, so
# that a long run of such tasks costs one more claim, not one per task.
LOOK_AHEAD = 200
# How often a claim is made again after meeting missing directories; each time records at
# least one more, and the look-ahead most of them.
ROUNDS = 20


def host_and_needs(d: Dialect, t: str = "t") -> str:
    """Binds (host name, the host's labels as `labels_arg` gives them)."""
    return (
        f"({t}.pinned_host IS NULL OR {t}.pinned_host = ?)"
        f" AND ({t}.needs IS NULL OR {d.json_within(f'{t}.needs', '?')})"
    )


def not_missing(t: str = "t") -> str:
    """Binds (host name): the task's directory is not recorded as missing on the host."""
    return (
        f"NOT EXISTS (SELECT 1 FROM cwd_missing m WHERE m.task = {t}.id AND m.host = ?"
        f" AND m.cwd = {t}.cwd)"
    )


def labels_arg(labels: Iterable[str]) -> str:
    return json.dumps(sorted(set(labels)))


def needs_value(needs: Sequence[str]) -> str | None:
    """What `tasks.needs` holds: NULL for none (most tasks), which the claim's filter passes
    without parsing any JSON."""
    return json.dumps(list(needs), separators=(",", ":")) if needs else None


class Missing(Exception):
    """A claim took tasks whose directories are missing on this host: (task, cwd) pairs."""

    def __init__(self, found: list[tuple[str, str]]) -> None:
        super().__init__(found)
        self.found = found


def lacking(rows: Iterable[tuple[Any, ...]]) -> list[tuple[str, str]]:
    """The (task, cwd) of `rows` (task, cwd, ...) whose directory is not here, each directory
    looked at once."""
    here: dict[str, bool] = {}
    out = []
    for task_id, cwd, *_ in rows:
        if cwd not in here:
            here[cwd] = os.path.isdir(cwd)
        if not here[cwd]:
            out.append((str(task_id), str(cwd)))
    return out
