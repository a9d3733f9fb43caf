"""The store's semantics, against the real SQLite store in a temporary FLEET_HOME."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.errors import Conflict, InputError, NotFound, StoreError
from fleet.model import AttemptEnd, Status, TaskEdit, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, TaskFilter, open_store
from fleet.store.base import BadSpec
from fleet.store.schema import VERSION
from tests.conftest import store_at_version


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
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
    assert got.status == Status.READY
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


def test_a_claim_from_before_boots_were_recorded_goes_by_its_lease(home: Path) -> None:
    db = store_at_version(home, VERSION - 1)
    now = "2026-11-30T10:00:00.000Z"
    db.execute(
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at, status, attempts, claimed_by,"
        " lease_until) VALUES ('fl-aaaaaa', 't', '/', ?, ?, 'running', 1, 'host',"
        " '2099-01-01T00:00:00.000Z')",
        (now, now),
    )
    db.commit()
    db.close()
    s = open_store(resolve())
    try:
        assert s.stale_claims("host", "any boot") == []
    finally:
        s.close()


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


def test_newer_schema_is_refused(home: Path, store: Store) -> None:
    store.close()
    db = sqlite3.connect(home / "fleet.db")
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match=f"schema version {VERSION + 1}") as refused:
        open_store(resolve())
    assert "newer fleet" in (refused.value.hint or "")


def test_a_foreign_or_corrupt_database_is_refused(home: Path) -> None:
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


def test_the_store_is_in_wal_mode_and_private(home: Path, store: Store) -> None:
    db = sqlite3.connect(home / "fleet.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    assert (home.stat().st_mode & 0o777) == 0o700
