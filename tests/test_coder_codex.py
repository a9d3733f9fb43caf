"""The codex coder: its parser over recorded codex streams, then the real codex CLI against the
scripted OpenAI Responses server, by hand (`fleet-run ID`) and dispatched by a sandboxed systemd.

The real CLI is the pinned one in tests/clis (`npm ci --prefix tests/clis`); it talks to the
server through a custom model provider in a per-test `$CODEX_HOME/config.toml`, the way a user
configures codex, and fleet is told where the binary and that home are through `fleet config`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet import asktools, coders
from fleet.coders.base import CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.coders.codex import LAST_MESSAGE, CodexCoder, overrides, try_again_at
from fleet.config import load
from fleet.events import MSG_STARTED
from fleet.paths import resolve
from fleet.store import open_store
from fleet.timeutil import parse as parse_time
from tests import sandbox
from tests.conftest import (
    ROOT,
    Fleet,
    asked_in_background,
    command_lines_once,
    fleet_exe,
    run_fleet,
)
from tests.conftest import events_of as events
from tests.conftest import fleet_run as run
from tests.conftest import run_in_background as running
from tests.conftest import show_task as show
from tests.sandbox import Sandbox
from tests.servers import openai_responses
from tests.servers.base import Log
from tests.servers.openai_responses import CONTEXT_TOKENS, USAGE, State, responses, scripted

systemd = sandbox.systemd
CODEX = ROOT / "tests" / "clis" / "node_modules" / ".bin" / "codex"
STREAMS = ROOT / "tests" / "fixtures" / "streams"
BIN = os.path.dirname(fleet_exe())
KEY_VAR = "FLEET_TEST_RESPONSES_KEY"
DEADLINE = 60.0


# ---------------------------------------------------------------------- helpers


def replay(name: str, coder: CodexCoder | None = None) -> tuple[list[Event], Tally, CodexCoder]:
    """Every line of a recorded stream through one coder, as the runner feeds it."""
    coder = coder or CodexCoder(CoderSettings())
    tally = Tally()
    events: list[Event] = []
    for line in (STREAMS / name).read_text().splitlines():
        for event in coder.parse(line):
            tally.add(event)
            events.append(event)
    return events, tally, coder


def of(events: list[Event], kind: Kind) -> list[Event]:
    return [e for e in events if e.kind == kind]


def spec(tmp_path: Path, prompt: str = "do the thing", model: str | None = None) -> RunSpec:
    task_dir = tmp_path / "task"
    (task_dir / "artifacts").mkdir(parents=True, exist_ok=True)
    return RunSpec(
        "fl-abc123",
        1,
        "title",
        "description",
        str(tmp_path),
        model,
        task_dir,
        task_dir / "artifacts",
        prompt,
        task_dir / "prompt.md",
    )


def config_overrides(argv: list[str]) -> dict[str, Any]:
    """The `-c key=value` pairs of an argv, each value parsed as TOML (as codex must)."""
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]
    found = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        found[key] = tomllib.loads(f"v = {value}")["v"]
    return found


def provider_toml(url: str, name: str = "scripted") -> str:
    return (
        f'model_provider = "{name}"\n'
        f"[model_providers.{name}]\n"
        'name = "Scripted Responses API"\n'
        f'base_url = "{url}"\n'
        f'env_key = "{KEY_VAR}"\n'
        'wire_api = "responses"\n'
    )


def tree(path: Path) -> set[str] | None:
    return {str(p.relative_to(path)) for p in path.rglob("*")} if path.exists() else None


@pytest.fixture(scope="module", autouse=True)
def real_codex_home_untouched() -> Iterator[None]:
    """No test of this module may write into the real user's ~/.codex."""
    real = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".codex"
    before = tree(real)
    yield
    after = tree(real)
    assert after is None or (before is not None and after <= before), sorted(
        (after or set()) - (before or set())
    )


# ---------------------------------------------------------------------- the recorded streams


def test_the_installed_cli_is_the_tested_version(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "CODEX_HOME": str(tmp_path / ".codex")}
    out = subprocess.run(
        [str(CODEX), "--version"], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    assert out.stdout.strip() in CodexCoder.tested_versions
    assert coders.find("codex") is CodexCoder


def test_a_shell_turn() -> None:
    events, tally, coder = replay("codex_shell.jsonl")
    assert [e.kind for e in events] == [
        Kind.SESSION,
        Kind.ERROR,  # codex's own non-fatal note: no metadata for the model
        Kind.TOOL_CALL,
        Kind.TOOL_RESULT,
        Kind.TEXT,
        Kind.USAGE,
        Kind.RESULT,
    ]
    assert tally.session == "01a22c0d-8856-7cd3-a23c-2a8cd48a45ca"
    call, result = events[2], events[3]
    assert (call.tool, call.text) == ("exec_command", "echo hi > fleet_out.txt && ls")
    assert (result.tool, result.text, result.is_error) == ("exec_command", "fleet_out.txt", False)
    assert events[4].text.startswith("Done. All good.")
    # Two model calls of 1200 in / 30 out each; codex reports no cost.
    assert (tally.tokens_in, tally.tokens_out, tally.cost) == (2400, 60, None)
    assert tally.result_seen and not tally.result_error and tally.turns == 1
    assert coder.verdict(0, tally) == Verdict.SUCCESS


def test_an_mcp_call() -> None:
    events, tally, coder = replay("codex_mcp.jsonl")
    (call,) = of(events, Kind.TOOL_CALL)
    (result,) = of(events, Kind.TOOL_RESULT)
    assert call.tool == result.tool == "mcp__askhuman__ask_human_question"
    assert json.loads(call.text) == {"question": "May I proceed?"}
    assert result.text.startswith("HUMAN_ANSWER: yes") and not result.is_error
    assert (tally.tokens_in, tally.tokens_out) == (2400, 60)
    assert coder.verdict(0, tally) == Verdict.SUCCESS


def test_a_resumed_thread_reports_the_thread_total() -> None:
    # codex's usage is cumulative over the thread: fleet starts a new thread every attempt, so
    # for fleet it is the attempt's total; a resume (3 calls by now) would include the first run.
    _, tally, coder = replay("codex_resume.jsonl")
    assert tally.session == "01a22c0d-8856-7cd3-a23c-2a8cd48a45ca"
    assert (tally.tokens_in, tally.tokens_out) == (3600, 90)
    assert coder.verdict(0, tally) == Verdict.SUCCESS


def test_429_after_retries_is_a_rejected_rate_limit() -> None:
    events, tally, coder = replay("codex_429.jsonl")
    assert len(of(events, Kind.RETRY)) == 5  # "Reconnecting... n/5 (… 429 …)"
    *retried, limit = of(events, Kind.RATE_LIMIT)
    assert [e.rate_status for e in retried] == ["allowed_warning"] * 5  # pressure, no gate
    assert limit.rate_status == "rejected" and limit.resets_at is None  # no reset time given
    assert "429" in limit.text
    assert tally.result_seen and tally.result_error
    assert tally.last_error == "exceeded retry limit, last status: 429 Too Many Requests"
    assert coder.verdict(1, tally) == Verdict.RATE_LIMITED


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("codex_http500.jsonl", "We\u2019re currently experiencing high demand"),
        ("codex_http401.jsonl", "unexpected status 401 Unauthorized"),
    ],
)
def test_server_and_auth_errors_are_failures(name: str, message: str) -> None:
    events, tally, coder = replay(name)
    assert len(of(events, Kind.RETRY)) == 5
    assert not of(events, Kind.RATE_LIMIT)
    assert tally.last_error is not None and tally.last_error.startswith(message)
    assert of(events, Kind.RESULT)[-1].is_error
    assert coder.verdict(1, tally) == Verdict.FAILURE


def test_signals_during_a_tool() -> None:
    # SIGINT: codex kills its tool and exits 1 without a terminal event. Alone that is a
    # failure; when fleet sent the signal, the runner itself records the kill.
    events, tally, coder = replay("codex_sigint_during_tool.jsonl")
    assert [e.text for e in of(events, Kind.TOOL_CALL)] == ["sleep 300 && echo slept > slept.txt"]
    assert not tally.result_seen
    assert coder.verdict(1, tally) == Verdict.FAILURE
    assert coder.verdict(-signal.SIGINT, tally) == Verdict.KILLED
    # SIGTERM: killed by the signal, no terminal event.
    _, tally, coder = replay("codex_sigterm_native_binary_killed_by_signal.jsonl")
    assert coder.verdict(-signal.SIGTERM, tally) == Verdict.KILLED
    assert coder.verdict(143, tally) == Verdict.FAILURE


def test_the_usage_limit_message_gives_the_reset_minute() -> None:
    now = time.mktime((2026, 11, 30, 13, 36, 10, 0, 0, -1))
    at = try_again_at("… purchase more credits or try again at 1:37 PM.", now)
    assert at == time.mktime((2026, 11, 30, 13, 38, 0, 0, 0, -1))  # the end of that minute
    at = try_again_at("try again at Dec 3rd, 2026 4:05 PM.", now)
    assert at == time.mktime((2026, 12, 3, 16, 6, 0, 0, 0, -1))
    late = time.mktime((2026, 11, 30, 23, 59, 0, 0, 0, -1))
    assert try_again_at("try again at 12:10 AM", late) == time.mktime(
        (2026, 12, 1, 0, 11, 0, 0, 0, -1)
    )
    assert try_again_at("no time here", now) is None
    coder = CodexCoder(CoderSettings())
    line = json.dumps(
        {"type": "error", "message": "You\u2019ve hit your usage limit. Try again at 9:05 AM."}
    )
    (error, limit) = coder.parse(line)
    assert error.kind == Kind.ERROR
    assert limit.kind == Kind.RATE_LIMIT and limit.rate_status == "rejected"
    assert limit.resets_at is not None and limit.resets_at % 60 == 0
    failed = json.dumps({"type": "turn.failed", "error": {"message": error.text}})
    assert [e.kind for e in coder.parse(failed)] == [Kind.RESULT]  # said once


def write_rollout(home: Path, thread: str, lines: list[str]) -> Path:
    day = home / "sessions" / time.strftime("%Y/%m/%d")
    day.mkdir(parents=True, exist_ok=True)
    path = day / f"rollout-2026-11-30T10-45-33-{thread}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_usage_context_and_windows_come_from_the_session_file(tmp_path: Path) -> None:
    thread = "01a22c0f-594d-7f31-977d-73a5274d84b9"
    recorded = (STREAMS / "codex_rollout_session_file_with_rate_limits.jsonl").read_text()
    lines = recorded.splitlines()
    home = tmp_path / "codex-home"
    first_call = next(i for i, line in enumerate(lines) if '"token_usage_record"' in line)
    path = write_rollout(home, thread, lines[: first_call + 1])
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(home)}))
    coder.prepare(spec(tmp_path))
    assert coder.parse(json.dumps({"type": "thread.started", "thread_id": thread}))[0].session
    events = list(coder.parse('{"type":"turn.started"}'))
    (call,) = events[0].calls
    assert [e._replace(calls=()) for e in events] == [
        Event(Kind.USAGE, tokens_in=1200, tokens_out=30, context=1230)
    ]
    # The call's own tokens, disjoint: 1200 input of which 500 were read from the cache.
    assert (call.model, call.input, call.cache_read, call.cache_write, call.output) == (
        "gpt-fake",
        700,
        500,
        0,
        30,
    )
    # The rest, with half a line at the end (codex still writing it) and some junk.
    rest = "".join(line + "\n" for line in lines[first_call + 1 :])
    with path.open("a") as f:
        f.write('{"type": "event_msg", "payload": {"type": "token_count"\n')  # broken
        f.write('{"type":"event_msg","payload":{"type":"token_count","rate_limits":[]}}\n')
        f.write(rest[:-40])
    events = list(coder.parse('{"type":"item.started","item":{"type":"reasoning"}}'))
    limits = of(events, Kind.RATE_LIMIT)
    assert [(e.limit_type, e.rate_status, e.utilization, e.resets_at) for e in limits] == [
        ("seven_day", "allowed", 0.4, 1796121932.0),
        ("five_hour", "allowed_warning", 0.915, 1796039132.0),
    ]
    assert of(events, Kind.USAGE)[-1]._replace(calls=()) == Event(
        Kind.USAGE, tokens_in=2400, tokens_out=60, context=1230
    )
    assert events[-1].kind == Kind.RAW  # the line itself: a reasoning item
    with path.open("a") as f:
        f.write(rest[-40:])
    done = '{"type":"turn.completed","usage":{"input_tokens":2400,"output_tokens":60}}'
    events = list(coder.parse(done))
    assert not of(events, Kind.RATE_LIMIT)  # the same windows are not repeated
    assert [e.kind for e in events] == [Kind.USAGE, Kind.RESULT]
    assert events[0].context == 1230 and events[1].tokens_in == 2400


def test_a_full_window_in_the_session_file_is_a_refusal(tmp_path: Path) -> None:
    thread = "01a22cac-7471-7482-9ed9-712ce08a6ab2"
    home = tmp_path / "codex-home"
    reset = time.time() + 3
    limits = {
        "primary": {"used_percent": 100.0, "window_minutes": 300, "resets_at": reset},
        "secondary": {"used_percent": 10.0, "window_minutes": 10080, "resets_at": reset + 9},
    }
    write_rollout(
        home,
        thread,
        [
            json.dumps(
                {"type": "event_msg", "payload": {"type": "token_count", "rate_limits": limits}}
            )
        ],
    )
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(home)}))
    coder.prepare(spec(tmp_path))
    tally = Tally()
    for line in [
        json.dumps({"type": "thread.started", "thread_id": thread}),
        json.dumps(
            {"type": "error", "message": "You\u2019ve hit your usage limit. Try again at 1:37 PM."}
        ),
        json.dumps(
            {"type": "turn.failed", "error": {"message": "You\u2019ve hit your usage limit."}}
        ),
    ]:
        for event in coder.parse(line):
            tally.add(event)
            if event.kind == Kind.RATE_LIMIT:
                last = event
    # The exact reset from the file wins over the message's minute; the refusal comes last.
    assert (last.rate_status, last.resets_at, last.limit_type) == ("rejected", reset, "five_hour")
    assert tally.rate_status == "rejected" and tally.resets_at == reset
    assert coder.verdict(1, tally) == Verdict.RATE_LIMITED


ODD: list[object] = [
    None,
    True,
    0,
    -7,
    10**400,
    1e308,
    float("inf"),
    float("nan"),
    "",
    "x",
    [],
    {},
    [1, None],
    {"k": None},
]


def mutations(obj: object) -> Iterator[object]:
    """obj with one value at a time replaced by each odd value, or removed."""
    if isinstance(obj, dict):
        for key in obj:
            for odd in [*ODD, *mutations(obj[key])]:
                changed = copy.copy(obj)
                changed[key] = odd
                yield changed
            yield {k: v for k, v in obj.items() if k != key}
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            for odd in [*ODD, *mutations(value)]:
                yield [*obj[:i], odd, *obj[i + 1 :]]


def test_any_line_at_all_is_survived(tmp_path: Path) -> None:
    coder = CodexCoder(CoderSettings())
    tally = Tally()
    garbage = [
        "",
        "not json at all {",
        "\x00\x01\udcff binary",
        "null",
        "[]",
        "42",
        '"a string"',
        "{}",
        '{"type": 5}',
        '{"type": "something.new", "x": 1}',
        '{"type": "item.completed", "item": "not an object"}',
        '{"type": "item.completed"}',
        '{"type": "thread.started"}',
        '{"type": "turn.completed", "usage": [1, 2]}',
        '{"type": "turn.failed", "error": "flat"}',
        '{"type": "error", "message": null}',
        "{" * 100_000,
        "x" * (9 << 20),
    ]
    for line in garbage:
        events = coder.parse(line)
        assert all(isinstance(e, Event) for e in events)
        for event in events:
            tally.add(event)
    assert coder.parse("not json at all {") == (Event(Kind.RAW, "not json at all {"),)
    assert coder.parse('{"type": "something.new", "x": 1}')[0].kind == Kind.RAW
    seen = 0
    for path in sorted(STREAMS.glob("codex_*.jsonl")):
        if "rollout" in path.name:
            continue
        for line in path.read_text().splitlines():
            for variant in mutations(json.loads(line)):
                for event in coder.parse(json.dumps(variant)):
                    tally.add(event)
                seen += 1
    assert seen > 1000
    # And the session file's lines that parse() reads along the way.
    rollout = (STREAMS / "codex_rollout_session_file_with_rate_limits.jsonl").read_text()
    for line in rollout.splitlines():
        if '"token_' in line:
            for variant in mutations(json.loads(line)):
                if isinstance(variant, dict):
                    for event in coder.rollout_line(variant):
                        tally.add(event)
    coder.verdict(1, tally)  # and the verdict still comes


# ---------------------------------------------------------------------- the command


def test_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "codex-home"
    settings = CoderSettings(
        binary="/opt/codex",
        args=("--color", "never"),
        env={"CODEX_HOME": str(home)},
        models={"fast": "gpt-5-mini"},
    )
    coder = CodexCoder(settings)
    run = spec(tmp_path, model="fast")
    argv = coder.argv(run)
    assert argv[:2] == ["/opt/codex", "exec"]
    for flag in ("--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"):
        assert flag in argv
    assert argv[argv.index("-C") + 1] == str(tmp_path)
    assert argv[argv.index("-m") + 1] == "gpt-5-mini"  # the alias, resolved
    assert argv[argv.index("-o") + 1] == str(run.task_dir / LAST_MESSAGE)
    assert argv[-4:] == ["--color", "never", "--", "-"]  # the prompt: standard input
    assert coder.prompt_on_stdin and "do the thing" not in " ".join(argv)
    assert "-m" not in coder.argv(spec(tmp_path))
    found = config_overrides(argv)
    entry = found["mcp_servers.fleet"]
    ask = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "fleet-ask")
    assert entry["command"] == ask
    assert entry["env"] == {"FLEET_TASK_ID": "fl-abc123", "FLEET_HOME": os.environ["FLEET_HOME"]}
    assert entry["tool_timeout_sec"] >= 8 * 3600  # a person may take hours
    assert "required" not in entry
    assert found["mcp_optional_startup_grace_ms"] > 0
    assert found["allow_login_shell"] is False
    assert not any(k.startswith("model_providers.") for k in found)  # built-in openai: hands off
    monkeypatch.delenv("FLEET_HOME")
    assert config_overrides(coder.argv(run))["mcp_servers.fleet"]["env"] == {
        "FLEET_TASK_ID": "fl-abc123"
    }
    assert coder.stop_signal == signal.SIGINT
    assert coder.default_context == 272_000
    assert coder.environ(run) == {"CODEX_HOME": str(home)}  # nothing more, root or not


@pytest.mark.parametrize(
    ("config", "args", "capped"),
    [
        (None, (), None),  # codex's default: the built-in openai provider, which may not change
        ('model_provider = "mine"\n[model_providers.mine]\nname = "m"\n', (), "mine"),
        ('model_provider = "ollama"\n', (), None),
        ('model_provider = "nowhere"\n', (), None),  # undefined: codex fails by itself
        (None, ("-c", 'model_provider="mine"', "-c", 'model_providers.mine={name="m"}'), "mine"),
        (None, ("--config=model_provider=mine", "-cmodel_providers.mine.name=m"), "mine"),
        ('[model_providers.mine]\nname = "m"\n', ("-c", "model_provider=mine", "--oss"), None),
        ('[model_providers.mine]\nname = "m"\n', ("-p", "work"), "mine"),
    ],
)
def test_the_retry_budget_is_capped_only_for_a_users_provider(
    tmp_path: Path, config: str | None, args: tuple[str, ...], capped: str | None
) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    if config is not None:
        (home / "config.toml").write_text(config)
    (home / "work.config.toml").write_text('model_provider = "mine"\n')
    coder = CodexCoder(CoderSettings(args=args, env={"CODEX_HOME": str(home)}))
    argv = coder.argv(spec(tmp_path))
    found = config_overrides(argv[: argv.index("-o")])  # fleet's own, before the user's args
    caps = {k: v for k, v in found.items() if k.startswith("model_providers.")}
    assert caps == ({f"model_providers.{capped}.stream_max_retries": 0} if capped else {})


def test_overrides_are_read_as_codex_reads_them() -> None:
    assert overrides(["-c", "a=1", "--config", 'b="x"', "-cc=raw words", "--config=d=[1]"]) == {
        "a": 1,
        "b": "x",
        "c": "raw words",
        "d": [1],
    }


def test_a_resumed_prompt_is_stdin_too_and_a_stale_last_message_goes(tmp_path: Path) -> None:
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(tmp_path / "h")}))
    run = spec(tmp_path, prompt="x" * 300_000)
    assert coder.argv(run._replace(resume="t-1"))[-3:] == ["--", "t-1", "-"]
    assert all(len(a) < 1000 for a in coder.argv(run))
    (run.task_dir / LAST_MESSAGE).write_text("from the previous attempt")
    coder.prepare(run)
    assert not (run.task_dir / LAST_MESSAGE).exists()


# ---------------------------------------------------------------------- fleet-run by hand


@dataclass
class Scripted:
    log: Log
    state: State
    codex_home: Path


@pytest.fixture
def codex(fleet: Fleet, tmp_path: Path) -> Iterator[Scripted]:
    """The scripted server, codex configured for it in its own home, fleet told about both."""
    with scripted() as (url, log, state):
        home = tmp_path / "codex-home"
        home.mkdir()
        (home / "config.toml").write_text(provider_toml(url))
        fleet.ok(
            "config",
            "set",
            f"coders.codex.binary={CODEX}",
            f'coders.codex.env={{CODEX_HOME = "{home}", {KEY_VAR} = "sk-test-not-a-key"}}',
        )
        yield Scripted(log, state, home)


def add(fleet: Fleet, scenario: str, *args: str) -> str:
    return fleet.add(
        scenario,
        "--coder",
        "codex",
        "--model",
        "gpt-fake",
        "-d",
        f"FLEET-SCENARIO:{scenario}",
        *args,
    )


def test_codex_writes_a_file_and_closes_its_task(
    fleet: Fleet, project: Path, codex: Scripted, home: Path, tmp_path: Path
) -> None:
    # fleet's programs linked into a directory of their own, so that the fleet-ask next to
    # fleet-run is one that notes how codex started it before it becomes the real one.
    bindir, asked = tmp_path / "bin", tmp_path / "asked"
    bindir.mkdir()
    for name in ("fleet", "fleet-run"):
        (bindir / name).symlink_to(fleet_exe(name))
    (bindir / "fleet-ask").write_text(
        f'#!/bin/sh\necho "$FLEET_TASK_ID $FLEET_HOME $#" >> {asked}\n'
        f'exec {fleet_exe("fleet-ask")} "$@"\n'
    )
    (bindir / "fleet-ask").chmod(0o755)
    tid = add(fleet, "shell")
    result = run(tid, project, bindir / "fleet-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (project / "fleet_out.txt").read_text() == "hello from codex\n"
    task = show(fleet, tid)
    assert (task["status"], task["reason"]) == ("done", "done")
    (attempt,) = task["attempt_log"]
    bodies = responses(codex.log)
    assert len(bodies) == 3  # write, close, answer: no retries
    assert "FLEET-SCENARIO:shell" in json.dumps(bodies[0]["input"])  # the task's prompt
    assert attempt["outcome"] == "success"
    assert (attempt["tokens_in"], attempt["tokens_out"]) == (
        3 * USAGE["input"],
        3 * USAGE["output"],
    )
    seen = events(result.stdout)
    assert attempt["session_id"] == next(e["session"] for e in seen if e["event"] == "session")
    calls = [e["text"] for e in seen if e["event"] == "tool_call"]
    assert calls == [
        "echo hello from codex > fleet_out.txt",
        'fleet close "$FLEET_TASK_ID" --reason done',
    ]
    assert [e["text"] for e in seen if e["event"] == "tool_result"][1] == tid  # fleet was on PATH
    assert any(e["event"] == "usage" and e.get("context") == 1230 for e in seen)
    # codex started fleet-ask as its MCP server, and offered its tools with every request.
    assert asked.read_text() == f"{tid} {home} 0\n"
    for body in bodies:
        # Every tool fleet-ask declares (fleet.asktools), in codex's (sorted) order.
        assert openai_responses.namespaces(body)["mcp__fleet"] == sorted(asktools.TOOLS)
        assert {"ask_human", "task_done", "send_message", "claim"} <= set(asktools.TOOLS)
    assert (home / "tasks" / tid / LAST_MESSAGE).read_text().startswith("Done: wrote")
    # The x-codex-* headers reached fleet's gauges through codex's session file.
    store = open_store(resolve())
    try:
        gauges = {g["window"]: (g["status"], g["utilization"]) for g in store.gauges()}
    finally:
        store.close()
    assert gauges == {"five_hour": ("allowed", 0.42), "seven_day": ("allowed", 0.1)}
    # The session is in codex's own store, where `codex exec resume <id>` finds it.
    assert list(codex.codex_home.glob(f"sessions/*/*/*/rollout-*-{attempt['session_id']}.jsonl"))


def test_codex_asks_a_person_and_finishes_with_task_done(
    fleet: Fleet, project: Path, codex: Scripted, tmp_path: Path
) -> None:
    tid = add(fleet, "ask")
    out = tmp_path / "events.jsonl"
    with running(tid, project, out) as agent:
        question = asked_in_background(tid, agent, out, DEADLINE)
        assert (question["task"], question["status"], question["kind"]) == (
            tid,
            "pending",
            "approval",
        )
        assert question["text"] == openai_responses.ASK_ARGS["question"]
        assert question["options"] == [] and show(fleet, tid)["question"] == question["id"]
        assert len(responses(codex.log)) == 1 and agent.poll() is None
        # A person denies it from another shell, with a comment.
        answer = run_fleet("answer", question["id"], "--deny", "keep it for now", "--by", "tester")
        assert answer.code == 0, answer.err
        assert agent.wait(timeout=DEADLINE) == 0, out.with_suffix(".err").read_text()
    received = "The person (tester) DENIED it.\nTheir comment: keep it for now"
    # The model saw the answer as the tool's output and passed it on to task_done.
    bodies = responses(codex.log)
    assert len(bodies) == 3
    (seen_by_model,) = openai_responses.outputs(bodies[1])
    wall, said = seen_by_model.split("\nOutput:\n", 1)  # codex's frame of an MCP tool's output
    assert wall.startswith("Wall time: ") and said == received
    task = show(fleet, tid)
    assert (task["status"], task["reason"], task["question"]) == (
        "done",
        openai_responses.done_summary(seen_by_model),
        None,
    )
    assert [a["outcome"] for a in task["attempt_log"]] == ["success"]
    seen = events(out.read_text())
    assert [e["tool"] for e in seen if e["event"] == "tool_call"] == [
        "mcp__fleet__ask_human",
        "mcp__fleet__task_done",
    ]
    (done,) = json.loads(fleet.ok("questions", "--all", "--json", "--task", tid))
    assert (done["status"], done["answered_by"], done["approved"], done["comment"]) == (
        "answered",
        "tester",
        False,
        "keep it for now",
    )


def test_a_garbage_line_before_codex_is_survived(
    fleet: Fleet, project: Path, codex: Scripted, tmp_path: Path
) -> None:
    wrapper = tmp_path / "noisy-codex"
    wrapper.write_text(f"#!/bin/sh\nprintf 'not json {{{{\\n'\nexec {CODEX} \"$@\"\n")
    wrapper.chmod(0o755)
    fleet.ok("config", "set", f"coders.codex.binary={wrapper}")
    tid = add(fleet, "shell")
    result = run(tid, project)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = events(result.stdout)
    assert seen[0] == {"event": "raw", "text": "not json {{"}
    assert show(fleet, tid)["status"] == "done"


def test_a_full_context_stops_codex_and_requeues(
    fleet: Fleet, project: Path, codex: Scripted
) -> None:
    tid = add(fleet, "context")
    result = run(tid, project)
    assert result.returncode == 7, result.stderr[-3000:]
    task = show(fleet, tid)
    assert (task["status"], task["failures"], task["noclose"]) == ("ready", 0, 0)
    (attempt,) = task["attempt_log"]
    assert attempt["outcome"] == "context-pressure"
    assert attempt["tokens_in"] == CONTEXT_TOKENS
    # Stopped while its tool ran: the model saw one call, not the answer after it.
    assert len(responses(codex.log)) == 1


@pytest.mark.parametrize("scenario", ["quota-600", "toomany-600"])
def test_a_refusal_gates_codex_only(
    fleet: Fleet, project: Path, codex: Scripted, scenario: str
) -> None:
    tid = add(fleet, scenario)
    other = fleet.add("other coder", "--coder", "command", "-d", "true")
    waiting = add(fleet, "shell")
    started = time.time()
    result = run(tid, project)
    assert result.returncode == 6, result.stderr[-3000:]
    assert time.time() - started < 20  # not five retries of Retry-After 600
    assert len(responses(codex.log)) == 1  # the first 429 ended the turn
    task = show(fleet, tid)
    assert (task["status"], task["failures"]) == ("ready", 0)
    assert task["attempt_log"][0]["outcome"] == "rate-limited"
    store = open_store(resolve())
    try:
        until, why = store.gates()["coder:codex"]
        claimed = [t.id for t in store.claim(10, "test", 60, "claude", None)]
    finally:
        store.close()
    assert until is not None and "codex" in str(why)
    if scenario.startswith("quota"):  # codex recorded the window's exact reset
        assert parse_time(until) == codex.state.resets_at
    else:  # no reset time given: fleet's backoff
        backoff = load(resolve()).get_int("rate_limit_backoff_seconds")
        assert abs(parse_time(until) - (started + backoff)) < 15
    assert claimed == [other] and waiting not in claimed


def command_line(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode("utf-8", "replace")
        )
    except OSError:
        return ""


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below `root` (host view)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = {}
    for pid in parent:
        up = parent[pid]
        while up > 1 and up != root:
            up = parent.get(up, 0)
        if up == root:
            found[pid] = command_line(pid)
    return found


def test_the_prompt_is_never_on_a_command_line(
    fleet: Fleet, project: Path, codex: Scripted, home: Path, tmp_path: Path
) -> None:
    """Issue 11, item 2: any local user reads /proc/PID/cmdline; the prompt goes by stdin."""
    seconds = 800_000 + os.getpid()
    secret = f"private-{os.getpid()}-{time.time_ns()}"
    what = f"FLEET-SCENARIO:hang-{seconds} {secret}"
    tid = fleet.add("hang", "--coder", "codex", "--model", "gpt-fake", "-d", what)
    with running(tid, project, tmp_path / "out") as agent:
        lines = command_lines_once(agent.pid, f"sleep {seconds}")
        (home / "tasks" / tid / ".kill").touch()
        assert agent.wait(timeout=DEADLINE) == 3
    assert len(lines) >= 3  # the runner, node, codex, the tool's shell
    assert [line for line in lines.values() if secret.encode() in line] == []
    assert any(secret in json.dumps(body) for body in codex.log.bodies("/responses"))


def test_stopping_codex_ends_its_tool(
    fleet: Fleet, project: Path, codex: Scripted, home: Path, tmp_path: Path
) -> None:
    seconds = 900_000 + os.getpid()
    tid = add(fleet, f"hang-{seconds}")
    tools: dict[int, str] = {}  # the tool's processes, seen while they were codex's

    def tool_started() -> bool:
        below = descendants(proc.pid).items()
        tools.update({pid: cmd for pid, cmd in below if f"sleep {seconds}" in cmd})
        return any(cmd.startswith("sleep ") for cmd in tools.values())

    def left() -> list[int]:
        return [pid for pid, cmd in tools.items() if command_line(pid) == cmd]

    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(
            [fleet_exe("fleet-run"), tid], cwd=project, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        sandbox.wait_for(tool_started, 30, "the tool")
        # The tool runs in a session of its own, deaf to SIGHUP: a signal to codex's process
        # group misses it, and only codex can end it, which it does on SIGINT (not on SIGTERM).
        (home / "tasks" / tid / ".kill").touch()
        assert proc.wait(timeout=DEADLINE) == 3, (tmp_path / "stderr").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(TimeoutError):
            sandbox.wait_for(lambda: not left(), 2, "the tool to end")
        leftovers = left()
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
    assert leftovers == []
    task = show(fleet, tid)
    assert task["attempt_log"][0]["outcome"] == "killed" and task["status"] == "blocked"


# ---------------------------------------------------------------------- under systemd


@dataclass
class UnitFleet:
    box: Sandbox
    home: Path
    project: Path
    scripted: Scripted

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def add(self, scenario: str) -> str:
        return self(
            "add",
            scenario,
            "--coder",
            "codex",
            "--model",
            "gpt-fake",
            "--cwd",
            str(self.project),
            "-d",
            f"FLEET-SCENARIO:{scenario}",
        ).stdout.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def wait(self, task_id: str, timeout: float = 50) -> int:
        code = self("wait", task_id, "--timeout", str(timeout), check=False).returncode
        if code == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return code

    def pgrep(self, pattern: str) -> str:
        return self.box.run("pgrep", "-a", "-f", pattern, check=False).stdout.strip()


@pytest.fixture
def unit(systemd: Sandbox, tmp_path: Path) -> Iterator[UnitFleet]:
    home, project, user = tmp_path / "home", tmp_path / "project", tmp_path / "user"
    project.mkdir()
    user.mkdir()
    with scripted() as (url, log, state):
        codex_home = user / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(provider_toml(url))
        f = UnitFleet(systemd, home, project, Scripted(log, state, codex_home))
        env = f'{{HOME = "{user}", CODEX_HOME = "{codex_home}", {KEY_VAR} = "sk-test-not-a-key"}}'
        f(
            "config",
            "set",
            "lease_seconds=10",
            "stop_grace_seconds=2",
            f"coders.codex.binary={CODEX}",
            f"coders.codex.env={env}",
        )
        f("setup", "--system")
        yield f
        systemd.systemctl(
            "stop",
            "fleet-claim.path",
            "fleet-claim.timer",
            "fleet-wake-codex.timer",
            "fleet-task@*",
            check=False,
        )
        systemd.systemctl("reset-failed", check=False)


def test_dispatched_codex_closes_its_task(unit: UnitFleet) -> None:
    tid = unit.add("shell")
    assert unit.wait(tid) == 0
    task = unit.show(tid)
    assert task["status"] == "done"
    (attempt,) = task["attempt_log"]
    assert attempt["outcome"] == "success" and attempt["tokens_in"] == 3 * USAGE["input"]
    assert (unit.project / "fleet_out.txt").exists()
    transcript = unit.box.run("journalctl", "-u", f"fleet-task@{tid}", "-o", "cat").stdout
    assert '→ exec_command: fleet close "$FLEET_TASK_ID" --reason done' in transcript


def test_fleet_kill_ends_codex_and_its_tool(unit: UnitFleet) -> None:
    seconds = 800_000 + os.getpid()
    tid = unit.add(f"hang-{seconds}")
    unit.box.wait_for(lambda: bool(unit.pgrep(f"^sleep {seconds}$")), 30, "the tool running")
    unit("kill", tid)
    assert unit.pgrep(f"sleep {seconds}") == ""
    assert unit.pgrep(str(CODEX.resolve().parent.parent)) == ""  # nor codex itself
    assert unit.wait(tid) == 1
    assert [a["outcome"] for a in unit.show(tid)["attempt_log"]] == ["killed"]


def test_a_rate_limited_codex_runs_again_after_the_reset(unit: UnitFleet) -> None:
    tid = unit.add("quota-3")
    assert unit.wait(tid, timeout=90) == 0
    task = unit.show(tid)
    first, second = task["attempt_log"]
    assert (first["outcome"], second["outcome"], task["status"]) == (
        "rate-limited",
        "success",
        "done",
    )
    resets = unit.scripted.state.resets_at
    assert resets is not None and parse_time(second["started_at"]) >= resets  # held back till then
    assert len(responses(unit.scripted.log)) == 1 + 3  # one refusal, then the whole shell scenario


def test_a_suspended_thread_resumes_and_each_attempt_counts_its_own(unit: UnitFleet) -> None:
    tid = unit(
        "add",
        "pause",
        "--coder",
        "codex",
        "--model",
        "gpt-5-codex",
        "--cwd",
        str(unit.project),
        "-d",
        "FLEET-SCENARIO:pause",
    ).stdout.strip()
    unit.box.wait_for(lambda: bool(unit.pgrep(openai_responses.PAUSE_COMMAND)), 30, "the tool")
    unit("suspend", tid, "-s", "suspended in the middle of a tool")
    unit.box.wait_for(
        lambda: unit.show(tid)["claimed_by"] is None, 30, "the suspended attempt to end"
    )
    assert unit.pgrep(openai_responses.PAUSE_COMMAND) == ""
    unit("resume", tid)
    assert unit.wait(tid) == 0
    first, second = unit.show(tid)["attempt_log"]
    assert (first["outcome"], second["outcome"]) == ("suspended", "success")
    assert first["session_id"] == second["session_id"]  # `codex exec resume` of the same thread
    # The stop reached codex as SIGINT alone (fleet-run's; KillMode=mixed keeps systemd's
    # SIGTERM from it): it ended its tool and exited 1, without a terminal event.
    assert first["exit_status"] == 1
    # The resumed run's turn.completed reports the whole thread (three calls by then): each
    # attempt records its own calls, one before the suspension and two after it.
    per_call = (USAGE["input"], USAGE["output"], USAGE["cached"])
    assert (first["tokens_in"], first["tokens_out"], first["tokens_cache_read"]) == per_call
    assert (second["tokens_in"], second["tokens_out"], second["tokens_cache_read"]) == tuple(
        2 * n for n in per_call
    )
    assert len(responses(unit.scripted.log)) == 3
    # Priced as gpt-5 (1.25 input, 0.125 cached, 10 output per million tokens), call by call.
    call = (700 * 1.25 + 500 * 0.125 + 30 * 10) / 1e6
    assert (first["cost"], first["cost_source"]) == (pytest.approx(call), "estimated")
    assert (second["cost"], second["model"]) == (pytest.approx(2 * call), "gpt-5-codex")


def test_dispatched_codex_under_the_standard_sandbox(unit: UnitFleet) -> None:
    unit("config", "set", "coders.codex.sandbox=standard")
    tid = unit.add("shell")
    assert unit.wait(tid) == 0
    assert unit.show(tid)["status"] == "done"
    assert (unit.project / "fleet_out.txt").exists()
    (started,) = unit.box.journal("-u", f"fleet-task@{tid}", f"MESSAGE_ID={MSG_STARTED}")
    assert started["FLEET_SANDBOX"] == "standard"
    transcript = unit.box.run("journalctl", "-u", f"fleet-task@{tid}", "-o", "cat").stdout
    assert '→ exec_command: fleet close "$FLEET_TASK_ID" --reason done' in transcript
