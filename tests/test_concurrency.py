"""Many processes on one queue: no task claimed twice, no task lost, no "database is locked"."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from tests.conftest import fleet_exe, run_fleet, store_rows

TASKS = 1500


def _claimer(
    owner: str, start: mp.synchronize.Event, out: mp.Queue[list[str]], batch: int = 3
) -> None:
    store = open_store(resolve())
    start.wait()
    got: list[str] = []
    while True:
        claimed = store.claim(batch, owner, 60, "claude", None)
        if not claimed:
            break
        got.extend(t.id for t in claimed)
    store.close()
    out.put(got)


def _adder(start: mp.synchronize.Event, cwd: str, out: mp.Queue[list[str]]) -> None:
    store = open_store(resolve())
    start.wait()
    added = [store.add([TaskSpec(title=f"late {i}", cwd=cwd)])[0].id for i in range(100)]
    store.close()
    out.put(added)


def test_concurrent_claimers_and_writers_never_double_claim(
    backend: str, home: Path, project: Path
) -> None:
    store = open_store(resolve())
    store.add([TaskSpec(title=f"t{i}", cwd=str(project)) for i in range(TASKS)])
    store.close()
    ctx = mp.get_context("spawn")  # fresh interpreters, like separate fleet-claim processes
    start = ctx.Event()
    claims: mp.Queue[list[str]] = ctx.Queue()
    adds: mp.Queue[list[str]] = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(f"c{i}", start, claims)) for i in range(4)]
    procs.append(ctx.Process(target=_adder, args=(start, str(project), adds)))
    for p in procs:
        p.start()
    start.set()
    per_claimer = [claims.get(timeout=120) for _ in range(4)]
    added = adds.get(timeout=120)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = [task_id for got in per_claimer for task_id in got]
    assert len(claimed) == len(set(claimed)), "a task was claimed twice"
    store = open_store(resolve())
    try:
        remaining = [t.id for t in store.ready()]
        # Every task is either claimed exactly once or (added late) still ready: none lost.
        assert len(claimed) + len(remaining) == TASKS + len(added)
        assert set(remaining) <= set(added)
    finally:
        store.close()
    rows = store_rows(home, "SELECT task, COUNT(*) FROM attempts GROUP BY task")
    assert len(rows) == len(claimed) and all(n == 1 for _, n in rows)


@pytest.mark.postgresql_only
def test_eight_claimers_on_postgresql_pass_each_other_and_never_double_claim(
    backend: str, home: Path, project: Path
) -> None:
    """FOR UPDATE SKIP LOCKED: claimers in separate processes (as on separate hosts) that
    claim one task at a time get disjoint sets, and every task exactly one attempt."""
    tasks = 4000
    store = open_store(resolve())
    store.add([TaskSpec(title=f"t{i}", cwd=str(project)) for i in range(tasks)])
    store.close()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    claims: mp.Queue[list[str]] = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(f"host{i}", start, claims, 1)) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    per_claimer = [claims.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = [task_id for got in per_claimer for task_id in got]
    assert len(claimed) == tasks and len(set(claimed)) == tasks, "a task was claimed twice"
    rows = store_rows(home, "SELECT task, count(*), max(n) FROM attempts GROUP BY task")
    assert len(rows) == tasks and all(n == 1 and top == 1 for _, n, top in rows)
    assert store_rows(home, "SELECT count(*) FROM tasks WHERE status != 'running'") == [(0,)]


@pytest.mark.sqlite_only
def test_a_foreign_write_lock_makes_fleet_wait_not_fail(
    backend: str, home: Path, project: Path
) -> None:
    run_fleet("ls")  # create the store
    blocker = sqlite3.connect(home / "fleet.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # e.g. someone in the sqlite3 shell
    proc = subprocess.Popen(
        [fleet_exe(), "add", "waits for the lock", "--cwd", str(project)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    waited: list[bool] = []

    def release_when_blocked() -> None:
        # Without busy handling the add would fail at once; it must still be waiting here.
        try:
            proc.wait(timeout=1.5)
        except subprocess.TimeoutExpired:
            waited.append(True)
        blocker.execute("COMMIT")

    thread = threading.Thread(target=release_when_blocked)
    thread.start()
    out, err = proc.communicate(timeout=120)
    thread.join()
    assert waited == [True], err.decode()
    assert proc.returncode == 0, err.decode()
    assert b"locked" not in err
    tasks = json.loads(run_fleet("ls", "--json").out)
    assert [t["id"] for t in tasks] == [out.decode().strip()]
