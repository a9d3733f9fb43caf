"""Store-level claimers, one way for every test and benchmark that races them: `drain` (claim
one task at a time until none is left) and `safety` (the double claims and lost tasks of a
drained queue, from its store and from what the claimers got). Run as a script, a claimer
process of one host (tests/multihost.py: `Host.spawn`) for the many-claimers test and
benchmark, claiming in the name of the host it runs on (fleet.host.owner(), the machine's
node name).

The script's protocol on its standard streams, so that every claimer starts together and the
caller needs no sleep: it opens the store (FLEET_STORE, else FLEET_HOME's), prints `ready`,
waits for one line on standard input, drains, and prints the JSON list of the ids it got.
Anything wrong is a traceback on standard error and a non-zero exit.

    python tests/claimer.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from fleet.host import owner
from fleet.paths import resolve
from fleet.store import Store, open_store

LEASE_S = 3600
# Each task's attempt rows, and the tasks not running, of a drained queue.
ATTEMPTS_SQL = (
    "SELECT t.id, count(a.task) FROM tasks t LEFT JOIN attempts a ON a.task = t.id GROUP BY t.id"
)
IDLE_SQL = "SELECT id FROM tasks WHERE status != 'running'"


def drain(
    store: Store,
    me: str,
    coder: str = "command",
    lease_s: float = LEASE_S,
    boot: str | None = None,
) -> list[str]:
    """Claim one task at a time as host `me` until none is left: the ids got, in order."""
    got: list[str] = []
    while tasks := store.claim(1, me, lease_s, coder, None, boot):
        got.extend(t.id for t in tasks)
    return got


def tally(attempts: dict[str, int], idle: set[str], got: Sequence[str]) -> tuple[int, int]:
    """(double claims, lost tasks) from each task's attempt rows, the tasks not running and
    the ids the claimers were handed. A task claimed k > 1 times counts k - 1, where k is the
    larger of its attempt rows and the number of claimers it was handed to (the two views of
    one double claim are not added). A task is lost if it has no attempt row, is not running,
    or was handed to no claimer."""
    handed = Counter(got)
    double = sum(max(attempts.get(t, 0), handed[t], 1) - 1 for t in attempts.keys() | handed)
    lost = {t for t, k in attempts.items() if k == 0 or handed[t] == 0} | idle
    return double, len(lost)


def safety(rows: Callable[[str], Sequence[Sequence[Any]]], got: Sequence[str]) -> tuple[int, int]:
    """`tally` of a drained queue whose store `rows` reads (SQL -> rows, bypassing fleet)."""
    attempts = {str(t): int(k) for t, k in rows(ATTEMPTS_SQL)}
    return tally(attempts, {str(r[0]) for r in rows(IDLE_SQL)}, got)


def main() -> int:
    store = open_store(resolve())
    try:
        me = owner()
        print("ready", flush=True)
        if not sys.stdin.readline():
            raise SystemExit("claimer: no start line on standard input")
        got = drain(store, me)
    finally:
        store.close()
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
