"""What several hosts on one queue add to a host's work, SQLite beside PostgreSQL in one run.

Why: every dispatch pass now writes its host's heartbeat, every lease renewal refreshes the
host's last_seen in the same transaction, and every pass looks for other hosts' orphaned claims
(issue 14). Each is timed in-process on its store, median of RUNS: the heartbeat; a renewal of
one of RUNNING claims; and the search for orphans among CLAIMS claims held by 3 hosts, one of
them silent with its leases run out (the answer is checked: the silent host's claims, no
other). No targets: these are costs to keep small beside a claim's.

PostgreSQL is a cluster of this benchmark's own (tests/pg.py), a new database per store.
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter

from fleet.model import TaskSpec
from fleet.store.hosts import HostInfo
from tests.bench.bench_backends import BACKENDS, Stores, opened, rows
from tests.bench.common import Options, ratio, report, scratch_dir

NAME = "hosts"
CLAIMS = 3_000
RUNS = 50
HOSTS = ("alive-1", "alive-2", "silent")
DEAD_AFTER = 300.0
LONG_AGO = "2000-01-01T00:00:00.000Z"


def _sql(env: dict[str, str], sql: str) -> None:
    """`sql` run straight on the store's database (committed), bypassing fleet."""
    if env.get("FLEET_STORE"):
        import psycopg

        with psycopg.connect(env["FLEET_STORE"], autocommit=True) as conn:
            conn.execute(sql.encode())
        return
    import sqlite3

    db = sqlite3.connect(Path(env["FLEET_HOME"]) / "fleet.db")
    try:
        db.execute(sql)
        db.commit()
    finally:
        db.close()


def one_backend(stores: Stores, backend: str, n: int, runs: int, cwd: str) -> dict[str, float]:
    env = stores.new(backend)
    medians: dict[str, float] = {}
    with opened(env) as store:
        for name in HOSTS:
            store.heartbeat(HostInfo(name, None, None, (), 4), DEAD_AFTER)
        store.add([TaskSpec(title=f"bench task {i}", cwd=cwd) for i in range(n)])
        per_host = n // len(HOSTS)
        for name in HOSTS:
            lease = -1 if name == "silent" else 3600
            store.claim(per_host, name, lease, "claude", None)
        _sql(env, f"UPDATE hosts SET last_seen = '{LONG_AGO}' WHERE name = 'silent'")
        held = [t.id for t in store.claims("alive-1")]
        info = HostInfo("alive-1", None, None, ("gpu",), 4)

        def timed(label: str, call: object) -> None:
            samples = []
            for i in range(runs):
                start = perf_counter()
                call(i)  # type: ignore[operator]
                samples.append((perf_counter() - start) * 1000)
            medians[label] = report(f"{label}, {backend}", samples, "ms")

        timed("heartbeat of a dispatch pass", lambda i: store.heartbeat(info, DEAD_AFTER))
        timed(
            "lease renewal with its host's last_seen",
            lambda i: store.renew(held[i % len(held)], "alive-1", 3600),
        )
        found: list[int] = []
        timed(
            f"orphaned claims among {per_host * len(HOSTS)} claims of {len(HOSTS)} hosts",
            lambda i: found.append(len(store.orphaned_claims("alive-2", DEAD_AFTER))),
        )
    silent = rows(env, "SELECT count(*) FROM tasks WHERE claimed_by = 'silent'")[0][0]
    if set(found) != {silent} or silent != per_host:
        raise RuntimeError(f"orphaned claims found {set(found)}, the silent host holds {silent}")
    return medians


def main(opts: Options) -> None:
    from tests.pg import Cluster

    n = opts.size(CLAIMS)
    runs = opts.runs(RUNS)
    cluster = Cluster()
    with scratch_dir(NAME) as tmp:
        try:
            cluster.start()
            cluster.make_template()
            stores = Stores(tmp, cluster)
            project = tmp / "project"
            project.mkdir()
            got = {b: one_backend(stores, b, n, runs, str(project)) for b in BACKENDS}
            label = "heartbeat of a dispatch pass"
            ratio(
                f"{label}, postgresql vs sqlite",
                got["postgresql"][label],
                got["sqlite"][label],
                "ms on PostgreSQL / on SQLite",
            )
        finally:
            cluster.stop()
