"""Two real agents coordinating in one repository: the real Claude Code CLI (tests/clis)
against the scripted Anthropic server (tests/servers/anthropic.py, scenarios `lease-first`
and `lease-second`), each run by `fleet-run ID` by hand, their tools served by the real
fleet-ask; a person takes part with `fleet message`."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.paths import resolve
from fleet.store import open_store
from tests import test_coder_claude as claude
from tests.conftest import Fleet, run_fleet
from tests.conftest import run_in_background as running
from tests.conftest import show_task as shown
from tests.sandbox import wait_for
from tests.servers import anthropic
from tests.test_coder_claude import Server, configure

# The scripted server, its runtime directory and the check that the CLI keeps to its test
# home: the fixtures of the claude tests, under their names.
server, runtime_dir, leaves_the_real_home_alone = (
    claude.server,
    claude.runtime_dir,
    claude.leaves_the_real_home_alone,
)

DEADLINE = 120.0  # two CLIs at once on a loaded machine
MESSAGE = "the tokenizer tests are flaky: rerun them twice"


def holders() -> list[tuple[str, str]]:
    store = open_store(resolve())
    try:
        return [(c.task, c.resource) for c in store.resource_claims()]
    finally:
        store.close()


def has_result(srv: Server, key: str, tool: str, n: int = 1) -> bool:
    """Whether a request of `key`'s agent carries the `n`th result of `tool`."""
    return any(len(anthropic.results(b, tool)) >= n for b in srv.calls(key))


def last_results(srv: Server, key: str, tool: str) -> list[str]:
    bodies = srv.calls(key)
    return anthropic.results(bodies[-1], tool) if bodies else []


def until(predicate: Callable[[], bool], what: str, logs: Path) -> None:
    """wait_for, with the agents' events and errors in the failure's message."""
    try:
        wait_for(predicate, DEADLINE, what)
    except TimeoutError as e:
        tails = [f"{p.name}:\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*.jsonl"))]
        tails += [f"{p.name}:\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*.err"))]
        raise AssertionError(f"{e}\n" + "\n".join(tails)) from None


def live(home: Path, task_id: str) -> dict[str, Any]:
    path = home / "live" / f"{task_id}.json"
    found = json.loads(path.read_text()) if path.exists() else {}
    assert isinstance(found, dict)
    return found


def test_the_second_agents_claim_is_refused_until_the_first_releases(
    fleet: Fleet,
    project: Path,
    server: Server,
    tmp_path: Path,
    home: Path,
) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    configure(fleet, server, tmp_path / "claude-home")
    one, two = uuid.uuid4().hex, uuid.uuid4().hex
    first = fleet.add("the parser", "--coder", "claude", "-d", f"FLEET-SCENARIO:lease-first:{one}")
    second = fleet.add("the lexer", "--coder", "claude", "-d", f"FLEET-SCENARIO:lease-second:{two}")
    with contextlib.ExitStack() as stack:
        agent_one = stack.enter_context(running(first, project, tmp_path / "first.jsonl"))
        # The first agent holds the lease, then waits in its shell; its runner shows its focus.
        until(lambda: (first, anthropic.LEASED) in holders(), "the first claim", tmp_path)
        until(
            lambda: live(home, first).get("focus") == anthropic.FOCUS_TEXT,
            "the focus in the first runner's live figures",
            tmp_path,
        )
        agent_two = stack.enter_context(running(second, project, tmp_path / "second.jsonl"))
        # The second's claim is refused, naming the first, its note and its lease's end.
        until(lambda: has_result(server, two, anthropic.CLAIM_TOOL), "the second claim", tmp_path)
        (refused,) = last_results(server, two, anthropic.CLAIM_TOOL)
        assert refused.startswith(f"Refused: {anthropic.LEASED} held by task {first} (attempt 1)")
        assert f": {anthropic.FIRST_NOTE}." in refused
        assert holders() == [(first, anthropic.LEASED)]
        # A person messages the first agent while it works in the shell; the first releases.
        sent = run_fleet("message", first, MESSAGE)
        assert sent.code == 0, sent.err
        (project / anthropic.RELEASE_FILE).touch()
        until(lambda: holders() == [], "the release", tmp_path)
        # The message came with the result of the agent's next tool call, its shell command
        # (through Claude Code's PostToolUse hook), and only there.
        until(
            lambda: has_result(server, one, anthropic.RELEASE_TOOL),
            "the release's result",
            tmp_path,
        )
        (released,) = last_results(server, one, anthropic.RELEASE_TOOL)
        assert released == f"Released {anthropic.LEASED}."
        after_wait = [
            b for b in server.calls(one) if anthropic.commands(b)[-1:] == [anthropic.WAIT_RELEASE]
        ]
        assert after_wait, "no request after the shell command"
        history = json.dumps(after_wait[0]["messages"])
        assert "PostToolUse:Bash hook additional context: Messages for you" in history
        assert MESSAGE in history
        # Now the second's claim succeeds.
        (project / anthropic.RETRY_FILE).touch()
        assert agent_one.wait(timeout=DEADLINE) == 0, (tmp_path / "first.err").read_text()
        assert agent_two.wait(timeout=DEADLINE) == 0, (tmp_path / "second.err").read_text()
    task_one, task_two = shown(fleet, first), shown(fleet, second)
    assert (task_one["status"], task_one["reason"]) == ("done", "released")
    assert task_two["status"] == "done"
    refusal, claim = task_two["reason"].split(" | ")
    assert refusal.startswith(f"Refused: {anthropic.LEASED} held by task {first} (attempt 1)")
    assert refusal.endswith(f": {anthropic.FIRST_NOTE}")
    assert claim.startswith(f"Claimed {anthropic.LEASED} until ")
    # The trail: the lease taken and released, the message, in order.
    actions = [e["action"] for e in json.loads(fleet.ok("history", first, "--json"))]
    assert actions.index("leased") < actions.index("messaged") < actions.index("lease-released")
    (note,) = json.loads(fleet.ok("messages", first, "--json"))
    assert (note["text"], note["read_at"] is not None) == (MESSAGE, True)
    assert holders() == []  # the second's lease ended with its attempt


def test_an_offer_declined_then_one_accepted_while_a_real_agent_works(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    configure(fleet, server, tmp_path / "claude-home")
    key = uuid.uuid4().hex
    task = fleet.add("the parser", "--coder", "claude", "-d", f"FLEET-SCENARIO:lease-first:{key}")
    with running(task, project, tmp_path / "agent.jsonl") as agent:
        until(lambda: (task, anthropic.LEASED) in holders(), "the agent's claim", tmp_path)
        first = fleet.ok("handoff", task, "--to", "claude:opus", "--offer", "--context", "ctx")
        fleet.ok("decline", task, "--reason", "it is nearly done")
        assert shown(fleet, task)["status"] == "running"  # declined: the agent goes on
        second = fleet.ok("handoff", task, "--to", "claude", "--offer")
        successor = fleet.ok("accept", task).strip()
        # Accepted: the agent's attempt is stopped, its lease ends with it.
        assert agent.wait(timeout=DEADLINE) != 0
    assert holders() == []
    assert shown(fleet, task)["status"] == "handed-off"
    assert shown(fleet, successor)["predecessor"] == task
    offers = {o["id"]: o for o in json.loads(fleet.ok("offers", task, "--json"))}
    assert offers[int(first)]["status"] == "declined"
    assert offers[int(first)]["reason"] == "it is nearly done"
    assert (offers[int(second)]["status"], offers[int(second)]["successor"]) == (
        "accepted",
        successor,
    )
    (told,) = json.loads(fleet.ok("messages", task, "--json"))
    assert "was declined by " in told["text"] and "it is nearly done" in told["text"]
    trail = [e["action"] for e in json.loads(fleet.ok("history", task, "--json"))]
    handoffs = [a for a in trail if a.startswith("hand")]
    assert handoffs == [
        "handoff-offered",
        "handoff-declined",
        "handoff-offered",
        "handoff-accepted",
        "handed-off",
    ]
    assert trail.index("leased") < trail.index("handoff-offered")
    assert trail[-1] == "ended"
