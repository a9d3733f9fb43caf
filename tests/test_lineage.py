"""Lineage and the audit trail: subtasks a parent waits for, handoffs accepted and refused,
merge tasks, `fleet tree` and `fleet history`, the audit rows each action writes in its own
transaction, and the forward migration of a version 4 store. Under systemd: a parent that
waits for the subtask its agent spawned, and a handoff of a running task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.audit import ACTIONS, person
from fleet.config import load
from fleet.model import AttemptEnd, Status
from fleet.paths import resolve
from fleet.reap import Service, settle
from fleet.store import Store, open_store
from fleet.store.schema import VERSION
from tests import sandbox
from tests.conftest import Fleet, run_fleet, store_at_version, store_rows
from tests.conftest import fleet_run as run
from tests.sandbox import Sandbox
from tests.test_questions import agent, running
from tests.test_systemd import Fleet as UnitFleet
from tests.test_worktree import make_repo

# Every test here runs on each store (SQLite, PostgreSQL) unless marked sqlite_only.
pytestmark = pytest.mark.usefixtures("backend")


def trail(fleet: Fleet, task_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (e["action"], e["by"], e["detail"])
        for e in json.loads(fleet.ok("history", task_id, "--json"))
    ]


def audit_rows(home: Path) -> int:
    return int(store_rows(home, "SELECT count(*) FROM audit")[0][0])


def test_a_campaign_drawn_as_a_tree_with_its_history(fleet: Fleet, project: Path) -> None:
    """One root, handed off; the successor's two subtasks, which it waits for; their merge."""
    me = person()
    root = fleet.add("root work", "--coder", "command", "-d", "true")
    fleet.ok("checkpoint", root, "-s", "parser done; next: the printer")
    succ = fleet.ok("handoff", root, "--to", "command", "--context", "the printer is left")
    succ = succ.strip()
    one = fleet.add(
        "part one", "--parent", succ, "--parent-waits", "-d", "true", "--coder", "command"
    )
    two = fleet.add(
        "part two", "--parent", succ, "--parent-waits", "-d", "true", "--coder", "command"
    )
    merge = fleet.ok(
        "merge-tasks", one, two, "--title", "consolidate", "-d", "true", "--coder", "command"
    ).strip()
    loner = fleet.add("unrelated", "-d", "true")
    deps = sorted([one, two])  # `after` lists ids in order, merged_from as given
    drawn = [
        f"{root}  handed-off  root work",
        f"└── successor {succ}  waiting  root work  [after {deps[0]}, {deps[1]}]",
        f"    ├── subtask {one}  ready  part one",
        f"    │   └── merge {merge}  waiting  consolidate  [merges {one}, {two}]",
        f"    └── subtask {two}  ready  part two",
    ]
    assert fleet.ok("tree").splitlines() == [*drawn, f"{loner}  ready  unrelated"]
    assert fleet.ok("tree", two).splitlines() == drawn  # the tree that holds it

    def node(tid: str, title: str, status: str, relation: str | None, **links: Any) -> Any:
        return {
            "id": tid,
            "title": title,
            "status": status,
            "relation": relation,
            "parent": links.get("parent"),
            "predecessor": links.get("predecessor"),
            "merged_from": links.get("merged_from", []),
            "after": links.get("after", []),
            "below": links.get("below", []),
        }

    merged = node(merge, "consolidate", "waiting", "merge", merged_from=[one, two], after=deps)
    assert json.loads(fleet.ok("tree", root, "--json")) == [
        node(
            root,
            "root work",
            "handed-off",
            None,
            below=[
                node(
                    succ,
                    "root work",
                    "waiting",
                    "successor",
                    predecessor=root,
                    after=deps,
                    below=[
                        node(one, "part one", "ready", "subtask", parent=succ, below=[merged]),
                        node(two, "part two", "ready", "subtask", parent=succ),
                    ],
                )
            ],
        )
    ]
    assert trail(fleet, root) == [
        ("added", me, {"title": "root work"}),
        ("checkpointed", me, {"checkpoint": 1, "attempt": 0}),
        ("handed-off", me, {"to": succ, "coder": "command"}),
    ]
    assert trail(fleet, succ) == [
        ("added", me, {"title": "root work", "predecessor": root}),
        ("spawned", me, {"child": one, "parent_waits": True}),
        ("spawned", me, {"child": two, "parent_waits": True}),
    ]
    assert trail(fleet, one) == [
        ("added", me, {"title": "part one", "parent": succ}),
        ("merged", me, {"into": merge}),
    ]
    assert trail(fleet, merge) == [
        ("added", me, {"title": "consolidate"}),
        ("merged", me, {"from": [one, two]}),
    ]
    table = fleet.ok("history", succ).splitlines()
    assert table[0].split() == ["AT", "ACTION", "BY", "DETAIL"]
    assert f"child={one} parent_waits=True" in table[3]

    # The work runs (by hand): the subtasks, then the successor, then the merge.
    for tid in (one, two):
        assert run(tid, project).returncode == 0
    assert run(succ, project).returncode == 0
    prompt = (resolve().tasks / succ / "prompt.md").read_text()
    assert f"handed off to you from {root}" in prompt
    assert "the printer is left" in prompt and "parser done; next: the printer" in prompt
    assert f"- {one} 'part one': done (" in prompt and f"- {two} 'part two': done (" in prompt
    assert run(merge, project).returncode == 0
    prompt = (resolve().tasks / merge / "prompt.md").read_text()
    for tid in (one, two):
        assert f"artifacts in {resolve().tasks / tid / 'artifacts'}" in prompt
    assert [a for a, _, _ in trail(fleet, succ)][3:] == ["claimed", "started", "ended"]
    assert trail(fleet, succ)[-1][2]["outcome"] == "success"
    # fleet-run claimed and started it by hand; the policy is fleet-reap's.
    assert [by for _, by, _ in trail(fleet, succ)][3:] == ["fleet-run", "fleet-run", "fleet-reap"]
    assert fleet.ok("tree", merge).splitlines()[1] == (
        f"└── successor {succ}  done  root work  [after {deps[0]}, {deps[1]}]"
    )


def test_refused_handoffs_change_nothing(fleet: Fleet, home: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    before = (fleet.show(tid), audit_rows(home))
    unknown = fleet("handoff", tid, "--to", "nosuch:big")
    assert unknown.code == 2 and "handoff refused: no coder 'nosuch'" in unknown.err
    missing = fleet("--set", "coders.codex.binary=/no/such/codex", "handoff", tid, "--to", "codex")
    assert missing.code == 4
    assert "handoff refused: codex: /no/such/codex not found" in missing.err
    assert (fleet.show(tid), audit_rows(home)) == before
    assert [t["id"] for t in json.loads(fleet.ok("ls", "--all", "--json"))] == [tid]
    fleet.ok("close", tid)
    late = fleet("handoff", tid, "--to", "command")
    assert late.code == 4 and "it is done" in late.err
    assert "only a ready, running, blocked or suspended task can be handed off" in late.err


def test_a_refused_action_writes_no_audit_row(fleet: Fleet, home: Path, project: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    fleet.ok("cancel", tid, "--reason", "not needed")
    rows = audit_rows(home)
    assert fleet("close", tid).code == 4
    assert fleet("suspend", tid).code == 4
    assert audit_rows(home) == rows
    batch = project / "batch.jsonl"
    batch.write_text('{"title": "good"}\n{"title": "bad", "after": ["fl-zzzzzz"]}\n')
    assert fleet("add", "--batch", str(batch)).code == 3  # the whole batch is refused
    assert audit_rows(home) == rows
    assert [a for a, _, _ in trail(fleet, tid)] == ["added", "cancelled"]
    assert trail(fleet, tid)[1][2] == {"reason": "not needed"}


def test_subtasks_inherit_the_directory_isolation_and_base(
    fleet: Fleet, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = make_repo(project)
    parent = fleet.add("parent", "--isolation", "worktree", "--base", "main")
    fleet.cwd = tmp_path  # the subtasks are added from somewhere else
    child = fleet.show(fleet.add("child", "--parent", parent))
    assert (child["cwd"], child["isolation"], child["base"]) == (str(repo), "worktree", "main")
    assert child["parent"] == parent and fleet.show(parent)["after"] == []
    # Another directory keeps the parent's isolation, checked there (not the parent's base).
    other = fleet("add", "elsewhere", "--parent", parent, "--cwd", str(tmp_path))
    assert other.code == 2 and "not in a git repository, which worktree isolation" in other.err
    plain = fleet.show(fleet.add("plain", "--parent", parent, "--isolation", "none"))
    assert (plain["cwd"], plain["isolation"], plain["base"]) == (str(repo), "none", None)
    bad = fleet("add", "orphan", "--parent-waits")
    assert bad.code == 2 and "--parent-waits needs --parent" in bad.err


def test_spawn_and_handoff_through_the_mcp_server(fleet: Fleet, home: Path) -> None:
    parent = running(fleet, "big job")

    async def scenario() -> list[tuple[str, bool]]:
        results = []
        async with agent(parent) as session:
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"spawn_subtask", "handoff"} <= tools
            calls: list[tuple[str, dict[str, Any]]] = [
                ("spawn_subtask", {"title": "waited for", "description": "true", "depends": True}),
                ("spawn_subtask", {"title": "on its own", "coder": "command"}),
                ("spawn_subtask", {"title": "bad coder", "coder": "nosuch"}),
                ("handoff", {"coder": "nosuch", "context": "x"}),
                ("handoff", {"coder": "command", "model": "m1", "context": "go on from here"}),
            ]
            for tool, arguments in calls:
                result = await session.call_tool(tool, arguments)
                text = "".join(getattr(block, "text", "") for block in result.content)
                results.append((text, bool(result.is_error)))
        return results

    waited, alone, bad, refused, accepted = asyncio.run(scenario())
    assert "this task waits for it" in waited[0] and not waited[1]
    assert "runs on its own" in alone[0] and not alone[1]
    assert bad[1] and "unknown coder 'nosuch'" in bad[0]
    assert refused[1] and "handoff refused: no coder 'nosuch'" in refused[0]
    assert not accepted[1] and "Stop working now" in accepted[0]
    listed = {t["title"]: t for t in json.loads(fleet.ok("ls", "--all", "--json"))}
    first, second = listed["waited for"], listed["on its own"]
    original = fleet.show(parent)
    assert (first["parent"], first["cwd"], first["coder"]) == (
        parent,
        original["cwd"],
        None,
    )
    assert (second["parent"], second["coder"]) == (parent, "command")
    assert original["status"] == "handed-off" and original["after"] == [first["id"]]
    (successor,) = [t for t in listed.values() if t["predecessor"] == parent]
    assert (successor["coder"], successor["model"], successor["handoff"]) == (
        "command",
        "m1",
        "go on from here",
    )
    assert successor["after"] == [first["id"]]  # it waits for what the original waited for
    assert (home / "tasks" / parent / ".kill").exists()  # the attempt is stopped
    actions = [(a, by) for a, by, _ in trail(fleet, parent)]
    assert actions[-3:] == [("spawned", "agent"), ("spawned", "agent"), ("handed-off", "agent")]


@pytest.mark.sqlite_only
def test_a_version_5_store_is_migrated(home: Path, project: Path) -> None:
    db = store_at_version(home, 5)
    db.execute(
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at, status) VALUES"
        " (?, ?, ?, ?, ?, 'suspended')",
        ("fl-000001", "old task", str(project), "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    )
    db.commit()
    old = sqlite3.connect(home / "fleet.db", isolation_level=None)
    assert old.execute("SELECT count(*) FROM tasks").fetchone() == (1,)
    shown = run_fleet("show", "fl-000001", "--json")
    assert shown.code == 0, shown.err
    obj = json.loads(shown.out)
    assert (obj["predecessor"], obj["merged_from"], obj["handoff"]) == (None, [], None)
    assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    db.close()
    assert run_fleet("history", "fl-000001", "--json").out == "[]\n"  # older than the trail
    done = run_fleet("handoff", "fl-000001", "--to", "command", cwd=project)
    assert done.code == 0, done.err
    assert old.execute("SELECT status FROM tasks WHERE id = 'fl-000001'").fetchone() == (
        "handed-off",
    )
    # The connection open since before the migration re-read the widened CHECK.
    old.execute("UPDATE tasks SET status = 'suspended' WHERE id = 'fl-000001'")
    old.execute("UPDATE tasks SET status = 'handed-off' WHERE id = 'fl-000001'")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        old.execute("UPDATE tasks SET status = 'gone' WHERE id = 'fl-000001'")
    old.close()
    check = sqlite3.connect(home / "fleet.db")
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert check.execute("SELECT action FROM audit").fetchall() == [("handed-off",), ("added",)]
    check.close()


@contextlib.contextmanager
def opened() -> Iterator[Store]:
    store = open_store(resolve())
    try:
        yield store
    finally:
        store.close()


def test_a_successor_waits_until_its_predecessors_attempt_ends(fleet: Fleet) -> None:
    """Its predecessor's work reaches the branch only when that attempt's runner stops."""
    tid = running(fleet, "long job")
    successor = fleet.ok("handoff", tid, "--to", "command", "--no-block").strip()
    with opened() as store:
        assert store.get(tid).claimed_by == "test"  # the attempt is still stopping
        assert [t.id for t in store.ready()] == []
        assert store.claim_task(successor, "host", 60, "command", None) is None
    (listed,) = json.loads(fleet.ok("ls", "--json"))
    assert (listed["id"], listed["waiting_on"]) == (successor, [tid])
    assert "waiting" in fleet.ok("ls")
    assert fleet.show(successor)["waiting_on"] == [tid]
    assert "waiting on " + tid in fleet.ok("show", successor)
    with opened() as store:
        store.finish(tid, "test", AttemptEnd("handed-off"), Status.HANDED_OFF)
        assert [t.id for t in store.ready()] == [successor]
    assert fleet.show(successor)["waiting_on"] == []


@pytest.mark.parametrize("action", ["suspend", "handoff"])
def test_a_task_stopped_before_its_unit_started_is_not_run(
    fleet: Fleet, project: Path, action: str
) -> None:
    """The dispatch pass claimed it and started its unit (--no-block); a person suspended or
    handed it off before the runner took it, and the `.kill` they left would be cleared."""
    ran = project / "ran"
    tid = fleet.add("job", "--coder", "command", "-d", f"touch {ran}")
    me = os.uname().nodename
    with opened() as store:
        assert store.claim_task(tid, me, 60, "command", None) is not None
    if action == "suspend":
        fleet.ok("suspend", tid, "--no-block")
        status = "suspended"
    else:
        successor = fleet.ok("handoff", tid, "--to", "command", "--no-block").strip()
        status = "handed-off"
    started = run(tid, project, INVOCATION_ID="0123456789abcdef")  # as its unit runs it
    assert started.returncode == 4 and not ran.exists()
    assert f"not claimable: it was {status} before it started" in started.stderr
    with opened() as store:  # fleet-reap, as ExecStopPost runs it
        service = Service("exit-code", "exited", "4", "0123456789abcdef", 0)
        assert settle(resolve(), store, load(resolve()), tid, service) == "not-started"
    shown = fleet.show(tid)
    assert (shown["status"], shown["claimed_by"], shown["failures"]) == (status, None, 0)
    assert [a["outcome"] for a in shown["attempt_log"]] == ["not-started"]
    if action == "handoff":
        assert fleet.show(successor)["waiting_on"] == []  # its predecessor let go


def test_a_merge_task_handed_off_still_merges_the_same_tasks(fleet: Fleet, home: Path) -> None:
    one = fleet.add("one", "--coder", "command", "-d", "true")
    two = fleet.add("two", "--coder", "command", "-d", "true")
    merge = fleet.ok("merge-tasks", one, two, "--title", "both", "-d", "true").strip()
    successor = fleet.ok("handoff", merge, "--to", "command").strip()
    shown = fleet.show(successor)
    assert (shown["merged_from"], sorted(shown["after"])) == ([one, two], sorted([one, two]))
    fleet.ok("close", one)
    fleet.ok("close", two)
    assert run(successor, home).returncode == 0
    prompt = (home / "tasks" / successor / "prompt.md").read_text()
    assert f"- {one} 'one' (done)" in prompt and f"- {two} 'two' (done)" in prompt


def test_a_dependency_on_a_handed_off_task_waits_for_its_successor(
    fleet: Fleet, project: Path
) -> None:
    first = fleet.add("first", "-d", "true")
    second = fleet.ok("handoff", first, "--to", "command").strip()
    last = fleet.ok("handoff", second, "--to", "command").strip()
    added = fleet.add("added", "--after", first)
    edited = fleet.add("edited")
    fleet.ok("edit", edited, "--after", second)
    batch = project / "batch.jsonl"
    batch.write_text(json.dumps({"title": "batched", "after": [first]}) + "\n")
    (batched,) = fleet.ok("add", "--batch", str(batch)).split()
    for tid in (added, edited, batched):
        assert fleet.show(tid)["after"] == [last]
    fleet.ok("close", last)
    assert all(fleet.show(t)["waiting_on"] == [] for t in (added, edited, batched))
    fleet.ok("edit", edited, "--not-after", first)  # what stands for it goes too
    assert fleet.show(edited)["after"] == []


def test_wait_follows_a_handed_off_task_to_its_last_successor(fleet: Fleet) -> None:
    first = fleet.add("first", "-d", "true")
    second = fleet.ok("handoff", first, "--to", "command").strip()
    last = fleet.ok("handoff", second, "--to", "command").strip()
    assert fleet("wait", first, "--timeout", "0.2").code == 124  # its work goes on in `last`
    fleet.ok("close", last)
    waited = fleet("wait", first, second)
    assert waited.code == 0, waited.err
    assert f"{first} was handed off: waiting for {last}" in waited.err
    fleet.ok("retry", last)
    fleet.ok("cancel", last)
    assert fleet("wait", first).code == 1


def test_bad_input_around_lineage_is_refused_with_a_hint(
    fleet: Fleet, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = project / "batch.jsonl"
    batch.write_text(json.dumps({"title": "x"}) + "\n")
    parent = fleet.add("parent", "-d", "true")
    for flags in (
        ("--parent", parent),
        ("--parent", parent, "--parent-waits"),
        ("--parent-waits",),
    ):
        refused = fleet("add", "--batch", str(batch), *flags)
        assert refused.code == 2 and "do not apply to --batch" in refused.err
        assert "the keys parent and parent_waits" in refused.err
    fleet.ok("suspend", parent)
    retried = fleet("retry", parent)
    assert retried.code == 4 and f"fleet resume {parent}" in retried.err
    successor = fleet.ok("handoff", parent, "--to", "command").strip()
    for verb in ("close", "retry"):
        refused = fleet(verb, parent)
        assert refused.code == 4 and f"its work goes on in {successor}" in refused.err
        assert f"fleet {verb} {successor}" in refused.err


def test_a_batch_line_with_a_parent_inherits_like_fleet_add(
    fleet: Fleet, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = make_repo(project)
    parent = fleet.add("parent", "--isolation", "worktree", "--base", "main", "--merge", "rebase")
    batch = tmp_path / "batch.jsonl"
    lines = [
        {"title": "child", "parent": parent, "parent_waits": True},
        {"title": "new parent", "ref": "p", "isolation": "worktree", "merge": "ff-only"},
        {"title": "grandchild", "parent": "p", "parent_waits": True},
    ]
    batch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fleet.cwd = tmp_path  # added from somewhere else: the subtasks still work in the repository
    child, new_parent, grandchild = fleet.ok(
        "add", "--batch", str(batch), "--cwd", str(repo)
    ).split()
    for tid, of in ((child, parent), (grandchild, new_parent)):
        shown = fleet.show(tid)
        assert (shown["cwd"], shown["isolation"], shown["base"], shown["parent"]) == (
            str(repo),
            "worktree",
            "main",
            of,
        )
        assert fleet.show(of)["after"] == [tid]  # parent_waits
    assert (fleet.show(child)["merge"], fleet.show(grandchild)["merge"]) == ("rebase", "ff-only")
    bad = project / "bad.jsonl"
    bad.write_text(json.dumps({"title": "x", "parent_waits": True}) + "\n")
    refused = fleet("add", "--batch", str(bad))
    assert refused.code == 2 and "line 1: parent_waits needs parent" in refused.err


# ---------------------------------------------------------------------- under systemd

systemd = sandbox.systemd


@pytest.fixture
def units(systemd: Sandbox, tmp_path: Path, project: Path) -> Iterator[UnitFleet]:
    fleet = UnitFleet(systemd, tmp_path / "unit-home", project)
    fleet.setup("default_coder=command", "stop_grace_seconds=2")
    yield fleet
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("reset-failed", check=False)


@pytest.mark.sqlite_only
def test_a_parent_waits_for_the_subtask_its_agent_spawned(units: UnitFleet) -> None:
    """The parent's agent (a shell script) adds a subtask it waits for and ends its turn; the
    parent runs again only once the subtask is done, and its prompt then says how it ended."""
    fleet = units
    script = (
        'if test -e "$FLEET_ARTIFACT_DIR/spawned"; then'
        ' cp "$FLEET_TASK_DIR/prompt.md" "$FLEET_ARTIFACT_DIR/again.md"; exit 0; fi;'
        ' fleet add "the part" --parent "$FLEET_TASK_ID" --parent-waits -d "echo part done"'
        ' && touch "$FLEET_ARTIFACT_DIR/spawned"'
    )
    parent = fleet.add(script)
    assert fleet.wait(parent) == 0
    (child,) = [t for t in json.loads(fleet("ls", "--all", "--json").stdout) if t["parent"]]
    assert (child["parent"], child["status"], child["cwd"]) == (parent, "done", str(fleet.project))
    shown = fleet.show(parent)
    assert [a["outcome"] for a in shown["attempt_log"]] == ["waiting", "success"]
    assert (shown["failures"], shown["noclose"], shown["after"]) == (0, 0, [child["id"]])
    assert child["finished_at"] <= shown["attempt_log"][1]["started_at"]
    again = (fleet.home / "tasks" / parent / "artifacts" / "again.md").read_text()
    assert f"- {child['id']} 'the part': done (" in again
    history = json.loads(fleet("history", parent, "--json").stdout)
    spawned = [e for e in history if e["action"] == "spawned"]
    assert [(e["by"], e["detail"]) for e in spawned] == [
        ("agent", {"child": child["id"], "parent_waits": True})
    ]
    ended = [e["detail"]["outcome"] for e in history if e["action"] == "ended"]
    assert ended == ["waiting", "success"]
    # Each row is also a journal entry the catalog explains.
    entries = fleet.box.journal(f"FLEET_TASK_ID={parent}", "FLEET_ACTION=spawned")
    assert [(e["MESSAGE_ID"], e["FLEET_CHILD"], e["FLEET_BY"]) for e in entries] == [
        (ACTIONS["spawned"].message_id, child["id"], "agent")
    ]
    explained = fleet.box.run("journalctl", "-x", "--no-pager", f"FLEET_TASK_ID={parent}").stdout
    assert f"added subtask {child['id']} of fleet task {parent}" in explained


@pytest.mark.sqlite_only
def test_a_running_task_handed_off_and_refused_under_systemd(units: UnitFleet) -> None:
    fleet = units
    mark = fleet.project / "started"
    # The original marks that it runs and works on; its successor finds the mark and is done.
    tid = fleet.add(f"test -e {mark} && exit 0; touch {mark}; exec sleep 120")
    fleet.box.wait_for(mark.exists, what="the original's agent")
    for args, code, why in (
        (("handoff", tid, "--to", "nosuch"), 2, "no coder 'nosuch' is configured"),
        (
            ("--set", "coders.codex.binary=/no/such", "handoff", tid, "--to", "codex:o4"),
            4,
            "codex: /no/such not found",
        ),
    ):
        refused = fleet(*args, check=False)
        assert (refused.returncode, why in refused.stderr) == (code, True), refused.stderr
    state = fleet.box.systemctl("is-active", f"fleet-task@{tid}", check=False).stdout.strip()
    assert (state, fleet.show(tid)["status"]) == ("active", "running")
    successor = fleet("handoff", tid, "--to", "command", "--context", "carry on").stdout.strip()
    shown = fleet.show(tid)  # the stop has completed: the attempt is reaped
    assert (shown["status"], shown["reason"]) == (
        "handed-off",
        f"handed off to {successor} (command)",
    )
    assert [a["outcome"] for a in shown["attempt_log"]] == ["handed-off"]
    assert (shown["failures"], shown["claimed_by"]) == (0, None)
    assert fleet.wait(successor) == 0
    after = fleet.show(successor)
    assert (after["predecessor"], after["handoff"], after["status"]) == (tid, "carry on", "done")
    prompt = (fleet.home / "tasks" / successor / "prompt.md").read_text()
    assert f"handed off to you from {tid}" in prompt and "carry on" in prompt
    actions = [e["action"] for e in json.loads(fleet("history", tid, "--json").stdout)]
    assert actions == ["added", "claimed", "started", "handed-off", "ended"]
