"""The claude coder: its reading of recorded Claude Code streams, and the real CLI at work.

Three layers: the parser and verdict over every recorded `claude_*` stream (plus lines no CLI
should print); `fleet-run ID` by hand with the real CLI from tests/clis against the scripted
Anthropic server of tests/servers/anthropic.py; and the same under a sandboxed systemd, where
dispatch, `fleet kill` and the wake-up after a rate limit's reset are the units' doing. Both
ways, the model also asks a person through fleet-ask's `ask_human` and a test answers it with
`fleet answer`, as a person would.
"""

from __future__ import annotations

import getpass
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet.audit import MSG_CHECKPOINTED, MSG_RESUMED, MSG_SUSPENDED
from fleet.coders.base import CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.coders.claude import MCP_FILE, MCP_TIMEOUT_MS, SETTINGS_FILE, TMP_DIR, ClaudeCoder
from fleet.events import MSG_STARTED
from fleet.timeutil import parse
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
from tests.conftest import show_task as shown
from tests.sandbox import Sandbox, wait_for
from tests.servers import anthropic
from tests.servers.base import Log, serve

systemd = sandbox.systemd
CLAUDE = ROOT / "tests" / "clis" / "node_modules" / ".bin" / "claude"
STREAMS = ROOT / "tests" / "fixtures" / "streams"
BIN = os.path.dirname(fleet_exe())
DEADLINE = 60.0
PER_CALL_IN = sum(anthropic.USAGE.values())  # 1800: uncached + cache writes + cache reads
REPORTED_PER_CALL = 0.006  # the cost of one scripted call by Claude Code 2.1.332's own prices
FLEET_TOOLS = (
    "ask_human",
    "notify_human",
    "task_blocked",
    "task_done",
    "checkpoint",
    "spawn_subtask",
    "handoff",
)
PERSON = f"root@{socket.gethostname()}"  # who runs `fleet` in the sandbox


# ---------------------------------------------------------------------- recorded streams


def replay(name: str, coder: ClaudeCoder | None = None) -> tuple[list[Event], Tally, ClaudeCoder]:
    coder = coder or ClaudeCoder(CoderSettings())
    tally = Tally()
    seen: list[Event] = []
    for line in (STREAMS / name).read_text().splitlines():
        for event in coder.parse(line):
            tally.add(event)
            seen.append(event)
    return seen, tally, coder


@dataclass(frozen=True)
class Expect:
    returncode: int  # the exit status recorded with the stream (notes §1.6)
    verdict: Verdict
    session: str
    tokens: tuple[int, int]
    cost: float | None
    rates: tuple[str, ...] = ()
    retries: int = 0


RECORDED = {
    "claude_shell.jsonl": Expect(0, Verdict.SUCCESS, "b90935cc", (3600, 60), 0.01525),
    "claude_shell_partial_messages.jsonl": Expect(
        0, Verdict.SUCCESS, "4ab5ddce", (3600, 60), 0.01525
    ),
    "claude_shell_realistic_usage.jsonl": Expect(
        0, Verdict.SUCCESS, "55294948", (3600, 60), 0.01525
    ),
    "claude_mcp.jsonl": Expect(0, Verdict.SUCCESS, "3cbf9fb0", (3600, 60), 0.01525),
    "claude_resume.jsonl": Expect(0, Verdict.SUCCESS, "b90935cc", (1800, 30), 0.007625),
    "claude_resume_wrong_cwd_error.jsonl": Expect(1, Verdict.FAILURE, "b90935cc", (0, 0), 0.0),
    "claude_429_default_10retries.jsonl": Expect(
        1, Verdict.RATE_LIMITED, "e0d88065", (0, 0), 0.0, ("rejected",), 10
    ),
    "claude_429_maxretries2.jsonl": Expect(
        1, Verdict.RATE_LIMITED, "9ed0f5f7", (0, 0), 0.0, ("rejected",), 2
    ),
    "claude_oauth_429_rejected.jsonl": Expect(
        1, Verdict.RATE_LIMITED, "c67717e4", (0, 0), 0.0, ("rejected",)
    ),
    "claude_oauth_429_no_unified_headers.jsonl": Expect(
        1, Verdict.RATE_LIMITED, "459f233e", (0, 0), 0.0, ("rejected",)
    ),
    "claude_oauth_rate_limit_event_allowed.jsonl": Expect(
        0, Verdict.SUCCESS, "03053be5", (3600, 60), 0.00915, ("allowed",)
    ),
    "claude_http500.jsonl": Expect(1, Verdict.FAILURE, "1d1e8f7f", (0, 0), 0.0, retries=1),
    "claude_http401.jsonl": Expect(1, Verdict.FAILURE, "b6003fd6", (0, 0), 0.0, retries=1),
    "claude_connection_refused.jsonl": Expect(
        1, Verdict.FAILURE, "d20ded8a", (0, 0), 0.0, retries=1
    ),
    # SIGINT: the CLI kills the tool and writes an aborted result; SIGTERM: exit 143, no result.
    "claude_sigint_during_tool.jsonl": Expect(1, Verdict.KILLED, "98a66762", (1800, 30), 0.007625),
    "claude_sigterm_during_tool.jsonl": Expect(143, Verdict.KILLED, "aabe1d79", (1800, 30), None),
    # 2.1.332 against the scripted server (tests/test_usage.py reads them for what a resumed
    # attempt spent): a fresh session and its resume, whose result reports modelUsage and
    # total_cost_usd for the whole session (so no cost of its own without the earlier
    # attempt's totals); a session stopped by SIGINT in a tool, and its resume.
    "claude_332_shell.jsonl": Expect(0, Verdict.SUCCESS, "bac8fbc3", (5400, 90), 0.018),
    "claude_332_resume_session_totals.jsonl": Expect(
        0, Verdict.SUCCESS, "bac8fbc3", (1800, 30), None
    ),
    "claude_332_sigint_during_tool.jsonl": Expect(0, Verdict.KILLED, "658a22b6", (1800, 30), 0.006),
    "claude_332_resume_after_sigint.jsonl": Expect(
        0, Verdict.SUCCESS, "658a22b6", (1800, 30), None
    ),
}


def test_every_recorded_claude_stream_is_covered() -> None:
    assert {p.name for p in STREAMS.glob("claude_*.jsonl")} == set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_stream(name: str) -> None:
    want = RECORDED[name]
    seen, tally, coder = replay(name)
    kinds = [e.kind for e in seen]
    assert tally.session is not None and tally.session.startswith(want.session)
    assert (tally.tokens_in, tally.tokens_out) == want.tokens
    assert tally.cost == pytest.approx(want.cost) if want.cost is not None else tally.cost is None
    assert tuple(e.rate_status for e in seen if e.kind == Kind.RATE_LIMIT) == want.rates
    assert kinds.count(Kind.RETRY) == want.retries
    assert coder.verdict(want.returncode, tally) == want.verdict
    assert kinds.count(Kind.SESSION) == (0 if "wrong_cwd" in name else 1)
    assert kinds.count(Kind.RESULT) == (0 if "sigterm" in name else 1)
    if want.verdict == Verdict.FAILURE:
        assert tally.last_error  # the reason fleet records
    assert Kind.RAW not in kinds or "sig" in name  # everything else is understood


def test_a_shell_turn_reads_as_call_result_text_and_usage() -> None:
    seen, tally, _ = replay("claude_shell.jsonl")
    assert [e.kind for e in seen] == [
        Kind.SESSION,
        Kind.TOOL_CALL,
        Kind.USAGE,
        Kind.TOOL_RESULT,
        Kind.TEXT,
        Kind.USAGE,
        Kind.RESULT,
    ]
    call, result = seen[1], seen[3]
    assert (call.tool, call.text) == ("Bash", "echo hi > fleet_out.txt && ls")
    assert (result.tool, result.text, result.is_error) == ("Bash", "fleet_out.txt", False)
    assert seen[4].text == "Done. All good. last_tool_output=[fleet_out.txt]"
    assert seen[-1].session == "b90935cc-fdc3-4db6-9c00-846d4b0bf05e"
    assert tally.turns == 1 and tally.last_tool == "Bash" and tally.context == 1830


def test_per_message_usage_is_provisional_and_the_result_is_the_truth() -> None:
    seen, tally, _ = replay("claude_shell_realistic_usage.jsonl")
    usage = [(e.tokens_in, e.tokens_out, e.context) for e in seen if e.kind == Kind.USAGE]
    # message_start said output 1 for each call; only the result has the real 60.
    assert usage == [(1800, 1, 1801), (3600, 2, 1801)]
    assert (seen[-1].tokens_in, seen[-1].tokens_out) == (3600, 60)
    assert (tally.tokens_in, tally.tokens_out) == (3600, 60)


def test_mcp_tool_names_and_the_server_status_are_kept() -> None:
    seen, _, _ = replay("claude_mcp.jsonl")
    assert "MCP askhuman connected" in seen[0].text
    call = next(e for e in seen if e.kind == Kind.TOOL_CALL)
    assert (call.tool, call.text) == (
        "mcp__askhuman__ask_human_question",
        '{"question": "May I proceed?"}',
    )
    result = next(e for e in seen if e.kind == Kind.TOOL_RESULT)
    assert result.tool == call.tool and "HUMAN_ANSWER" in result.text


def test_a_structured_rejection_carries_its_reset_and_window() -> None:
    seen, tally, _ = replay("claude_oauth_429_rejected.jsonl")
    (limit,) = [e for e in seen if e.kind == Kind.RATE_LIMIT]
    assert (limit.rate_status, limit.resets_at, limit.limit_type) == (
        "rejected",
        1796038964.0,
        "five_hour",
    )
    assert tally.last_error == "You've hit your session limit · resets 11:42am (UTC)"


def test_an_unstructured_429_becomes_a_rejection_once() -> None:
    seen, tally, _ = replay("claude_429_maxretries2.jsonl")
    kinds = [e.kind for e in seen]
    assert kinds == [
        Kind.SESSION,
        Kind.RETRY,
        Kind.RETRY,
        Kind.RATE_LIMIT,
        Kind.ERROR,
        Kind.RESULT,
    ]
    assert seen[1].text == "API error 429 (rate_limit): retry 1/2 in 1.0 s"
    assert tally.rate_status == "rejected" and tally.resets_at is None
    # The result alone (its synthetic message lost) is enough too.
    coder = ClaudeCoder(CoderSettings())
    last = (STREAMS / "claude_429_maxretries2.jsonl").read_text().splitlines()[-1]
    assert [e.kind for e in coder.parse(last)] == [Kind.RATE_LIMIT, Kind.ERROR, Kind.RESULT]


def line(**obj: Any) -> str:
    return json.dumps(obj)


def assistant(msg_id: str, content: list[dict[str, Any]], parent: str | None = None) -> str:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 100,
        "output_tokens": 7,
    }
    message = {"id": msg_id, "role": "assistant", "content": content, "usage": usage}
    return line(type="assistant", message=message, parent_tool_use_id=parent, session_id="s")


def test_one_message_over_several_lines_counts_once_and_subagents_keep_the_context() -> None:
    coder = ClaudeCoder(CoderSettings())
    first = coder.parse(assistant("m1", [{"type": "text", "text": "thinking aloud"}]))
    second = coder.parse(
        assistant("m1", [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"x": 1}}])
    )
    sub = coder.parse(assistant("m2", [{"type": "text", "text": "sub"}], parent="t1"))
    assert [e.kind for e in first] == [Kind.TEXT, Kind.USAGE]
    assert [e.kind for e in second] == [Kind.TOOL_CALL]  # the same message: no usage again
    assert (first[1].tokens_in, first[1].tokens_out, first[1].context) == (115, 7, 122)
    assert (sub[1].tokens_in, sub[1].tokens_out, sub[1].context) == (230, 14, None)


def test_rate_limit_warnings_read_utilization_from_either_place() -> None:
    coder = ClaudeCoder(CoderSettings())
    (warning,) = coder.parse(
        line(
            type="rate_limit_event",
            rate_limit_info={
                "status": "allowed_warning",
                "resetsAt": 1796038955,
                "rateLimitType": "five_hour",
                "utilization": 0.91,
                "surpassedThreshold": 0.9,
            },
        )
    )
    assert (warning.rate_status, warning.utilization, warning.resets_at, warning.limit_type) == (
        "allowed_warning",
        0.91,
        1796038955.0,
        "five_hour",
    )
    # 2.1.332 puts the per-window utilization under unifiedWindows.
    (windowed,) = coder.parse(
        line(
            type="rate_limit_event",
            rate_limit_info={
                "status": "allowed",
                "resetsAt": 1796038955000,
                "rateLimitType": "seven_day",
                "unifiedWindows": {"seven_day": {"utilization": 0.4, "status": "allowed"}},
            },
        )
    )
    assert (windowed.utilization, windowed.resets_at) == (0.4, 1796038955.0)
    assert coder.verdict(0, Tally(result_seen=True)) == Verdict.SUCCESS


def test_api_errors_and_compaction_read_as_such() -> None:
    coder = ClaudeCoder(CoderSettings())
    seen = coder.parse('{"type": "assistant", "error": "rate_limit", "message": null}')
    assert [(e.kind, e.rate_status) for e in seen] == [
        (Kind.RATE_LIMIT, "rejected"),
        (Kind.ERROR, None),
    ]
    (compacted,) = coder.parse(
        line(
            type="system",
            subtype="compact_boundary",
            compact_metadata={"trigger": "auto", "pre_tokens": 170000},
        )
    )
    assert compacted == Event(Kind.RAW, "context compacted (auto, 170000 tokens before)")


def test_verdicts_without_a_result() -> None:
    coder = ClaudeCoder(CoderSettings())
    assert coder.verdict(-9, Tally()) == Verdict.KILLED
    assert coder.verdict(130, Tally()) == Verdict.KILLED
    assert coder.verdict(143, Tally()) == Verdict.KILLED
    assert coder.verdict(0, Tally()) == Verdict.FAILURE  # success needs result.is_error false
    assert coder.verdict(1, Tally()) == Verdict.FAILURE
    assert coder.verdict(1, Tally(rate_status="rejected")) == Verdict.RATE_LIMITED


GARBAGE = [
    "not json at all",
    "{",
    "[1, 2, 3]",
    "null",
    "42",
    '"a string"',
    "\x00\x01\x02\ufffd\ufffd",
    "[" * 100_000 + "]" * 100_000,
    '{"type": "x' + "y" * (8 << 20) + '"}',
    "{}",
    '{"type": 5}',
    '{"type": "assistant", "message": "not a dict"}',
    '{"type": "assistant", "message": {"content": "text", "usage": [1]}}',
    '{"type": "assistant", "message": {"content": [1, null, {"type": "tool_use"}]}}',
    '{"type": "assistant", "error": "rate_limit", "message": null}',
    '{"type": "user", "message": {"content": [1, null, {"type": "tool_result", "content": 5}]}}',
    '{"type": "result", "usage": "x", "modelUsage": [1], "is_error": "yes", "errors": 3}',
    '{"type": "result", "modelUsage": {"m": 1}, "total_cost_usd": "free"}',
    '{"type": "rate_limit_event", "rate_limit_info": []}',
    '{"type": "rate_limit_event", "rate_limit_info": {"resetsAt": "soon", "utilization": true}}',
    '{"type": "system", "subtype": "init", "mcp_servers": "none", "session_id": 7}',
    '{"type": "system", "subtype": "api_retry", "retry_delay_ms": "x", "error_status": []}',
    '{"type": "system", "subtype": "something_new"}',
    '{"type": "stream_event", "event": null}',
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text: str) -> None:
    coder = ClaudeCoder(CoderSettings())
    events = coder.parse(text)
    assert all(isinstance(e, Event) for e in events)
    tally = Tally()
    for event in events:
        tally.add(event)
    coder.verdict(1, tally)


def test_unknown_and_malformed_lines_are_raw() -> None:
    coder = ClaudeCoder(CoderSettings())
    for text in ("not json at all", "[1, 2, 3]", "[" * 100_000 + "]" * 100_000, "{}"):
        assert coder.parse(text) == (Event(Kind.RAW, text),)
    odd = '{"type": "keep_alive", "session_id": "s"}'
    assert coder.parse(odd) == (Event(Kind.RAW, odd),)


def test_a_line_reads_as_json_loads_reads_it() -> None:
    # parse skips json.loads's wrapper when a line is one JSON value and nothing else; any
    # other line must still read as json.loads has it.
    coder = ClaudeCoder(CoderSettings())
    init = '{"type": "system", "subtype": "init", "session_id": "s1"}'
    for text in (init, f"  {init}", f"{init} ", f"\t{init}\r\n"):
        assert json.loads(text)
        assert coder.parse(text) == (Event(Kind.SESSION, "session s1", session="s1"),)
    for text in (f"{init} x", f"{init}{init}", f"\ufeff{init}", f"{init}]", f"x{init}"):
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
        assert coder.parse(text) == (Event(Kind.RAW, text),)


# ---------------------------------------------------------------------- the command


def test_the_installed_cli_is_a_tested_version() -> None:
    out = subprocess.run(
        [str(CLAUDE), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    assert any(v in out.stdout for v in ClaudeCoder.tested_versions), out.stdout


def spec(tmp_path: Path, model: str | None = None) -> RunSpec:
    task_dir = tmp_path / "tasks" / "fl-abc123"
    task_dir.mkdir(parents=True, exist_ok=True)
    return RunSpec(
        "fl-abc123",
        1,
        "title",
        "desc",
        str(tmp_path),
        model,
        task_dir,
        task_dir / "artifacts",
        "# title\n\ndesc",
        task_dir / "prompt.md",
    )


def test_argv_puts_the_prompt_last_after_the_options(tmp_path: Path) -> None:
    settings = CoderSettings(
        binary="/opt/claude", args=("--allowedTools", "Bash", "Read"), models={"big": "opus-x"}
    )
    run = spec(tmp_path, model="big")
    argv = ClaudeCoder(settings).argv(run)
    assert argv[:6] == [
        "/opt/claude",
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
    ]
    assert argv[argv.index("--mcp-config") + 1] == str(run.task_dir / MCP_FILE)
    assert argv[argv.index("--model") + 1] == "opus-x"
    assert argv[-3:] == ["--allowedTools", "Bash", "Read"]  # the prompt is standard input
    assert ClaudeCoder.prompt_on_stdin and run.prompt not in argv
    assert "--model" not in ClaudeCoder(CoderSettings()).argv(spec(tmp_path))
    assert ClaudeCoder(CoderSettings()).argv(spec(tmp_path))[0] == "claude"


def test_no_prompt_is_on_the_command_line_however_long(tmp_path: Path) -> None:
    run = spec(tmp_path)
    huge = run._replace(prompt="x" * 200_000, resume="a-session")
    assert all(len(a) < 1000 for a in ClaudeCoder(CoderSettings()).argv(huge))


def test_prepare_writes_the_fleet_ask_server(tmp_path: Path, home: Path) -> None:
    run = spec(tmp_path)
    ClaudeCoder(CoderSettings()).prepare(run)
    config = json.loads((run.task_dir / MCP_FILE).read_text())
    assert config == {
        "mcpServers": {
            "fleet": {
                "type": "stdio",
                "command": os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "fleet-ask"),
                "args": [],
                "env": {"FLEET_TASK_ID": "fl-abc123", "FLEET_HOME": str(home)},
                "timeout": MCP_TIMEOUT_MS,
            }
        }
    }
    assert (run.task_dir / TMP_DIR).is_dir()
    (hooks,) = json.loads((run.task_dir / SETTINGS_FILE).read_text())["hooks"]["PostToolUse"]
    (hook,) = hooks["hooks"]
    assert hook["type"] == "command" and hook["command"].endswith("fleet-ask --deliver")
    assert f"FLEET_TASK_ID=fl-abc123 FLEET_HOME={home} exec " in hook["command"]


def test_environ_caps_retries_and_sets_is_sandbox_only_as_root(tmp_path: Path) -> None:
    settings = CoderSettings(env={"ANTHROPIC_API_KEY": "k", "CLAUDE_CODE_MAX_RETRIES": "5"})
    env = ClaudeCoder(settings).environ(spec(tmp_path))
    assert env["ANTHROPIC_API_KEY"] == "k" and env["CLAUDE_CODE_MAX_RETRIES"] == "5"
    assert env["CLAUDE_CODE_TMPDIR"] == str(spec(tmp_path).task_dir / TMP_DIR)
    assert "HOME" not in env and "CLAUDE_CONFIG_DIR" not in env  # the user's login stays
    assert ClaudeCoder(CoderSettings()).environ(spec(tmp_path))["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert os.geteuid() == 0  # the suite runs as root (the sandbox needs it)
    assert env["IS_SANDBOX"] == "1"
    probe = (
        "import json, pathlib; from fleet.coders.base import CoderSettings, RunSpec;"
        " from fleet.coders.claude import ClaudeCoder;"
        " p = pathlib.Path('/nonexistent');"
        " s = RunSpec('fl-x', 1, 't', 'd', '/', None, p, p, 'x', p);"
        " print(json.dumps(ClaudeCoder(CoderSettings()).environ(s)))"
    )
    nobody = pwd.getpwnam("nobody")
    user = [f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    out = subprocess.run(
        ["setpriv", *user, sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=30,
        check=True,
    )
    assert "IS_SANDBOX" not in json.loads(out.stdout)


# ---------------------------------------------------------------------- the real CLI, by hand


@dataclass
class Server:
    url: str
    log: Log
    handler: type[anthropic.AnthropicHandler]
    runtime: Path  # the XDG_RUNTIME_DIR the CLI gets

    def calls(self, key: str) -> list[dict[str, Any]]:
        """The model calls (with tools) whose prompt carries `key`."""
        return [
            b
            for b in self.log.bodies("/v1/messages")
            if isinstance(b, dict) and b.get("tools") and key in json.dumps(b.get("messages"))
        ]


@pytest.fixture(scope="module")
def server(runtime_dir: Path) -> Iterator[Server]:
    handler = anthropic.handler()
    with serve(handler) as (url, log):
        yield Server(url, log, handler, runtime_dir)


def claude_home_files() -> set[str]:
    """Everything Claude Code would write under the real home of root, and in /tmp by default."""
    root = Path(pwd.getpwuid(0).pw_dir)
    found: set[str] = set()
    tops = [root / ".claude", root / ".claude.json", root / ".cache" / "claude-cli-nodejs"]
    tops += [Path("/tmp/claude-0"), Path("/tmp/cc-socks"), Path("/tmp/cc-socks-0")]
    for top in tops:
        if top.exists():
            found.add(str(top))
            found.update(str(p) for p in top.rglob("*") if top.is_dir())
    return found


@pytest.fixture(scope="module", autouse=True)
def leaves_the_real_home_alone() -> Iterator[None]:
    before = claude_home_files()
    yield
    appeared = claude_home_files() - before
    assert not appeared, f"the CLI wrote outside its test home: {sorted(appeared)[:10]}"


@pytest.fixture(scope="module")
def runtime_dir() -> Iterator[Path]:
    """A short XDG_RUNTIME_DIR for the CLI's socket: under pytest's long task directories the
    socket path would pass the 103-byte limit and the CLI would fall back to /tmp/cc-socks-0."""
    path = Path(tempfile.mkdtemp(prefix="fleet-cc-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def env_table(url: str, home: Path, runtime: Path, oauth: bool = False) -> str:
    auth = (
        'CLAUDE_CODE_OAUTH_TOKEN = "sk-ant-oat01-fake"' if oauth else 'ANTHROPIC_API_KEY = "sk-t"'
    )
    return (
        f'coders.claude.env={{ANTHROPIC_BASE_URL = "{url}", {auth}, HOME = "{home}",'
        f' XDG_RUNTIME_DIR = "{runtime}", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1"}}'
    )


def configure(fleet: Fleet, server: Server, home: Path, binary: Path = CLAUDE) -> None:
    assert CLAUDE.exists(), "run `npm ci --prefix tests/clis` first"
    table = env_table(server.url, home, server.runtime)
    fleet.ok("config", "set", f"coders.claude.binary={binary}", table)


def tools_running(pattern: str) -> list[int]:
    """PIDs whose command line contains `pattern` (a tool the CLI may have left behind)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if name.isdigit() and int(name) != os.getpid() and pattern.encode() in cmdline:
            found.append(int(name))
    return found


def test_shell_task_runs_to_done(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path, home: Path
) -> None:
    claude_home = tmp_path / "claude-home"
    configure(fleet, server, claude_home)
    key = uuid.uuid4().hex
    tid = fleet.add("write a file", "--coder", "claude", "-d", f"FLEET-SCENARIO:shell:{key}")
    result = run(tid, project)
    assert result.returncode == 0, result.stderr
    assert (project / "fleet_out.txt").read_text() == "fleet\n"
    task = shown(fleet, tid)
    assert (task["status"], task["reason"]) == ("done", "done")
    (attempt,) = task["attempt_log"]
    assert attempt["outcome"] == "success"
    calls = len(server.calls(key))
    assert calls == 3  # write, close, answer
    assert (attempt["tokens_in"], attempt["tokens_out"]) == (calls * PER_CALL_IN, calls * 30)
    assert attempt["cost"] > 0
    seen = events(result.stdout)
    kinds = [e["event"] for e in seen]
    assert kinds[0] == "session" and kinds[-1] == "result"
    assert [e["text"] for e in seen if e["event"] == "tool_call"] == [
        anthropic.WRITE_COMMAND,
        anthropic.CLOSE_COMMAND,
    ]
    assert [e["tool"] for e in seen if e["event"] == "tool_result"] == ["Bash", "Bash"]
    assert [e["text"] for e in seen if e["event"] == "text"] == [anthropic.FINAL_TEXT]
    # The CLI started fleet-ask and offered its tools with every call: deferred, by name, for
    # the model to load with ToolSearch.
    assert seen[0]["text"].endswith("MCP fleet connected")
    for body in server.calls(key):
        assert {"Bash", anthropic.SEARCH_TOOL} <= {t.get("name") for t in body["tools"]}
        assert all(f"mcp__fleet__{t}" in json.dumps(body) for t in FLEET_TOOLS)
    mcp = json.loads((home / "tasks" / tid / MCP_FILE).read_text())["mcpServers"]["fleet"]
    assert mcp["command"] == os.path.join(BIN, "fleet-ask") and os.path.exists(mcp["command"])
    # The session stays in the user's config directory, where `claude --resume` finds it.
    session = attempt["session_id"]
    assert list((claude_home / ".claude" / "projects").glob(f"*/{session}.jsonl"))
    assert (home / "tasks" / tid / TMP_DIR).is_dir()


def test_the_prompt_is_never_on_a_command_line(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path, home: Path
) -> None:
    """Issue 11, item 2: any local user reads /proc/PID/cmdline; the prompt goes by stdin."""
    configure(fleet, server, tmp_path / "claude-home")
    secret = f"private-{uuid.uuid4().hex}"
    tid = fleet.add("hang", "--coder", "claude", "-d", f"FLEET-SCENARIO:hang {secret}")
    with running(tid, project, tmp_path / "out") as agent:
        lines = command_lines_once(agent.pid, "time.sleep(300)")
        (home / "tasks" / tid / ".kill").touch()
        assert agent.wait(timeout=DEADLINE) == 3
    assert len(lines) >= 3  # the runner, the CLI, fleet-ask, the tool's shell
    assert [line for line in lines.values() if secret.encode() in line] == []
    assert server.calls(secret), "the prompt did not reach the model"


def test_a_garbage_line_does_not_end_the_attempt(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    wrapper = tmp_path / "claude-wrapper"
    wrapper.write_bytes(
        b"#!/bin/sh\nprintf '\\001garbage \\377{not json\\n'\nexec " + bytes(CLAUDE) + b' "$@"\n'
    )
    wrapper.chmod(0o755)
    configure(fleet, server, tmp_path / "claude-home", binary=wrapper)
    tid = fleet.add("garbage first", "--coder", "claude", "-d", "FLEET-SCENARIO:shell")
    result = run(tid, project)
    assert result.returncode == 0, result.stderr
    seen = events(result.stdout)
    assert seen[0]["event"] == "raw" and "garbage" in seen[0]["text"]
    assert seen[1]["event"] == "session" and seen[-1]["event"] == "result"
    assert shown(fleet, tid)["status"] == "done"


def test_a_fleet_ask_that_fails_to_start_leaves_the_run_alone(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    # fleet-run starts the fleet-ask next to itself: here one that fails at once.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("fleet", "fleet-run"):
        (bindir / name).symlink_to(fleet_exe(name))
    (bindir / "fleet-ask").write_text("#!/bin/sh\necho 'fleet-ask: broken' >&2\nexit 69\n")
    (bindir / "fleet-ask").chmod(0o755)
    configure(fleet, server, tmp_path / "claude-home")
    key = uuid.uuid4().hex
    tid = fleet.add("no tools", "--coder", "claude", "-d", f"FLEET-SCENARIO:shell:{key}")
    result = run(tid, project, bindir / "fleet-run")
    assert result.returncode == 0, result.stderr
    seen = events(result.stdout)
    # The CLI reports the server failed and works on without its tools.
    assert seen[0]["text"].endswith("MCP fleet failed")
    assert server.calls(key) and not any("mcp__fleet" in json.dumps(b) for b in server.calls(key))
    assert shown(fleet, tid)["status"] == "done"


def test_the_model_asks_a_person_and_finishes_with_the_answer(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    configure(fleet, server, tmp_path / "claude-home")
    key = uuid.uuid4().hex
    tid = fleet.add("pick a colour", "--coder", "claude", "-d", f"FLEET-SCENARIO:ask:{key}")
    out = tmp_path / "events.jsonl"
    with running(tid, project, out) as agent:
        question = asked_in_background(tid, agent, out, DEADLINE)
        assert (question["task"], question["status"], question["kind"]) == (
            tid,
            "pending",
            "choice",
        )
        assert question["text"] == anthropic.ASK_INPUT["question"]
        assert question["options"] == anthropic.ASK_INPUT["options"]
        assert question["multi_select"] is False and question["answered_by"] is None
        assert shown(fleet, tid)["question"] == question["id"]
        # The model is waiting on the tool: no call has carried its result yet.
        assert all(anthropic.ASK_TOOL not in anthropic.called(b) for b in server.calls(key))
        assert agent.poll() is None
        # A person answers from another shell: option 3 by its number, with a comment.
        answer = run_fleet("answer", question["id"], "make it stand out", "--choice", "3")
        assert (answer.code, answer.out) == (0, question["id"] + "\n"), answer.err
        assert agent.wait(timeout=DEADLINE) == 0, out.with_suffix(".err").read_text()
    person = f"{getpass.getuser()}@{socket.gethostname()}"
    received = f"The person ({person}) chose: blue\nTheir comment: make it stand out"
    # The model loaded the deferred tools with ToolSearch, whose answer defined ask_human.
    bodies = server.calls(key)
    assert [anthropic.called(b) for b in bodies] == [
        [],
        [anthropic.SEARCH_TOOL],
        [anthropic.SEARCH_TOOL, anthropic.ASK_TOOL],
        [anthropic.SEARCH_TOOL, anthropic.ASK_TOOL, anthropic.DONE_TOOL],
    ]
    (schema,) = [t for t in bodies[1]["tools"] if t["name"] == anthropic.ASK_TOOL]
    assert {"question", "kind", "options", "multi_select"} <= set(
        schema["input_schema"]["properties"]
    )
    # The model saw the answer as the tool's result and passed it on to task_done.
    seen_by_model = anthropic.tool_result_text(bodies[2], anthropic.ASK_TOOL)
    assert seen_by_model == received
    done_result = anthropic.tool_result_text(bodies[3], anthropic.DONE_TOOL)
    assert done_result.startswith(f"{tid} is now done")
    task = shown(fleet, tid)
    assert (task["status"], task["reason"], task["question"]) == (
        "done",
        anthropic.done_summary(seen_by_model),
        None,
    )
    assert [a["outcome"] for a in task["attempt_log"]] == ["success"]
    seen = events(out.read_text())
    calls = [(e["tool"], e["text"]) for e in seen if e["event"] == "tool_call"]
    assert calls == [
        (anthropic.SEARCH_TOOL, anthropic.SEARCH_INPUT["query"]),
        (anthropic.ASK_TOOL, json.dumps(anthropic.ASK_INPUT)),
        (anthropic.DONE_TOOL, json.dumps({"summary": anthropic.done_summary(seen_by_model)})),
    ]
    results = [(e["tool"], e["text"]) for e in seen if e["event"] == "tool_result"]
    assert [(tool, text) for tool, text in results][1] == (anthropic.ASK_TOOL, received)
    (done,) = json.loads(fleet.ok("questions", "--all", "--json", "--task", tid))
    assert (done["id"], done["status"], done["answered_by"]) == (question["id"], "answered", person)
    assert (done["answer"], done["choices"], done["comment"]) == (
        "blue",
        ["blue"],
        "make it stand out",
    )
    # Nothing waits any more; a second answer is refused and names the first.
    assert json.loads(fleet.ok("questions", "--json")) == []
    again = run_fleet("answer", question["id"], "--choice", "red")
    assert again.code == 4 and f"already answered by {person}" in again.err


def test_a_full_context_stops_the_agent_and_requeues(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    configure(fleet, server, tmp_path / "claude-home")
    tid = fleet.add("fill the context", "--coder", "claude", "-d", "FLEET-SCENARIO:context")
    try:
        result = run(tid, project)
        assert result.returncode == 7, result.stderr
        task = shown(fleet, tid)
        assert (task["status"], task["failures"], task["noclose"]) == ("ready", 0, 0)
        assert [a["outcome"] for a in task["attempt_log"]] == ["context-pressure"]
        (usage,) = [e for e in events(result.stdout) if e["event"] == "usage"]
        assert usage["context"] >= anthropic.HUGE_INPUT > 0.85 * ClaudeCoder.default_context
        # SIGINT made the CLI kill the tool it had started.
        wait_for(lambda: not tools_running("time.sleep(299)"), 10, "the tool to be gone")
    finally:
        for pid in tools_running("time.sleep(299)"):
            os.kill(pid, 9)


def test_a_429_holds_back_the_coder_and_requeues(
    fleet: Fleet, project: Path, server: Server, tmp_path: Path
) -> None:
    from fleet.paths import resolve
    from fleet.store import open_store

    configure(fleet, server, tmp_path / "claude-home")
    tid = fleet.add("limited", "--coder", "claude", "-d", "FLEET-SCENARIO:ratelimit")
    other = fleet.add("another coder", "--coder", "command", "-d", "true")
    waiting = fleet.add("same coder", "--coder", "claude", "-d", "FLEET-SCENARIO:shell")
    started = time.monotonic()
    result = run(tid, project)
    took = time.monotonic() - started
    assert result.returncode == 6, result.stderr
    assert took < 20  # two capped retries, not ten over three minutes
    task = shown(fleet, tid)
    assert (task["status"], task["failures"]) == ("ready", 0)
    assert [a["outcome"] for a in task["attempt_log"]] == ["rate-limited"]
    kinds = [e["event"] for e in events(result.stdout)]
    assert kinds.count("retry") == 2 and kinds.count("rate_limit") == 1
    store = open_store(resolve())
    try:
        until, why = store.gates()["coder:claude"]
        # An API key gets no reset time: the gate holds for rate_limit_backoff_seconds.
        assert until is not None and parse(until) > time.time() + 200
        assert "rejected" in str(why)
        claimed = [t.id for t in store.claim(10, "test", 60, "claude", None)]
    finally:
        store.close()
    assert claimed == [other] and waiting not in claimed


# ---------------------------------------------------------------------- under systemd


@dataclass
class Box:
    box: Sandbox
    home: Path
    project: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = {"FLEET_HOME": str(self.home)}
        return self.box.run(f"{BIN}/fleet", *args, env=env, check=check, timeout=timeout)

    def add(self, description: str) -> str:
        return self(
            "add",
            "a claude task",
            "--coder",
            "claude",
            "--cwd",
            str(self.project),
            "-d",
            description,
        ).stdout.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def wait(self, task_id: str, timeout: int = 60) -> int:
        code = self(
            "wait", task_id, "--timeout", str(timeout), check=False, timeout=timeout + 30
        ).returncode
        if code == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return code

    def tool_pids(self, pattern: str) -> str:
        return self.box.run("pgrep", "-f", pattern, check=False).stdout.strip()


def boxed(systemd: Sandbox, tmp_path: Path, server: Server, oauth: bool = False) -> Iterator[Box]:
    project = tmp_path / "project"
    project.mkdir()
    f = Box(systemd, tmp_path / "home", project)
    f(
        "config",
        "set",
        "default_coder=command",
        "lease_seconds=10",
        "stop_grace_seconds=2",
        f"coders.claude.binary={CLAUDE}",
        env_table(server.url, tmp_path / "claude-home", server.runtime, oauth),
    )
    f("setup", "--system")
    yield f
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("stop", "fleet-wake-claude.timer", check=False)
    systemd.systemctl("reset-failed", check=False)


@pytest.fixture
def box(systemd: Sandbox, tmp_path: Path, server: Server) -> Iterator[Box]:
    yield from boxed(systemd, tmp_path, server)


@pytest.fixture
def oauth_box(systemd: Sandbox, tmp_path: Path, server: Server) -> Iterator[Box]:
    yield from boxed(systemd, tmp_path, server, oauth=True)


def test_dispatched_task_runs_to_done(box: Box) -> None:
    task_id = box.add("FLEET-SCENARIO:shell")
    assert box.wait(task_id) == 0
    task = box.show(task_id)
    assert task["status"] == "done"
    assert [a["outcome"] for a in task["attempt_log"]] == ["success"]
    assert task["attempt_log"][0]["tokens_in"] == 3 * PER_CALL_IN
    assert (box.project / "fleet_out.txt").exists()
    journal = box.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert f"→ Bash: {anthropic.WRITE_COMMAND}" in journal and "result (ok)" in journal


def test_fleet_kill_ends_the_running_tool(box: Box) -> None:
    task_id = box.add("FLEET-SCENARIO:hang")
    box.box.wait_for(
        lambda: box.tool_pids("time.sleep.300") != "", timeout=30, what="the tool started"
    )
    box("kill", task_id)
    assert box.tool_pids("time.sleep.300") == ""
    assert box.wait(task_id) == 1
    task = box.show(task_id)
    assert [a["outcome"] for a in task["attempt_log"]] == ["killed"]
    assert task["status"] == "blocked" and "stopped by a person" in task["reason"]


def status_text(box: Box, task_id: str) -> str:
    unit = f"fleet-task@{task_id}"
    return box.box.systemctl("show", "-p", "StatusText", "--value", unit).stdout.strip()


def pending_in_box(box: Box, task_id: str) -> dict[str, Any]:
    """The question the task's agent asks, once `fleet questions --wait` sees it."""
    args = ("questions", "--wait", "--json", "--timeout", "60", "--task", task_id)
    found = box(*args, check=False, timeout=90)
    if found.returncode != 0:
        journal = box.box.run("journalctl", "-n", "80", "--no-pager").stdout
        raise AssertionError(f"no question from {task_id}: {found.stderr}\n{journal}")
    (question,) = json.loads(found.stdout)
    assert isinstance(question, dict)
    return question


def test_a_unit_waits_for_a_person_and_finishes_with_the_answer(box: Box, server: Server) -> None:
    key = uuid.uuid4().hex
    task_id = box.add(f"FLEET-SCENARIO:ask:{key}")
    question = pending_in_box(box, task_id)
    qid = question["id"]
    assert (question["kind"], question["text"], question["options"]) == (
        "choice",
        anthropic.ASK_INPUT["question"],
        anthropic.ASK_INPUT["options"],
    )
    # While it waits: the unit's status line says so, and so does `fleet ls`.
    box.box.wait_for(
        lambda: "waiting for a person" in status_text(box, task_id), 30, "the unit's status"
    )
    assert f"waiting for a person: {qid} (choice) Which colour" in status_text(box, task_id)
    (row,) = [r for r in box("ls").stdout.splitlines() if r.startswith(task_id)]
    assert row.split()[1] == "asking"
    assert box.show(task_id)["question"] == qid
    # Answered by the task's id (it has exactly one question waiting).
    answer = box("answer", task_id, "--choice", "blue", "--by", "tester", "--json")
    assert json.loads(answer.stdout)["status"] == "answered"
    assert box.wait(task_id) == 0
    received = "The person (tester) chose: blue"
    task = box.show(task_id)
    assert task["status"] == "done" and task["reason"].removeprefix("answer: ") == received
    assert task["reason"].startswith("answer: ")
    assert [a["outcome"] for a in task["attempt_log"]] == ["success"]
    (last,) = [b for b in server.calls(key) if anthropic.DONE_TOOL in anthropic.called(b)]
    assert anthropic.tool_result_text(last, anthropic.ASK_TOOL) == received
    (done,) = json.loads(box("questions", "--all", "--json", "--task", task_id).stdout)
    assert (done["status"], done["answered_by"], done["answer"]) == ("answered", "tester", "blue")
    # fleet-ask wrote the question and its answer to the task's journal.
    entries = box.box.journal("-u", f"fleet-task@{task_id}", "SYSLOG_IDENTIFIER=fleet-ask")
    mine = [e for e in entries if e.get("FLEET_QUESTION") == qid]
    assert [(e["MESSAGE"], e["FLEET_QUESTION_STATUS"]) for e in mine] == [
        (
            f"question {qid} (choice): Which colour should the new button be?"
            " [1) red | 2) green | 3) blue]",
            "pending",
        ),
        (f"answer to {qid} by tester: blue", "answered"),
    ]
    assert all(e["FLEET_TASK_ID"] == task_id and e["FLEET_EVENT"] == "question" for e in mine)
    assert "waiting for a person" not in status_text(box, task_id)


def test_fleet_kill_while_the_agent_waits_cancels_the_question(box: Box) -> None:
    task_id = box.add(f"FLEET-SCENARIO:ask:{uuid.uuid4().hex}")
    question = pending_in_box(box, task_id)
    box("kill", task_id)
    assert box.wait(task_id) == 1
    task = box.show(task_id)
    assert [a["outcome"] for a in task["attempt_log"]] == ["killed"]
    assert task["status"] == "blocked" and task["question"] is None
    (gone,) = json.loads(box("questions", "--all", "--json", "--task", task_id).stdout)
    assert (gone["id"], gone["status"], gone["answered_by"]) == (question["id"], "cancelled", None)
    assert json.loads(box("questions", "--json").stdout) == []
    late = box("answer", question["id"], "--choice", "red", check=False)
    assert late.returncode == 4 and "cancelled" in late.stderr
    assert box.tool_pids("fleet-ask") == ""


def test_a_rate_limited_task_runs_again_after_the_reset(oauth_box: Box, server: Server) -> None:
    key = uuid.uuid4().hex
    task_id = oauth_box.add(f"FLEET-SCENARIO:ratelimit-once:{key}")
    assert oauth_box.wait(task_id, timeout=90) == 0
    task = oauth_box.show(task_id)
    assert task["status"] == "done"
    first, second = task["attempt_log"]
    assert (first["outcome"], second["outcome"]) == ("rate-limited", "success")
    # The gate held the task until the reset the server announced, not the 300 s backoff.
    reset = server.handler.resets[key]
    assert reset - 1 <= parse(second["started_at"]) < reset + 30
    assert len(server.calls(key)) == 1 + 3
    # fleet-reap's transient timer woke fleet-claim at the reset (the safety-net timer's first
    # pass comes 10 s after setup, every 30 s after that).
    journal = oauth_box.box.run("journalctl", "-u", "fleet-wake-claude.timer", "-o", "cat")
    assert "fleet-wake-claude" in journal.stdout


def suspended_at_work(box: Box, key: str) -> str:
    """A task whose agent wrote a file, checkpointed through fleet-ask and started a long tool,
    suspended by a person with `fleet suspend`."""
    git = ["git", "-C", str(box.project), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True, timeout=30)
    task_id = box.add(f"FLEET-SCENARIO:suspend:{key}")
    box.box.wait_for(lambda: box.tool_pids("time.sleep.300") != "", 60, "the long tool")
    (mine,) = json.loads(box("checkpoints", task_id, "--json").stdout)
    assert (mine["n"], mine["by"], mine["summary"]) == (1, "agent", anthropic.CHECKPOINT_SUMMARY)
    assert mine["ref"] == f"refs/fleet/{task_id}/checkpoints/1" and mine["session_id"]
    # The work in progress is on the ref (the agent committed nothing).
    shown = subprocess.run(
        [*git, "show", f"{mine['ref']}:suspended_out.txt"], capture_output=True, text=True
    )
    assert shown.stdout == "before\n", shown.stderr
    assert box("suspend", task_id, "-s", "suspended for the test").stdout == "2\n"
    assert box.tool_pids("time.sleep.300") == ""
    task = box.show(task_id)
    assert (task["status"], task["failures"], task["claimed_by"]) == ("suspended", 0, None)
    assert [a["outcome"] for a in task["attempt_log"]] == ["suspended"]
    # Never claimed while suspended, however often fleet-claim runs.
    claim = box.box.run(f"{BIN}/fleet-claim", env={"FLEET_HOME": str(box.home)})
    assert claim.stdout.startswith("started 0;") and box.show(task_id)["status"] == "suspended"
    return task_id


def test_a_suspended_session_resumes_with_its_history(box: Box, server: Server) -> None:
    key = uuid.uuid4().hex
    task_id = suspended_at_work(box, key)
    first, second = json.loads(box("checkpoints", task_id, "--json").stdout)
    assert second["session_id"] == first["session_id"]
    assert (second["by"], second["summary"]) == (PERSON, "suspended for the test")
    calls_before = len(server.calls(key))
    assert box("resume", task_id).stdout == f"{task_id}\n"
    assert box.wait(task_id) == 0
    task = box.show(task_id)
    assert (task["status"], task["reason"], task["resume_from"]) == (
        "done",
        "resumed-history-ok",
        None,
    )
    suspended, resumed = task["attempt_log"]
    assert (suspended["outcome"], resumed["outcome"]) == ("suspended", "success")
    assert resumed["session_id"] == suspended["session_id"] == first["session_id"]
    # The stop reached the CLI as SIGINT alone (KillMode=mixed: systemd's SIGTERM went to
    # fleet-run, which gave claude its stop signal), so the suspended run always ended its tool
    # and printed its result: the four calls before the suspension (ToolSearch, the write, the
    # checkpoint, the long tool), with their whole output and the cost Claude Code reports
    # ($0.006 a call, its own price). The resumed run's result reports modelUsage and
    # total_cost_usd for the whole session; fleet records only the two calls made after the
    # resume (the close, the final text), its cost taken against the suspended run's totals.
    made = len(server.calls(key)) - calls_before
    assert (calls_before, made) == (4, 2)
    assert suspended["exit_status"] == 0  # 2.1.332 exits 0 after an aborted result (on SIGINT)
    (printed,) = box.box.journal(
        f"FLEET_TASK_ID={task_id}", "FLEET_ATTEMPT=1", "FLEET_EVENT=result"
    )
    assert printed["MESSAGE"].startswith("result (error): ")
    assert (suspended["tokens_in"], suspended["tokens_out"], suspended["tokens_cache_read"]) == (
        4 * PER_CALL_IN,
        4 * anthropic.OUTPUT_TOKENS,
        4 * anthropic.USAGE["cache_read_input_tokens"],
    )
    assert (resumed["tokens_in"], resumed["tokens_out"], resumed["tokens_cache_read"]) == (
        2 * PER_CALL_IN,
        2 * anthropic.OUTPUT_TOKENS,
        2 * anthropic.USAGE["cache_read_input_tokens"],
    )
    assert (suspended["cost_source"], resumed["cost_source"]) == ("reported", "reported")
    assert (suspended["cost"], resumed["cost"]) == (
        pytest.approx(4 * REPORTED_PER_CALL),
        pytest.approx(2 * REPORTED_PER_CALL),
    )
    assert task["cost"] == pytest.approx(6 * REPORTED_PER_CALL)
    assert resumed["model"].startswith("claude-opus")
    # The resumed conversation, as the server received it: every earlier turn, then fleet's
    # message naming the checkpoint.
    first_resumed = server.calls(key)[calls_before]
    assert anthropic.SUSPEND_WRITE in anthropic.commands(first_resumed)
    assert anthropic.CHECKPOINT_TOOL in anthropic.called(first_resumed)
    assert anthropic.HANG_COMMAND in anthropic.commands(first_resumed)
    assert f"{anthropic.RESUMED_MARK} 2" in anthropic.user_text(first_resumed)
    assert "suspended for the test" in anthropic.user_text(first_resumed)
    # The trail: the agent's checkpoint, the person's, the suspension and the resumption.
    trail = [
        e
        for e in box.box.journal(f"FLEET_TASK_ID={task_id}", "FLEET_EVENT=audit")
        if e["FLEET_ACTION"] in ("checkpointed", "suspended", "resumed")
    ]
    assert [(e["FLEET_ACTION"], e["FLEET_CHECKPOINT"]) for e in trail] == [
        ("checkpointed", "1"),
        ("checkpointed", "2"),
        ("suspended", "2"),
        ("resumed", "2"),
    ]
    assert trail[0]["FLEET_BY"] == "agent" and trail[0]["SYSLOG_IDENTIFIER"] == "fleet-ask"
    assert [e["MESSAGE_ID"] for e in trail] == [
        MSG_CHECKPOINTED,
        MSG_CHECKPOINTED,
        MSG_SUSPENDED,
        MSG_RESUMED,
    ]
    assert all(e["FLEET_BY"] == PERSON for e in trail[1:])


def test_a_resume_whose_session_is_gone_starts_afresh_from_the_summary(
    box: Box, server: Server, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex
    task_id = suspended_at_work(box, key)
    session = box.show(task_id)["attempt_log"][0]["session_id"]
    (transcript,) = (tmp_path / "claude-home" / ".claude" / "projects").glob(f"*/{session}.jsonl")
    transcript.unlink()
    calls_before = len(server.calls(key))
    box("resume", task_id, "--from", "1")
    assert box.wait(task_id) == 0
    task = box.show(task_id)
    assert (task["status"], task["reason"]) == ("done", "fresh-summary-ok")
    # One attempt: the failed resume and the fresh session, no failure counted.
    assert [a["outcome"] for a in task["attempt_log"]] == ["suspended", "success"]
    assert task["failures"] == 0 and task["attempt_log"][1]["session_id"] != session
    fresh = server.calls(key)[calls_before]
    assert anthropic.commands(fresh) == [] and anthropic.CHECKPOINT_SUMMARY in json.dumps(fresh)
    journal = box.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert f"session {session} could not be resumed" in journal


def test_dispatched_task_runs_to_done_under_the_standard_sandbox(box: Box) -> None:
    box("config", "set", "coders.claude.sandbox=standard")
    task_id = box.add("FLEET-SCENARIO:shell")
    assert box.wait(task_id) == 0
    task = box.show(task_id)
    assert task["status"] == "done", task
    assert (box.project / "fleet_out.txt").exists()
    unit = f"fleet-task@{task_id}.service"
    (started,) = box.box.journal("-u", unit, f"MESSAGE_ID={MSG_STARTED}")
    assert started["FLEET_SANDBOX"] == "standard"
    journal = box.box.run("journalctl", "-u", unit, "-o", "cat").stdout
    assert f"→ Bash: {anthropic.WRITE_COMMAND}" in journal and "result (ok)" in journal
