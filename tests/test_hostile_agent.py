"""Hostile and careless agents (issue 11): what an agent, or a careless person, could do on
main and no longer can. Every row of these tables failed before its fix.

Agents run as the person, beside the person's secrets and terminal. So each case is driven as
an agent drives fleet: with its shell's `fleet` (FLEET_TASK_ID set), or through fleet-ask's
tools with the MCP SDK's own client over stdio (the real server); and what it leaves behind is
read back as a person or a person's script reads it: fleet show, ls, history, questions and
checkpoints, as tables and as JSON, the notification hook's files, fleet-ask's standard error
(its journal off systemd) and the task's event log. The journal itself is read in a real
systemd (tests/sandbox.py), at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from fleet import questions, taskdir
from fleet.model import QuestionKind, TaskSpec
from fleet.paths import resolve
from fleet.store import Actor, open_store
from tests import sandbox
from tests.conftest import Fleet, fleet_exe, fleet_run, run_fleet
from tests.sandbox import Sandbox, wait_for
from tests.test_alerts import deliveries, hook_writing
from tests.test_questions import running
from tests.test_systemd import Fleet as UnitFleet

systemd = sandbox.systemd

# No token shape: only the name of the variable that holds it says that it is a secret.
ENV_SECRET = "Zq9fP2mX7vL4tR8wK1nB"  # in the agent's environment, as DEPLOY_API_KEY
CODER_SECRET = "Hy3uQ6cT0jW5eR2sD8gV"  # only in [coders.command.env]: codex keeps it from tools
HUGE = "x" * 200_000
ESCAPES = "done \x1b]0;owned\x07\x1b[2J \x9b31m \u202eevil\u2069 end"
TITLE = "fix \x9b31m the \u202elogin\u202c page"  # main refused C0 in a title, not these
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2069")
DEADLINE = 60.0


class Payload(NamedTuple):
    text: str
    refused: bool  # the agent is told no, and nothing is kept
    forbidden: tuple[str, ...]  # what must appear nowhere


PAYLOADS = {
    "env-secret": Payload(f"the deploy key is {ENV_SECRET}", False, (ENV_SECRET,)),
    "coder-secret": Payload(f"the deploy token is {CODER_SECRET}", False, (CODER_SECRET,)),
    "200k": Payload(HUGE, True, ("x" * 10_001,)),
    "escapes": Payload(ESCAPES, True, RAW),
    "c1-bidi": Payload(TITLE, True, RAW),
}


@pytest.fixture
def hook(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A configuration with a notification hook that saves every event it gets, and a secret
    in the command coder's env table; the directory the hook writes to."""
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    out = tmp_path / "notified"
    out.mkdir()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    command = hook_writing(out)
    (home / "config.toml").write_text(
        f"notify_command = {json.dumps(command)}\nnotify_desktop = false\n"
        f'[coders.command.env]\nDEPLOY_TOKEN = "{CODER_SECRET}"\n'
    )
    return out


def strings(value: Any) -> Iterator[str]:
    """Every string inside a parsed JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def readable(fleet: Fleet, home: Path, out: Path, *more: str) -> list[str]:
    """Everything a person or a script can read about the queue now: each command's output as
    printed, each JSON output's strings decoded, the hook's files, the event logs."""
    texts = list(more)

    def json_of(*args: str) -> Any:
        printed = fleet.ok(*args)
        texts.append(printed)
        parsed = json.loads(printed)
        texts.extend(strings(parsed))
        return parsed

    tasks = json_of("ls", "--all", "--json")
    texts.append(fleet.ok("ls", "--all"))
    for task in tasks:
        texts.append(fleet.ok("show", task["id"]))
        json_of("show", task["id"], "--json")
        texts.append(fleet.ok("history", task["id"]))
        json_of("history", task["id"], "--json")
        json_of("checkpoints", task["id"], "--json")
    texts.append(fleet.ok("status"))
    json_of("status", "--json")
    texts.append(fleet.ok("claims"))
    json_of("claims", "--json")
    texts.append(fleet.ok("messages"))
    json_of("messages", "--json")
    texts.append(fleet.ok("questions", "--all"))
    json_of("questions", "--all", "--json")
    wait_for(lambda: not deliveries(home), 30, "every notification to be delivered")
    texts += [p.read_text(errors="replace") for p in sorted(out.iterdir())]
    texts += [p.read_text(errors="replace") for p in sorted(home.glob("tasks/*/events*.jsonl"))]
    return texts


def nowhere(texts: list[str], forbidden: tuple[str, ...]) -> None:
    for text in texts:
        for bad in forbidden:
            assert bad not in text, (bad[:40], text[:300])


# ---------------------------------------------------------------------- what an agent writes


@contextlib.asynccontextmanager
async def agent(task_id: str, errlog: TextIO) -> AsyncIterator[ClientSession]:
    """fleet-ask as a coder starts it, its standard error (the journal off systemd) to
    `errlog`."""
    env = {**os.environ, "FLEET_TASK_ID": task_id}
    params = StdioServerParameters(command=fleet_exe("fleet-ask"), env=env)
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def tool(session: ClientSession, name: str, **arguments: Any) -> tuple[str, bool]:
    result = await session.call_tool(name, arguments)
    return "".join(getattr(b, "text", "") for b in result.content), bool(result.is_error)


async def asking(session: ClientSession, task_id: str, **arguments: Any) -> tuple[str, bool]:
    """ask_human: refused at once, or asked (then answered by a person, as it blocks)."""
    call = asyncio.ensure_future(tool(session, "ask_human", **arguments))
    while not call.done():
        done = await asyncio.to_thread(
            run_fleet, "questions", "--wait", "--task", task_id, "--json", "--timeout", "1"
        )
        if done.code == 0:
            answered = await asyncio.to_thread(run_fleet, "answer", task_id, "--choice", "b")
            if answered.code != 0:
                await asyncio.to_thread(run_fleet, "answer", task_id, "fine")
            break
    return await asyncio.wait_for(call, DEADLINE)


Call = Callable[[str, str, ClientSession], Any]


def mcp(name: str, **arguments: Any) -> Call:
    """A tool call with the payload in place of every "P" among the arguments."""

    def call(task_id: str, payload: str, session: ClientSession) -> Any:
        args = {k: payload if v == "P" else v for k, v in arguments.items()}
        if isinstance(args.get("options"), list):
            args["options"] = [payload if o == "P" else o for o in args["options"]]
        if name == "ask_human":
            return asking(session, task_id, **args)
        return tool(session, name, **args)

    return call


ENTRY_POINTS: dict[str, tuple[str, str] | Call] = {
    "close --reason": ("close", "--reason"),
    "block --reason": ("block", "--reason"),
    "task_done": mcp("task_done", summary="P"),
    "task_blocked": mcp("task_blocked", reason="P"),
    "notify_human": mcp("notify_human", message="P"),
    "ask_human question": mcp("ask_human", question="P"),
    "ask_human option": mcp("ask_human", question="which?", kind="choice", options=["P", "b"]),
    "spawn_subtask title": mcp("spawn_subtask", title="P"),
    "spawn_subtask description": mcp("spawn_subtask", title="part", description="P"),
    "handoff context": mcp("handoff", coder="command", context="P"),
    "checkpoint summary": mcp("checkpoint", summary="P"),
    "claim note": mcp("claim", resource="fleet/run.py", note="P"),
    "set_focus text": mcp("set_focus", text="P"),
    "send_message text": lambda task_id, payload, session: tool(
        session, "send_message", to=task_id, text=payload
    ),
}
# Each row failed on main: there, `fleet close/block --reason` and task_done/task_blocked
# stored anything, the hook received notify_human's text as given, fleet-ask redacted only
# the variables of its own (pared-down) environment, and C1 controls, bidi marks and ESC in
# free text went through. The rows main already refused (a 200,000-character title, say) are
# in test_bad_input.py and test_questions.py.
AGENT_TEXT = [
    ("close --reason", "env-secret"),
    ("close --reason", "coder-secret"),
    ("close --reason", "escapes"),
    ("block --reason", "env-secret"),
    ("block --reason", "coder-secret"),
    ("block --reason", "escapes"),
    ("task_done", "env-secret"),
    ("task_done", "coder-secret"),
    ("task_done", "200k"),
    ("task_done", "escapes"),
    ("task_blocked", "env-secret"),
    ("task_blocked", "coder-secret"),
    ("task_blocked", "200k"),
    ("task_blocked", "escapes"),
    ("notify_human", "env-secret"),
    ("notify_human", "coder-secret"),
    ("notify_human", "200k"),
    ("notify_human", "escapes"),
    ("ask_human question", "coder-secret"),
    ("ask_human question", "escapes"),
    ("ask_human option", "coder-secret"),
    ("ask_human option", "escapes"),
    ("spawn_subtask title", "coder-secret"),
    ("spawn_subtask title", "c1-bidi"),
    ("spawn_subtask description", "coder-secret"),
    ("spawn_subtask description", "escapes"),
    ("handoff context", "coder-secret"),
    ("handoff context", "escapes"),
    ("checkpoint summary", "coder-secret"),
    ("checkpoint summary", "escapes"),
    ("claim note", "coder-secret"),
    ("claim note", "escapes"),
    ("set_focus text", "coder-secret"),
    ("set_focus text", "escapes"),
    ("send_message text", "env-secret"),
    ("send_message text", "coder-secret"),
    ("send_message text", "200k"),
    ("send_message text", "escapes"),
]


@pytest.mark.parametrize(("entry", "payload"), AGENT_TEXT)
def test_what_an_agent_writes_is_checked_and_redacted_like_a_persons_input(
    fleet: Fleet,
    home: Path,
    hook: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    entry: str,
    payload: str,
) -> None:
    given = PAYLOADS[payload]
    task_id = running(fleet)
    monkeypatch.setenv("DEPLOY_API_KEY", ENV_SECRET)  # the agent's environment
    errlog = tmp_path / "fleet-ask.err"
    how = ENTRY_POINTS[entry]
    if isinstance(how, tuple):
        verb, option = how
        monkeypatch.setenv("FLEET_TASK_ID", task_id)
        result = fleet(verb, task_id, option, given.text)
        monkeypatch.delenv("FLEET_TASK_ID")
        refused, said = result.code != 0, result.err
        if refused:
            assert result.code == 2 and "Traceback" not in result.err, result.err
    else:
        call = how

        async def scenario() -> tuple[str, bool]:
            with errlog.open("w") as err:
                async with agent(task_id, err) as session:
                    text, error = await call(task_id, given.text, session)
                    return str(text), bool(error)

        said, refused = asyncio.run(scenario())
    assert refused == given.refused, said
    texts = readable(fleet, home, hook, said, errlog.read_text() if errlog.exists() else "")
    nowhere(texts, given.forbidden)
    if not given.refused:
        assert any("[REDACTED]" in t for t in texts), "the text was kept, with the secret masked"
    else:
        assert "characters long" in said or "control character" in said, said


def test_a_secret_only_in_the_environment_the_agents_shell_was_started_with(
    fleet: Fleet, home: Path, project: Path
) -> None:
    """A coder may start its tools with a pared-down environment (codex leaves out *_KEY
    variables): the value is still known from the environments of the agent's processes."""
    task_id = fleet.add("t")
    script = f'env -u DEPLOY_API_KEY {fleet_exe()} close {task_id} --reason "key $DEPLOY_API_KEY"'
    env = {**os.environ, "FLEET_TASK_ID": task_id, "DEPLOY_API_KEY": ENV_SECRET}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert fleet.show(task_id)["reason"] == "key [REDACTED]"


# ---------------------------------------------------------------------- one output path


def stored(**fields: Any) -> str:
    """A task whose text was stored as given (as by an older fleet, or behind any check):
    what the output path alone must make harmless."""
    fields = {"title": "plain", "cwd": str(Path.cwd()), **fields}
    spec = TaskSpec(**fields)
    store = open_store(resolve(), Actor("agent", "test"))
    try:
        return store.add([spec])[0].id
    finally:
        store.close()


def with_reason(reason: str) -> str:
    task_id = stored()
    store = open_store(resolve(), Actor("agent", "test"))
    try:
        store.block(task_id, reason)
    finally:
        store.close()
    return task_id


FAR = "2999-01-01T00:00:00.000Z"


def with_question(
    text: str, options: tuple[str, ...] = (), by: str | None = None, answer: str = "yes"
) -> str:
    """A running task with a question (answered by `by`, if given); its id."""
    return asked(text, options, by, answer)[0]


def asked(
    text: str, options: tuple[str, ...] = (), by: str | None = None, answer: str = "yes"
) -> tuple[str, str]:
    task_id = stored()
    store = open_store(resolve(), Actor("agent", "test"))
    try:
        assert store.claim_task(task_id, "test", 60, "command", None) is not None
        kind = QuestionKind.CHOICE if options else QuestionKind.INPUT
        q = store.ask(task_id, kind, text, options, False, FAR)
        if by is not None:
            store.answer(q.id, by, answer)
    finally:
        store.close()
    return task_id, q.id


def in_a_directory(tmp_path: Path) -> Callable[[], str]:
    def make() -> str:
        odd = tmp_path / "repo \x1b[8m\u202e"
        odd.mkdir()
        return stored(cwd=str(odd))

    return make


TERMINAL: list[tuple[str, Callable[[Path], Callable[[], str]], tuple[str, ...]]] = [
    ("title (C1, bidi) in ls", lambda _: lambda: stored(title=TITLE), ("ls",)),
    ("title in ready", lambda _: lambda: stored(title=TITLE), ("ready",)),
    ("title in show", lambda _: lambda: stored(title=TITLE), ("show", "ID")),
    ("title in history", lambda _: lambda: stored(title=TITLE), ("history", "ID")),
    ("title in tree", lambda _: lambda: stored(title=TITLE), ("tree",)),
    ("description in show", lambda _: lambda: stored(description=ESCAPES), ("show", "ID")),
    ("reason in show", lambda _: lambda: with_reason(ESCAPES), ("show", "ID")),
    ("reason in history", lambda _: lambda: with_reason(ESCAPES), ("history", "ID")),
    ("cwd name in show", in_a_directory, ("show", "ID")),
    ("question in questions", lambda _: lambda: with_question(ESCAPES), ("questions",)),
    (
        "option in questions",
        lambda _: lambda: with_question("which?", (ESCAPES, "b")),
        ("questions",),
    ),
    (
        "--by in questions --all",
        lambda _: lambda: with_question("ok?", by="\x1b[31mroot\u202e"),
        ("questions", "--all"),
    ),
    (
        "an answer quoted by an error",
        lambda _: lambda: asked("ok?", by="alice", answer="80\x9b31m")[1],
        ("answer", "ID", "again"),
    ),
]


@pytest.mark.parametrize(("case", "make", "args"), TERMINAL, ids=[row[0] for row in TERMINAL])
def test_text_for_a_terminal_has_its_control_characters_escaped(
    fleet: Fleet,
    tmp_path: Path,
    case: str,
    make: Callable[[Path], Callable[[], str]],
    args: tuple[str, ...],
) -> None:
    task_id = make(tmp_path)()
    result = fleet(*(task_id if a == "ID" else a for a in args))
    printed = result.out + result.err
    assert printed.strip(), result
    nowhere([printed], RAW)
    assert "\\x9b" in printed or "\\x1b" in printed or "\\u202e" in printed, printed


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("add", TITLE), "control characters (U+009B)"),
        (("add", "t", "-d", ESCAPES), "control character (U+001B)"),
        (("add", "t", "--label", "x\u202e"), "bad label"),
        (("add", "t", "--model", "m\x9b"), "bad model name"),
        (("pause", "--reason", ESCAPES), "control character (U+001B)"),
        (("cancel", "ID", "--reason", "\u202eevil"), "control character (U+202E)"),
    ],
)
def test_what_a_person_types_keeps_being_checked(
    fleet: Fleet, args: tuple[str, ...], needle: str
) -> None:
    task_id = fleet.add("existing")
    result = fleet(*(task_id if a == "ID" else a for a in args))
    assert result.code == 2 and needle in result.err, result
    nowhere([result.err], RAW)
    assert len(json.loads(fleet.ok("ls", "--all", "--json"))) == 1
    assert fleet.show(task_id)["reason"] is None


@pytest.mark.parametrize("command", ["show", "answer"])
def test_completions_show_titles_and_questions_escaped(fleet: Fleet, command: str) -> None:
    """zsh and fish show each candidate's help beside what the person types."""
    with_question(ESCAPES) if command == "answer" else stored(title=TITLE)
    env = {**os.environ, "_FLEET_COMPLETE": "zsh_complete", "COMP_WORDS": f"fleet {command} "}
    done = subprocess.run(
        [fleet_exe()], env={**env, "COMP_CWORD": "2"}, capture_output=True, text=True, check=True
    )
    assert "\\x9b" in done.stdout or "\\x1b" in done.stdout, done.stdout
    nowhere([done.stdout], RAW)


def test_fleet_ask_writes_an_answer_to_its_standard_error_escaped(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Off systemd fleet-ask logs each question and answer on standard error, the agent's
    terminal: an answer stored with escapes (behind any check) must arrive harmless."""
    task_id = running(fleet)
    errlog = tmp_path / "fleet-ask.err"

    async def scenario() -> str:
        with errlog.open("w") as err:
            async with agent(task_id, err) as session:
                call = asyncio.ensure_future(tool(session, "ask_human", question="port?"))
                done = await asyncio.to_thread(
                    run_fleet, "questions", "--wait", "--task", task_id, "--json"
                )
                [q] = json.loads(done.out)
                store = open_store(resolve(), Actor("someone", "test"))
                try:
                    store.answer(q["id"], "\x1b[2Jmallory", "80\x9b31m")
                finally:
                    store.close()
                questions.ring(taskdir.task_dir(resolve(), task_id))  # as fleet answer does
                text, _ = await asyncio.wait_for(call, DEADLINE)
                return text

    asyncio.run(scenario())
    logged = errlog.read_text()
    assert "answer to" in logged and "\\x1b[2Jmallory" in logged and "80\\x9b31m" in logged
    nowhere([logged], RAW)


# ---------------------------------------------------------------------- answering oneself


@pytest.mark.parametrize(
    ("kind", "answer_args"),
    [
        ("approval", ("--approve",)),
        ("approval", ("--deny", "no")),
        ("approval", ("--approve", "--by", "alice@laptop")),
        ("input", ("yes, go ahead",)),
        ("choice", ("--choice", "1")),
    ],
)
def test_an_agent_cannot_answer_its_own_question(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, kind: str, answer_args: tuple[str, ...]
) -> None:
    task_id = stored()
    store = open_store(resolve(), Actor("agent", "test"))
    try:
        assert store.claim_task(task_id, "test", 60, "command", None) is not None
        options = ("drop it", "keep it") if kind == "choice" else ()
        store.ask(task_id, QuestionKind(kind), "drop the table?", options, False, FAR)
    finally:
        store.close()
    monkeypatch.setenv("FLEET_TASK_ID", task_id)
    result = fleet("answer", task_id, *answer_args)
    assert result.code == 1 and "an agent cannot answer" in result.err, result
    monkeypatch.delenv("FLEET_TASK_ID")
    [q] = json.loads(fleet.ok("questions", "--json"))
    assert q["status"] == "pending" and q["answered_by"] is None
    assert [e["action"] for e in json.loads(fleet.ok("history", task_id, "--json"))] == [
        "added",
        "claimed",
        "asked",
    ]


# ---------------------------------------------------------------------- sentinels


def planted(fleet: Fleet, tmp_path: Path, name: str, kind: str) -> tuple[str, Path]:
    """A claimed task whose directory holds, as `name`, what a hostile agent that owns the
    directory plants: a symlink to a file that does not exist yet, or a FIFO."""
    task_id = with_question("ok?") if name == ".question" else running(fleet)
    directory = resolve().tasks / task_id
    directory.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "victim"
    if kind == "symlink":
        (directory / name).symlink_to(target)
    else:
        os.mkfifo(directory / name)
    return task_id, target


@pytest.mark.parametrize(
    ("name", "kind", "args"),
    [
        (".question", "symlink", ("answer", "ID", "sure")),
        (".question", "fifo", ("answer", "ID", "sure")),
        # (A FIFO as .kill did not block main: Path.touch only set its times.)
        (".kill", "symlink", ("suspend", "ID", "--no-block")),
    ],
)
def test_sentinels_are_never_followed_through_a_symlink_nor_block_on_a_fifo(
    fleet: Fleet, tmp_path: Path, name: str, kind: str, args: tuple[str, ...]
) -> None:
    task_id, target = planted(fleet, tmp_path, name, kind)
    # A separate process: on a FIFO without a reader, an open for writing would never return.
    done = run_fleet(*(task_id if a == "ID" else a for a in args))
    assert done.code == 0, done.err
    assert not target.exists() and not target.is_symlink()


# ---------------------------------------------------------------------- blocking oneself


@pytest.mark.parametrize(
    ("coder", "script"),
    [
        # The replay coder leaves closing to its agent: main counted this as a no-close.
        ("replay", [{"run": ["fleet", "block", "$FLEET_TASK_ID", "--reason", "needs creds"]}]),
        # The command coder closes on success: main recorded a success.
        ("command", 'fleet block "$FLEET_TASK_ID" --reason "needs creds"; exit 0'),
    ],
)
def test_an_agent_that_blocks_its_task_and_exits_zero_ends_as_blocked(
    fleet: Fleet, project: Path, coder: str, script: Any
) -> None:
    if coder == "replay":
        (project / "s.jsonl").write_text("".join(json.dumps(s) + "\n" for s in script))
        description = "s.jsonl"
    else:
        description = script
    task_id = fleet.add("t", "--coder", coder, "-d", description)
    done = fleet_run(task_id, project)
    assert f"{task_id}: blocked → blocked (needs creds)" in done.stderr, done.stderr
    shown = fleet.show(task_id)
    assert (shown["status"], shown["reason"], shown["noclose"], shown["failures"]) == (
        "blocked",
        "needs creds",
        0,
        0,
    )
    assert [a["outcome"] for a in shown["attempt_log"]] == ["blocked"]


def test_a_coders_last_words_become_a_reason_clipped_and_escaped(
    fleet: Fleet, project: Path
) -> None:
    """The reason of a failed attempt is the coder's last error, which fleet cannot refuse:
    it is kept with its control characters spelled out, and clipped like a reason."""
    words = "\x1b[2Jboom \x9b31m " + "y" * 20_000
    (project / "s.jsonl").write_text(
        json.dumps({"event": "error", "text": words}) + "\n" + json.dumps({"exit": 1}) + "\n"
    )
    task_id = fleet.add("t", "--coder", "replay", "-d", "s.jsonl")
    done = fleet_run(task_id, project)
    reason = fleet.show(task_id)["reason"]
    assert reason.startswith("failure: \\x1b[2Jboom \\x9b31m yyy"), reason[:80]
    assert len(reason) <= len("failure: ") + 10_000 and reason.endswith("…")
    nowhere(readable_by_hand(fleet), (*RAW, "y" * 10_001))
    nowhere([done.stderr], RAW)  # the runner's own lines in the terminal


def readable_by_hand(fleet: Fleet, *more: str) -> list[str]:
    """What a person reads of every task, beside the texts given (no hook here)."""
    texts = list(more)
    for task in json.loads(fleet.ok("ls", "--all", "--json")):
        texts += [fleet.ok("show", task["id"]), fleet.ok("history", task["id"])]
        texts += strings(json.loads(fleet.ok("show", task["id"], "--json")))
        texts += strings(json.loads(fleet.ok("history", task["id"], "--json")))
    return texts


# ---------------------------------------------------------------------- batches


@pytest.mark.parametrize(
    ("options", "field", "expected"),
    [
        (("--coder", "command"), "coder", ["command", "codex"]),
        (("--model", "opus"), "model", ["opus", "opus"]),
        (("-p", "0"), "priority", [0, 4]),
        (("--label", "nightly"), "labels", [["nightly"], ["nightly", "own"]]),
        (("--after", "FIRST"), "after", [["FIRST"], ["FIRST"]]),
    ],
)
def test_batch_options_apply_to_every_line(
    fleet: Fleet,
    tmp_path: Path,
    options: tuple[str, ...],
    field: str,
    expected: list[Any],
) -> None:
    first = fleet.add("first")
    batch = tmp_path / "b.jsonl"
    batch.write_text(
        '{"title": "a"}\n{"title": "b", "coder": "codex", "priority": 4, "labels": ["own"]}\n'
    )
    given = [first if o == "FIRST" else o for o in options]
    added = json.loads(fleet.ok("add", "--batch", str(batch), *given, "--json"))
    values = [t[field] for t in added]
    assert values == json.loads(json.dumps(expected).replace("FIRST", first))


# ---------------------------------------------------------------------- smaller


def test_fleet_logs_prints_an_attempt_run_by_hand(fleet: Fleet, project: Path) -> None:
    (project / "s.jsonl").write_text(
        '{"event": "text", "text": "looking \\u001b[31maround"}\n'
        '{"event": "tool_call", "tool": "Bash", "text": "ls"}\n'
        '{"run": ["fleet", "close", "$FLEET_TASK_ID"]}\n'
    )
    task_id = fleet.add("t", "--coder", "replay", "-d", "s.jsonl")
    assert fleet_run(task_id, project).returncode == 0
    printed = fleet.ok("logs", task_id)
    assert "looking \\x1b[31maround" in printed and "→ Bash: ls" in printed
    assert "attempt 1 ended: success" in printed
    records = [json.loads(x) for x in fleet.ok("logs", task_id, "--json").splitlines()]
    assert [r["event"] for r in records] == ["lifecycle", "text", "tool_call", "raw", "lifecycle"]
    assert all(r["attempt"] == 1 and r["coder"] == "replay" for r in records)
    assert fleet.ok("logs", task_id, "--attempt", "2") == ""
    last = [json.loads(x) for x in fleet.ok("logs", task_id, "-n", "1", "--json").splitlines()]
    assert [r["message"] for r in last] == ["attempt 1 ended: success"]


def test_the_event_log_of_a_task_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet import eventlog

    monkeypatch.setattr(eventlog, "MAX_BYTES", 4096)
    log = eventlog.EventLog(tmp_path)
    for n in range(1000):
        log.append({"time": f"2026-01-01T00:00:{n % 60:02d}.000Z", "message": f"m{n}"})
    sizes = [p.stat().st_size for p in tmp_path.iterdir()]
    assert sorted(p.name for p in tmp_path.iterdir()) == [eventlog.FILE, eventlog.OLD]
    assert max(sizes) < 4096 + 200
    kept = [r["message"] for r in eventlog.records(tmp_path)]
    assert kept[-1] == "m999" and kept == [f"m{n}" for n in range(1000 - len(kept), 1000)]


@pytest.mark.parametrize("name", ["spawn_subtask", "handoff"])  # main listed the others
def test_fleet_ask_help_and_man_page_list_every_tool(name: str) -> None:
    from tests.conftest import ROOT

    shown = subprocess.run(
        [fleet_exe("fleet-ask"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert name in shown
    assert name in (ROOT / "man" / "fleet-ask.1").read_text()


# ---------------------------------------------------------------------- under systemd


@pytest.fixture
def units(
    systemd: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[UnitFleet, Path]]:
    """fleet set up in the sandbox (system scope), with the notification hook and the coder
    secret of the other tests; this process uses the same FLEET_HOME."""
    project = tmp_path / "project"
    project.mkdir()
    out = tmp_path / "notified"
    out.mkdir()
    f = UnitFleet(systemd, tmp_path / "home", project)
    f.home.mkdir(mode=0o700)
    (f.home / "config.toml").write_text(
        f"default_coder = 'command'\nnotify_command = {json.dumps(hook_writing(out))}\n"
        f'notify_desktop = false\n[coders.command.env]\nDEPLOY_TOKEN = "{CODER_SECRET}"\n'
    )
    f.setup()
    monkeypatch.setenv("FLEET_HOME", str(f.home))
    try:
        yield f, out
    finally:
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*")
        systemd.systemctl("reset-failed", check=False)


def test_in_its_unit_an_agent_leaves_neither_secrets_nor_escapes_nor_answers(
    units: tuple[UnitFleet, Path],
) -> None:
    """The journal's side: the audit entries, the settle line, the transcript; the hook's.
    The agent, in its fleet-task@ unit, also drops FLEET_TASK_ID to answer a question."""
    f, out = units
    store = open_store(resolve(), Actor("someone", "test"))
    try:
        [other] = store.add([TaskSpec(title="another task", cwd=str(f.project))])
        store.claim_task(other.id, "elsewhere", 3600, "command", None)
        q = store.ask(other.id, QuestionKind.APPROVAL, "drop the table?", (), False, FAR)
    finally:
        store.close()
    script = (
        f"env -u FLEET_TASK_ID fleet answer {q.id} --approve > answered 2>&1;"
        ' echo "rc=$?" >> answered;'
        ' fleet block "$FLEET_TASK_ID" --reason "$(printf \'stuck \\033]0;owned\\007\')";'
        ' fleet block "$FLEET_TASK_ID" --reason "needs the key $DEPLOY_TOKEN"; exit 0'
    )
    task_id = f.add(script)
    assert f.wait(task_id) == 1
    shown = f.show(task_id)
    assert (shown["status"], shown["reason"]) == ("blocked", "needs the key [REDACTED]")
    assert [a["outcome"] for a in shown["attempt_log"]] == ["blocked"]
    answered = (f.project / "answered").read_text()
    assert "an agent cannot answer" in answered and answered.endswith("rc=1\n"), answered
    [pending] = json.loads(f("questions", "--json").stdout)
    assert (pending["id"], pending["status"]) == (q.id, "pending")

    settle = f"{task_id}: blocked → blocked (needs the key [REDACTED])"
    unit = f"fleet-task@{task_id}.service"

    def journal() -> list[dict[str, Any]]:
        both = [*f.box.journal(f"FLEET_TASK_ID={task_id}"), *f.box.journal("-u", unit)]
        return list({e["__CURSOR"]: e for e in both}.values())

    f.box.wait_for(
        lambda: any(e.get("MESSAGE") == settle for e in journal()), 30, "the settle line"
    )
    entries = journal()
    blocked = [e for e in entries if e.get("FLEET_ACTION") == "blocked"]
    assert [e["FLEET_REASON"] for e in blocked] == ["needs the key [REDACTED]"]
    texts = [json.dumps(e, ensure_ascii=False) for e in entries]
    texts += [str(v) for e in entries for v in e.values()]
    texts.append(f("logs", task_id).stdout)
    wait_for(lambda: (out / "blocked.json").exists(), 30, "the hook's blocked event")
    hooked = json.loads((out / "blocked.json").read_text())
    assert hooked["reason"] == "needs the key [REDACTED]"
    texts += [p.read_text() for p in (f.project / "answered", *sorted(out.glob("*")))]
    nowhere(texts, (CODER_SECRET, *RAW))
