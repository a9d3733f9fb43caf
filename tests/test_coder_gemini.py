"""The gemini coder: its reading of recorded Gemini CLI streams, and the real Gemini CLI
(tests/clis) against a scripted Gemini API on 127.0.0.1, run by hand (`fleet-run ID`) and as
systemd units in a sandbox.

The CLI's home for each task is TASK_DIR/gemini; the tests give the runner a HOME of their own
(with a `.gemini` of "the user's" to link from), so nothing is written to the real home
(/root when the tests run as root).
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.coders.base import CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.coders.gemini import MCP_TIMEOUT_MS, GeminiCoder, pacific_midnight
from fleet.events import MSG_STARTED
from fleet.timeutil import parse
from tests import sandbox
from tests.conftest import (
    ROOT,
    Fleet,
    asked_in_background,
    command_lines_once,
    events_of,
    fleet_exe,
    run_fleet,
)
from tests.conftest import fleet_run as run
from tests.conftest import run_in_background as running
from tests.conftest import show_task as show
from tests.sandbox import Sandbox
from tests.servers import gemini as server
from tests.servers.base import Log
from tests.servers.gemini import serve_gemini

systemd = sandbox.systemd
CLI = ROOT / "tests" / "clis" / "node_modules" / ".bin" / "gemini"
STREAMS = ROOT / "tests" / "fixtures" / "streams"
BIN = os.path.dirname(fleet_exe())
MODEL = "gemini-2.5-pro"
API_KEY = "sk-fake-gemini"
MEMORY = "the-users-own-gemini-memory-7f3a"
GARBAGE = "{this line is not JSON from the wrapper"
DEADLINE = 90.0
SESSIONS: list[str] = []  # every session the real CLI started here: none in the real home
REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)  # /root when the tests run as root


# ---------------------------------------------------------------------- helpers


def replay(name: str) -> tuple[list[Event], Tally]:
    coder = GeminiCoder(CoderSettings())
    events: list[Event] = []
    tally = Tally()
    for line in (STREAMS / name).read_text().splitlines():
        for event in coder.parse(line):
            events.append(event)
            tally.add(event)
    return events, tally


def iso_epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def kinds(events: list[Event]) -> list[str]:
    return [str(e.kind) for e in events]


def spec(task_dir: Path, prompt: str = "# do it\n", model: str | None = MODEL) -> RunSpec:
    return RunSpec(
        "fl-abc123",
        1,
        "do it",
        "",
        str(task_dir.parent),
        model,
        task_dir,
        task_dir / "artifacts",
        prompt,
        task_dir / "prompt.md",
    )


def user_home(path: Path) -> Path:
    """A home whose .gemini holds the user's own settings (with a comment) and memory."""
    dot = path / ".gemini"
    dot.mkdir(parents=True)
    (dot / "settings.json").write_text(
        '// mine\n{"privacy": {"usageStatisticsEnabled": false}, "mcp": {"allowed": ["mine"]}}\n'
    )
    (dot / "GEMINI.md").write_text(f"Remember {MEMORY}.\n")
    return path


def untouched(home: Path) -> bool:
    """Nothing but what user_home() made is in the user's home: the CLI wrote elsewhere."""
    return os.listdir(home) == [".gemini"] and sorted(os.listdir(home / ".gemini")) == [
        "GEMINI.md",
        "settings.json",
    ]


def gemini_env(url: str, **extra: str) -> str:
    """`coders.gemini.env` as a TOML inline table: the fake key and the server's URL."""
    values = {"GEMINI_API_KEY": API_KEY, "GOOGLE_GEMINI_BASE_URL": url, **extra}
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + "}"


def sessions_under(directory: Path, session: str) -> list[str]:
    return glob.glob(f"{directory}/**/*{session[:8]}*", recursive=True)


def requests(log: Log) -> list[Any]:
    return log.bodies(":streamGenerateContent")


@pytest.fixture(scope="module", autouse=True)
def root_stays_clean() -> Iterator[None]:
    yield
    for session in SESSIONS:
        assert sessions_under(REAL_HOME / ".gemini", session) == []


# ---------------------------------------------------------------------- 1. the parser


def test_a_shell_turn_reads_as_session_tools_text_usage_and_result() -> None:
    events, tally = replay("gemini_shell.jsonl")
    assert kinds(events) == ["session", "tool_call", "tool_result", "text", "usage", "result"]
    session, call, result, _, usage, final = events
    assert session.session == tally.session == "519864c0-2e42-4588-98c6-ffe7a67b86cc"
    assert (call.tool, call.text) == ("run_shell_command", "echo hi > fleet_out.txt && ls")
    assert (result.tool, result.text, result.is_error) == (
        "run_shell_command",
        "fleet_out.txt",
        False,
    )
    # result.stats: both models, the routing call included; no cost in this stream
    assert (usage.tokens_in, usage.tokens_out) == (3600, 90)
    # the routed model's 2400 prompt tokens over at most 2 calls: each call really had 1200
    assert usage.context == 1200
    assert (final.tokens_in, final.tokens_out, final.cost, final.is_error) == (
        3600,
        90,
        None,
        False,
    )
    assert final.text.startswith("Done. All good.")
    assert (tally.tokens_in, tally.tokens_out, tally.last_tool) == (3600, 90, "run_shell_command")
    assert GeminiCoder(CoderSettings()).verdict(0, tally) == Verdict.SUCCESS


def test_an_mcp_call_and_a_resumed_run() -> None:
    events, tally = replay("gemini_mcp.jsonl")
    call = next(e for e in events if e.kind == Kind.TOOL_CALL)
    answer = next(e for e in events if e.kind == Kind.TOOL_RESULT)
    assert (call.tool, call.text) == ("mcp_askhuman_ask_human_question", "May I proceed?")
    assert answer.tool == call.tool and answer.text.startswith("HUMAN_ANSWER: yes")
    assert (tally.tokens_in, tally.tokens_out, tally.context) == (2400, 60, 1200)
    events, tally = replay("gemini_resume.jsonl")
    assert tally.session == "519864c0-2e42-4588-98c6-ffe7a67b86cc"  # the same session
    assert (tally.tokens_in, tally.tokens_out) == (1200, 30)  # this run's only
    assert GeminiCoder(CoderSettings()).verdict(0, tally) == Verdict.SUCCESS


def test_a_429_is_a_rejected_rate_limit_and_exit_173() -> None:
    events, tally = replay("gemini_429.jsonl")
    assert kinds(events) == ["session", "usage", "rate_limit", "error", "result"]
    limit = events[2]
    assert limit.rate_status == "rejected" and limit.resets_at is None  # no delay given
    assert tally.result_error and "fake 429" in str(tally.last_error)
    coder = GeminiCoder(CoderSettings())
    assert coder.verdict(173, tally) == Verdict.RATE_LIMITED
    # exit 173 (429 mod 256) alone says so too, should the line have been lost
    assert coder.verdict(173, Tally()) == Verdict.RATE_LIMITED


@pytest.mark.parametrize(
    ("name", "status", "words"),
    [
        ("gemini_http500_maxAttempts1.jsonl", 244, "fake 500"),  # 500 mod 256
        ("gemini_http401_maxAttempts1.jsonl", 145, "fake 401"),  # 401 mod 256
        ("gemini_empty_response_error.jsonl", 0, "empty response"),  # exit 0, not a success
    ],
)
def test_api_errors_and_an_empty_answer_are_failures(name: str, status: int, words: str) -> None:
    events, tally = replay(name)
    assert Kind.RATE_LIMIT not in [e.kind for e in events]
    assert tally.result_seen and tally.result_error and words in str(tally.last_error)
    assert events[-1].kind == Kind.RESULT and words in events[-1].text
    assert GeminiCoder(CoderSettings()).verdict(status, tally) == Verdict.FAILURE


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("gemini_sigterm_to_process_group_exit0_no_result.jsonl", 0),
        ("gemini_sigterm_NO_RELAUNCH_exit0_no_result.jsonl", 0),
        ("gemini_sigterm_to_launcher_pid_only_NO_EXIT_killed_after_30s.jsonl", -signal.SIGKILL),
        ("gemini_sigint_to_launcher_pid_only_NO_EXIT_killed_after_30s.jsonl", -signal.SIGKILL),
    ],
)
def test_signals_end_without_a_result_and_are_kills(name: str, status: int) -> None:
    events, tally = replay(name)
    assert kinds(events) == ["session", "tool_call"] and not tally.result_seen
    assert events[1].text == "sleep 300 && echo slept > slept.txt"
    coder = GeminiCoder(CoderSettings())
    assert coder.verdict(status, tally) == Verdict.KILLED
    assert coder.verdict(1, tally) == Verdict.FAILURE  # a crash is not a kill


def test_the_retry_delay_in_a_429_message_is_the_reset() -> None:
    coder = GeminiCoder(CoderSettings())
    line = json.dumps(
        {
            "type": "result",
            "timestamp": "2026-11-30T13:33:33.542Z",
            "status": "error",
            "error": {
                "type": "unknown",
                "message": "[API Error: Resource has been exhausted. Please retry in 3s.\n"
                "Suggested retry after 3s.]\nPlease wait and try again later.",
            },
            "stats": {"input_tokens": 0, "output_tokens": 0, "tool_calls": 0, "models": {}},
        }
    )
    (limit,) = [e for e in coder.parse(line) if e.kind == Kind.RATE_LIMIT]
    assert limit.resets_at == pytest.approx(1796045613.542 + 3)
    daily = line.replace(
        "Resource has been exhausted. Please retry in 3s.\\nSuggested retry after 3s.",
        "You have exhausted your daily quota on this model.",
    )
    (limit,) = [e for e in coder.parse(daily) if e.kind == Kind.RATE_LIMIT]
    assert limit.limit_type == "daily"
    assert limit.resets_at == iso_epoch("2026-12-01T08:00:00Z")  # midnight, UTC-8
    assert pacific_midnight(iso_epoch("2026-07-01T06:59:59Z")) == iso_epoch("2026-07-01T07:00:00Z")
    assert pacific_midnight(iso_epoch("2026-07-01T07:00:00Z")) == iso_epoch("2026-07-02T07:00:00Z")
    # the error of a tool that happens to say 429 is no rate limit
    tool = json.dumps(
        {
            "type": "result",
            "status": "error",
            "error": {
                "type": "FatalToolExecutionError",
                "message": "Error executing tool x: port 429 busy",
            },
        }
    )
    assert Kind.RATE_LIMIT not in [e.kind for e in coder.parse(tool)]


def test_garbage_never_raises_and_becomes_raw() -> None:
    coder = GeminiCoder(CoderSettings())
    lines = [
        "",
        "not json at all",
        "\ufffd\ufffd binary \x00 junk",
        "[1, 2, 3]",
        "null",
        '"a string"',
        '{"no": "type"}',
        '{"type": "martian"}',
        '{"type": "init"}',
        '{"type": "message", "role": "narrator", "content": "?"}',
        '{"type": "init", "session_id": 12}',
        '{"type": "tool_use", "tool_name": ["x"], "parameters": "p"}',
        '{"type": "tool_result", "status": 7, "output": {"a": 1}, "error": "e"}',
        '{"type": "result", "stats": {"input_tokens": "many", "models": [1], "tool_calls": -5}}',
        '{"type": "result", "stats": {"input_tokens": 1e400, "models": {"m": null}}}',
        '{"type": "error", "message": null, "severity": []}',
        '{"type": "message", "role": "assistant", "content": {"nested": true}}',
        "{" * 100_000,
        json.dumps({"type": "message", "role": "assistant", "content": "x" * (9 << 20)}),
        "x" * (20 << 20),
    ]
    for line in lines:
        for event in coder.parse(line):
            assert isinstance(event, Event)
    for line in lines[1:11]:
        assert [e.kind for e in coder.parse(line)] == [Kind.RAW]
        assert coder.parse(line)[0].text == line
    (big,) = coder.parse(lines[-2])
    assert big.kind == Kind.TEXT and len(big.text) == 9 << 20


def test_verdicts() -> None:
    coder = GeminiCoder(CoderSettings())
    ok = Tally(result_seen=True)
    failed = Tally(result_seen=True, result_error=True)
    limited = Tally(result_seen=True, result_error=True, rate_status="rejected")
    assert coder.verdict(0, ok) == Verdict.SUCCESS
    assert coder.verdict(0, Tally(result_seen=True, rate_status="rejected")) == Verdict.SUCCESS
    assert coder.verdict(1, failed) == Verdict.FAILURE
    assert coder.verdict(0, failed) == Verdict.FAILURE
    assert coder.verdict(173, limited) == Verdict.RATE_LIMITED
    assert coder.verdict(1, limited) == Verdict.RATE_LIMITED
    assert coder.verdict(0, Tally()) == Verdict.KILLED
    assert coder.verdict(-signal.SIGTERM, Tally()) == Verdict.KILLED
    assert coder.verdict(41, Tally()) == Verdict.FAILURE  # bad auth
    assert coder.verdict(42, Tally()) == Verdict.FAILURE  # bad input


def test_argv_environ_and_the_task_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = user_home(tmp_path / "user")
    (home / ".gemini" / "oauth_creds.json").write_text("{}")
    (home / ".gemini" / "tmp").mkdir()  # the user's own sessions stay theirs
    (home / ".gemini" / "projects.json.1234.tmp").write_text("{}")
    (home / ".env").write_text("X=1\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "fleet"))
    task_dir = tmp_path / "fleet" / "tasks" / "fl-abc123"
    task_dir.mkdir(parents=True)
    (task_dir / "tmp").mkdir()
    (task_dir / "tmp" / "gemini-shell-left-behind").mkdir()
    settings = CoderSettings(
        binary="/opt/gemini",
        args=("--debug",),
        env={"GEMINI_API_KEY": API_KEY, "TMPDIR": "/elsewhere"},
        models={"pro": MODEL},
    )
    coder = GeminiCoder(settings)
    run = spec(task_dir, model="pro")
    assert coder.prompt_on_stdin  # the runner gives it prompt.md as standard input
    assert coder.argv(run) == [
        "/opt/gemini",
        "--output-format",
        "stream-json",
        "--approval-mode",
        "yolo",
        "--model",
        MODEL,
        "--debug",
    ]
    env = coder.environ(run)
    assert env == {
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "TMPDIR": "/elsewhere",  # the user's table wins
        "GEMINI_API_KEY": API_KEY,
        "GEMINI_CLI_HOME": str(task_dir / "gemini"),
    }
    assert "IS_SANDBOX" not in env
    coder.prepare(run)
    coder.prepare(run)  # again, as the next attempt does
    dot = task_dir / "gemini" / ".gemini"
    assert os.readlink(dot / "oauth_creds.json") == str(home / ".gemini" / "oauth_creds.json")
    assert os.readlink(dot / "GEMINI.md") == str(home / ".gemini" / "GEMINI.md")
    assert os.readlink(task_dir / "gemini" / ".env") == str(home / ".env")
    assert sorted(os.listdir(dot)) == ["GEMINI.md", "oauth_creds.json", "settings.json"]
    assert os.listdir(task_dir / "tmp") == []  # emptied for the attempt
    written = json.loads((dot / "settings.json").read_text())
    assert written["privacy"] == {"usageStatisticsEnabled": False}  # the user's own
    assert written["general"] == {"maxAttempts": 1, "enableAutoUpdate": False}
    assert written["mcp"] == {"allowed": ["mine", "fleet"]}
    assert written["security"]["auth"] == {"selectedType": "gemini-api-key"}
    assert "FLEET_TASK_ID" in written["security"]["environmentVariableRedaction"]["allowed"]
    assert written["mcpServers"] == {
        "fleet": {
            "command": os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "fleet-ask"),
            "args": [],
            "env": {"FLEET_TASK_ID": "fl-abc123", "FLEET_HOME": str(tmp_path / "fleet")},
            "timeout": MCP_TIMEOUT_MS,
            "trust": True,
        }
    }
    assert "required" not in written["mcpServers"]["fleet"]
    # A user who chose their auth keeps it; a link that went stale goes.
    (home / ".gemini" / "settings.json").write_text(
        '{"security": {"auth": {"selectedType": "oauth-personal"}}}'
    )
    (home / ".gemini" / "oauth_creds.json").unlink()
    coder.prepare(run)
    written = json.loads((dot / "settings.json").read_text())
    assert written["security"]["auth"] == {"selectedType": "oauth-personal"}
    assert not os.path.lexists(dot / "oauth_creds.json")


def test_no_prompt_is_on_the_command_line(tmp_path: Path) -> None:
    run = spec(tmp_path / "task", prompt="x" * 200_000)
    argv = GeminiCoder(CoderSettings()).argv(run._replace(resume="a-session"))
    assert all(len(a) < 1000 for a in argv) and "--include-directories" not in argv
    assert not any(a.startswith(("--prompt", "-p")) for a in argv)


def test_the_installed_cli_is_the_tested_version() -> None:
    out = subprocess.run(
        [str(CLI), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() in GeminiCoder.tested_versions


# ---------------------------------------------------------------------- 2. by hand


@pytest.fixture
def gemini(fleet: Fleet, tmp_path: Path) -> Iterator[tuple[str, Log]]:
    """The scripted server, and fleet configured to run the real CLI against it."""
    user_home(tmp_path / "user")  # the HOME conftest gives this test
    with serve_gemini(retry_seconds=60) as (url, log):
        fleet.ok(
            "config", "set", f"coders.gemini.binary={CLI}", f"coders.gemini.env={gemini_env(url)}"
        )
        yield url, log


def test_by_hand_the_cli_writes_the_file_closes_the_task_and_survives_garbage(
    fleet: Fleet, project: Path, home: Path, tmp_path: Path, gemini: tuple[str, Log]
) -> None:
    url, log = gemini
    wrapper = tmp_path / "noisy-gemini"
    wrapper.write_text(f"#!/bin/sh\necho '{GARBAGE}'\nexec {CLI} \"$@\"\n")
    wrapper.chmod(0o755)
    fleet.ok("config", "set", f"coders.gemini.binary={wrapper}")
    tid = fleet.add(
        "write the file", "--coder", "gemini", "--model", MODEL, "-d", "FLEET-SCENARIO=shell"
    )
    result = run(tid, project)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = events_of(result.stdout)
    assert seen[0] == {"event": "raw", "text": GARBAGE}
    assert [e["event"] for e in seen[1:]] == [
        "session",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ]
    assert seen[2]["text"] == server.WRITE_COMMAND and seen[2]["tool"] == "run_shell_command"
    assert seen[4]["text"] == server.CLOSE_COMMAND and seen[5]["text"] == tid
    assert (project / server.OUT_FILE).read_text() == "written by the scripted gemini\n"
    shown = show(fleet, tid)
    assert (shown["status"], shown["reason"]) == ("done", "done")
    (attempt,) = shown["attempt_log"]
    session = seen[1]["session"]
    SESSIONS.append(session)
    assert (attempt["outcome"], attempt["exit_status"], attempt["session_id"]) == (
        "success",
        0,
        session,
    )
    # three calls: 1200, 1300 and 1400 prompt tokens, 30 out and 7 of thoughts each (billed as
    # output, and counted so: the CLI's output_tokens leaves them out)
    assert (attempt["tokens_in"], attempt["tokens_out"]) == (
        3900,
        3 * (server.OUTPUT + server.THOUGHTS),
    )
    assert attempt["tokens_cache_read"] == 3 * server.CACHED
    bodies = requests(log)
    assert len(bodies) == 3 and f"/models/{MODEL}:" in log.requests[0][1]
    assert MEMORY in json.dumps(bodies[0])  # the user's GEMINI.md reached the model
    # The session lives in the task's home, and nowhere in the user's.
    task_home = home / "tasks" / tid / "gemini"
    assert sessions_under(task_home / ".gemini" / "tmp", session)
    assert sessions_under(tmp_path / "user", session) == []
    assert untouched(tmp_path / "user")
    # ... and it resumes from there.
    coder = GeminiCoder(
        CoderSettings(env={"GEMINI_API_KEY": API_KEY, "GOOGLE_GEMINI_BASE_URL": url})
    )
    resumed = subprocess.run(
        [
            str(CLI),
            "--resume",
            session,
            "--prompt=and once more",
            "--output-format",
            "stream-json",
            "--approval-mode",
            "yolo",
            "--model",
            MODEL,
        ],
        cwd=project,
        env={**os.environ, **coder.environ(spec(home / "tasks" / tid))},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = events_of(resumed.stdout)
    assert lines[0]["type"] == "init" and lines[0]["session_id"] == session
    assert server.WRITE_COMMAND in json.dumps(requests(log)[-1])  # the history came along


def test_by_hand_the_prompt_is_never_on_a_command_line(
    fleet: Fleet, project: Path, home: Path, tmp_path: Path, gemini: tuple[str, Log]
) -> None:
    """Issue 11, item 2: any local user reads /proc/PID/cmdline; the prompt goes by stdin."""
    _, log = gemini
    secret = f"private-{os.getpid()}-{time.time_ns()}"
    tid = fleet.add(
        "hang", "--coder", "gemini", "--model", MODEL, "-d", f"FLEET-SCENARIO=hang {secret}"
    )
    with running(tid, project, tmp_path / "out") as agent:
        lines = command_lines_once(agent.pid, f"sleep {server.HANG_SECONDS}")
        (home / "tasks" / tid / ".kill").touch()
        assert agent.wait(timeout=60) == 3
    assert len(lines) >= 3  # the runner, the CLI, the tool's shell (and fleet-ask)
    assert [line for line in lines.values() if secret.encode() in line] == []
    assert any(secret in json.dumps(body) for body in log.bodies(":streamGenerateContent"))


def test_by_hand_the_model_asks_a_person_and_closes_the_task_with_the_answer(
    fleet: Fleet, project: Path, tmp_path: Path, gemini: tuple[str, Log]
) -> None:
    _, log = gemini
    tid = fleet.add("ask", "--coder", "gemini", "--model", MODEL, "-d", "FLEET-SCENARIO=ask")
    out = tmp_path / "events.jsonl"
    with running(tid, project, out) as agent:
        question = asked_in_background(tid, agent, out, DEADLINE)
        assert (question["task"], question["status"], question["kind"]) == (
            tid,
            "pending",
            "choice",
        )
        assert question["text"] == server.ASK_ARGS["question"]
        assert question["options"] == server.ASK_ARGS["options"]
        assert question["multi_select"] is True
        assert show(fleet, tid)["question"] == question["id"] and agent.poll() is None
        # A person picks two options, one by its number and one by its text.
        answer = run_fleet("answer", tid, "-c", "1", "-c", "LINT", "--by", "tester", "--json")
        assert answer.code == 0, answer.err
        assert json.loads(answer.out)["choices"] == ["unit tests", "lint"]
        assert agent.wait(timeout=DEADLINE) == 0, out.with_suffix(".err").read_text()
    received = "The person (tester) chose: unit tests, lint"
    # The model saw the answer as the function's response, and closed the task with it.
    bodies = requests(log)
    assert "mcp_fleet_ask_human" in server.declared(bodies[0])
    # The CLI marks what an MCP tool returns as untrusted.
    seen_by_model = f"<untrusted_context>\n{received}\n</untrusted_context>"
    answered = [b for b in bodies if server.tool_results(b) == 1]
    assert answered and all(server.last_response(b) == seen_by_model for b in answered)
    shown = show(fleet, tid)
    assert (shown["status"], shown["reason"], shown["question"]) == (
        "done",
        f"answer: {seen_by_model}",
        None,
    )
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
    seen = events_of(out.read_text())
    calls = [(e["tool"], e["text"]) for e in seen if e["event"] == "tool_call"]
    assert [tool for tool, _ in calls] == ["mcp_fleet_ask_human", "run_shell_command"]
    assert calls[1][1] == " ".join(server.close_command(seen_by_model).split())
    (done,) = json.loads(fleet.ok("questions", "--all", "--json", "--task", tid))
    assert (done["status"], done["answered_by"], done["choices"]) == (
        "answered",
        "tester",
        ["unit tests", "lint"],
    )


def test_by_hand_a_huge_context_is_context_pressure(
    fleet: Fleet, project: Path, gemini: tuple[str, Log]
) -> None:
    tid = fleet.add("big", "--coder", "gemini", "--model", MODEL, "-d", "FLEET-SCENARIO=huge")
    result = run(tid, project)
    assert result.returncode == 7, result.stderr[-3000:]
    usage = next(e for e in events_of(result.stdout) if e["event"] == "usage")
    assert usage["context"] == server.HUGE_PROMPT  # over 85 % of gemini's 1,048,576
    SESSIONS.append(next(e["session"] for e in events_of(result.stdout) if e["event"] == "session"))
    shown = show(fleet, tid)
    assert (shown["status"], shown["failures"], shown["noclose"]) == ("ready", 0, 0)
    (attempt,) = shown["attempt_log"]
    assert attempt["outcome"] == "context-pressure"
    assert attempt["tokens_in"] == server.HUGE_PROMPT


def test_by_hand_a_429_holds_back_gemini_only(
    fleet: Fleet, project: Path, gemini: tuple[str, Log]
) -> None:
    from fleet.paths import resolve
    from fleet.store import open_store

    _, log = gemini
    tid = fleet.add("limited", "--coder", "gemini", "--model", MODEL, "-d", "FLEET-SCENARIO=429")
    other = fleet.add("other coder", "--coder", "command", "-d", "true")
    waiting = fleet.add("same coder", "--coder", "gemini", "-d", "FLEET-SCENARIO=shell")
    started = time.time()
    result = run(tid, project)
    ended = time.time()
    assert result.returncode == 6, result.stderr[-3000:]
    assert ended - started < 30  # the CLI's own retries are capped: one request, no backoff
    assert len(requests(log)) == 1
    limit = next(e for e in events_of(result.stdout) if e["event"] == "rate_limit")
    assert limit["rate_status"] == "rejected"
    assert started + 60 <= limit["resets_at"] <= ended + 60  # "Suggested retry after 60s."
    shown = show(fleet, tid)
    assert (shown["status"], shown["failures"]) == ("ready", 0)
    (attempt,) = shown["attempt_log"]
    assert (attempt["outcome"], attempt["exit_status"]) == ("rate-limited", 173)
    store = open_store(resolve())
    try:
        until, _ = store.gates()["coder:gemini"]
        assert until is not None and parse(until) == pytest.approx(limit["resets_at"], abs=0.01)
        claimed = [t.id for t in store.claim(10, "probe", 60, "claude", None)]
    finally:
        store.close()
    assert claimed == [other] and waiting not in claimed


# ---------------------------------------------------------------------- 3. under systemd


@dataclass
class Unit:
    """fleet inside the sandbox, with one FLEET_HOME and project."""

    box: Sandbox
    home: Path
    project: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def add(self, scenario: str) -> str:
        return self(
            "add", scenario, "--coder", "gemini", "--model", MODEL,
            "--cwd", str(self.project), "-d", f"FLEET-SCENARIO={scenario}",
        ).stdout.strip()  # fmt: skip

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def wait(self, task_id: str) -> int:
        code = self("wait", task_id, "--timeout", "90", check=False).returncode
        if code == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return code

    def outcomes(self, task_id: str) -> list[str]:
        return [str(a["outcome"]) for a in self.show(task_id)["attempt_log"]]

    def tool_running(self) -> bool:
        found = self.box.run("pgrep", "-f", f"sleep {server.HANG_SECONDS}", check=False)
        return found.returncode == 0


@pytest.fixture
def unit(systemd: Sandbox, tmp_path: Path) -> Iterator[tuple[Unit, Log]]:
    project = tmp_path / "project"
    project.mkdir()
    user = user_home(tmp_path / "user")
    u = Unit(systemd, tmp_path / "home", project)
    with serve_gemini() as (url, log):
        env = gemini_env(url, HOME=str(user))  # a unit has no HOME: not /root's
        u("config", "set", f"coders.gemini.binary={CLI}", f"coders.gemini.env={env}")
        u("config", "set", "lease_seconds=10", "stop_grace_seconds=2")
        u("setup", "--system")
        yield u, log
        systemd.systemctl(
            "stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False
        )
        systemd.systemctl("reset-failed", check=False)


def test_a_unit_runs_the_cli_to_done(unit: tuple[Unit, Log]) -> None:
    u, log = unit
    tid = u.add("shell")
    assert u.wait(tid) == 0
    shown = u.show(tid)
    assert shown["status"] == "done" and u.outcomes(tid) == ["success"]
    assert (shown["attempt_log"][0]["tokens_in"], shown["attempt_log"][0]["tokens_out"]) == (
        3900,
        3 * (server.OUTPUT + server.THOUGHTS),  # thoughts are output
    )
    SESSIONS.append(str(shown["attempt_log"][0]["session_id"]))
    assert (u.project / server.OUT_FILE).exists() and len(requests(log)) == 3
    assert untouched(u.project.parent / "user")
    lines = u.box.run("journalctl", "-u", f"fleet-task@{tid}", "-o", "cat").stdout
    assert f"→ run_shell_command: {server.WRITE_COMMAND}" in lines
    assert "attempt 1 ended: success" in lines


def test_fleet_kill_ends_the_cli_and_its_tool(unit: tuple[Unit, Log]) -> None:
    u, _ = unit
    tid = u.add("hang")
    u.box.wait_for(u.tool_running, timeout=60, what="the shell tool running")
    u("kill", tid)
    assert not u.tool_running()
    assert u.wait(tid) == 1
    assert u.outcomes(tid) == ["killed"]
    assert u.show(tid)["status"] == "blocked"


def test_a_429_holds_gemini_back_then_the_task_runs_again(unit: tuple[Unit, Log]) -> None:
    u, log = unit
    tid = u.add("429-once")
    assert u.wait(tid) == 0
    assert u.outcomes(tid) == ["rate-limited", "success"]
    shown = u.show(tid)
    assert shown["status"] == "done" and shown["failures"] == 0
    first, second = shown["attempt_log"]
    assert first["exit_status"] == 173
    (limit,) = u.box.journal("-u", f"fleet-task@{tid}", "FLEET_EVENT=rate_limit")
    resets = float(limit["FLEET_RESETS_AT"])
    assert resets == pytest.approx(parse(first["ended_at"]) + server.RETRY_SECONDS, abs=2)
    assert parse(second["started_at"]) >= resets  # not before the reset the 429 asked for
    assert len(requests(log)) == 4  # the 429, then the three calls of the shell turn
    SESSIONS.append(str(second["session_id"]))


def test_a_unit_runs_the_cli_to_done_under_the_standard_sandbox(unit: tuple[Unit, Log]) -> None:
    u, _ = unit
    u("config", "set", "coders.gemini.sandbox=standard")
    tid = u.add("shell")
    assert u.wait(tid) == 0
    assert u.show(tid)["status"] == "done" and u.outcomes(tid) == ["success"]
    assert (u.project / server.OUT_FILE).exists()
    (started,) = u.box.journal("-u", f"fleet-task@{tid}", f"MESSAGE_ID={MSG_STARTED}")
    assert started["FLEET_SANDBOX"] == "standard"
    lines = u.box.run("journalctl", "-u", f"fleet-task@{tid}", "-o", "cat").stdout
    assert f"→ run_shell_command: {server.WRITE_COMMAND}" in lines
