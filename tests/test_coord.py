"""Agents that coordinate: leases on resources in each store (the `backend` fixture), through
the real fleet-ask MCP server and `fleet claims` (the real coder CLIs at it are in
test_coord_agents.py)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet import checkpoints, coordination
from fleet.errors import Conflict, InputError
from fleet.model import AttemptEnd, Status, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, open_store
from fleet.store.coord import CLAIM_FIELDS, MESSAGE_FIELDS, OFFER_FIELDS
from tests import test_questions
from tests.conftest import Fleet, fleet_exe, run_fleet, store_sql
from tests.test_questions import agent

RACERS = 20
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
CAUSE = "I found the cause: a stale lock"


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def running(store: Store, cwd: Path, title: str = "t", parent: str | None = None) -> str:
    """A task claimed as fleet-run claims it (its attempt open)."""
    (task,) = store.add([TaskSpec(title=title, cwd=str(cwd), coder="command", parent=parent)])
    assert store.claim_task(task.id, f"runner-{task.id}", 60, "command", None) is not None
    return task.id


def end(store: Store, task_id: str) -> None:
    store.finish(task_id, f"runner-{task_id}", AttemptEnd("success"), Status.READY)


async def call(session: Any, name: str, **arguments: Any) -> tuple[str, bool]:
    result = await session.call_tool(name, arguments)
    return "".join(getattr(b, "text", "") for b in result.content), bool(result.is_error)


# ---------------------------------------------------------------------- the store


def _racer(task_id: str, start: Any, out: Any) -> None:
    store = open_store(resolve())
    start.wait()
    won, holder = store.claim_resource(task_id, "fleet/run.py", 60, f"by {task_id}")
    store.close()
    out.put((task_id, won, holder.task))


def test_of_twenty_racing_claimers_exactly_one_wins(store: Store, project: Path) -> None:
    tasks = [running(store, project, f"racer {i}") for i in range(RACERS)]
    ctx = mp.get_context("fork")  # each opens its own store, as each fleet-ask does
    start = ctx.Event()
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(t, start, out)) for t in tasks]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winners = [t for t, won, _ in results if won]
    assert len(winners) == 1
    # Every loser was told the winner's name.
    assert {holder for _, _, holder in results} == set(winners)
    (held,) = store.resource_claims()
    assert (held.task, held.resource, held.note) == (winners[0], "fleet/run.py", f"by {winners[0]}")


def test_a_lease_ends_at_its_time_on_release_or_with_its_attempt(
    store: Store, project: Path
) -> None:
    first, second = running(store, project), running(store, project)
    won, holder = store.claim_resource(first, "db-migrations", 60, "adding a column")
    assert won and holder.task == first
    won, holder = store.claim_resource(second, "db-migrations", 60, "")
    assert not won and (holder.task, holder.note) == (first, "adding a column")
    # The holder renews its own lease; the other still cannot take it.
    assert store.claim_resource(first, "db-migrations", 120, "still at it").won
    assert not store.claim_resource(second, "db-migrations", 60, "").won
    assert store.release_resource(first, "db-migrations")
    assert not store.release_resource(first, "db-migrations")  # nothing left to release
    assert store.claim_resource(second, "db-migrations", 60, "mine now").won
    # The end of the holder's attempt ends its leases, with no clean-up.
    end(store, second)
    assert store.resource_claims() == []
    assert store.claim_resource(first, "db-migrations", 60, "").won
    # A lease that has run out is anyone's.
    third = running(store, project)
    store_sql(resolve().home, "UPDATE resource_claims SET until = '2000-01-01T00:00:00.000Z'")
    assert store.resource_claims() == []
    assert store.claim_resource(third, "db-migrations", 60, "").won


def test_leases_are_per_directory_and_only_for_running_tasks(
    store: Store, project: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    here, there = running(store, project), running(store, other)
    assert store.claim_resource(here, "README.md", 60, "").won
    assert store.claim_resource(there, "README.md", 60, "").won
    assert [c.scope for c in store.resource_claims()] == sorted([str(project), str(other)])
    assert [c.task for c in store.resource_claims(scope=str(other))] == [there]
    end(store, here)
    with pytest.raises(Conflict, match="not running"):
        store.claim_resource(here, "README.md", 60, "")
    actions = [e.action for e in store.history(there)]
    assert "leased" in actions


def test_a_checkpoint_saves_the_leases_and_the_resumed_attempt_takes_them_back(
    store: Store, project: Path
) -> None:
    task = running(store, project)
    store.claim_resource(task, "src/a.py", 600, "refactoring")
    store.claim_resource(task, "src/b.py", 600, "")
    cp = checkpoints.take(store, task, "agent", "halfway")
    assert [s.resource for s in store.saved_claims(task, cp.n)] == ["src/a.py", "src/b.py"]
    end(store, task)
    # Meanwhile another agent took one of them.
    rival = running(store, project)
    assert store.claim_resource(rival, "src/b.py", 60, "mine").won
    assert store.claim_task(task, f"runner-{task}", 60, "command", None) is not None
    plan = checkpoints.plan(store.checkpoint(task, cp.n), "command", [], "resumed")
    plan = coordination.resumed_with_claims(store, task, plan)
    assert [c.resource for c in store.resource_claims(task_id=task)] == ["src/a.py"]
    for prompt in (plan.resumed_prompt, plan.fresh_note):
        assert "taken back for you:\n- src/a.py" in prompt
        assert f"src/b.py held by task {rival}" in prompt and ": mine" in prompt


# ---------------------------------------------------------------------- the tools, the CLI


def test_the_agents_claim_release_and_list_through_fleet_ask(
    fleet: Fleet, store: Store, project: Path
) -> None:
    first, second = running(store, project), running(store, project)

    async def scenario() -> None:
        async with agent(first) as one, agent(second) as two:
            text, error = await call(one, "claim", resource="fleet/run.py", note="the loop")
            assert not error and text.startswith("Claimed fleet/run.py until ")
            text, error = await call(two, "claim", resource="fleet/run.py", ttl_seconds=60)
            assert not error and text.startswith(f"Refused: fleet/run.py held by task {first}")
            assert ": the loop." in text and " s left)" in text
            text, _ = await call(two, "claims")
            assert f"- fleet/run.py held by task {first}" in text and "(yours)" not in text
            text, _ = await call(one, "claims")
            assert "(yours)" in text
            text, error = await call(two, "claim", resource="x", ttl_seconds=0)
            assert error and "ttl_seconds must be from 1" in text
            text, error = await call(two, "claim", resource="a\x1bb")
            assert error and "control characters" in text
            assert (await call(one, "release", resource="fleet/run.py"))[0] == (
                "Released fleet/run.py."
            )
            text, _ = await call(two, "claim", resource="fleet/run.py")
            assert text.startswith("Claimed")

    asyncio.run(scenario())
    listed = json.loads(fleet.ok("claims", "--json"))
    assert [(c["resource"], c["task"], c["scope"]) for c in listed] == [
        ("fleet/run.py", second, str(project))
    ]
    assert set(listed[0]) == {f.name for f in CLAIM_FIELDS}
    table = run_fleet("claims")
    assert table.code == 0 and "fleet/run.py" in table.out and second in table.out
    assert json.loads(fleet.ok("claims", "--json", "--dir", "/nowhere")) == []


def test_bad_lease_input_is_refused_before_the_store() -> None:
    with pytest.raises(InputError, match="resource is empty"):
        coordination.resource("  ")
    with pytest.raises(InputError, match="longer than"):
        coordination.resource("x" * 301)
    with pytest.raises(InputError):
        coordination.lease_seconds(86401)


# ---------------------------------------------------------------------- messages


def test_a_broadcast_reaches_the_three_running_siblings(store: Store, project: Path) -> None:
    (parent,) = store.add([TaskSpec(title="parent", cwd=str(project))])
    sender, *siblings = [running(store, project, f"child {i}", parent.id) for i in range(4)]
    (idle,) = store.add([TaskSpec(title="not running", cwd=str(project), parent=parent.id)])

    async def scenario() -> None:
        async with agent(sender) as session:
            text, error = await call(
                session, "send_message", to="siblings", text="I found the cause: a stale lock"
            )
            assert not error and text.startswith(f"Sent to {', '.join(siblings)}.")
            text, error = await call(session, "send_message", to="parent", text="halfway")
            assert not error and text.startswith(f"Sent to {parent.id}.")
            text, error = await call(session, "send_message", to="children", text="x")
            assert error and "no running task to send to as 'children'" in text
        for sibling in siblings:
            async with agent(sibling) as session:
                text, _ = await call(session, "read_messages")
                shape = rf"New messages:\n- message \d+ from {sender} at {STAMP}:\n  {CAUSE}"
                assert re.fullmatch(shape, text), text
                assert (await call(session, "read_messages"))[0] == "No new messages."

    asyncio.run(scenario())
    assert store.messages(idle.id) == []
    (to_parent,) = store.messages(parent.id)
    assert (to_parent.sender, to_parent.sender_task, to_parent.text) == (sender, sender, "halfway")
    assert to_parent.read_at is None
    assert [e.action for e in store.history(siblings[0])].count("messaged") == 1


def test_a_message_arrives_with_the_agents_next_tool_result(
    fleet: Fleet, store: Store, project: Path
) -> None:
    task = running(store, project)

    async def scenario() -> None:
        async with agent(task) as session:
            text, _ = await call(session, "claims")
            assert "Messages for you" not in text
            sent = await asyncio.to_thread(run_fleet, "message", task, "please look at run.py")
            assert sent.code == 0, sent.err
            (number,) = sent.out.split()
            text, _ = await call(session, "claims")
            assert text.startswith(f"No leases are held in {project}.")
            assert "\n---\nMessages for you (from other agents or a person) arrived" in text
            assert f"- message {number} from " in text and "please look at run.py" in text
            # Each message once: the next result has none.
            assert "Messages for you" not in (await call(session, "claims"))[0]

    asyncio.run(scenario())
    (seen,) = json.loads(fleet.ok("messages", task, "--json"))
    assert seen["read_at"] is not None and seen["sender_task"] is None
    assert set(seen) == {f.name for f in MESSAGE_FIELDS}
    assert "please look at run.py" in fleet.ok("messages")


def test_a_person_broadcasts_to_every_running_task(
    fleet: Fleet, store: Store, project: Path
) -> None:
    one, two = running(store, project), running(store, project)
    fleet.add("never started")
    sent = json.loads(fleet.ok("message", "--all", "--json", "stop at a good point"))
    assert sorted(m["recipient"] for m in sent) == sorted([one, two])
    assert [m.text for m in store.take_messages(one)] == ["stop at a good point"]
    end(store, one)
    end(store, two)
    refused = fleet("message", "--all", "anyone?")
    assert refused.code == 2 and "no running task to send to as 'all'" in refused.err
    assert fleet("message", "--all").code == 2
    wrong = fleet("message", one)
    assert wrong.code == 2 and "give ID and TEXT" in wrong.err
    missing = fleet("message", "fl-zzzzzz", "hello")
    assert missing.code != 0
    empty = fleet("message", one, "  ")
    assert empty.code == 2 and "message is empty" in empty.err


# ---------------------------------------------------------------------- who is doing what


def test_list_agents_shows_each_running_agents_focus_and_leases(
    fleet: Fleet, store: Store, project: Path
) -> None:
    first, second = running(store, project, "fix the lock"), running(store, project, "docs")
    done = fleet.add("an old one")
    fleet.ok("close", done, "--reason", "shipped")

    async def scenario() -> None:
        async with agent(first) as one, agent(second) as two:
            said, error = await call(one, "set_focus", text="reading fleet/store/sqlite.py")
            assert (said, error) == ("Focus set: reading fleet/store/sqlite.py", False)
            await call(one, "claim", resource="fleet/store/sqlite.py")
            text, _ = await call(two, "list_agents")
            assert text.startswith("Running tasks (2):\n")
            assert f"- {first}: fix the lock [command, starting, attempt 1]" in text
            assert "  focus: reading fleet/store/sqlite.py\n  holds: fleet/store/sqlite.py" in text
            assert f"- {second} (you): docs [command" in text
            assert f"Latest other tasks in {project}:\n- {done}: an old one [done, shipped]" in text
            said, error = await call(one, "set_focus", text="two\nlines")
            assert error and "control characters" in said

    asyncio.run(scenario())
    (row,) = [r for r in json.loads(fleet.ok("status", "--json"))["running"] if r["id"] == first]
    assert (row["focus"], row["claims"]) == (
        "reading fleet/store/sqlite.py",
        ["fleet/store/sqlite.py"],
    )
    assert "reading fleet/store/sqlite.py"[:30] in fleet.ok("status")
    assert "focus: reading fleet/store" in fleet.ok("ls")
    # The focus, like a lease, goes with the attempt.
    end(store, first)
    assert store.focuses() == {}
    with pytest.raises(Conflict, match="not running"):
        store.set_focus(first, "later")


# ---------------------------------------------------------------------- teaching the protocol

PROTOCOL = ("set_focus", "claim", "release", "list_agents", "send_message")


def test_the_server_instructions_and_the_prompt_teach_the_protocol(
    store: Store, project: Path
) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from fleet.asktools import TOOLS
    from fleet.taskdir import compose_prompt
    from tests.conftest import fleet_exe

    task = running(store, project)

    async def instructions() -> str:
        env = {**os.environ, "FLEET_TASK_ID": task}
        params = StdioServerParameters(command=fleet_exe("fleet-ask"), env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            return (await session.initialize()).instructions or ""

    taught = asyncio.run(instructions())
    prompt = compose_prompt(store.get(task), project / "artifacts")
    for name in PROTOCOL:
        assert name in TOOLS
        assert re.search(rf"\b{name}\b", taught), name
        assert re.search(rf"\b{name}\b", prompt), name
    assert "claim a file or area before you change it" in prompt


# ---------------------------------------------------------------------- handoff offers


def offered(fleet: Fleet, task: str, *more: str) -> str:
    return fleet.ok("handoff", task, "--to", "command", "--offer", *more).strip()


def test_an_offer_declined_then_one_accepted_and_the_trail_shows_both(
    fleet: Fleet, store: Store, project: Path
) -> None:
    task = running(store, project, "long work")
    first = offered(fleet, task, "--context", "the parser is done; the docs are left")
    (made,) = json.loads(fleet.ok("offers", "--json"))
    assert (made["id"], made["status"], made["coder"]) == (int(first), "offered", "command")
    assert made["context"] == "the parser is done; the docs are left"
    assert set(made) == {f.name for f in OFFER_FIELDS}
    # Nothing changed meanwhile; a second offer waits for the first to be settled.
    assert store.get(task).status == Status.RUNNING
    again = fleet("handoff", task, "--to", "command", "--offer")
    assert again.code != 0 and "already has an open handoff offer" in again.err
    fleet.ok("decline", task, "--reason", "nobody free for the docs")
    assert store.get(task).status == Status.RUNNING
    (told,) = store.take_messages(task)
    assert f"handoff offer {first} to command was declined by " in told.text
    assert "nobody free for the docs. Carry on with the task yourself." in told.text
    refused = fleet("accept", task)
    assert refused.code != 0 and f"offer {first} was declined by " in refused.err
    second = offered(fleet, task)
    successor = fleet.ok("accept", task, "--no-block").strip()
    assert store.get(task).status == Status.HANDED_OFF
    assert store.get(successor).predecessor == task
    settled = {o.id: o for o in store.offers(task)}
    assert (settled[int(second)].status, settled[int(second)].successor) == (
        "accepted",
        successor,
    )
    actions = [e.action for e in store.history(task) if "hand" in e.action]
    assert actions == [
        "handoff-offered",
        "handoff-declined",
        "handoff-offered",
        "handoff-accepted",
        "handed-off",
    ]
    assert "declined" in fleet.ok("offers", task) and "accepted" in fleet.ok("offers")


def test_an_offer_expires_and_the_policy_may_accept_at_once(
    fleet: Fleet, store: Store, project: Path
) -> None:
    task = running(store, project)
    number = offered(fleet, task, "--expires", "600")
    store_sql(resolve().home, "UPDATE handoff_offers SET expires_at = '2000-01-01T00:00:00.000Z'")
    late = fleet("accept", task)
    assert late.code != 0 and f"offer {number} was expired" in late.err
    assert [e.action for e in store.history(task)][-1] == "handoff-expired"
    assert store.get(task).status == Status.RUNNING
    assert fleet("handoff", task, "--to", "command", "--expires", "5").code == 2
    successor = fleet.ok(
        "--set",
        "handoff_offers=accept",
        "handoff",
        task,
        "--to",
        "command",
        "--offer",
        "--no-block",
    ).strip()
    assert store.get(successor).predecessor == task
    assert store.offers(task)[-1].status == "accepted"


def test_an_agent_of_the_offered_coder_reads_the_offer_and_accepts_it(
    fleet: Fleet, store: Store, project: Path, home: Path, backend: str
) -> None:
    original, other = running(store, project, "the original"), running(store, project, "other")
    (home / "tasks" / original).mkdir(parents=True)  # as its runner prepared it
    receiver = running(store, project, "a command agent")
    offered(fleet, original, "--context", "half done")

    async def scenario() -> None:
        async with agent(receiver) as session:
            text, _ = await call(session, "read_messages")
            assert f"task {original} (the original) is offered to command" in text
            assert "Context: half done" in text and "accept_handoff(task=" in text
            text, _ = await call(session, "list_agents")
            assert "Open handoff offers to your coder (command; accept_handoff takes one):" in text
            assert f": task {original}, until " in text and "; context: half done" in text
            text, error = await call(session, "accept_handoff", task=other)
            assert error and f"{other} has no handoff offer" in text
            text, error = await call(session, "accept_handoff", task=original)
            assert not error and text.startswith("Accepted offer ")

    asyncio.run(scenario())
    task = store.get(original)
    assert task.status == Status.HANDED_OFF
    (offer,) = store.offers(original)
    assert (offer.status, offer.decided_by) == ("accepted", "agent")
    # Its attempt is stopped where it runs: on SQLite every claim is this host's, whose
    # runner hears its `.kill`; on PostgreSQL `runner-…` is another host, asked through the
    # store as `fleet kill` asks it.
    rung = (home / "tasks" / original / ".kill").exists()
    asked = store.kill_requested(original, task.attempts)
    assert (rung, asked) == ((True, False) if backend == "sqlite" else (False, True))


def test_claudes_hook_delivers_messages_with_the_result_of_any_tool(
    store: Store, project: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.coders.claude import hook_settings

    # Written by fleet-run, which names the fleet-ask beside itself (whatever runs pytest).
    monkeypatch.setattr(sys, "argv", [fleet_exe("fleet-run")])
    task = running(store, project)
    task_dir = home / "tasks" / task
    task_dir.mkdir(parents=True)
    settings = hook_settings(task_dir, {"FLEET_TASK_ID": task, "FLEET_HOME": str(home)})
    (command,) = [h["command"] for m in settings["hooks"]["PostToolUse"] for h in m["hooks"]]

    def after(tool: str) -> str:
        """What the hook prints after a call of `tool`, run as Claude Code runs it."""
        done = subprocess.run(
            ["sh", "-c", command],
            input=json.dumps({"hook_event_name": "PostToolUse", "tool_name": tool}),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert after("Bash") == ""  # no mail: the shell's test alone
    coordination.send(store, resolve(), "root@host", None, task, "look at the logs first")
    assert (task_dir / ".mail").exists()
    # fleet's own tools bring messages with their results: the hook leaves them alone.
    assert after("mcp__fleet__claims") == "" and (task_dir / ".mail").exists()
    out = json.loads(after("Edit"))["hookSpecificOutput"]
    assert out["hookEventName"] == "PostToolUse"
    assert out["additionalContext"].startswith("Messages for you (from other agents or a person)")
    assert "from root@host at " in out["additionalContext"]
    assert out["additionalContext"].endswith("\n  look at the logs first")
    assert not (task_dir / ".mail").exists()
    assert after("Bash") == ""
    assert store.take_messages(task) == []  # shown once


# ---------------------------------------------------------------------- under systemd

systemd, units = test_questions.systemd, test_questions.units  # the fixtures, by their names
FOCUS_AGENT = Path(__file__).parent / "fixtures" / "focus_agent.py"


def test_the_units_status_line_shows_the_agents_focus(units: Any) -> None:
    fleet = units
    task_id = fleet.add(f"{sys.executable} {FOCUS_AGENT} 'migrating the schema' 'Go on?'")
    (q,) = json.loads(fleet("questions", "--wait", "--json", "--timeout", "60").stdout)
    unit = f"fleet-task@{task_id}"

    def status() -> str:
        return str(fleet.box.systemctl("show", "-p", "StatusText", unit).stdout)

    fleet.box.wait_for(lambda: "focus: migrating the schema" in status(), what="the focus")
    assert "focus: migrating the schema" in fleet("ls").stdout
    fleet("answer", q["id"], "yes")
    assert fleet.wait(task_id) == 0
