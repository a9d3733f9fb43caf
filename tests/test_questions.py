"""Questions from agents: the real fleet-ask MCP server, `fleet questions` and `fleet answer`.

The agent here is the MCP SDK's own client talking to the real `fleet-ask` over stdio, as a
coder CLI would (the coder CLIs themselves are driven in the test_coder_* modules); the person
is `fleet` run as a separate process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from fleet.model import AttemptEnd, Status
from fleet.paths import resolve
from fleet.store import open_store
from fleet.store.schema import VERSION
from tests import sandbox
from tests.conftest import Fleet, fleet_exe, run_fleet, store_at_version
from tests.sandbox import Sandbox
from tests.test_systemd import Fleet as UnitFleet

# Every test here runs on each store (SQLite, PostgreSQL) unless marked sqlite_only.
pytestmark = pytest.mark.usefixtures("backend")

DEADLINE = 30.0


def running(fleet: Fleet, title: str = "needs a decision") -> str:
    """A task claimed as fleet-run would claim it, so that its agent may ask."""
    task_id = fleet.add(title, "--coder", "command", "-d", "true")
    store = open_store(resolve())
    try:
        assert store.claim_task(task_id, "test", 60, "command", None) is not None
    finally:
        store.close()
    return task_id


@asynccontextmanager
async def agent(task_id: str) -> AsyncIterator[ClientSession]:
    """fleet-ask as a coder starts it: with the task's id in its environment."""
    env = {**os.environ, "FLEET_TASK_ID": task_id}
    params = StdioServerParameters(command=fleet_exe("fleet-ask"), env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def person(*args: str) -> subprocess.CompletedProcess[str]:
    """`fleet ARGS` as a separate process, as a person at a shell runs it."""
    proc = await asyncio.create_subprocess_exec(
        fleet_exe(), *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


async def asked(task_id: str) -> list[dict[str, Any]]:
    """The task's pending questions, once there is one (`fleet questions --wait`: inotify)."""
    done = await person("questions", "--wait", "--task", task_id, "--json", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert isinstance(found, list)
    return found


async def ask(session: ClientSession, **arguments: Any) -> tuple[str, bool]:
    result = await session.call_tool("ask_human", arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    return text, bool(result.is_error)


def answer(*args: str) -> Any:
    """Run `fleet answer` with ARGS and return the answered question."""
    done = run_fleet("answer", *args, "--json")
    assert done.code == 0, done.err
    return json.loads(done.out)


def test_an_input_question_reaches_a_person_and_the_answer_the_agent(fleet: Fleet) -> None:
    task_id = running(fleet)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Which port should it use?"))
            (q,) = await asked(task_id)
            assert (q["kind"], q["text"], q["status"]) == (
                "input",
                "Which port should it use?",
                "pending",
            )
            shown = fleet.show(task_id)
            assert shown["question"] == q["id"]
            table = await person("ls")
            assert task_id in table.stdout and "asking" in table.stdout
            listed = await person("questions")
            assert q["id"] in listed.stdout and "Which port" in listed.stdout
            assert not call.done()  # the agent still waits

            done = await person("answer", task_id, "8080, the one the proxy expects")
            assert done.returncode == 0 and done.stdout.strip() == q["id"], done.stderr
            text, error = await asyncio.wait_for(call, DEADLINE)
            assert not error
            assert text.startswith("The person (") and "answered: 8080, the one" in text

    asyncio.run(scenario())
    (q,) = json.loads(fleet.ok("questions", "--all", "--json"))
    assert q["status"] == "answered" and q["answer"] == "8080, the one the proxy expects"
    assert q["answered_by"] and "@" in q["answered_by"] and q["answered_at"]
    assert fleet.show(task_id)["question"] is None
    assert "asking" not in fleet.ok("ls")


def test_choice_questions_take_options_by_number_or_name(fleet: Fleet) -> None:
    task_id = running(fleet)

    async def scenario() -> None:
        async with agent(task_id) as session:
            options = ["Postgres", "SQLite", "MySQL"]
            call = asyncio.ensure_future(
                ask(session, question="Which database?", kind="choice", options=options)
            )
            (q,) = await asked(task_id)
            assert q["options"] == options and q["multi_select"] is False
            # Wrong answers are refused with the options listed, and lose nothing.
            wrong = await person("answer", q["id"], "--choice", "Oracle")
            assert wrong.returncode == 2 and "1) Postgres; 2) SQLite; 3) MySQL" in wrong.stderr
            two = await person("answer", q["id"], "--choice", "1", "--choice", "2")
            assert two.returncode == 2 and "takes one choice" in two.stderr
            text_only = await person("answer", q["id"], "SQLite")
            assert text_only.returncode == 2 and "--choice" in text_only.stderr
            assert not call.done()
            done = await person("answer", q["id"][:5], "--choice", "sqlite", "small and local")
            assert done.returncode == 0, done.stderr
            text, _ = await asyncio.wait_for(call, DEADLINE)
            assert "chose: SQLite" in text and "Their comment: small and local" in text

            call = asyncio.ensure_future(
                ask(
                    session,
                    question="Which checks should run?",
                    kind="choice",
                    options=["lint", "types", "tests"],
                    multi_select=True,
                )
            )
            (q,) = await asked(task_id)
            done = await person("answer", q["id"], "-c", "3", "-c", "lint", "-c", "tests")
            assert done.returncode == 0, done.stderr
            text, _ = await asyncio.wait_for(call, DEADLINE)
            assert "chose: tests, lint" in text

    asyncio.run(scenario())
    first, second = json.loads(fleet.ok("questions", "--all", "--json"))
    assert first["choices"] == ["SQLite"] and first["comment"] == "small and local"
    assert second["choices"] == ["tests", "lint"]


def test_approval_questions_are_approved_or_denied_with_a_comment(fleet: Fleet) -> None:
    task_id = running(fleet)

    async def scenario() -> list[str]:
        texts = []
        async with agent(task_id) as session:
            for verdict in (("--approve",), ("--deny", "not on a Friday")):
                call = asyncio.ensure_future(
                    ask(session, question="May I drop the old table?", kind="approval")
                )
                (q,) = await asked(task_id)
                plain = await person("answer", q["id"], "yes")
                assert plain.returncode == 2 and "--approve" in plain.stderr
                done = await person("answer", q["id"], *verdict)
                assert done.returncode == 0, done.stderr
                text, _ = await asyncio.wait_for(call, DEADLINE)
                texts.append(text)
        return texts

    approved, denied = asyncio.run(scenario())
    assert "APPROVED it." in approved
    assert "DENIED it." in denied and "Their comment: not on a Friday" in denied
    first, second = json.loads(fleet.ok("questions", "--all", "--json"))
    assert (first["approved"], second["approved"]) == (True, False)
    assert second["comment"] == "not on a Friday"


def test_of_two_answerers_racing_exactly_one_wins(fleet: Fleet) -> None:
    task_id = running(fleet)

    async def scenario() -> tuple[str, list[subprocess.CompletedProcess[str]]]:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Ship it?"))
            (q,) = await asked(task_id)
            racers = [
                person("answer", q["id"], f"answer {n}", "--by", f"person{n}") for n in range(6)
            ]
            results = await asyncio.gather(*racers)
            text, _ = await asyncio.wait_for(call, DEADLINE)
            return text, list(results)

    text, results = asyncio.run(scenario())
    winners = [r for r in results if r.returncode == 0]
    losers = [r for r in results if r.returncode != 0]
    assert len(winners) == 1 and len(losers) == 5
    (q,) = json.loads(fleet.ok("questions", "--all", "--json"))
    assert f"answered: {q['answer']}" in text and q["answered_by"] in text
    for lost in losers:
        assert lost.returncode == 4
        assert f"already answered by {q['answered_by']}" in lost.stderr
        assert len(lost.stderr.strip().splitlines()) == 2  # the error and its hint


def test_an_unanswered_question_expires_and_the_agent_is_told(fleet: Fleet) -> None:
    fleet.ok("config", "set", "question_timeout_seconds=2")
    task_id = running(fleet)
    reports: list[float] = []

    async def scenario() -> str:
        async def seen(progress: float, total: float | None, message: str | None) -> None:
            reports.append(progress)

        async with agent(task_id) as session:
            result = await session.call_tool(
                "ask_human", {"question": "Anyone there?"}, progress_callback=seen
            )
            return "".join(getattr(block, "text", "") for block in result.content)

    text = asyncio.run(scenario())
    assert text.startswith("No answer came within 2 s")
    # The call was kept alive while it waited, as OpenCode's 60 s tool timeout needs.
    assert len(reports) >= 2 and reports == sorted(reports)
    (q,) = json.loads(fleet.ok("questions", "--all", "--json"))
    assert q["status"] == "expired" and q["answer"] is None
    late = run_fleet("answer", q["id"], "sorry, I was out")
    assert late.code == 4 and "expired" in late.err
    assert fleet.show(task_id)["question"] is None


def test_an_agent_that_goes_away_leaves_no_question_pending(fleet: Fleet) -> None:
    task_id = running(fleet)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Still there?"))
            await asked(task_id)
            call.cancel()  # the coder drops the call, then exits
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(scenario())
    (q,) = json.loads(fleet.ok("questions", "--all", "--json"))
    assert q["status"] == "cancelled"
    assert fleet.show(task_id)["question"] is None
    late = run_fleet("answer", q["id"], "yes")
    assert late.code == 4 and "cancelled" in late.err


def test_the_end_of_the_attempt_cancels_what_it_left_pending(fleet: Fleet) -> None:
    task_id = running(fleet)
    store = open_store(resolve())
    try:
        from fleet.model import QuestionKind

        q = store.ask(task_id, QuestionKind.INPUT, "Which?", (), False, "2999-01-01T00:00:00Z")
        assert store.get(task_id).question == q.id
        store.finish(task_id, "test", AttemptEnd("killed"), Status.BLOCKED, "stopped")
        assert store.question(q.id).status == "cancelled"
        assert store.get(task_id).question is None
        # Only a running task's agent may ask.
        with pytest.raises(Exception, match="only a running task's agent can ask"):
            store.ask(task_id, QuestionKind.INPUT, "Again?", (), False, "2999-01-01T00:00:00Z")
    finally:
        store.close()


def test_questions_wait_sleeps_until_an_agent_asks(fleet: Fleet) -> None:
    task_id = running(fleet)
    waiter = subprocess.Popen(
        [fleet_exe(), "questions", "--wait", "--json", "--timeout", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        empty = run_fleet("questions", "--json")
        assert json.loads(empty.out) == [] and waiter.poll() is None

        async def scenario() -> None:
            async with agent(task_id) as session:
                call = asyncio.ensure_future(ask(session, question="Proceed?"))
                out, _ = await asyncio.to_thread(waiter.communicate, timeout=DEADLINE)
                (q,) = json.loads(out)
                assert q["text"] == "Proceed?" and waiter.returncode == 0
                await person("answer", q["id"], "yes")
                await asyncio.wait_for(call, DEADLINE)

        asyncio.run(scenario())
    finally:
        waiter.kill()
        waiter.wait()
    timed_out = run_fleet("questions", "--wait", "--timeout", "0.2")
    assert timed_out.code == 124 and "no question" in timed_out.err


def test_the_close_protocol_through_mcp(fleet: Fleet) -> None:
    done_id, blocked_id = running(fleet, "finish me"), running(fleet, "block me")

    async def call(task_id: str, tool: str, **arguments: str) -> tuple[str, bool]:
        async with agent(task_id) as session:
            result = await session.call_tool(tool, arguments)
            return "".join(getattr(b, "text", "") for b in result.content), bool(result.is_error)

    text, error = asyncio.run(call(done_id, "task_done", summary="tests pass"))
    assert not error and "is now done" in text
    assert (fleet.show(done_id)["status"], fleet.show(done_id)["reason"]) == ("done", "tests pass")
    text, error = asyncio.run(call(done_id, "task_done", summary="again"))
    assert error and "cannot close" in text and "it is done" in text

    text, error = asyncio.run(call(blocked_id, "task_blocked", reason="needs the prod password"))
    assert not error and "is now blocked" in text
    shown = fleet.show(blocked_id)
    assert (shown["status"], shown["reason"]) == ("blocked", "needs the prod password")
    text, error = asyncio.run(call(blocked_id, "task_blocked", reason="  "))
    assert error and "reason" in text

    text, error = asyncio.run(call(blocked_id, "notify_human", message="halfway there"))
    assert not error and text.startswith("Sent.")


def test_bad_questions_are_refused_to_the_agent_and_record_nothing(fleet: Fleet) -> None:
    task_id = running(fleet)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"question": "Which?", "kind": "choice", "options": ["only one"]}, "at least two"),
        ({"question": "Which?", "kind": "choice", "options": ["a", "A"]}, "differ"),
        ({"question": "   "}, "empty"),
        ({"question": "Sure?", "kind": "approval", "options": ["y", "n"]}, "choice questions"),
        ({"question": "x" * 9000}, "at most 8,000"),
        ({"question": "Which?", "kind": "essay"}, "kind"),
    ]

    async def scenario() -> list[tuple[str, bool]]:
        async with agent(task_id) as session:
            return [await ask(session, **arguments) for arguments, _ in bad]

    for (text, error), (_, expected) in zip(asyncio.run(scenario()), bad, strict=True):
        assert error and expected in text, text
    assert json.loads(fleet.ok("questions", "--all", "--json")) == []


def test_answer_names_its_question_clearly(fleet: Fleet) -> None:
    idle = fleet.add("no agent", "--coder", "command", "-d", "true")
    missing = run_fleet("answer", "q-zzzzzz", "yes")
    assert missing.code == 3 and "no question q-zzzzzz" in missing.err
    none = run_fleet("answer", idle, "yes")
    assert none.code == 4 and "has no question waiting" in none.err
    garbage = run_fleet("answer", "../../etc", "yes")
    assert garbage.code == 2 and "not a task id" in garbage.err
    task_id = running(fleet)
    store = open_store(resolve())
    try:
        from fleet.model import QuestionKind

        for text in ("First?", "Second?"):
            store.ask(task_id, QuestionKind.INPUT, text, (), False, "2999-01-01T00:00:00Z")
    finally:
        store.close()
    two = run_fleet("answer", task_id, "yes")
    assert two.code == 2 and "has 2 questions waiting" in two.err
    # The newest is the one the task points at; the oldest goes first in the listing.
    listed = json.loads(fleet.ok("questions", "--json"))
    assert [q["text"] for q in listed] == ["First?", "Second?"]
    assert fleet.show(task_id)["question"] == listed[1]["id"]
    answer(listed[1]["id"], "two")
    assert fleet.show(task_id)["question"] == listed[0]["id"]
    assert answer(task_id, "one")["answer"] == "one"  # now the only one: the task names it


@pytest.mark.sqlite_only
def test_a_version_1_store_is_migrated_with_its_tasks(home: Path, project: Path) -> None:
    db = store_at_version(home, 1)
    db.execute(
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
        ("fl-000001", "old task", str(project), "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    )
    db.commit()
    db.close()
    shown = run_fleet("show", "fl-000001", "--json")
    assert shown.code == 0, shown.err
    obj = json.loads(shown.out)
    assert (obj["title"], obj["question"]) == ("old task", None)
    version = sqlite3.connect(home / "fleet.db").execute("PRAGMA user_version").fetchone()[0]
    assert version == VERSION


# ---------------------------------------------------------------------- under systemd

systemd = sandbox.systemd
AGENT = Path(__file__).parent / "fixtures" / "ask_agent.py"


@pytest.fixture
def units(systemd: Sandbox, tmp_path: Path, project: Path) -> Iterator[UnitFleet]:
    fleet = UnitFleet(systemd, tmp_path / "unit-home", project)
    fleet.setup("default_coder=command", "stop_grace_seconds=2")
    yield fleet
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("reset-failed", check=False)


@pytest.mark.sqlite_only
def test_a_waiting_task_shows_it_and_outlives_its_runtime_limit(units: UnitFleet) -> None:
    fleet, limit = units, 8
    fleet.setup("retry_limit=1", f"task_timeout_seconds={limit}", "watchdog_seconds=5")
    task_id = fleet.add(f"{sys.executable} {AGENT} 'Deploy to staging now?'")
    waited = fleet("questions", "--wait", "--json", "--timeout", "60").stdout
    (q,) = json.loads(waited)
    asked_at = time.monotonic()
    unit = f"fleet-task@{task_id}"

    def status() -> str:
        return fleet.box.systemctl("show", "-p", "StatusText", unit).stdout

    fleet.box.wait_for(lambda: "waiting for a person" in status(), what="the status line")
    assert q["id"] in status() and "Deploy to staging" in status()
    assert "asking" in fleet("ls").stdout

    def still_waiting_past_the_limit() -> bool:
        state = fleet.box.systemctl("is-active", unit, check=False).stdout.strip()
        assert state == "active", f"{unit} is {state} while its question waits"
        return time.monotonic() > asked_at + limit + 2

    # Past RuntimeMaxSec= and several watchdog periods, the waiting task is still alive.
    fleet.box.wait_for(still_waiting_past_the_limit, timeout=limit + 30, what="the limit")
    fleet("answer", q["id"], "yes, go ahead")
    assert fleet.wait(task_id) == 0
    shown = fleet.show(task_id)
    assert shown["status"] == "done" and "answered: yes, go ahead" in shown["reason"]
    assert fleet.outcomes(task_id) == ["success"]
    entries = fleet.box.journal("-u", unit, f"FLEET_QUESTION={q['id']}")
    texts = [e["MESSAGE"] for e in entries]
    assert texts[0].startswith(f"question {q['id']} (input): Deploy to staging now?")
    assert texts[-1].startswith(f"answer to {q['id']} by ") and "yes, go ahead" in texts[-1]
    assert {e["SYSLOG_IDENTIFIER"] for e in entries} == {"fleet-ask"}


@pytest.mark.sqlite_only
def test_stopping_a_waiting_task_cancels_its_question(units: UnitFleet) -> None:
    fleet = units
    task_id = fleet.add(f"{sys.executable} {AGENT} 'Are you there?'")
    (q,) = json.loads(fleet("questions", "--wait", "--json", "--timeout", "60").stdout)
    fleet("kill", task_id)
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["killed"]
    (after,) = json.loads(fleet("questions", "--all", "--json").stdout)
    assert (after["id"], after["status"]) == (q["id"], "cancelled")
    late = fleet("answer", q["id"], "yes", check=False)
    assert late.returncode == 4 and "cancelled" in late.stderr
    assert "asking" not in fleet("ls", "--all").stdout


def test_answer_completes_the_questions_waiting(fleet: Fleet) -> None:
    from fleet.model import QuestionKind
    from tests.test_docs import bash_complete

    task_id = running(fleet)
    store = open_store(resolve())
    try:
        q = store.ask(task_id, QuestionKind.INPUT, "Which?", (), False, "2999-01-01T00:00:00Z")
    finally:
        store.close()
    assert bash_complete("fleet", "answer", "q-") == [q.id]
    assert bash_complete("fleet", "answer", task_id[:5]) == [task_id]
    answer(q.id, "this one")
    assert bash_complete("fleet", "answer", "q-") == []


def test_a_secret_in_a_question_is_redacted_before_it_is_stored(fleet: Fleet) -> None:
    task_id = running(fleet)
    key = "sk-ant-api03-" + "x" * 40

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question=f"Is {key} the right key?"))
            (q,) = await asked(task_id)
            assert key not in json.dumps(q) and "[REDACTED]" in q["text"]
            await person("answer", q["id"], "no")
            await asyncio.wait_for(call, DEADLINE)

    asyncio.run(scenario())
