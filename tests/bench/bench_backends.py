"""SQLite beside PostgreSQL in one run: claims/s with 8 concurrent claimers, and `fleet ls --json`.

Why: the PostgreSQL store (issue 14) shares one queue between hosts, so its claimers contend
across processes without SQLite's file lock, and its listings travel over a connection. Targets
from the issue: >= 1,000 claims/s with 8 claimers over 10,000 tasks and 0 double claims; `fleet
ls --json` with 100,000 tasks <= 1.5 s. SQLite's figures, measured the same way, stand beside.

PostgreSQL is a cluster of this benchmark's own (tests/pg.py: Debian's server, a Unix socket in
a temporary directory, fsync off, so the figure is fleet's cost and not the disk's), each run in
a new database. Claimers are separate processes (multiprocessing, `spawn`), as on separate
hosts: 8 claimers as 3 hosts (claimer i claims as host i mod 3, with that host's boot id,
as the units of a host's dispatch passes would), each opens the store, reports ready and
waits for one start event; the clock runs from
that event until the last claimer reports the ids it got (claiming one task at a time until
none is left). Double claims are counted from the store (attempt rows per task) and from what
the claimers got; a task nobody holds at the end is lost. Median of 3 runs.

The listing fills the store through `Store.add()` in chunks of 5,000 (tasks shaped as in the
`ls` benchmark) and times the installed `fleet ls --json` as a fresh process, median of 5.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from tests.bench import bench_ls_json
from tests.bench.bench_claim import claimer, race
from tests.bench.common import (
    Options,
    figure,
    fleet_env,
    fleet_exe,
    note,
    ratio,
    report,
    scratch_dir,
    time_runs,
)
from tests.claimer import safety

NAME = "backends"
CLAIM_TASKS = 10_000
LS_TASKS = 100_000
CLAIMERS = 8
HOSTS = 3
RUNS = 3
LS_RUNS = 5
CHUNK = 5_000
CLAIM_TARGET = 1_000.0
LS_TARGET_S = 1.5
TIMEOUT_S = 600.0
BACKENDS = ("sqlite", "postgresql")


class Stores:
    """New, empty stores of either backend: a FLEET_HOME each, and for PostgreSQL a database."""

    def __init__(self, tmp: Path, cluster: Any) -> None:
        self.tmp = tmp
        self.cluster = cluster
        self.n = 0

    def new(self, backend: str) -> dict[str, str]:
        """The environment of a fleet that uses a new store of `backend`."""
        self.n += 1
        env = fleet_env(self.tmp / f"home-{self.n}")
        if backend == "postgresql":
            env["FLEET_STORE"] = self.cluster.new_database()
        return env


@contextmanager
def opened(env: dict[str, str]) -> Iterator[Any]:
    store = open_store(resolve(env=env), url=env.get("FLEET_STORE", ""))
    try:
        yield store
    finally:
        store.close()


def rows(env: dict[str, str], sql: str) -> list[tuple[Any, ...]]:
    """`sql` read straight from the store's database, bypassing fleet."""
    if env.get("FLEET_STORE"):
        import psycopg

        with psycopg.connect(env["FLEET_STORE"], autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(sql.encode()).fetchall()]
    db = sqlite3.connect(Path(env["FLEET_HOME"]) / "fleet.db")
    try:
        return [tuple(r) for r in db.execute(sql).fetchall()]
    finally:
        db.close()


def claim_once(stores: Stores, backend: str, n: int, cwd: str) -> tuple[float, int, int]:
    """(seconds, double claims, lost tasks) of CLAIMERS claimers draining `n` tasks."""
    env = stores.new(backend)
    with opened(env) as store:
        store.add([TaskSpec(title=f"bench task {i}", cwd=cwd) for i in range(n)])
    hosts = [(f"host{i % HOSTS}", f"boot-of-host{i % HOSTS}") for i in range(CLAIMERS)]
    seconds, claimed = race(claimer, [(env, i, *hosts[i]) for i in range(CLAIMERS)])
    double, lost = safety(partial(rows, env), [task_id for ids in claimed for task_id in ids])
    return seconds, double, lost


def main(opts: Options) -> None:
    from tests.pg import Cluster

    n = opts.size(CLAIM_TASKS)
    listed = opts.size(LS_TASKS)
    cluster = Cluster()
    with scratch_dir(NAME) as tmp:
        try:
            cluster.start()
            cluster.make_template()
            stores = Stores(tmp, cluster)
            project = tmp / "project"
            project.mkdir()
            rates: dict[str, float] = {}
            for backend in BACKENDS:
                runs = [
                    claim_once(stores, backend, n, str(project)) for _ in range(opts.runs(RUNS))
                ]
                rates[backend] = report(
                    f"claim, {CLAIMERS} claimers on {HOSTS} hosts, {n} tasks, {backend}",
                    [n / seconds for seconds, _, _ in runs],
                    "claims/s",
                    CLAIM_TARGET,
                    higher_is_better=True,
                )
                figure(
                    f"claim safety, {CLAIMERS} claimers on {HOSTS} hosts, {n} tasks, {backend}",
                    f"double claims {sum(r[1] for r in runs)}, lost {sum(r[2] for r in runs)}"
                    f" over {len(runs)} runs (target 0)",
                )
            ratio(
                f"claim, {CLAIMERS} claimers on {HOSTS} hosts, postgresql vs sqlite",
                rates["postgresql"],
                rates["sqlite"],
                "claims/s on PostgreSQL / on SQLite",
            )
            times: dict[str, float] = {}
            for backend in BACKENDS:
                env = stores.new(backend)
                start = perf_counter()
                with opened(env) as store:
                    for first in range(0, listed, CHUNK):
                        specs = range(first, min(listed, first + CHUNK))
                        store.add([bench_ls_json.spec(i, str(project)) for i in specs])
                note(f"{backend}: {listed} tasks added in {perf_counter() - start:.1f} s")
                samples = time_runs([fleet_exe(), "ls", "--json"], env, opts.runs(LS_RUNS))
                times[backend] = report(
                    f"ls --json, {listed} tasks, {backend}", samples, "s", LS_TARGET_S
                )
            ratio(
                f"ls --json, {listed} tasks, postgresql vs sqlite",
                times["postgresql"],
                times["sqlite"],
                "time on PostgreSQL / on SQLite",
            )
        finally:
            cluster.stop()
