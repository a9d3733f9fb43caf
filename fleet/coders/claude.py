"""The `claude` coder: Claude Code in headless mode, reading its `stream-json` output.

Command line::

    claude --print --output-format stream-json --verbose --dangerously-skip-permissions
           --mcp-config TASK_DIR/claude-mcp.json [--model M] [--resume SESSION] [ARGS...]
           -- PROMPT

(`stream-json` needs `--verbose`; `--resume` continues the session of a suspended attempt, which
works only from the same directory and with the same config directory, as every attempt of a
task has; the prompt comes last, after `--`, so that no variadic option in ARGS, such as
`--allowedTools A B`, can swallow it; a prompt over 100 kB, which Linux would refuse as one
argument, is replaced by a pointer to the prompt file.) The runner's working
directory is the task's: Claude Code has no flag for it.

Where its state lives. Claude Code keeps the login (`~/.claude/.credentials.json`, or the
`ANTHROPIC_API_KEY` of the environment), its settings and its session transcripts
(`projects/<cwd>/<session>.jsonl`) under `CLAUDE_CONFIG_DIR`, by default `~/.claude` and
`~/.claude.json`. fleet leaves all of that alone: each task runs with the user's own login and
settings, and its session lands where `claude --resume SESSION`, run by the user in the task's
directory, finds it (fleet records the session id on the attempt). A private config directory
per task would have meant copying credentials around and sessions nobody could resume. Only what
is per run goes to the task's directory: `claude-mcp.json` (the MCP entry below) and
`claude-tmp/` as `CLAUDE_CODE_TMPDIR` (the CLI's scratch files and background task output, and
its socket when `XDG_RUNTIME_DIR` is unset and the path fits a socket's 103 bytes, else
`/tmp/cc-socks-UID`), so they go when the task's directory does. `[coders.claude] env` may
still set `HOME` or `CLAUDE_CONFIG_DIR` for a separate account.

The environment also caps the CLI's own retries (`CLAUDE_CODE_MAX_RETRIES=2`: with an API key a
429 is otherwise retried ten times over about three minutes; with two it surfaces within seconds,
more if the server sends a longer `retry-after`), turns off the self-updater (the version that
`fleet doctor` checked is the one that runs), and as root sets `IS_SANDBOX=1`, without which
`--dangerously-skip-permissions` refuses to start. `[coders.claude] env` overrides any of them.

MCP: `claude-mcp.json` names one stdio server, `fleet`, which is `fleet-ask` from the directory
of the running `fleet-run`, with the task id and `FLEET_HOME`. It is not `--strict-mcp-config`:
the user's own MCP servers still load (add the flag to `args` to exclude them). Its tool-call
timeout is 2^31-1 ms (about 24 days), the most every timer takes, so a person may take hours to
answer. A server that fails to start is reported as failed in the `init` line and the run goes
on without its tools.

Stopping: SIGINT. Claude Code then kills the running tool (which runs in a session of its own,
out of reach of a signal to the process group), prints a `result` with `terminal_reason`
`aborted_tools` and exits (status 0 in 2.1.332, 1 in 2.1.197); on SIGTERM it exits 143 without
a `result`. Such an aborted result is a kill, not a failure.

Tokens: the per-message usage in `assistant` lines is provisional (its output count is the one
from `message_start`), so `usage` events add it up per message id only as an estimate for the
status line; the final `result` gives the run's true totals (`modelUsage`, summed over models,
else `usage`). tokens_in counts every input token the model read: uncached, cache writes and
cache reads. `context` is the last main-thread message's input plus its output: what the model
held at that turn.

Context window: 200000 tokens when a task names no model, the window of most Claude models. The
CLI's own default may be bigger (2.1.332 picks `claude-opus-5-5`, 1M tokens, with an API key),
in which case fleet stops early rather than too late; a task's model picks its window from
`context_limits`.

Rate limits: `rate_limit_event` lines (only under a claude.ai login) carry the status, reset and
window; a 429 without them (API key) becomes a `rejected` rate limit when the CLI gives up, from
the `rate_limit` error of its synthetic message or the result's `api_error_status`. Each
`api_retry` line is a `retry` event: a retry that works is not a rate limit.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.coders.base import Coder, CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.fsutil import write_atomic
from fleet.paths import program

MCP_FILE = "claude-mcp.json"
TMP_DIR = "claude-tmp"
MCP_TIMEOUT_MS = 2**31 - 1
MAX_RETRIES = "2"
SHORT = 300  # characters of a tool call's input in its event
LONGER = 2000  # characters of a tool result in its event
# Exit statuses of a process that died of (or exited for) a stop signal.
SIGNAL_EXITS = frozenset(
    128 + s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
)
# Linux refuses a single argument over 128 KiB (MAX_ARG_STRLEN); a longer prompt is passed as
# a pointer to the prompt file instead.
PROMPT_ARG_MAX = 100_000
_DECODE = json.JSONDecoder().raw_decode
INPUT_KEYS = ("command", "file_path", "path", "pattern", "url", "query", "description", "prompt")


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _short(text: str, limit: int, one_line: bool = True) -> str:
    text = " ".join(text.split()) if one_line else text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text_of(content: object) -> str:
    """The text in a message or tool-result content: a string or a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_str(_dict(b).get("text")) for b in content]
        return "\n".join(p for p in parts if p)
    return ""


def _input_summary(value: object) -> str:
    data = _dict(value)
    for key in INPUT_KEYS:
        text = data.get(key)
        if isinstance(text, str) and text.strip():
            return _short(text, SHORT)
    return _short(json.dumps(value, ensure_ascii=False), SHORT) if data else ""


def _input_tokens(usage: Mapping[str, Any], camel: bool = False) -> int:
    if camel:
        return (
            _int(usage.get("inputTokens"))
            + _int(usage.get("cacheCreationInputTokens"))
            + _int(usage.get("cacheReadInputTokens"))
        )
    return (
        _int(usage.get("input_tokens"))
        + _int(usage.get("cache_creation_input_tokens"))
        + _int(usage.get("cache_read_input_tokens"))
    )


def _json(line: str) -> Any:
    """`json.loads(line)`, without its wrapper's cost when the line is one JSON value and no
    more, as every line of the stream is (anything else goes through `json.loads` itself)."""
    try:
        value, end = _DECODE(line)
    except ValueError:
        return json.loads(line)
    return value if end == len(line) else json.loads(line)


def _epoch(value: object) -> float | None:
    number = _number(value)
    if number is None or number <= 0:
        return None
    return number / 1000 if number > 1e11 else number  # milliseconds, just in case


def ask_command() -> str:
    """`fleet-ask` next to the running program (fleet-run)."""
    return program("fleet-ask")


class ClaudeCoder(Coder):
    name = "claude"
    default_binary = "claude"
    stop_signal = signal.SIGINT
    default_context = 200_000
    tested_versions = ("2.1.332",)
    resumes = True

    def __init__(self, settings: CoderSettings) -> None:
        super().__init__(settings)
        # What this attempt's stream said so far (a coder instance lives for one attempt).
        self._tools: dict[str, str] = {}  # tool_use id -> tool name
        self._messages: set[str] = set()  # message ids whose usage is counted
        self._tokens_in = 0
        self._tokens_out = 0
        self._rejected = False  # a rejected rate limit was reported
        self._aborted = False  # the result says a person (or fleet) interrupted it
        self._last_error = ""

    # ------------------------------------------------------------------ the command

    def argv(self, run: RunSpec) -> list[str]:
        argv = [
            self.binary,
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--mcp-config",
            str(run.task_dir / MCP_FILE),
        ]
        model = self.model(run)
        if model:
            argv += ["--model", model]
        if run.resume:
            argv += ["--resume", run.resume]
        prompt = run.prompt
        if len(prompt.encode()) > PROMPT_ARG_MAX:
            prompt = (
                f"Your task is too long for a command line: it is in {run.prompt_file}."
                " Read that file first and do what it says."
            )
        return [*argv, *self.settings.args, "--", prompt]

    def environ(self, run: RunSpec) -> dict[str, str]:
        env = {
            "CLAUDE_CODE_MAX_RETRIES": MAX_RETRIES,
            "CLAUDE_CODE_TMPDIR": str(run.task_dir / TMP_DIR),
            "DISABLE_AUTOUPDATER": "1",
        }
        if os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"
        env.update(self.settings.env)
        return env

    def prepare(self, run: RunSpec) -> None:
        (run.task_dir / TMP_DIR).mkdir(mode=0o700, exist_ok=True)
        env = {"FLEET_TASK_ID": run.task_id}
        if os.environ.get("FLEET_HOME"):
            env["FLEET_HOME"] = os.environ["FLEET_HOME"]
        server = {
            "type": "stdio",
            "command": ask_command(),
            "args": [],
            "env": env,
            "timeout": MCP_TIMEOUT_MS,
        }
        config = {"mcpServers": {"fleet": server}}
        write_atomic(run.task_dir / MCP_FILE, (json.dumps(config, indent=2) + "\n").encode())

    # ------------------------------------------------------------------ the stream

    def parse(self, line: str) -> Sequence[Event]:
        try:
            obj = _json(line)
        except (ValueError, RecursionError):
            return (Event(Kind.RAW, line),)
        if not isinstance(obj, dict):
            return (Event(Kind.RAW, line),)
        try:
            return self._parse(obj, line)
        except Exception:  # a shape nobody foresaw: keep the line, never end the attempt
            return (Event(Kind.RAW, line),)

    def _parse(self, obj: dict[str, Any], line: str) -> Sequence[Event]:
        kind = obj.get("type")
        error = obj.get("error")
        if kind == "assistant" and isinstance(error, str) and error:
            return self._api_error(error, _dict(obj.get("message")).get("content"))
        if kind in ("assistant", "user") and not isinstance(obj.get("message"), dict):
            return (Event(Kind.RAW, line),)
        if kind == "assistant":
            return self._assistant(obj)
        if kind == "user":
            return self._user(obj)
        if kind == "result":
            return self._result(obj)
        if kind == "rate_limit_event":
            return self._rate_limit(_dict(obj.get("rate_limit_info")))
        if kind == "system":
            return self._system(obj, line)
        if kind == "stream_event":
            return ()  # partial messages: the whole message follows as an `assistant` line
        return (Event(Kind.RAW, line),)

    def _system(self, obj: dict[str, Any], line: str) -> Sequence[Event]:
        sub = obj.get("subtype")
        if sub == "init":
            sid = _str(obj.get("session_id")) or None
            text = f"session {sid}"
            if obj.get("model"):
                text += f" ({obj['model']})"
            servers = [_dict(s) for s in obj.get("mcp_servers") or [] if isinstance(s, dict)]
            if servers:
                text += "; MCP " + ", ".join(f"{s.get('name')} {s.get('status')}" for s in servers)
            return (Event(Kind.SESSION, text, session=sid),)
        if sub == "api_retry":
            status = obj.get("error_status")
            delay = (_number(obj.get("retry_delay_ms")) or 0) / 1000
            text = (
                f"API error {status if status is not None else '(no connection)'}"
                f" ({_str(obj.get('error')) or 'unknown'}): retry {obj.get('attempt')}"
                f"/{obj.get('max_retries')} in {delay:.1f} s"
            )
            return (Event(Kind.RETRY, text),)
        if sub == "status":
            return ()
        if sub == "compact_boundary":
            meta = _dict(obj.get("compact_metadata"))
            text = f"context compacted ({_str(meta.get('trigger')) or 'auto'}"
            if _int(meta.get("pre_tokens")):
                text += f", {_int(meta.get('pre_tokens'))} tokens before"
            return (Event(Kind.RAW, text + ")"),)
        if sub in ("task_started", "task_notification"):
            what = _str(obj.get("description")) or _str(obj.get("summary"))
            state = _str(obj.get("status")) or "started"
            return (Event(Kind.RAW, f"task {obj.get('task_id')} {state}: {what}"),)
        return (Event(Kind.RAW, line),)

    def _api_error(self, error: str, content: object) -> Sequence[Event]:
        """The synthetic message the CLI prints when it gives up on an API error."""
        text = _text_of(content) or error
        events = [self._error(text)] if text != self._last_error else []
        if error == "rate_limit" and not self._rejected:
            events.insert(0, self._rejection(text))
        return events

    def _assistant(self, obj: dict[str, Any]) -> Sequence[Event]:
        message = _dict(obj.get("message"))
        content = message.get("content")
        events = []
        for block in content if isinstance(content, list) else []:
            block = _dict(block)
            kind = block.get("type")
            if kind == "text":
                text = _str(block.get("text"))
                if text.strip():
                    events.append(Event(Kind.TEXT, text))
            elif kind == "tool_use":
                name = _str(block.get("name")) or "tool"
                self._tools[_str(block.get("id"))] = name
                events.append(Event(Kind.TOOL_CALL, _input_summary(block.get("input")), tool=name))
        usage = self._usage(message, main=obj.get("parent_tool_use_id") is None)
        if usage is not None:
            events.append(usage)
        return events

    def _usage(self, message: dict[str, Any], main: bool) -> Event | None:
        """A usage event the first time a message id is seen; None after that."""
        usage = _dict(message.get("usage"))
        ident = _str(message.get("id"))
        if not usage or not ident or ident in self._messages:
            return None
        self._messages.add(ident)
        read, wrote = _input_tokens(usage), _int(usage.get("output_tokens"))
        if read == 0 and wrote == 0:
            return None
        self._tokens_in += read
        self._tokens_out += wrote
        return Event(
            Kind.USAGE,
            tokens_in=self._tokens_in,
            tokens_out=self._tokens_out,
            context=read + wrote if main else None,
        )

    def _user(self, obj: dict[str, Any]) -> Sequence[Event]:
        content = _dict(obj.get("message")).get("content")
        if not isinstance(content, list):
            text = _text_of(content)
            return (Event(Kind.RAW, text),) if text else ()
        events = []
        for block in content:
            block = _dict(block)
            if block.get("type") == "tool_result":
                tool = self._tools.get(_str(block.get("tool_use_id")))
                text = _short(_text_of(block.get("content")), LONGER, one_line=False)
                error = block.get("is_error") is True
                events.append(Event(Kind.TOOL_RESULT, text, tool=tool, is_error=error))
            elif _str(block.get("text")):
                events.append(Event(Kind.RAW, _str(block.get("text"))))
        return events

    def _rate_limit(self, info: dict[str, Any]) -> Sequence[Event]:
        status = _str(info.get("status")) or None
        window = _str(info.get("rateLimitType")) or None
        utilization = _number(info.get("utilization"))
        if utilization is None and window:
            windows = _dict(info.get("unifiedWindows"))
            utilization = _number(_dict(windows.get(window)).get("utilization"))
        resets = _epoch(info.get("resetsAt"))
        if status == "rejected":
            self._rejected = True
        text = f"rate limit {status or 'unknown'}"
        if window:
            text += f" ({window})"
        if utilization is not None:
            text += f", {utilization:.0%} used"
        if resets is not None:
            text += ", resets " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resets))
        return (
            Event(
                Kind.RATE_LIMIT,
                text,
                rate_status=status,
                resets_at=resets,
                utilization=utilization,
                limit_type=window,
            ),
        )

    def _rejection(self, text: str) -> Event:
        """A 429 the stream reports without structured rate-limit information."""
        self._rejected = True
        return Event(Kind.RATE_LIMIT, f"rate limit rejected: {text}", rate_status="rejected")

    def _error(self, text: str) -> Event:
        self._last_error = text
        return Event(Kind.ERROR, text)

    def _result(self, obj: dict[str, Any]) -> Sequence[Event]:
        is_error = obj.get("is_error") is True
        errors = [e for e in obj.get("errors") or [] if isinstance(e, str)]
        text = _str(obj.get("result")) or "; ".join(errors) or _str(obj.get("subtype"))
        if _str(obj.get("terminal_reason")).startswith("aborted"):
            self._aborted = True
        tokens_in, tokens_out = self._tokens_in, self._tokens_out
        models = [_dict(m) for m in _dict(obj.get("modelUsage")).values()]
        usage = _dict(obj.get("usage"))
        if models:
            tokens_in = sum(_input_tokens(m, camel=True) for m in models)
            tokens_out = sum(_int(m.get("outputTokens")) for m in models)
        elif usage:
            tokens_in, tokens_out = _input_tokens(usage), _int(usage.get("output_tokens"))
        events = []
        if is_error and obj.get("api_error_status") == 429 and not self._rejected:
            events.append(self._rejection(text))
        if is_error and text and text != self._last_error:
            events.append(self._error(text))
        events.append(
            Event(
                Kind.RESULT,
                text,
                session=_str(obj.get("session_id")) or None,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=_number(obj.get("total_cost_usd")),
                is_error=is_error,
            )
        )
        return events

    # ------------------------------------------------------------------ the end

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        """`result.is_error` decides when there is a result (not the exit status: an
        interrupted run exits 0 or 1 with an error result); without one, a signal exit is a
        kill and anything else a failure."""
        if tally.result_seen and not tally.result_error:
            return Verdict.SUCCESS
        if self._rejected or tally.rate_status == "rejected":
            return Verdict.RATE_LIMITED
        if tally.result_seen:
            return Verdict.KILLED if self._aborted else Verdict.FAILURE
        if returncode < 0 or returncode in SIGNAL_EXITS:
            return Verdict.KILLED
        return Verdict.FAILURE
