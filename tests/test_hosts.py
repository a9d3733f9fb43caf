"""Several hosts on one queue, on each real store: heartbeats, the name a machine holds, the
recovery of a silent host's expired claims by another, and tasks lost again and again. Two
owner names stand for two hosts; silence is made by putting a host's last_seen in the past
(the store's own clock decides the rest)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import claim, host
from fleet.config import load
from fleet.errors import ConfigError, Conflict
from fleet.model import AttemptEnd, Status, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, open_store
from fleet.store.hosts import HOST_FIELDS, HostInfo
from fleet.timeutil import parse
from tests.conftest import Fleet, store_rows, store_sql

LONG_AGO = "2000-01-01T00:00:00.000Z"


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def info(name: str, machine: str | None = None, cap: int = 4) -> HostInfo:
    return HostInfo(name, machine or host.machine_id(), "boot-" + name, ("gpu",), cap)


def silence(home: Path, name: str) -> None:
    """Host `name` was last heard from long ago."""
    store_sql(home, f"UPDATE hosts SET last_seen = '{LONG_AGO}' WHERE name = '{name}'")


def add(store: Store, project: Path, n: int = 1) -> list[str]:
    return [t.id for t in store.add([TaskSpec(f"t{i}", str(project)) for i in range(n)])]


def test_a_heartbeat_upserts_the_host_and_a_renewal_refreshes_it(
    store: Store, home: Path, project: Path
) -> None:
    store.heartbeat(info("h1", cap=2), 300)
    (h1,) = store.hosts(300)
    assert (h1.name, h1.alive, h1.running, h1.max_concurrent, h1.labels) == (
        "h1",
        True,
        0,
        2,
        ("gpu",),
    )
    assert (h1.boot_id, h1.machine_id) == ("boot-h1", host.machine_id())
    assert abs(parse(h1.last_seen) - parse(store.now())) < 60
    (t,) = add(store, project)
    store.claim(1, "h1", 60, "claude", None)
    silence(home, "h1")
    (h1,) = store.hosts(300)
    assert not h1.alive and h1.running == 1 and h1.silent_s > 86400
    assert store.renew(t, "h1", 60)
    (h1,) = store.hosts(300)
    assert h1.alive and h1.silent_s < 60
    # A renewal that does not hold the claim is no sign of its host's life.
    silence(home, "h1")
    assert not store.renew(t, "h1", 60, attempt=7)
    assert not store.hosts(300)[0].alive
    # The next pass brings it back, with what it says now.
    store.heartbeat(info("h1", cap=3), 300)
    (h1,) = store.hosts(300)
    assert h1.alive and h1.max_concurrent == 3


def test_a_second_machine_under_a_live_hosts_name_is_refused(store: Store, home: Path) -> None:
    store.heartbeat(info("box", "machine-a"), 300)
    with pytest.raises(Conflict, match="box is in use by another machine") as refused:
        store.heartbeat(info("box", "machine-b"), 300)
    assert refused.value.hint and "unique hostname" in refused.value.hint
    assert store.hosts(300)[0].machine_id == "machine-a"
    # Once the first has been silent longer than host_dead_after, the name is free again.
    silence(home, "box")
    store.heartbeat(info("box", "machine-b"), 300)
    assert store.hosts(300)[0].machine_id == "machine-b"


def test_another_hosts_claim_is_recovered_only_once_its_lease_ran_out_and_its_host_is_silent(
    store: Store, home: Path, project: Path
) -> None:
    expired, leased = add(store, project, 2)
    store.heartbeat(info("h1"), 300)
    store.heartbeat(info("h2"), 300)
    assert [t.id for t in store.claim(1, "h1", -1, "claude", None)] == [expired]
    assert [t.id for t in store.claim(1, "h1", 3600, "claude", None)] == [leased]
    # The lease ran out, but h1 was heard from: it may only be slow.
    assert store.orphaned_claims("h2", 300) == []
    silence(home, "h1")
    # Silent now: its expired claim is h2's to recover, the one still leased is not, and
    # a host never recovers its own this way.
    assert [t.id for t in store.orphaned_claims("h2", 300)] == [expired]
    assert store.orphaned_claims("h1", 300) == []
    config = load(resolve())
    assert claim.recover(store, "user", "h2", None, config) == [expired]
    task = store.get(expired)
    assert (task.status, task.claimed_by, task.host, task.lost_streak) == (
        Status.READY,
        None,
        "h1",
        1,
    )
    assert [a.outcome for a in store.attempts(expired)] == ["lost"]
    (recovered,) = [e for e in store.history(expired) if e.action == "recovered"]
    assert recovered.detail == {"attempt": 1, "host": "h1", "by_host": "h2"}
    assert store.get(leased).claimed_by == "h1"
    assert store.orphaned_claims("h2", 300) == []


def test_silence_and_leases_are_judged_by_the_store_clock(store: Store, project: Path) -> None:
    """With a second of silence allowed and a half-second lease, real time decides: the claim
    is orphaned only once the store's clock is past both."""
    (t,) = add(store, project)
    store.heartbeat(info("h1"), 1.0)
    store.claim(1, "h1", 0.5, "claude", None)
    (h1,) = store.hosts(1.0)
    lease = store.get(t).lease_until
    assert lease and store.orphaned_claims("h2", 1.0) == []
    deadline = time.monotonic() + 30
    while not store.orphaned_claims("h2", 1.0):
        assert time.monotonic() < deadline, "never orphaned"
        time.sleep(0.05)
    now = parse(store.now())
    assert now - parse(h1.last_seen) >= 0.999 and now >= parse(lease) - 0.001
    assert not store.hosts(1.0)[0].alive


def test_a_claim_of_a_host_that_never_heartbeat_goes_by_its_lease_plus_the_silence(
    store: Store, home: Path, project: Path
) -> None:
    (t,) = add(store, project)
    store.claim(1, "old-fleet", -1, "claude", None)
    assert store.orphaned_claims("h2", 300) == []  # its lease only just ran out
    store_sql(home, f"UPDATE tasks SET lease_until = '{LONG_AGO}' WHERE id = '{t}'")
    assert [x.id for x in store.orphaned_claims("h2", 300)] == [t]


def test_two_hosts_recovering_one_claim_at_once_release_it_once(
    backend: str, store: Store, home: Path, project: Path
) -> None:
    (t,) = add(store, project)
    store.claim(1, "dead", -1, "claude", None)
    store.heartbeat(info("dead"), 300)
    silence(home, "dead")
    stores = [open_store(resolve()) for _ in range(2)]
    found = [s.orphaned_claims(name, 300) for s, name in zip(stores, ("h1", "h2"), strict=True)]
    assert [[x.id for x in f] for f in found] == [[t], [t]]
    start = threading.Barrier(2)
    results: list[str] = []

    def recover(s: Store, me: str) -> None:
        start.wait()
        try:
            s.recover_lost(t, "dead", AttemptEnd("lost"), 1, 3, me)
            results.append("released")
        except Conflict:
            results.append("conflict")

    threads = [
        threading.Thread(target=recover, args=(s, me))
        for s, me in zip(stores, ("h1", "h2"), strict=True)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    for s in stores:
        s.close()
    assert sorted(results) == ["conflict", "released"]
    assert [a.outcome for a in store.attempts(t)] == ["lost"]
    assert [e.action for e in store.history(t)].count("recovered") == 1
    assert store_rows(home, f"SELECT lost_streak FROM tasks WHERE id = '{t}'") == [(1,)]


def test_a_task_lost_max_lost_times_in_a_row_is_blocked_naming_its_hosts(
    store: Store, project: Path
) -> None:
    (t,) = add(store, project)
    for n, name in enumerate(("h1", "h2"), 1):
        store.claim(1, name, 60, "claude", None)
        after = store.recover_lost(t, name, AttemptEnd("lost"), n, 3, "h9")
        assert (after.status, after.lost_streak) == (Status.READY, n)
    # Any other end resets the streak.
    store.claim(1, "h1", 60, "claude", None)
    after = store.finish(t, "h1", AttemptEnd("failure", exit_status=1), Status.READY)
    assert after.lost_streak == 0
    for n, name in enumerate(("h1", "h2", "h1"), 4):
        store.claim(1, name, 60, "claude", None)
        after = store.recover_lost(t, name, AttemptEnd("lost"), n, 3, "h9")
    assert (after.status, after.lost_streak, after.reason) == (
        Status.BLOCKED,
        3,
        "lost 3 times in a row (on h1, h2)",
    )
    assert store.history(t)[-1].action == "blocked"
    assert store.claim(1, "h2", 60, "claude", None) == []
    # A person's retry makes it ready again; the next lost attempt counts from one.
    store.retry(t)
    store.claim(1, "h2", 60, "claude", None)
    assert store.recover_lost(t, "h2", AttemptEnd("lost"), 7, 3, "h2").lost_streak == 1


def test_host_dead_after_must_outlast_a_lease_and_its_renew_period(home: Path) -> None:
    paths = resolve()
    with pytest.raises(ConfigError, match=r"more than lease_seconds plus the renew period") as e:
        load(paths, flags=("lease_seconds=60", "host_dead_after=90"))
    assert "(60 + 20 + 10 = 90 s)" in e.value.message and e.value.hint
    assert "at least 91" in e.value.hint
    from fleet.config import dead_after

    assert dead_after(load(paths, flags=("lease_seconds=60", "host_dead_after=91"))) == 91
    # 0, the default: five leases and the stop grace, whatever they are.
    assert dead_after(load(paths)) == 310
    assert dead_after(load(paths, flags=("lease_seconds=100", "stop_grace_seconds=600"))) == 1100


# -- what the commands show ---------------------------------------------------------------


def two_hosts(home: Path, project: Path) -> tuple[str, str]:
    """h1 runs a task; h2 ran one (lost) and then fell silent."""
    s = open_store(resolve())
    try:
        s.heartbeat(info("h1", cap=2), 300)
        s.heartbeat(HostInfo("h2", "machine-h2", "boot-h2", (), 8), 300)
        running, ran = add(s, project, 2)
        s.claim(1, "h1", 3600, "claude", None)
        s.claim(1, "h2", 3600, "claude", None)
        s.recover_lost(ran, "h2", AttemptEnd("lost"), 1, 3, "h2")
    finally:
        s.close()
    silence(home, "h2")
    return running, ran


def test_fleet_hosts_lists_each_host_alive_or_silent_with_its_running_and_cap(
    backend: str, fleet: Fleet, home: Path, project: Path
) -> None:
    two_hosts(home, project)
    listed = json.loads(fleet.ok("hosts", "--json"))
    assert [h["name"] for h in listed] == ["h1", "h2"]
    h1, h2 = listed
    assert set(h1) == {f.name for f in HOST_FIELDS}
    assert (h1["alive"], h1["running"], h1["max_concurrent"], h1["labels"]) == (
        True,
        1,
        2,
        ["gpu"],
    )
    assert (h2["alive"], h2["running"], h2["machine_id"]) == (False, 0, "machine-h2")
    assert h2["silent_s"] > 86400 and h2["last_seen"] == LONG_AGO
    table = [line for line in fleet.ok("hosts").splitlines() if not line.startswith("-")]
    heads = ["HOST", "STATE", "LAST", "SEEN", "RUNNING", "LABELS", "BOOT", "MACHINE"]
    assert table[0].split() == heads
    assert table[1].split()[:5] == ["h1", "alive", "0s", "ago", "1/2"]
    assert table[2].split()[:2] == ["h2", "silent"] and "machine-" in table[2]
    # A host_dead_after a host could be taken for dead by while it still renews: refused.
    bad = fleet("--set", "host_dead_after=30", "hosts")
    assert bad.code != 0 and bad.out == ""
    assert bad.err.count("\n") <= 2 and "more than lease_seconds plus the renew period" in bad.err


def test_ls_and_show_name_the_host_of_each_task(
    backend: str, fleet: Fleet, home: Path, project: Path
) -> None:
    running, ran = two_hosts(home, project)
    rows = {line.split()[0]: line.split() for line in fleet.ok("ls").splitlines()}
    assert rows["ID"][:5] == ["ID", "STATUS", "P", "CODER", "HOST"]
    assert rows[running][4] == "h1" and rows[ran][4] == "h2"
    by_id = {t["id"]: t for t in json.loads(fleet.ok("ls", "--json"))}
    assert (by_id[running]["host"], by_id[ran]["host"]) == ("h1", "h2")
    assert by_id[ran]["lost_streak"] == 1
    shown = fleet.show(ran)
    assert shown["host"] == "h2" and [a["owner"] for a in shown["attempt_log"]] == ["h2"]
    text = fleet.ok("show", ran)
    assert "h2 (silent, seen" in text
    assert "lost in a row 1" in text
    head, first = [line for line in text.splitlines() if line.split()[:1] in (["#"], ["1"])][:2]
    assert head.split()[:3] == ["#", "HOST", "OUTCOME"] and first.split()[:3] == ["1", "h2", "lost"]
    assert "h1 (alive, seen" in fleet.ok("show", running)
    # Before its first claim a task has no host.
    fresh = fleet.add("fresh")
    assert fleet.show(fresh)["host"] is None
    assert {line.split()[0]: line.split() for line in fleet.ok("ls").splitlines()}[fresh][4] == "-"


def test_status_has_a_section_per_host(
    backend: str, fleet: Fleet, home: Path, project: Path
) -> None:
    two_hosts(home, project)
    snap = json.loads(fleet.ok("status", "--json"))
    assert [(h["name"], h["alive"], h["running"]) for h in snap["hosts"]] == [
        ("h1", True, 1),
        ("h2", False, 0),
    ]
    lines = fleet.ok("status").splitlines()
    at = lines.index("HOSTS")
    assert lines[at + 1].split() == ["HOST", "STATE", "RUNNING", "LAST", "SEEN", "LABELS"]
    assert lines[at + 2].split()[:3] == ["h1", "alive", "1/2"]
    assert lines[at + 3].split()[:3] == ["h2", "silent", "0/8"]


def test_a_dispatch_pass_records_its_host_and_refuses_a_name_another_machine_holds(
    backend: str, fleet: Fleet, home: Path
) -> None:
    from fleet import live
    from fleet.host import owner

    paths = resolve()
    config = load(paths, flags=('host_labels=["gpu", "big"]', "max_concurrent=3"))
    s = open_store(paths)
    try:
        done = claim.dispatch(paths, s, config, "user")
        assert done.started == [] and done.recovered == []
        (me,) = s.hosts(300)
        assert (me.name, me.machine_id, me.boot_id, me.labels, me.max_concurrent) == (
            owner(),
            host.machine_id(),
            host.boot_id(),
            ("gpu", "big"),
            3,
        )
        store_sql(home, "UPDATE hosts SET machine_id = 'another-machine'")
        with pytest.raises(Conflict, match="in use by another machine") as refused:
            claim.dispatch(paths, s, config, "user")
        assert refused.value.hint and "unique hostname" in refused.value.hint
        assert "in use by another machine" in str(live.last_pass(paths))
    finally:
        s.close()
    doctor = fleet("doctor", "--json")
    (row,) = [r for r in json.loads(doctor.out) if r["check"] == "host"]
    assert not row["ok"] and "unique hostname" in row["fix"]


def test_a_pass_given_time_waits_for_the_one_under_way_and_one_without_is_busy(
    backend: str, home: Path
) -> None:
    paths = resolve()
    config = load(paths)
    s = open_store(paths)
    waited: list[claim.Pass] = []
    try:
        with claim.dispatch_lock(paths):  # another pass's
            with pytest.raises(claim.Busy):
                claim.dispatch(paths, s, config, "user", wait=False)
            waiter = threading.Thread(
                target=lambda: waited.append(
                    claim.dispatch(paths, s, config, "user", wait=False, within=60)
                )
            )
            waiter.start()
            waiter.join(0.3)
            assert waiter.is_alive() and not waited  # still waiting, not given up
        waiter.join(60)
    finally:
        s.close()
    # It ran once the other pass let go: the pass fleet-listen would otherwise leave to
    # a new fleet-claim process.
    assert not waiter.is_alive() and [p.started for p in waited] == [[]]


def test_host_labels_are_labels(home: Path) -> None:
    with pytest.raises(ConfigError, match=r"--set host_labels: .* not 'two words'"):
        load(resolve(), flags=('host_labels=["gpu", "two words"]',))
    assert load(resolve(), flags=('host_labels=["gpu"]',)).values["host_labels"] == ["gpu"]


def test_the_migration_gives_each_task_the_host_of_its_last_attempt(
    backend: str, home: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.store.schema import MIGRATIONS
    from tests.conftest import pg_store_at_version, store_at_version

    # The schema just before the hosts came in (found by what it does: versions move on merge).
    before = next(i for i, step in enumerate(MIGRATIONS) if "CREATE TABLE hosts" in step[0])
    at = "'2026-11-30T10:00:00.000Z'"
    inserts = (
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at, attempts) VALUES"
        f" ('fl-aaaaaa', 'ran twice', '/', {at}, {at}, 2), ('fl-bbbbbb', 'never ran', '/', {at},"
        f" {at}, 0)",
        "INSERT INTO attempts (task, n, owner, started_at, ended_at, outcome) VALUES"
        f" ('fl-aaaaaa', 1, 'old-host', {at}, {at}, 'lost'),"
        f" ('fl-aaaaaa', 2, 'new-host', {at}, {at}, 'failure')",
    )
    if backend == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        monkeypatch.setenv("FLEET_STORE", pg_store_at_version(cluster, before, *inserts))
    else:
        db = store_at_version(home, before)
        for sql in inserts:
            db.execute(sql)
        db.commit()
        db.close()
    s = open_store(resolve())
    try:
        ran, never = s.get("fl-aaaaaa"), s.get("fl-bbbbbb")
        assert (ran.host, never.host) == ("new-host", None)
        assert ran.lost_streak == never.lost_streak == 0
        assert s.hosts(300) == []
    finally:
        s.close()
