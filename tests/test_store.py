"""The store's semantics, against each real store: SQLite in a temporary FLEET_HOME, and a new
database of the session's own PostgreSQL cluster (the `backend` fixture)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import Conflict, InputError, NotFound, StoreError
from fleet.model import AttemptEnd, Status, TaskEdit, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, TaskFilter, open_store
from fleet.store.base import BadSpec
from fleet.store.schema import MIGRATIONS, VERSION
from fleet.timeutil import parse
from tests.conftest import (
    Fleet,
    pg_store_at_version,
    run_fleet,
    store_at_version,
    store_rows,
    store_sql,
)


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def spec(title: str, cwd: Path, **kw: object) -> TaskSpec:
    return TaskSpec(title=title, cwd=str(cwd), **kw)  # type: ignore[arg-type]


def claim(store: Store, n: int = 1, owner: str = "me") -> list[str]:
    return [t.id for t in store.claim(n, owner, 60, "claude", None)]


def test_add_then_get_round_trips_every_field(store: Store, project: Path) -> None:
    (dep,) = store.add([spec("dep", project)])
    (t,) = store.add(
        [
            spec(
                "title",
                project,
                description="line 1\nline 2 ünïcode",
                coder="codex",
                model="gpt-5",
                priority=0,
                labels=("a", "b"),
                after=(dep.id,),
                parent=dep.id,
                sandbox="strict",
                limits={"memory_max": "1G"},
            )
        ]
    )
    got = store.get(t.id)
    assert got == t
    assert (got.title, got.description, got.coder, got.model) == (
        "title",
        "line 1\nline 2 ünïcode",
        "codex",
        "gpt-5",
    )
    assert (got.priority, got.labels, got.after, got.parent) == (0, ("a", "b"), (dep.id,), dep.id)
    assert got.waiting_on == (dep.id,)
    assert got.status == Status.READY and got.sandbox == "strict"
    assert got.limits == {"memory_max": "1G"}
    assert got.id.startswith("fl-") and len(got.id) == 9


def test_claim_order_is_priority_then_age(store: Store, project: Path) -> None:
    low, mid, high, mid2 = (
        t.id
        for t in store.add(
            [
                spec("low", project, priority=4),
                spec("mid", project),
                spec("high", project, priority=0),
                spec("mid2", project),
            ]
        )
    )
    assert [t.id for t in store.ready()] == [high, mid, mid2, low]
    assert claim(store, 2) == [high, mid]
    assert claim(store, 5) == [mid2, low]
    assert claim(store, 5) == []


def test_dependencies_gate_the_claim(store: Store, project: Path) -> None:
    (a,) = store.add([spec("a", project)])
    (b,) = store.add([spec("b", project, priority=0, after=(a.id,))])
    assert claim(store, 5) == [a.id]  # b waits although it has the higher priority
    store.finish(a.id, "me", AttemptEnd("success"), Status.DONE)
    assert store.get(b.id).waiting_on == ()
    assert claim(store, 5) == [b.id]


def test_pending_merges_are_the_tasks_in_merging_only(store: Store, project: Path) -> None:
    (a, _) = store.add([spec("a", project), spec("b", project)])
    assert claim(store) == [a.id]
    store.finish(a.id, "me", AttemptEnd("success"), Status.DONE)
    assert store.pending_merges() == []


def test_a_whole_listing_says_what_each_task_waits_on_as_a_page_and_get_do(
    store: Store, project: Path
) -> None:
    """A listing of every task reads all dependencies in one pass (on PostgreSQL); a page
    and `get` look them up task by task: the same JSON, byte for byte, for a task after
    dependencies done and not, and for a successor whose predecessor's attempt goes on."""
    a, b, c = store.add([spec("a", project), spec("b", project), spec("c", project)])
    (d,) = store.add([spec("d", project, after=(c.id, a.id, b.id))])
    assert claim(store) == [a.id]
    store.finish(a.id, "me", AttemptEnd("success"), Status.DONE)
    assert claim(store) == [b.id]
    store.handoff(b.id, spec("b2", project), None)
    b2 = store.heir(b.id)  # d now waits on b's successor, which waits on b's attempt
    (e,) = store.add([spec("e", project, after=(a.id,))])
    whole = list(store.list_json(TaskFilter(include_final=True)))
    page = list(store.list_json(TaskFilter(include_final=True, limit=100)))
    assert whole == page
    listed = {t["id"]: t for t in map(json.loads, whole)}
    assert (listed[d.id]["after"], listed[d.id]["waiting_on"]) == (
        sorted([a.id, b2, c.id]),
        sorted([b2, c.id]),
    )
    assert (listed[e.id]["after"], listed[e.id]["waiting_on"]) == ([a.id], [])
    assert (listed[b2]["after"], listed[b2]["waiting_on"]) == ([], [b.id])
    assert [store.get(i).to_json() for i in listed] == list(listed.values())


def test_claim_freezes_coder_and_model_and_records_an_attempt(store: Store, project: Path) -> None:
    (t, u) = store.add([spec("t", project), spec("u", project, coder="gemini", model="m1")])
    claimed = {x.id: x for x in store.claim(2, "host:1", 60, "claude", "sonnet")}
    assert (claimed[t.id].coder, claimed[t.id].model) == ("claude", "sonnet")
    assert (claimed[u.id].coder, claimed[u.id].model) == ("gemini", "m1")
    assert claimed[t.id].claimed_by == "host:1" and claimed[t.id].lease_until
    assert claimed[t.id].attempts == 1 and claimed[t.id].started_at
    (attempt,) = store.attempts(t.id)
    assert (attempt.n, attempt.owner, attempt.outcome) == (1, "host:1", None)


def test_renew_release_and_finish_are_compare_and_set_on_the_owner(
    store: Store, project: Path
) -> None:
    (t,) = store.add([spec("t", project)])
    claim(store, owner="a")
    before = store.get(t.id).lease_until
    assert store.renew(t.id, "a", 3600)
    assert (store.get(t.id).lease_until or "") > (before or "")
    assert not store.renew(t.id, "b", 3600)
    with pytest.raises(Conflict):
        store.release(t.id, "b", AttemptEnd("lost"))
    released = store.release(t.id, "a", AttemptEnd("lost", exit_status=None))
    assert released.status == Status.READY and released.claimed_by is None
    assert released.failures == 0
    assert store.attempts(t.id)[0].outcome == "lost"
    claim(store, owner="c")
    end = AttemptEnd("failure", exit_status=1, tokens_in=10, tokens_out=5, cost=0.01)
    done = store.finish(t.id, "c", end, Status.READY, reason="exit 1", count="failure")
    assert (done.status, done.failures, done.attempts, done.reason) == (
        Status.READY,
        1,
        2,
        "exit 1",
    )
    second = store.attempts(t.id)[1]
    assert (second.n, second.exit_status, second.tokens_in, second.cost) == (2, 1, 10, 0.01)
    assert not store.renew(t.id, "c", 60)  # the claim ended with the attempt


def test_a_claim_of_an_earlier_boot_is_stale_at_once_one_of_this_boot_is_not(
    store: Store, project: Path
) -> None:
    old, now, expired, elsewhere = (t.id for t in store.add([spec(n, project) for n in "abcd"]))
    hour = 3600
    assert [t.id for t in store.claim(1, "host", hour, "claude", None, boot="boot-1")] == [old]
    assert [t.id for t in store.claim(1, "host", hour, "claude", None, boot="boot-2")] == [now]
    assert [t.id for t in store.claim(1, "host", -1, "claude", None, boot="boot-2")] == [expired]
    assert [t.id for t in store.claim(1, "other", hour, "claude", None, boot="boot-1")] == [
        elsewhere
    ]
    # In boot-2 of the host, its claim of boot-1 is lost though its lease has an hour to go;
    # one of this boot only once its lease runs out; another host's is never this host's.
    assert [t.id for t in store.stale_claims("host", "boot-2")] == [old, expired]
    assert [t.id for t in store.stale_claims("host", "boot-1")] == [now, expired]
    # A host that cannot tell its boot goes by the lease alone.
    assert [t.id for t in store.stale_claims("host", None)] == [expired]
    assert store.release(old, "host", AttemptEnd("lost")).status == Status.READY
    assert [t.id for t in store.stale_claims("host", "boot-2")] == [expired]
    # Claimed again in this boot, it is not stale any more.
    assert [t.id for t in store.claim(1, "host", hour, "claude", None, boot="boot-2")] == [old]
    assert [t.id for t in store.stale_claims("host", "boot-2")] == [expired]
    assert [a.outcome for a in store.attempts(old)] == ["lost", None]


def test_a_claim_from_before_boots_were_recorded_goes_by_its_lease(
    backend: str, home: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = 8  # the schema before the boot of a claim (the ninth migration)
    insert = (
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at, status, attempts, claimed_by,"
        " lease_until) VALUES ('fl-aaaaaa', 't', '/', '2026-11-30T10:00:00.000Z',"
        " '2026-11-30T10:00:00.000Z', 'running', 1, 'host', '2099-01-01T00:00:00.000Z')"
    )
    if backend == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        monkeypatch.setenv("FLEET_STORE", pg_store_at_version(cluster, before, insert))
    else:
        db = store_at_version(home, before)
        db.execute(insert)
        db.commit()
        db.close()
    s = open_store(resolve())
    try:
        assert [t.id for t in s.stale_claims("host", "any boot")] == []
        assert [t.id for t in s.claims("host")] == ["fl-aaaaaa"]
    finally:
        s.close()


@pytest.mark.postgresql_only
def test_both_backends_hold_the_same_tables_at_each_schema_version(
    backend: str, home: Path, pg_cluster: Any
) -> None:
    """Same columns and same named indexes (a primary key or UNIQUE column aside, which
    SQLite leaves unnamed), at every version both backends have."""
    import psycopg

    from fleet.store import pgschema, schema

    assert pgschema.VERSION == schema.VERSION
    # From the version PostgreSQL came in at (its first step that is not empty).
    first = next(n for n, step in enumerate(pgschema.MIGRATIONS, 1) if step)
    assert first == 8
    for version in range(first, schema.VERSION + 1):
        db = store_at_version(home / f"v{version}", version)
        lite = {
            (table, column)
            for (table,) in db.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
            for (_, column, *_) in db.execute(f"PRAGMA table_info({table})").fetchall()
        }
        lite_indexes = {
            (str(table), str(name))
            for name, table in db.execute(
                "SELECT name, tbl_name FROM sqlite_schema WHERE type = 'index'"
                " AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        }
        db.close()
        with psycopg.connect(pg_store_at_version(pg_cluster, version), autocommit=True) as pg:
            rows = pg.execute(
                b"SELECT table_name, column_name FROM information_schema.columns"
                b" WHERE table_schema = current_schema() AND table_name <> 'fleet_schema'"
            ).fetchall()
            pg_indexes = pg.execute(
                b"SELECT i.tablename, i.indexname FROM pg_indexes i"
                b" WHERE i.schemaname = current_schema() AND NOT EXISTS (SELECT 1"
                b" FROM pg_constraint c WHERE c.conname = i.indexname AND c.contype IN ('p', 'u'))"
            ).fetchall()
        assert {(str(t), str(c)) for t, c in rows} == lite, f"schema version {version}"
        assert {(str(t), str(i)) for t, i in pg_indexes} == lite_indexes, f"version {version}"
    # A new database is migrated to the same version by the store itself.
    assert store_rows(home, "SELECT version FROM fleet_schema") == [(schema.VERSION,)]


def test_a_claim_records_the_boot_of_this_process(store: Store, project: Path) -> None:
    from fleet.host import boot_id

    this = boot_id()
    assert this and this == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (t,) = store.add([spec("t", project)])
    claim(store, owner="host")
    assert store.stale_claims("host", this) == []
    assert [s.id for s in store.stale_claims("host", "an earlier boot")] == [t.id]
    assert store.history(t.id)[-1].detail["boot"] == this


def test_a_person_closing_a_running_task_wins_over_the_attempt(store: Store, project: Path) -> None:
    (t,) = store.add([spec("t", project)])
    claim(store, owner="run")
    assert store.close_task(t.id, "agent says done").status == Status.DONE
    after = store.finish(t.id, "run", AttemptEnd("success"), Status.READY, count="noclose")
    assert after.status == Status.DONE and after.reason == "agent says done"
    assert after.claimed_by is None and after.finished_at


def test_person_transitions_and_their_conflicts(store: Store, project: Path) -> None:
    (t,) = store.add([spec("t", project)])
    assert store.block(t.id, "needs a key").status == Status.BLOCKED
    assert store.get(t.id).reason == "needs a key"
    assert claim(store) == []  # blocked tasks are not claimed
    assert store.retry(t.id).status == Status.READY
    assert store.cancel(t.id, None).status == Status.CANCELLED
    with pytest.raises(Conflict, match="it is cancelled"):
        store.close_task(t.id, None)
    with pytest.raises(Conflict):
        store.block(t.id, "x")
    store.retry(t.id)
    assert store.close_task(t.id, "ok").finished_at
    with pytest.raises(Conflict, match="it is done"):
        store.cancel(t.id, None)


def test_retry_refuses_while_an_attempt_runs_and_resets_counters(
    store: Store, project: Path
) -> None:
    (t,) = store.add([spec("t", project)])
    claim(store, owner="r")
    store.finish(t.id, "r", AttemptEnd("failure"), Status.READY, count="failure")
    claim(store, owner="r")
    store.block(t.id, "person")
    with pytest.raises(Conflict, match="still running"):
        store.retry(t.id)
    store.finish(t.id, "r", AttemptEnd("failure"), Status.READY, count="failure")
    assert store.get(t.id).failures == 2
    back = store.retry(t.id)
    assert (back.status, back.failures, back.noclose, back.reason) == (
        Status.READY,
        0,
        0,
        None,
    )
    assert back.attempts == 2  # the history count is kept


def test_edit_changes_fields_labels_and_dependencies(store: Store, project: Path) -> None:
    a, b, c = store.add([spec("a", project), spec("b", project), spec("c", project)])
    t = store.edit(
        c.id,
        TaskEdit(title="c2", priority=1, add_labels=("x", "y"), add_after=(a.id, b.id)),
    )
    assert (t.title, t.priority, t.labels) == ("c2", 1, ("x", "y"))
    assert t.after == tuple(sorted((a.id, b.id)))  # ids in id order
    t = store.edit(c.id, TaskEdit(remove_labels=("x",), remove_after=(a.id,), coder="codex"))
    assert (t.labels, t.after, t.coder) == (("y",), (b.id,), "codex")
    t = store.edit(c.id, TaskEdit(clear=frozenset({"coder"})))
    assert t.coder is None
    # A task's own limits merge, and an empty value removes one; none left is null.
    t = store.edit(c.id, TaskEdit(limits={"memory_max": "2G", "cpu_weight": "50"}))
    assert t.limits == {"memory_max": "2G", "cpu_weight": "50"}
    t = store.edit(c.id, TaskEdit(limits={"memory_max": "", "tasks_max": "64"}))
    assert t.limits == {"cpu_weight": "50", "tasks_max": "64"}
    assert store.edit(c.id, TaskEdit(limits={"cpu_weight": "", "tasks_max": ""})).limits is None


def test_edit_refuses_cycles(store: Store, project: Path) -> None:
    a, b, c = store.add([spec("a", project), spec("b", project), spec("c", project)])
    store.edit(b.id, TaskEdit(add_after=(a.id,)))
    store.edit(c.id, TaskEdit(add_after=(b.id,)))
    with pytest.raises(InputError, match="cycle"):
        store.edit(a.id, TaskEdit(add_after=(c.id,)))
    with pytest.raises(InputError, match="itself"):
        store.edit(a.id, TaskEdit(add_after=(a.id,)))
    store.edit(b.id, TaskEdit(parent=a.id))
    with pytest.raises(InputError, match="descends"):
        store.edit(a.id, TaskEdit(parent=b.id))
    assert store.get(a.id).after == ()


def test_edit_freezes_the_run_fields_while_claimed(store: Store, project: Path) -> None:
    (t,) = store.add([spec("t", project)])
    claim(store)
    with pytest.raises(Conflict, match="frozen"):
        store.edit(t.id, TaskEdit(model="other"))
    with pytest.raises(Conflict, match="limits are frozen"):
        store.edit(t.id, TaskEdit(limits={"memory_max": "1G"}))
    assert store.get(t.id).limits is None
    assert store.edit(t.id, TaskEdit(title="renamed")).title == "renamed"


def test_batch_refs_resolve_and_a_bad_task_adds_nothing(store: Store, project: Path) -> None:
    tasks = store.add(
        [
            spec("build", project, ref="build"),
            spec("test", project, after=("ref:build",), ref="test"),
            spec("ship", project, after=("ref:test", "ref:build"), parent="ref:build"),
        ]
    )
    assert tasks[1].after == (tasks[0].id,)
    assert set(tasks[2].after) == {tasks[0].id, tasks[1].id}
    assert tasks[2].parent == tasks[0].id
    count = sum(1 for _ in store.tasks(TaskFilter()))
    with pytest.raises(BadSpec) as bad:
        store.add([spec("ok", project), spec("bad", project, after=("fl-zzzzzz",))])
    assert bad.value.index == 1
    with pytest.raises(BadSpec, match="cycle"):
        store.add(
            [
                spec("x", project, ref="x", after=("ref:y",)),
                spec("y", project, ref="y", after=("ref:x",)),
            ]
        )
    with pytest.raises(BadSpec, match="already used"):
        store.add([spec("x", project, ref="x"), spec("y", project, ref="x")])
    assert sum(1 for _ in store.tasks(TaskFilter())) == count


def test_resolve_prefixes(store: Store, project: Path) -> None:
    (t,) = store.add([spec("t", project)])
    assert store.resolve(t.id) == t.id
    assert store.resolve(t.id[:5]) == t.id
    assert store.resolve(t.id[3:6].upper()) == t.id  # without fl-, any case
    with pytest.raises(NotFound):
        store.resolve("fl-zzzzzz" if t.id != "fl-zzzzzz" else "fl-yyyyyy")
    many = store.add([spec(str(i), project) for i in range(40)])
    first = {x.id[3] for x in many}
    shared = next(c for c in sorted(first) if sum(x.id[3] == c for x in [t, *many]) > 1)
    with pytest.raises(InputError, match="ambiguous"):
        store.resolve("fl-" + shared)


def test_list_filters(store: Store, project: Path, tmp_path: Path) -> None:
    sub = project / "sub"
    sub.mkdir()
    other = tmp_path / "projectile"  # shares a prefix with project, but is not below it
    other.mkdir()
    a, b, c = store.add(
        [spec("a", project, labels=("x",)), spec("b", sub), spec("c", other, labels=("x",))]
    )
    store.close_task(b.id, None)

    def ids(**kw: object) -> list[str]:
        return [t.id for t in store.tasks(TaskFilter(**kw))]  # type: ignore[arg-type]

    assert ids() == [a.id, c.id]
    assert ids(include_final=True) == [a.id, b.id, c.id]
    assert ids(statuses=(Status.DONE,)) == [b.id]
    assert ids(label="x") == [a.id, c.id]
    assert ids(cwd=str(project), include_final=True) == [a.id, b.id]


@pytest.mark.sqlite_only
def test_newer_schema_is_refused(home: Path, store: Store) -> None:
    store.close()
    db = sqlite3.connect(home / "fleet.db")
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match=f"schema version {VERSION + 1}") as refused:
        open_store(resolve())
    assert "newer fleet" in (refused.value.hint or "")


@pytest.mark.sqlite_only
def test_a_foreign_or_corrupt_database_is_refused(backend: str, home: Path) -> None:
    home.mkdir(mode=0o700, parents=True)
    db = sqlite3.connect(home / "fleet.db")
    db.execute("CREATE TABLE x (y)")
    db.execute("PRAGMA user_version = 1")
    db.close()
    with pytest.raises(StoreError, match="not fleet's"):
        open_store(resolve())
    (home / "fleet.db").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable fleet database"):
        open_store(resolve())


@pytest.mark.sqlite_only
def test_the_store_is_in_wal_mode_and_private(home: Path, store: Store) -> None:
    db = sqlite3.connect(home / "fleet.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    assert (home.stat().st_mode & 0o777) == 0o700


def test_a_runner_whose_claim_was_taken_over_changes_nothing(store: Store, project: Path) -> None:
    (t,) = store.add([spec("t", project)])
    claim(store, owner="host")
    store.release(t.id, "host", AttemptEnd("lost"), attempt=1)
    claim(store, owner="host")  # the same host claims it again: attempt 2
    assert not store.renew(t.id, "host", 60, attempt=1)
    with pytest.raises(Conflict, match="for attempt 1"):
        store.finish(t.id, "host", AttemptEnd("success"), Status.DONE, attempt=1)
    assert store.get(t.id).status == Status.RUNNING
    assert store.renew(t.id, "host", 60, attempt=2)
    assert store.finish(t.id, "host", AttemptEnd("success"), Status.DONE, attempt=2).status == (
        Status.DONE
    )


def test_a_lease_is_set_by_the_store_clock(store: Store, project: Path) -> None:
    store.add([spec("t", project)])
    before = store.now()
    (claimed,) = store.claim(1, "me", 600, "claude", None)
    after = store.now()
    lease = parse(claimed.lease_until or "")
    assert parse(before) + 600 - 1 <= lease <= parse(after) + 600 + 1
    assert store.now() < (claimed.lease_until or "")


def test_labels_search_and_coders_filter_alike(store: Store, project: Path) -> None:
    a, b, c = store.add(
        [
            spec("Fix the Parser", project, labels=("x", "y")),
            spec("parse 100%_done", project, coder="codex"),
            spec("other", project, labels=("y",)),
        ]
    )

    def ids(**kw: object) -> list[str]:
        return [t.id for t in store.tasks(TaskFilter(**kw))]  # type: ignore[arg-type]

    assert ids(search="PARSE") == [a.id, b.id]  # any case
    assert ids(search="100%_") == [b.id]  # LIKE's wildcards are plain characters
    assert ids(search="0%d") == []
    assert ids(label="y") == [a.id, c.id]
    assert ids(coder="codex", default_coder="claude") == [b.id]
    assert ids(coder="claude", default_coder="claude") == [a.id, c.id]
    assert store.count(TaskFilter(label="y")) == 2
    assert [x.id for x in store.ready(coders=("codex",), default_coder="claude")] == [b.id]


@pytest.mark.postgresql_only
def test_postgresql_refuses_a_newer_schema_and_a_foreign_database(
    backend: str, store: Store, pg_cluster: Any
) -> None:
    from fleet.store.pgschema import VERSION as PG_VERSION

    url = os.environ["FLEET_STORE"]
    store.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE fleet_schema SET version = {PG_VERSION + 1}".encode())
    with pytest.raises(StoreError, match=f"schema version {PG_VERSION + 1}") as refused:
        open_store(resolve())
    assert "newer fleet" in (refused.value.hint or "")
    other = pg_cluster.new_database(template=None)
    with psycopg.connect(other, autocommit=True) as conn:
        conn.execute(b"CREATE TABLE x (y text)")
    with pytest.raises(StoreError, match="not fleet's"):
        open_store(resolve(), url=other)


def test_an_unreachable_database_is_one_line_naming_the_host_never_the_password(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "no-server-here"
    gone.mkdir()
    monkeypatch.setenv("FLEET_STORE", f"postgresql://fleet:s3cret-pw@/fleet?host={gone}&port=5999")
    result = run_fleet("ls")
    assert result.code == StoreError.exit_code
    first, *rest = result.err.splitlines()
    assert first.startswith(f"fleet: error: cannot reach the task store at {gone}:5999/fleet: ")
    assert [line.split(":")[1] for line in rest] == [" hint"], result.err
    assert "s3cret-pw" not in result.err + result.out
    tcp = "postgresql://fleet:s3cret-pw@127.0.0.1:1/fleet?connect_timeout=5"
    monkeypatch.setenv("FLEET_STORE", tcp)
    result = run_fleet("show", "fl-aaaaaa")
    assert result.code == StoreError.exit_code
    first, *rest = result.err.splitlines()
    assert first.startswith("fleet: error: cannot reach the task store at 127.0.0.1:1/fleet: ")
    assert len(rest) == 1 and "s3cret-pw" not in result.err + result.out


def test_the_configuration_never_shows_the_store_password(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    for url, masked in (
        ("postgresql://bob:pa:ss@db.example:5433/q", "postgresql://bob:***@db.example:5433/q"),
        (
            "postgresql://db.example/q?password=pw&sslmode=require",
            "postgresql://db.example/q?password=***&sslmode=require",
        ),
        ("postgresql://bob@db.example/q", "postgresql://bob@db.example/q"),
    ):
        monkeypatch.setenv("FLEET_STORE", url)
        assert fleet.ok("config", "get", "store").strip() == masked
        shown = json.loads(fleet.ok("config", "show", "--json"))
        assert [e["value"] for e in shown if e["key"] == "store"] == [masked]
        assert masked in fleet.ok("config", "show")


def test_only_a_postgresql_store_imports_psycopg(backend: str, home: Path) -> None:
    probe = (
        "import sys; from fleet.cli import main; code = main(['ls']);"
        " print(code, 'psycopg' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.split()[-2:] == ["0", str(backend == "postgresql")], proc.stderr


@pytest.mark.postgresql_only
def test_a_lost_connection_is_one_error_changes_nothing_and_is_made_again(
    backend: str, store: Store, project: Path
) -> None:
    import psycopg

    (t,) = store.add([spec("t", project)])
    with psycopg.connect(os.environ["FLEET_STORE"], autocommit=True) as admin:
        admin.execute(
            b"SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            b" WHERE datname = current_database() AND pid != pg_backend_pid()"
        )
    with pytest.raises(StoreError, match=r"lost the task store at .*:5432/fleet_") as lost:
        store.claim(1, "me", 60, "claude", None)
    assert "\n" not in lost.value.message
    # Nothing was claimed, and the same store connects again on its next call.
    assert store.get(t.id).status == Status.READY and store.attempts(t.id) == []
    assert claim(store) == [t.id]


@pytest.mark.postgresql_only
def test_a_claim_whose_kept_plan_the_server_lost_is_made_again_the_plain_way(
    backend: str, store: Store, project: Path
) -> None:
    """A PgBouncer in transaction pooling may hand the store another server connection, which
    lacks the plans it kept (as one whose plans are dropped): the claim is made again without
    them, takes each task once, and the connection keeps no plan from then on."""
    conn = store._conn  # type: ignore[attr-defined]

    def kept() -> int:
        return int(conn.execute(b"SELECT count(*) FROM pg_prepared_statements").fetchone()[0])

    tasks = store.add([spec(str(i), project) for i in range(3)])
    assert claim(store) == [tasks[0].id]
    assert kept() == 1
    conn.execute(b"DEALLOCATE ALL")
    assert claim(store) == [tasks[1].id]
    assert claim(store) == [tasks[2].id]
    assert kept() == 0
    assert [len(store.attempts(t.id)) for t in tasks] == [1, 1, 1]
    assert [store.get(t.id).attempts for t in tasks] == [1, 1, 1]


def test_the_store_setting_in_the_configuration_file_picks_postgresql(
    home: Path, project: Path, pg_cluster: Any
) -> None:
    url = pg_cluster.new_database()
    resolve().config_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    resolve().config_file.write_text(f'# store = "ignored"\nstore = "{url}"\n')
    added = run_fleet("add", "in postgresql", "--cwd", str(project))
    assert added.code == 0, added.err
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        titles = conn.execute(b"SELECT id, title FROM tasks").fetchall()
    assert titles == [(added.out.strip(), "in postgresql")]
    assert not (home / "fleet.db").exists()


@pytest.mark.postgresql_only
def test_a_batch_add_gathers_the_statistics_claims_are_planned_by(
    backend: str, store: Store, home: Path, project: Path
) -> None:
    def analyzed() -> list[tuple[Any, ...]]:
        return store_rows(
            home, "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'tasks'"
        )

    store.add([spec(str(i), project) for i in range(10)])
    assert analyzed() == [(False,)]
    store.add([spec(str(i), project) for i in range(500)])
    assert analyzed() == [(True,)]


# Costs that SQLite's %!.15g and a shortest round-trip print differently, and awkward text.
COSTS = (0.1 + 0.2, 5.0, 1e20, 2.5e-7, 123456789.123456789, -0.5, 0.0, 1e15, 0.0001, 12.5)
AWKWARD = 'quote " backslash \\ tab \t nl \n cr \r bell \x07 del \x7f ls \u2028 é 😀'


def fill_alike(store: Store, project: Path) -> list[str]:
    """The same tasks in `store` whatever its backend; their ids in order."""
    first, second = store.add(
        [
            spec(AWKWARD, project, description=AWKWARD, labels=("é", "b")),
            spec("plain", project, limits={"memory_max": "1G", "cpu_weight": 50}),
        ]
    )
    rest = store.add(
        [
            spec(f"task {i}", project, after=(first.id, second.id) if i % 3 == 0 else (first.id,))
            for i in range(len(COSTS))
        ]
    )
    claim(store)  # the first task: running, so its dependants wait on it
    store.close_task(second.id, "done by hand")
    return [first.id, second.id, *(t.id for t in rest)]


def _sorted_ids(text: str) -> str:
    return '["' + '","'.join(sorted(text[2:-2].split('","'))) + '"]'


def test_ls_json_is_the_same_bytes_on_both_stores(
    fleet: Fleet, home: Path, project: Path, pg_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet ls --json` prints each task's JSON as its store builds it: the same tasks give
    the same bytes on SQLite and PostgreSQL (separators, escapes, JSON columns, numbers)."""
    outputs = []
    for url in ("", pg_cluster.new_database()):
        if url:
            monkeypatch.setenv("FLEET_STORE", url)
        store = open_store(resolve())
        try:
            ids = fill_alike(store, project)
        finally:
            store.close()
        # What differs by nature (the clock, random ids) made alike; costs set exactly.
        at = "'2026-01-01T00:00:00.000Z'"
        kept = ("started_at", "finished_at", "lease_until")  # null stays null
        store_sql(
            home,
            f"UPDATE tasks SET created_at = {at}, updated_at = {at}, "
            + ", ".join(f"{c} = CASE WHEN {c} IS NULL THEN NULL ELSE {at} END" for c in kept),
        )
        for n, cost in enumerate(COSTS):
            store_sql(
                home,
                f"UPDATE tasks SET cost = {cost!r}, max_cost_usd = {cost!r} WHERE seq ="
                f" (SELECT seq FROM tasks ORDER BY seq LIMIT 1 OFFSET {n})",
            )
        out = fleet.ok("ls", "--all", "--json")
        for n, task_id in enumerate(ids):
            out = out.replace(task_id, f"fl-{n:06d}")
        # Lists of ids are in id order, and the ids differ: sorted again once renamed (only
        # where elements are apart by "," alone).
        outputs.append(re.sub(r'\["fl-[^]]*"\]', lambda m: _sorted_ids(m.group(0)), out))
    sqlite, postgresql = outputs
    assert '"cost":0.3,' in sqlite and '"cost":1.0e+20,' in sqlite  # SQLite's %!.15g
    assert sqlite == postgresql


def test_json_columns_written_before_are_listed_compact_after_the_migration(
    backend: str, home: Path, fleet: Fleet, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    from tests.conftest import pg_store_at_version

    # The schema just before that migration (found by what it does: versions move on merge).
    before = next(
        i for i, step in enumerate(MIGRATIONS) if "merged_from = json(merged_from)" in step[0]
    )
    at = "'2026-11-30T10:00:00.000Z'"
    insert = (
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at, labels, merged_from, limits)"
        f" VALUES ('fl-aaaaaa', 'old', '/', {at}, {at}, '[\"a\", \"b\"]',"
        ' \'["fl-bbbbbb", "fl-cccccc"]\', \'{"memory_max": "1G", "cpu_weight": 50}\')'
    )
    if backend == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        monkeypatch.setenv("FLEET_STORE", pg_store_at_version(cluster, before, insert))
    else:
        db = store_at_version(home, before)
        db.execute(insert)
        db.commit()
        db.close()
    (line,) = [t for t in fleet.ok("ls", "--json").splitlines() if "fl-aaaaaa" in t]
    assert '"labels":["a","b"]' in line
    assert '"merged_from":["fl-bbbbbb","fl-cccccc"]' in line
    assert '"limits":{"memory_max":"1G","cpu_weight":50}' in line
