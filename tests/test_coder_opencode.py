"""The opencode coder: its reader over recorded streams, then the real OpenCode CLI.

The CLI (tests/clis, pinned) talks to a scripted Chat Completions server in this process
(tests/servers/openai_chat.py); a marker in the task's description picks the scenario. Runs go
through `fleet-run ID` by hand (no systemd) and through real units in a sandboxed systemd. The
CLI's HOME is a directory of the test with OpenCode's plugin package marked as installed, as
on a machine where OpenCode has run before (otherwise every start npm-installs it). Both ways,
the model also asks a person through fleet-ask's `ask_human` and the test answers with
`fleet answer`, as a person would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fleet.coders.base import CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.coders.opencode import MCP_SERVER, MCP_TIMEOUT_MS, OpencodeCoder
from fleet.events import MSG_STARTED
from fleet.paths import resolve
from fleet.store import open_store
from fleet.timeutil import parse
from tests import sandbox
from tests.conftest import ROOT, Fleet, asked_in_background, fleet_exe, run_fleet
from tests.conftest import events_of as events
from tests.conftest import fleet_run as run
from tests.conftest import run_in_background as running
from tests.conftest import show_task as show
from tests.sandbox import Sandbox
from tests.servers import openai_chat as chat
from tests.servers.base import Log, serve

systemd = sandbox.systemd
OPENCODE = ROOT / "tests" / "clis" / "node_modules" / ".bin" / "opencode"
STREAMS = ROOT / "tests" / "fixtures" / "streams"
BIN = os.path.dirname(fleet_exe())
DEADLINE = 90.0
FLEET_TOOLS = (
    "ask_human",
    "notify_human",
    "task_blocked",
    "task_done",
    "checkpoint",
    "spawn_subtask",
    "handoff",
)
ASK_TOOL = f"{MCP_SERVER}_ask_human"  # OpenCode names MCP tools <server>_<tool>
# Where OpenCode keeps its state when HOME is /root: a test must leave them as they were.
ROOT_STATE = tuple(
    f"/root/{d}/opencode" for d in (".config", ".local/share", ".cache", ".local/state")
)
# A real `error` line of OpenCode 1.18.33 after a 429 from the scripted server (its sixth
# attempt; the first five were its own retries).
LINE_429 = json.dumps(
    {
        "type": "error",
        "timestamp": 1796045707870,
        "sessionID": "ses_dd355776affetLEoVbuk9Ikd1U",
        "error": {
            "name": "APIError",
            "data": {
                "message": "fake 429 from scripted server",
                "statusCode": 429,
                "isRetryable": True,
                "responseHeaders": {
                    "content-length": "117",
                    "content-type": "application/json",
                    "date": "Mon, 30 Nov 2026 13:35:07 GMT",
                    "retry-after-ms": "200",
                    "server": "BaseHTTP/0.6 Python/3.11.7",
                    "x-ratelimit-limit-requests": "100",
                    "x-ratelimit-limit-tokens": "100000",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-remaining-tokens": "0",
                    "x-ratelimit-reset-requests": "3s",
                    "x-ratelimit-reset-tokens": "3s",
                },
                "responseBody": json.dumps(chat.RATE_LIMIT_BODY),
                "metadata": {"url": "http://127.0.0.1:37171/v1/chat/completions"},
            },
        },
    }
)


# ---------------------------------------------------------------------- the reader


def feed(lines: Sequence[str]) -> tuple[OpencodeCoder, Tally, list[Event]]:
    coder = OpencodeCoder(CoderSettings())
    tally = Tally()
    seen: list[Event] = []
    for line in lines:
        for event in coder.parse(line):
            tally.add(event)
            seen.append(event)
    return coder, tally, seen


def recorded(name: str) -> list[str]:
    return (STREAMS / name).read_text().splitlines()


def test_a_recorded_shell_run() -> None:
    coder, tally, seen = feed(recorded("opencode_shell.jsonl"))
    assert [e.kind for e in seen] == [
        Kind.SESSION,
        Kind.TOOL_CALL,
        Kind.TOOL_RESULT,
        Kind.USAGE,
        Kind.TEXT,
        Kind.USAGE,
        Kind.RESULT,
    ]
    assert tally.session == "ses_dd3ee5e6bffeXnqiN5faXAd4KU"
    call, result = seen[1], seen[2]
    assert (call.tool, call.text) == ("bash", "echo hi > fleet_out.txt && ls")
    assert (result.tool, result.text, result.is_error) == ("bash", "fleet_out.txt", False)
    assert seen[4].text == "Done. All good. last_tool_output=[fleet_out.txt | ]"
    # Two steps of 700 new + 500 cached prompt tokens and 30 output tokens each.
    assert (seen[3].tokens_in, seen[3].tokens_out, seen[3].context) == (1200, 30, 1230)
    # OpenCode priced nothing (cost 0: no prices for the model): no reported cost, fleet estimates.
    assert (tally.tokens_in, tally.tokens_out, tally.cost, tally.context) == (2400, 60, None, 1230)
    calls = tally.calls.values()
    assert [(c.input, c.cache_read, c.cache_write, c.output, c.cost) for c in calls] == [
        (700, 500, 0, 30, None),
        (700, 500, 0, 30, None),
    ]
    assert tally.result_seen and not tally.result_error and tally.last_tool == "bash"
    assert coder.verdict(0, tally) == Verdict.SUCCESS
    assert coder.verdict(1, tally) == Verdict.FAILURE


def test_a_recorded_mcp_call_and_a_resumed_session() -> None:
    _, tally, seen = feed(recorded("opencode_mcp.jsonl"))
    (call,) = [e for e in seen if e.kind == Kind.TOOL_CALL]
    (answer,) = [e for e in seen if e.kind == Kind.TOOL_RESULT]
    assert call.tool == "askhuman_ask_human_question" and "May I proceed?" in call.text
    assert answer.text.startswith("HUMAN_ANSWER: yes, go ahead")
    assert (tally.session, tally.tokens_in, tally.tokens_out) == (
        "ses_dd3ee0cb4ffeO6YYKfK3mxCEnr",
        2400,
        60,
    )
    coder, tally, seen = feed(recorded("opencode_resume.jsonl"))
    assert [e.kind for e in seen] == [Kind.SESSION, Kind.TEXT, Kind.USAGE, Kind.RESULT]
    assert (tally.session, tally.tokens_in, tally.tokens_out) == (
        "ses_dd3ede8bafferK4UV701EjJgWF",
        1200,
        30,
    )
    assert coder.verdict(0, tally) == Verdict.SUCCESS


@pytest.mark.parametrize(("name", "status"), [("http401", 401), ("http500", 500)])
def test_recorded_api_errors_fail(name: str, status: int) -> None:
    coder, tally, seen = feed(recorded(f"opencode_{name}.jsonl"))
    assert [e.kind for e in seen] == [Kind.SESSION, Kind.ERROR, Kind.RESULT]
    assert seen[1].text == f"APIError {status}: fake {status} from scripted server"
    assert seen[2].is_error and seen[2].tokens_in is None  # no step: nothing was measured
    assert tally.rate_status is None and tally.last_error == seen[1].text
    for returncode in (1, 0, -signal.SIGTERM):  # an error line is a failure, whatever the exit
        assert coder.verdict(returncode, tally) == Verdict.FAILURE


@pytest.mark.parametrize(
    ("name", "returncode"),
    [
        ("opencode_sigterm_prepopulated_config_exit143.jsonl", -signal.SIGTERM),
        ("opencode_sigterm_prepopulated_config_exit143.jsonl", 143),  # through a shell
        ("opencode_sigterm_during_bg_npm_install_NO_EXIT_killed_after_30s.jsonl", -9),
        ("opencode_sigint_during_bg_npm_install_NO_EXIT_killed_after_30s.jsonl", -9),
        ("opencode_sigint_during_bg_npm_install_NO_EXIT_killed_after_30s.jsonl", -2),
        ("opencode_sigint_during_bg_npm_install_NO_EXIT_killed_after_30s.jsonl", 130),
    ],
)
def test_recorded_signal_exits_are_kills(name: str, returncode: int) -> None:
    coder, tally, seen = feed(recorded(name))
    assert [e.kind for e in seen] == [Kind.SESSION] and tally.session
    assert coder.verdict(returncode, tally) == Verdict.KILLED
    assert coder.verdict(0, tally) == Verdict.SUCCESS  # no error line and exit 0


def test_a_signal_after_the_last_step_keeps_the_run() -> None:
    coder, tally, _ = feed(recorded("opencode_shell.jsonl"))
    assert coder.verdict(-signal.SIGTERM, tally) == Verdict.SUCCESS


def test_a_429_is_a_rejected_rate_limit_with_its_reset() -> None:
    coder, tally, seen = feed([LINE_429])
    assert [e.kind for e in seen] == [Kind.SESSION, Kind.ERROR, Kind.RATE_LIMIT, Kind.RESULT]
    limit = seen[2]
    assert (limit.rate_status, limit.limit_type, limit.utilization) == ("rejected", "requests", 1.0)
    assert limit.resets_at == pytest.approx(1796045707.870 + 3)
    assert seen[1].text == "APIError 429: fake 429 from scripted server"
    assert (tally.rate_status, tally.resets_at) == ("rejected", limit.resets_at)
    assert coder.verdict(1, tally) == Verdict.RATE_LIMITED


def error_line(data: dict[str, Any], name: str = "APIError") -> str:
    error = {"name": name, "data": data}
    return json.dumps({"type": "error", "timestamp": 1_800_000_000_000, "error": error})


@pytest.mark.parametrize(
    ("data", "resets_at", "limit_type"),
    [
        # seconds, an HTTP date and milliseconds of retry-after; Anthropic's RFC 3339 resets
        ({"statusCode": 429, "responseHeaders": {"Retry-After": "20"}}, 1_800_000_020, None),
        (
            {
                "statusCode": 429,
                "responseHeaders": {"retry-after": "Fri, 15 Jan 2027 08:00:05 GMT"},
            },
            1_800_000_005,
            None,
        ),
        ({"statusCode": 429, "responseHeaders": {"retry-after-ms": "1500"}}, 1_800_000_001.5, None),
        (
            {
                "statusCode": 429,
                "responseHeaders": {
                    "anthropic-ratelimit-requests-remaining": "7",
                    "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:01Z",
                    "anthropic-ratelimit-output-tokens-remaining": "0",
                    "anthropic-ratelimit-output-tokens-reset": "2027-01-15T08:01:00Z",
                },
            },
            1_800_000_060,
            "output-tokens",
        ),
        (
            {
                "statusCode": 429,
                "responseHeaders": {
                    "x-ratelimit-remaining-tokens": "0",
                    "x-ratelimit-reset-tokens": "6m0s",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": "120ms",
                },
            },
            1_800_000_360,
            "tokens",
        ),
        # An epoch in milliseconds; values no reset can have are no reset.
        (
            {"statusCode": 429, "responseHeaders": {"retry-after": "1800000030000"}},
            1_800_000_030,
            None,
        ),
        ({"statusCode": 429, "responseHeaders": {"retry-after": "1e300"}}, None, None),
        ({"statusCode": 429, "responseHeaders": {"retry-after-ms": "-5"}}, None, None),
        (
            {
                "statusCode": 429,
                "responseHeaders": {
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": "99999999999h",
                },
            },
            None,
            None,
        ),
        # No status and no headers: the text alone says it is a rate limit.
        ({"message": "Too Many Requests"}, None, None),
    ],
)
def test_rate_limit_signals(
    data: dict[str, Any], resets_at: float | None, limit_type: str | None
) -> None:
    coder, tally, seen = feed([error_line({"message": "slow down", **data})])
    (limit,) = [e for e in seen if e.kind == Kind.RATE_LIMIT]
    assert limit.rate_status == "rejected" and limit.limit_type == limit_type
    assert limit.resets_at == (pytest.approx(resets_at) if resets_at else None)
    assert coder.verdict(1, tally) == Verdict.RATE_LIMITED


def test_other_errors_are_not_rate_limits() -> None:
    lines = [
        error_line({"statusCode": 500, "message": "rate of errors too high"}),
        error_line({"message": "model not found"}, name="ProviderModelNotFoundError"),
        json.dumps({"type": "error", "error": "a string"}),
    ]
    coder, tally, seen = feed(lines)
    assert not [e for e in seen if e.kind == Kind.RATE_LIMIT]
    assert [e.kind for e in seen].count(Kind.ERROR) == 3
    assert coder.verdict(1, tally) == Verdict.FAILURE


def test_garbage_and_odd_lines_become_raw_events_never_exceptions() -> None:
    raw = [
        "",
        "garbage: this is not JSON {",
        "\ufffd\ufffd not utf8",
        "null",
        "[1, 2]",
        '"a string"',
        "1e999",
        '{"type": 5}',
        '{"no": "type"}',
        '{"type": "something_new", "sessionID": "ses_new"}',
        "[" * 100_000 + "]" * 100_000,  # deeper than the JSON reader recurses
        "x" * (9 << 20),
    ]
    odd = [  # known types with missing or wrongly typed fields
        '{"type": "step_finish", "part": {"tokens": "many", "cost": "free"}}',
        '{"type": "step_finish", "part": {"tokens": {"input": 1e999, "cache": [],'
        ' "output": -5, "total": true}, "cost": 1e999}}',
        '{"type": "step_finish", "part": {"tokens": {"input": ' + "9" * 400 + "}}}",
        '{"type": "tool_use", "part": []}',
        '{"type": "tool_use", "part": {"state": {"input": [1], "status": "error"}}}',
        '{"type": "text"}',
        '{"type": "error"}',
        '{"type": "error", "error": {"data": {"statusCode": "429", "responseHeaders": [1]}}}',
        '{"type": "step_start", "sessionID": 7}',
    ]
    coder, tally, seen = feed(raw + odd)
    assert [e.kind for e in seen[: len(raw) + 1]] == [Kind.RAW] * 9 + [
        Kind.SESSION,
        Kind.RAW,
        Kind.RAW,
        Kind.RAW,
    ]
    assert seen[0].text == "" and seen[1].text == "garbage: this is not JSON {"
    assert tally.session == "ses_new"
    assert tally.tokens_in is not None and tally.tokens_in >= 0
    assert coder.verdict(1, tally) == Verdict.FAILURE


# ---------------------------------------------------------------------- starting it


def spec(tmp_path: Path, model: str | None = "fast") -> RunSpec:
    task_dir = tmp_path / "tasks" / "fl-abc123"
    return RunSpec(
        "fl-abc123",
        2,
        "fix  the\nbug",
        "it is broken",
        str(tmp_path),
        model,
        task_dir,
        task_dir / "artifacts",
        'Fix it; then run: fleet close fl-abc123 --reason "<what>"\n',
        task_dir / "prompt.md",
    )


def test_command_environment_and_runtime_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_HOME", "/srv/fleet")
    mine = {"type": "local", "command": ["mcp-mine"]}
    user = {"model": "fake/x", "mcp": {"mine": mine}}
    settings = CoderSettings(
        binary="/opt/opencode",
        args=("--agent", "build"),
        env={"OPENCODE_CONFIG_CONTENT": json.dumps(user), "EXTRA": "1"},
        models={"fast": "fake/fast-model"},
    )
    coder = OpencodeCoder(settings)
    run = spec(tmp_path)
    argv = coder.argv(run)
    assert argv[:4] == ["/bin/sh", "-c", argv[2], "fleet-opencode"]
    assert coder.prompt_on_stdin and run.prompt not in " ".join(argv)
    assert argv[4:] == [
        "/opt/opencode",
        "run",
        "--format",
        "json",
        "--auto",
        "--dir",
        str(tmp_path),
        "--title",
        "fl-abc123 fix the bug",
        "--model",
        "fake/fast-model",
        "--agent",
        "build",
    ]
    assert "--model" not in coder.argv(spec(tmp_path, model=None))
    # The shell part passes the runner's standard input, the prompt file, on verbatim.
    run.task_dir.mkdir(parents=True)
    run.prompt_file.write_text(run.prompt)
    echo = [*argv[:4], sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"]
    with run.prompt_file.open("rb") as stdin:
        out = subprocess.run(echo, stdin=stdin, capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(run.prompt)

    env = coder.environ(run)
    assert env["EXTRA"] == "1" and env["TMPDIR"] == str(run.task_dir / "tmp")
    assert env["OPENCODE_DISABLE_AUTOUPDATE"] == "1" and "IS_SANDBOX" not in env
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == "fake/x" and config["mcp"]["mine"] == mine
    ask = config["mcp"][MCP_SERVER]
    assert ask == {
        "type": "local",
        "command": [os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "fleet-ask")],
        "environment": {"FLEET_TASK_ID": "fl-abc123", "FLEET_HOME": "/srv/fleet"},
        "enabled": True,
        "timeout": MCP_TIMEOUT_MS,
    }
    assert MCP_TIMEOUT_MS == 2**31 - 1  # hours of waiting for a person; more would mean 1 ms

    (run.task_dir / "tmp").mkdir()
    (run.task_dir / "tmp" / ".old-00000000.so").write_text("left by the last attempt")
    coder.prepare(run)
    assert list((run.task_dir / "tmp").iterdir()) == []
    # A configuration OpenCode cannot read is left for OpenCode to report.
    broken = OpencodeCoder(CoderSettings(env={"OPENCODE_CONFIG_CONTENT": "{nope"}))
    assert broken.environ(run)["OPENCODE_CONFIG_CONTENT"] == "{nope"


def cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "TMPDIR": str(home)}


def test_the_installed_cli_is_a_tested_version(clihome: Path) -> None:
    out = subprocess.run(
        [str(OPENCODE), "--version"],
        capture_output=True,
        text=True,
        env=cli_env(clihome),
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() in OpencodeCoder.tested_versions


# ---------------------------------------------------------------------- the real CLI


def listing(roots: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            found.update(os.path.join(dirpath, n) for n in (*dirnames, *filenames))
            found.add(dirpath)
    return found


@pytest.fixture(scope="module", autouse=True)
def root_untouched() -> Iterator[None]:
    before = listing(ROOT_STATE)
    yield
    assert listing(ROOT_STATE) == before, "OpenCode wrote to /root"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Log]]:
    with serve(chat.ChatHandler) as found:
        yield found


@pytest.fixture
def clihome(tmp_path: Path) -> Path:
    """The CLI's HOME: OpenCode's plugin package counts as installed, so no npm run starts."""
    home = tmp_path / "clihome"
    config = home / ".config" / "opencode"
    (config / "node_modules").mkdir(parents=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "1.18.33"}}}}
    (config / "package-lock.json").write_text(json.dumps(lock))
    return home


def settings(url: str, home: Path, binary: Path = OPENCODE) -> list[str]:
    """`fleet config set` arguments: the binary, the provider and a HOME of the test's own."""
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Scripted",
        "options": {"baseURL": f"{url}/v1", "apiKey": "sk-test"},
        "models": {chat.MODEL: {"name": "Scripted", "tool_call": True}},
    }
    env = {
        "HOME": str(home),
        "OPENCODE_CONFIG_CONTENT": json.dumps(
            {"model": f"fake/{chat.MODEL}", "provider": {"fake": provider}}
        ),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    }
    table = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}"
    return [f"coders.opencode.binary={binary}", f"coders.opencode.env={table}"]


def requests_of(log: Log, task_id: str) -> list[Any]:
    return [b for b in log.bodies(chat.PATH) if task_id in json.dumps(b)]


def test_a_task_runs_closes_itself_and_counts_its_tokens(
    fleet: Fleet, project: Path, tmp_path: Path, server: tuple[str, Log], clihome: Path
) -> None:
    url, log = server
    noisy = tmp_path / "opencode-noisy"  # a line that is not OpenCode's, then OpenCode
    noisy.write_text(f"#!/bin/sh\necho 'garbage: this is not JSON {{'\nexec {OPENCODE} \"$@\"\n")
    noisy.chmod(0o755)
    fleet.ok("config", "set", *settings(url, clihome, noisy))
    task_id = fleet.add("write the file", "--coder", "opencode", "-d", "FLEET_SCENARIO=shell")
    result = run(task_id, project)
    assert result.returncode == 0, result.stderr
    seen = events(result.stdout)
    assert seen[0] == {"event": "raw", "text": "garbage: this is not JSON {"}
    assert [e["event"] for e in seen[1:]] == [
        "session",
        *("tool_call", "tool_result", "usage") * 2,
        "text",
        "usage",
        "result",
    ]
    calls = [(e["tool"], e["text"]) for e in seen if e["event"] == "tool_call"]
    assert calls == [("bash", command) for command in chat.SHELL_COMMANDS]
    assert [e["text"] for e in seen if e["event"] == "tool_result"][1] == task_id
    assert seen[-1]["tokens_in"] == 3 * chat.PROMPT and seen[-1]["tokens_out"] == 3 * chat.OUTPUT
    shown = show(fleet, task_id)
    assert (shown["status"], shown["reason"]) == ("done", "done")
    (attempt,) = shown["attempt_log"]
    assert attempt["outcome"] == "success" and attempt["session_id"] == seen[1]["session"]
    assert (attempt["tokens_in"], attempt["tokens_out"]) == (3 * chat.PROMPT, 3 * chat.OUTPUT)
    assert (project / "fleet_out.txt").read_text() == "written by the fake model\n"
    # Three model calls (no title call), each with the prompt exactly as fleet wrote it and
    # with fleet-ask's tools.
    bodies = requests_of(log, task_id)
    assert len(bodies) == 3 and all(b["tools"] for b in bodies)
    prompt = (Path(os.environ["FLEET_HOME"]) / "tasks" / task_id / "prompt.md").read_text()
    assert chat.user_texts(bodies[0]) == [prompt]
    for body in bodies:
        offered = {t["function"]["name"] for t in body["tools"]}
        assert {"bash", *(f"{MCP_SERVER}_{t}" for t in FLEET_TOOLS)} <= offered


def test_a_fleet_ask_that_fails_to_start_leaves_the_run_alone(
    fleet: Fleet, project: Path, tmp_path: Path, server: tuple[str, Log], clihome: Path
) -> None:
    url, log = server
    # fleet-run starts the fleet-ask next to itself: here one that fails at once.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("fleet", "fleet-run"):
        (bindir / name).symlink_to(fleet_exe(name))
    (bindir / "fleet-ask").write_text("#!/bin/sh\necho 'fleet-ask: broken' >&2\nexit 69\n")
    (bindir / "fleet-ask").chmod(0o755)
    fleet.ok("config", "set", *settings(url, clihome))
    task_id = fleet.add("no tools", "--coder", "opencode", "-d", "FLEET_SCENARIO=shell")
    result = run(task_id, project, bindir / "fleet-run")
    assert result.returncode == 0, result.stderr
    assert show(fleet, task_id)["status"] == "done"
    # OpenCode only dropped the server's tools, with a warning in its log.
    bodies = requests_of(log, task_id)
    assert len(bodies) == 3
    assert not any(t["function"]["name"].startswith(MCP_SERVER) for b in bodies for t in b["tools"])
    logs = "".join(p.read_text() for p in (clihome / ".local/share/opencode/log").iterdir())
    assert f'message="server unavailable" key={MCP_SERVER} type=local status=failed' in logs


def test_the_model_asks_a_person_and_closes_the_task_with_the_answer(
    fleet: Fleet, project: Path, tmp_path: Path, server: tuple[str, Log], clihome: Path
) -> None:
    url, log = server
    fleet.ok("config", "set", *settings(url, clihome))
    task_id = fleet.add("greet", "--coder", "opencode", "-d", "FLEET_SCENARIO=ask")
    out = tmp_path / "events.jsonl"
    with running(task_id, project, out) as agent:
        question = asked_in_background(task_id, agent, out, DEADLINE)
        assert (question["task"], question["status"], question["kind"]) == (
            task_id,
            "pending",
            "input",
        )
        assert question["text"] == chat.ASK_ARGS["question"]
        assert (question["options"], question["multi_select"]) == ([], False)
        assert show(fleet, task_id)["question"] == question["id"]
        assert "asking" in fleet.ok("ls").split()
        assert len(requests_of(log, task_id)) == 1 and agent.poll() is None
        # A person answers from another shell, naming the task (it has one question waiting);
        # the quotes and the dollar reach the model and the shell untouched.
        text = 'Hi, it\'s "$USER" here'
        answer = run_fleet("answer", task_id, text, "--by", "tester", "--json")
        assert answer.code == 0, answer.err
        assert json.loads(answer.out)["answer"] == text
        assert agent.wait(timeout=DEADLINE) == 0, out.with_suffix(".err").read_text()
    received = f"The person (tester) answered: {text}"
    # The model saw the answer as the tool's result, and closed the task with it in the shell.
    bodies = requests_of(log, task_id)
    assert len(bodies) == 3
    assert ASK_TOOL in {t["function"]["name"] for t in bodies[0]["tools"]}
    assert chat.last_tool_result(bodies[1]) == received
    shown = show(fleet, task_id)
    assert (shown["status"], shown["reason"], shown["question"]) == (
        "done",
        f"answer: {received}",
        None,
    )
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
    seen = events(out.read_text())
    calls = [(e["tool"], e["text"]) for e in seen if e["event"] == "tool_call"]
    assert [tool for tool, _ in calls] == [ASK_TOOL, "bash"]
    assert calls[1][1] == chat.close_command(received)
    assert next(e["text"] for e in seen if e["event"] == "tool_result") == received
    (done,) = json.loads(fleet.ok("questions", "--all", "--json", "--task", task_id))
    assert (done["id"], done["status"], done["answered_by"], done["answer"]) == (
        question["id"],
        "answered",
        "tester",
        text,
    )
    assert json.loads(fleet.ok("questions", "--json")) == []


def test_a_huge_context_stops_the_attempt_and_requeues_it(
    fleet: Fleet, project: Path, server: tuple[str, Log], clihome: Path
) -> None:
    url, _ = server
    fleet.ok("config", "set", *settings(url, clihome), "stop_grace_seconds=2")
    task_id = fleet.add("fill the context", "--coder", "opencode", "-d", "FLEET_SCENARIO=huge")
    result = run(task_id, project)
    assert result.returncode == 7, result.stderr
    usage = [e for e in events(result.stdout) if e["event"] == "usage"]
    assert usage[0]["context"] == chat.HUGE_PROMPT + chat.OUTPUT  # 95 % of 200,000
    shown = show(fleet, task_id)
    assert (shown["status"], shown["failures"], shown["noclose"]) == ("ready", 0, 0)
    assert shown["attempt_log"][0]["outcome"] == "context-pressure"


def test_a_429_gates_opencode_but_not_other_coders(
    fleet: Fleet, project: Path, server: tuple[str, Log], clihome: Path
) -> None:
    url, log = server
    fleet.ok("config", "set", *settings(url, clihome))
    reset = 60  # long enough to look at the gate while it holds
    description = f"FLEET_SCENARIO=ratelimit FLEET_RESET_S={reset}"
    task_id = fleet.add("limited", "--coder", "opencode", "-d", description)
    other = fleet.add("other coder", "--coder", "command", "-d", "true")
    waiting = fleet.add("same coder", "--coder", "opencode", "-d", "FLEET_SCENARIO=shell")
    before = time.time()
    result = run(task_id, project)
    after = time.time()
    assert result.returncode == 6, result.stderr
    (limit,) = [e for e in events(result.stdout) if e["event"] == "rate_limit"]
    assert (limit["rate_status"], limit["limit_type"]) == ("rejected", "requests")
    assert before + reset < limit["resets_at"] < after + reset
    # OpenCode has no retry setting: six attempts (its five retries) before it gives up.
    assert len(requests_of(log, task_id)) == 6
    shown = show(fleet, task_id)
    assert (shown["status"], shown["failures"]) == ("ready", 0)
    assert shown["attempt_log"][0]["outcome"] == "rate-limited"
    assert "429" in str(shown["reason"])
    store = open_store(resolve())
    try:
        until, why = store.gates()["coder:opencode"]
        assert until is not None and abs(parse(until) - limit["resets_at"]) < 0.01
        assert "requests" in str(why)
        claimed = [t.id for t in store.claim(10, "test", 60, "claude", None)]
    finally:
        store.close()
    assert claimed == [other] and waiting not in claimed


# ---------------------------------------------------------------------- under systemd


@dataclass
class Units:
    """`fleet` inside the sandbox, with this test's FLEET_HOME."""

    box: Sandbox
    home: Path
    project: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = {"FLEET_HOME": str(self.home)}
        return self.box.run(f"{BIN}/fleet", *args, env=env, check=check, timeout=timeout)

    def add(self, title: str, scenario: str) -> str:
        description = f"FLEET_SCENARIO={scenario}"
        args = ("add", title, "--coder", "opencode", "--cwd", str(self.project), "-d", description)
        return self(*args).stdout.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def wait(self, task_id: str, timeout: float = DEADLINE) -> int:
        args = ("wait", task_id, "--timeout", str(int(timeout)))
        code = self(*args, check=False, timeout=timeout + 10).returncode
        if code == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return code

    def pgrep(self, pattern: str) -> str:
        return self.box.run("pgrep", "-af", pattern, check=False).stdout


@pytest.fixture
def units(
    systemd: Sandbox, tmp_path: Path, server: tuple[str, Log], clihome: Path
) -> Iterator[Units]:
    project = tmp_path / "project"
    project.mkdir()
    fleet = Units(systemd, tmp_path / "home", project)
    url, _ = server
    fleet("config", "set", "lease_seconds=10", "stop_grace_seconds=2", *settings(url, clihome))
    fleet("setup", "--system")
    yield fleet
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("stop", "fleet-wake-*", check=False)
    systemd.systemctl("reset-failed", check=False)


def test_units_run_one_task_to_done_and_kill_another_with_its_tool(units: Units) -> None:
    # Both at once, as dispatch would have it: the machine has two cores to spare for them.
    task_id = units.add("write the file", "shell")
    hung = units.add("sleep in a tool", "hang")
    assert units.wait(task_id) == 0
    shown = units.show(task_id)
    assert shown["status"] == "done"
    (attempt,) = shown["attempt_log"]
    assert attempt["outcome"] == "success" and attempt["session_id"].startswith("ses_")
    assert (attempt["tokens_in"], attempt["tokens_out"]) == (3 * chat.PROMPT, 3 * chat.OUTPUT)
    assert (units.project / "fleet_out.txt").exists()
    journal = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert "→ bash: echo written by the fake model > fleet_out.txt" in journal

    # The tool runs in a session of its own, out of OpenCode's process group: only the unit's
    # cgroup still holds it.
    sleeper = f"sleep {chat.HANG_SECONDS}"
    units.box.wait_for(lambda: sleeper in units.pgrep(sleeper), 60, "the tool's sleep")
    units("kill", hung)
    assert units.pgrep(sleeper) == "" and units.pgrep("opencode") == ""
    assert units.wait(hung) == 1
    shown = units.show(hung)
    assert [a["outcome"] for a in shown["attempt_log"]] == ["killed"]
    assert "stopped by a person" in shown["reason"]


def pending_in_units(units: Units, task_id: str) -> dict[str, Any]:
    """The question the task's agent asks, once `fleet questions --wait` sees it."""
    args = ("questions", "--wait", "--json", "--timeout", str(int(DEADLINE)), "--task", task_id)
    found = units(*args, check=False, timeout=DEADLINE + 30)
    if found.returncode != 0:
        journal = units.box.run("journalctl", "-n", "80", "--no-pager").stdout
        raise AssertionError(f"no question from {task_id}: {found.stderr}\n{journal}")
    (question,) = json.loads(found.stdout)
    assert isinstance(question, dict)
    return question


def status_text(units: Units, task_id: str) -> str:
    unit = f"fleet-task@{task_id}"
    return units.box.systemctl("show", "-p", "StatusText", "--value", unit).stdout.strip()


def status_says(units: Units, task_id: str, words: str) -> bool:
    return words in status_text(units, task_id)


def test_units_wait_for_a_person_one_answered_and_one_killed(
    units: Units, server: tuple[str, Log]
) -> None:
    _, log = server
    task_id = units.add("ask and close", "ask")
    killed = units.add("ask and be stopped", "ask")
    question = pending_in_units(units, task_id)
    doomed = pending_in_units(units, killed)
    assert (question["kind"], question["text"]) == ("input", chat.ASK_ARGS["question"])
    # While they wait: the units' status lines say so, and `fleet ls` shows them asking.
    for tid, q in ((task_id, question), (killed, doomed)):
        expected = f"waiting for a person: {q['id']} (input) What should"
        units.box.wait_for(partial(status_says, units, tid, expected), 30, f"{tid}'s status")
        (row,) = [r for r in units("ls").stdout.splitlines() if r.startswith(tid)]
        assert row.split()[1] == "asking"
        assert units.show(tid)["question"] == q["id"]

    # A kill while the agent waits: the question is cancelled, nobody can answer it any more.
    units("kill", killed)
    assert units.wait(killed) == 1
    shown = units.show(killed)
    assert [a["outcome"] for a in shown["attempt_log"]] == ["killed"]
    assert shown["status"] == "blocked" and shown["question"] is None
    (gone,) = json.loads(units("questions", "--all", "--json", "--task", killed).stdout)
    assert (gone["id"], gone["status"], gone["answered_by"]) == (doomed["id"], "cancelled", None)
    late = units("answer", doomed["id"], "too late", check=False)
    assert late.returncode == 4 and "cancelled" in late.stderr
    # The other one still waits, and its answer finishes it.
    assert [q["id"] for q in json.loads(units("questions", "--json").stdout)] == [question["id"]]
    units("answer", question["id"], "Hello, world", "--by", "tester")
    assert units.wait(task_id) == 0
    received = "The person (tester) answered: Hello, world"
    shown = units.show(task_id)
    assert (shown["status"], shown["reason"]) == ("done", f"answer: {received}")
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
    assert chat.last_tool_result(requests_of(log, task_id)[1]) == received
    (done,) = json.loads(units("questions", "--all", "--json", "--task", task_id).stdout)
    assert (done["status"], done["answered_by"], done["answer"]) == (
        "answered",
        "tester",
        "Hello, world",
    )
    # fleet-ask wrote the question and its answer to the task's journal.
    qid = question["id"]
    entries = units.box.journal("-u", f"fleet-task@{task_id}", f"FLEET_QUESTION={qid}")
    assert [
        (e["SYSLOG_IDENTIFIER"], e["MESSAGE"], e["FLEET_QUESTION_STATUS"]) for e in entries
    ] == [
        ("fleet-ask", f"question {qid} (input): {chat.ASK_ARGS['question']}", "pending"),
        ("fleet-ask", f"answer to {qid} by tester: Hello, world", "answered"),
    ]
    journal = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert f"→ {ASK_TOOL}" in journal


def test_a_rate_limited_task_runs_again_after_the_reset(
    units: Units, server: tuple[str, Log]
) -> None:
    _, log = server
    task_id = units.add("limited at first", "ratelimit-first")
    assert units.wait(task_id) == 0
    shown = units.show(task_id)
    first, second = shown["attempt_log"]
    assert (first["outcome"], second["outcome"]) == ("rate-limited", "success")
    # The gate held until the reset that the 429 gave (RESET_S after the last retry).
    (limit,) = units.box.journal("-u", f"fleet-task@{task_id}", "FLEET_EVENT=rate_limit")
    assert limit["FLEET_RATE_STATUS"] == "rejected"
    resets_at = float(limit["FLEET_RESETS_AT"])
    assert parse(first["ended_at"]) < resets_at <= parse(second["started_at"]) + 0.01
    assert len(requests_of(log, task_id)) == 6 + 3
    assert (units.project / "fleet_out.txt").exists()


def test_a_unit_runs_opencode_to_done_under_the_standard_sandbox(units: Units) -> None:
    units("config", "set", "coders.opencode.sandbox=standard")
    task_id = units.add("write the file", "shell")
    assert units.wait(task_id) == 0
    assert units.show(task_id)["status"] == "done"
    assert (units.project / "fleet_out.txt").exists()
    unit = f"fleet-task@{task_id}"
    (started,) = units.box.journal("-u", unit, f"MESSAGE_ID={MSG_STARTED}")
    assert started["FLEET_SANDBOX"] == "standard"
    journal = units.box.run("journalctl", "-u", unit, "-o", "cat").stdout
    assert "→ bash: echo written by the fake model > fleet_out.txt" in journal
