"""Schedules without a running systemd: slots from systemd-analyze, once per slot, overlap,
on each store (the `backend` fixture).

The timers themselves run in tests/test_schedule_units.py, in the systemd sandbox.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import calendar
from fleet.errors import Conflict, InputError, NotFound
from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.schedules import Schedule
from fleet.store import Store, open_store
from fleet.store.base import TaskFilter
from fleet.timeutil import iso, parse
from tests.conftest import Fleet, fleet_exe

# A spec whose last elapse is fixed: every fire computes the same slot, whenever it runs.
ONCE = "2021-06-01 12:00:00"


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def schedule(
    store: Store, name: str, args: list[str], cwd: Path, spec: str = ONCE, overlap: str = "skip"
) -> Schedule:
    return store.add_schedule(
        Schedule(name, spec, overlap, False, tuple(args), str(cwd), "2020-01-01T00:00:00.000Z")
    )


def test_calendar_spec_is_read_by_systemd() -> None:
    spec = calendar.check("*:0/15")
    assert spec.normalized == "*-*-* *:00/15:00" and spec.next is not None
    with pytest.raises(InputError, match="Failed to parse calendar specification 'bogus'"):
        calendar.check("bogus")
    for bad in ("daily\nOnCalendar=hourly", "100%", ""):
        with pytest.raises(InputError, match="bad calendar specification"):
            calendar.check(bad)
    assert calendar.check("2021-06-01").next is None  # in the past: never again


def test_latest_slot_matches_counting_every_elapse() -> None:
    now = time.time()
    # Beyond one call's 100 elapses: the bisection must land on the same second.
    for spec, span in (("*:*:0/7", 3 * 3600), ("*:0/5", 40 * 86400), ("hourly", 3 * 86400)):
        after = int(now) - span
        found = calendar.latest(spec, after, now)
        assert found is not None and after < found <= now
        assert calendar.elapses(spec, found)[0] > now  # nothing later is due
        # and it is an elapse: the first after the second before it
        assert calendar.elapses(spec, found - 1)[0] == found
    assert calendar.latest(ONCE, int(parse("2021-06-01T12:00:00Z")), now) is None


def test_fire_adds_a_slot_once_and_labels_its_tasks(fleet: Fleet, store: Store) -> None:
    schedule(store, "nightly", ["check the build", "-d", "run make"], fleet.cwd)
    out = fleet.ok("schedule", "fire", "nightly", "--json")
    run = json.loads(out)
    assert run["slot"] == "2021-06-01T12:00:00.000Z" and run["fresh"]
    (task_id,) = run["tasks"]
    task = fleet.show(task_id)
    assert task["labels"] == ["schedule:nightly"] and task["cwd"] == str(fleet.cwd)
    # Fired again later: no slot has elapsed since; in the same slot (a host that computed
    # it before the first commit): nothing added.
    assert json.loads(fleet.ok("schedule", "fire", "nightly", "--json")) is None
    said = fleet.ok("schedule", "fire", "nightly")
    assert "no slot has elapsed since 2021-06-01T12:00:00" in said
    again = store.fire("nightly", run["slot"], [TaskSpec(title="dup", cwd=str(fleet.cwd))])
    assert not again.fresh and again.tasks == (task_id,)
    assert len(json.loads(fleet.ok("ls", "--json", "--label", "schedule:nightly"))) == 1


def test_two_hosts_firing_one_slot_add_it_once(tmp_path: Path, store: Store) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"title": f"t{i}"}) + "\n" for i in range(20)))
    schedule(store, "twice", ["--batch", str(batch)], tmp_path, overlap="allow")
    procs = [
        subprocess.Popen(
            [fleet_exe(), "schedule", "fire", "twice", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    runs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        runs.append(json.loads(out))
    # One adds the slot; each other finds it fired (null: after the commit; not fresh: it
    # computed the slot before the commit and lost at the unique key).
    fresh = [r for r in runs if r is not None and r["fresh"]]
    assert len(fresh) == 1 and len(fresh[0]["tasks"]) == 20
    assert all(r["tasks"] == fresh[0]["tasks"] for r in runs if r is not None)
    assert store.count(TaskFilter(include_final=True)) == 20
    assert len(store.schedule_runs("twice", 10)) == 1


def spec(title: str) -> TaskSpec:
    return TaskSpec(title=title, cwd="/tmp")


def test_overlap_skip_queue_allow(store: Store, tmp_path: Path) -> None:
    for overlap in ("skip", "queue", "allow"):
        schedule(store, overlap, ["x"], tmp_path, overlap=overlap)
        first = store.fire(overlap, "2021-01-01T00:00:00.000Z", [spec("one")])
        assert first.outcome == "added" and first.fresh
        second = store.fire(overlap, "2021-01-02T00:00:00.000Z", [spec("two")])
        if overlap == "skip":
            assert second.outcome == "skipped" and second.tasks == ()
        else:
            (new,) = second.tasks
            deps = store.get(new).after
            assert list(deps) == (list(first.tasks) if overlap == "queue" else [])
    # Once the first run's task is finished, skip adds again, and the run it compares
    # with is the newest that added tasks (not the skipped one).
    (task_id,) = store.schedule_runs("skip", 1, added=True)[0].tasks
    store.close_task(task_id, "done by hand")
    third = store.fire("skip", "2021-01-03T00:00:00.000Z", [spec("three")])
    assert third.outcome == "added" and len(third.tasks) == 1
    assert [r.outcome for r in store.schedule_runs("skip", 10)] == ["added", "skipped", "added"]


def test_run_fires_a_slot_of_its_own_and_wait_follows_it(fleet: Fleet, store: Store) -> None:
    schedule(store, "adhoc", ["by hand"], fleet.cwd, overlap="allow")
    first = fleet.ok("schedule", "run", "adhoc").split()
    second = fleet.ok("schedule", "run", "adhoc").split()
    assert len(first) == len(second) == 1 and first != second
    timed_out = fleet("wait", "--schedule", "adhoc", "-t", "0")
    assert timed_out.code == 124 and second[0] in timed_out.err and first[0] not in timed_out.err
    fleet.ok("close", second[0])
    assert fleet("wait", "--schedule", "adhoc", "-t", "0").code == 0
    rows = json.loads(fleet.ok("schedule", "ls", "--json"))
    assert rows[0]["name"] == "adhoc" and rows[0]["last"]["slot"].startswith("run:")
    assert rows[0]["next"] is None  # ONCE is past


def test_bad_input(fleet: Fleet, store: Store) -> None:
    def error(*args: str) -> str:
        result = fleet(*args)
        assert result.code != 0 and result.err.startswith("fleet: error: "), result
        assert len(result.err.splitlines()) <= 2
        return result.err

    assert "no schedule ghost" in error("schedule", "fire", "ghost")
    assert "no schedule ghost" in error("wait", "--schedule", "ghost")
    assert "give task ids or --schedule" in error("wait")
    assert "bad schedule name" in error("schedule", "add", "a/b", "--on-calendar", "daily")
    assert "Failed to parse calendar specification" in error(
        "schedule", "add", "x", "--on-calendar", "someday", "--", "t"
    )
    assert "never elapses again" in error("schedule", "add", "x", "--on-calendar", ONCE, "--", "t")
    assert "either --batch FILE or --" in error("schedule", "add", "x", "--on-calendar", "daily")
    assert "standard input" in error(
        "schedule", "add", "x", "--on-calendar", "daily", "--batch", "-"
    )
    assert "cannot read batch file" in error(
        "schedule", "add", "x", "--on-calendar", "daily", "--batch", "missing.jsonl"
    )
    assert "not installed" in error("schedule", "add", "x", "--on-calendar", "daily", "--", "t")
    schedule(store, "empty", [], fleet.cwd)
    assert "has added no tasks yet" in error("wait", "--schedule", "empty")
    assert store.schedules()[0].name == "empty"  # nothing else was stored


def test_next_slot_is_strictly_after_the_last(store: Store, tmp_path: Path) -> None:
    # A fire right after another in the same slot finds nothing new to add.
    now = time.time()
    found = calendar.latest("*:*:*", int(now) - 10, now)
    assert found is not None
    assert calendar.latest("*:*:*", found, found + 0.5) is None
    assert iso(found).endswith(".000Z")


def test_dropping_a_schedule_drops_its_runs_and_keeps_its_tasks(
    store: Store, tmp_path: Path
) -> None:
    schedule(store, "gone", ["x"], tmp_path, overlap="allow")
    (task_id,) = store.fire("gone", "2021-01-01T00:00:00.000Z", [spec("one")]).tasks
    with pytest.raises(Conflict, match="schedule gone exists"):
        schedule(store, "gone", ["y"], tmp_path)
    assert store.schedule("gone").args == ("x",)  # the refused one changed nothing
    store.drop_schedule("gone")
    assert store.schedules() == [] and store.schedule_runs("gone", 10) == []
    assert store.get(task_id).title == "one"
    with pytest.raises(NotFound, match="no schedule gone"):
        store.drop_schedule("gone")
    # Made again under that name, it fires the same slot afresh.
    schedule(store, "gone", ["x"], tmp_path, overlap="allow")
    assert store.fire("gone", "2021-01-01T00:00:00.000Z", [spec("two")]).fresh
