"""A store-level claimer, run as a process of one host (tests/multihost.py: `Host.spawn`) by the
many-claimers test and benchmark: claims one task at a time, in the name of the host it runs on
(fleet.host.owner(), the machine's node name), until the queue is empty.

Protocol on its standard streams, so that every claimer starts together and the caller needs
no sleep: it opens the store (FLEET_STORE, else FLEET_HOME's), prints `ready`, waits for one
line on standard input, claims, and prints the JSON list of the ids it got. Anything wrong is a
traceback on standard error and a non-zero exit.

    python tests/claimer.py
"""

from __future__ import annotations

import json
import sys

from fleet.host import owner
from fleet.paths import resolve
from fleet.store import open_store

LEASE_S = 3600


def main() -> int:
    store = open_store(resolve())
    try:
        me = owner()
        got: list[str] = []
        print("ready", flush=True)
        if not sys.stdin.readline():
            raise SystemExit("claimer: no start line on standard input")
        while tasks := store.claim(1, me, LEASE_S, "command", None):
            got.extend(t.id for t in tasks)
    finally:
        store.close()
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
