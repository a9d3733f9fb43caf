"""The `claude` coder: Claude Code in headless mode, reading its `stream-json` output.

Command line::

    claude --print --output-format stream-json --verbose --dangerously-skip-permissions
           --mcp-config TASK_DIR/claude-mcp.json [--model M] [--resume SESSION] [ARGS...]
           < TASK_DIR/prompt.md

(`stream-json` needs `--verbose`; `--resume` continues the session of a suspended attempt, which
works only from the same directory and with the same config directory, as every attempt of a
task has; the prompt is standard input, which `--print` reads when no prompt argument is given:
on the command line any local user could read it in /proc/PID/cmdline, a variadic option in
ARGS such as `--allowedTools A B` could swallow it, and Linux refuses one argument over 128 KiB.)
The runner's working directory is the task's: Claude Code has no flag for it.

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

Messages: `claude-settings.json` (`--settings`, added to the user's own) holds a PostToolUse
hook that, when the task's mail sentinel is there, runs `fleet-ask --deliver`, whose output
adds the messages sent to the task to the result of the tool the agent just ran; so a message
reaches a working agent with its next tool call of any kind.

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
status line, one call per message (its model, uncached input, cache reads and writes, which are
final, and the provisional output); the final `result` gives the run's true totals in `usage`,
and the calls are then made to add up to them (the rest of the output is spread over the calls,
tokens no message showed become one call more). tokens_in counts every input token the model
read: uncached, cache writes and cache reads. `context` is the last main-thread message's input
plus its output: what the model held at that turn.

A resumed session (`--resume`): `usage` still covers this run alone, but 2.1.332 reports
`modelUsage` and `total_cost_usd` for the whole session whenever it restored the session's cost
state (it does when the session was the directory's last one). So the cost is this run's only
when `modelUsage` adds up to `usage`; otherwise it is the session's, and this attempt's share is
what it grew by since the attempt that last ran the session ended (`RunSpec.baseline`, which
`session_totals` gave then), if that share adds up to `usage`; failing both, the coder reports
no cost and fleet estimates it from the price table. A model's reported cost is spread over its
calls by Anthropic's rates relative to input (output 5, cache write 1.25, cache read 0.1), the
same for every Claude model.

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
from pathlib import Path
from typing import Any

from fleet.coders.base import Call, Coder, CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.fsutil import write_atomic
from fleet.paths import program
from fleet.taskdir import MAIL

MCP_FILE = "claude-mcp.json"
SETTINGS_FILE = "claude-settings.json"  # --settings: the hook that delivers messages
TMP_DIR = "claude-tmp"
MCP_TIMEOUT_MS = 2**31 - 1
MAX_RETRIES = "2"
SHORT = 300  # characters of a tool call's input in its event
LONGER = 2000  # characters of a tool result in its event
# Exit statuses of a process that died of (or exited for) a stop signal.
SIGNAL_EXITS = frozenset(
    128 + s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
)
_DECODE = json.JSONDecoder().raw_decode
INPUT_KEYS = ("command", "file_path", "path", "pattern", "url", "query", "description", "prompt")
# Anthropic's price of each token kind relative to uncached input, alike for every Claude model:
# how a model's reported cost is spread over its calls.
RELATIVE_PRICE = {"output": 5.0, "cache_read": 0.1, "cache_write": 1.25}


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


def hook_settings(task_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Settings with a PostToolUse hook that hands the agent the messages sent to its task
    with the result of whatever tool it ran (fleet's own tools bring them themselves): the
    shell tests the task's mail sentinel, so a call with no mail starts no Python."""
    import shlex

    mail = shlex.quote(str(task_dir / MAIL))
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = f"test -e {mail} || exit 0; {assign} exec {shlex.quote(ask_command())} --deliver"
    return {
        "hooks": {
            "PostToolUse": [{"matcher": "", "hooks": [{"type": "command", "command": command}]}]
        }
    }


class ClaudeCoder(Coder):
    name = "claude"
    default_binary = "claude"
    stop_signal = signal.SIGINT
    default_context = 200_000
    tested_versions = ("2.1.332",)
    resumes = True
    prompt_on_stdin = True

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
        self._calls: dict[str, Call] = {}  # this run's calls, by message id
        self._model: str | None = None  # the session's model, from `init`
        self._baseline: dict[str, Any] = {}  # the session's totals before this run
        self._totals: dict[str, object] | None = None  # the session's, as the result said

    # ------------------------------------------------------------------ the command

    def argv(self, run: RunSpec) -> list[str]:
        self._baseline = dict(run.baseline or {}) if run.resume else {}
        argv = [
            self.binary,
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--mcp-config",
            str(run.task_dir / MCP_FILE),
            "--settings",
            str(run.task_dir / SETTINGS_FILE),
        ]
        model = self.model(run)
        if model:
            argv += ["--model", model]
        if run.resume:
            argv += ["--resume", run.resume]
        return [*argv, *self.settings.args]

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
        write_atomic(
            run.task_dir / SETTINGS_FILE,
            (json.dumps(hook_settings(run.task_dir, env), indent=2) + "\n").encode(),
        )

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
                self._model = _str(obj.get("model")) or None
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
        call = Call(
            ident,
            _str(message.get("model")) or self._model,
            input=_int(usage.get("input_tokens")),
            output=wrote,
            cache_read=_int(usage.get("cache_read_input_tokens")),
            cache_write=_int(usage.get("cache_creation_input_tokens")),
        )
        self._calls[ident] = call
        return Event(
            Kind.USAGE,
            tokens_in=self._tokens_in,
            tokens_out=self._tokens_out,
            context=read + wrote if main else None,
            calls=(call,),
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
        models = {str(k): _dict(m) for k, m in _dict(obj.get("modelUsage")).items()}
        usage = _dict(obj.get("usage"))
        if usage:  # this run's own, resumed or not
            tokens_in, tokens_out = _input_tokens(usage), _int(usage.get("output_tokens"))
        elif models:
            tokens_in = sum(_input_tokens(m, camel=True) for m in models.values())
            tokens_out = sum(_int(m.get("outputTokens")) for m in models.values())
        total = _number(obj.get("total_cost_usd"))
        self._totals = {"cost": total, "models": models}
        own = self._own_share(models, total, tokens_in + tokens_out)
        calls = self._settled_calls(usage, own[1])
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
                cost=own[0],
                is_error=is_error,
                calls=calls,
            )
        )
        return events

    def _own_share(
        self, models: dict[str, dict[str, Any]], total: float | None, tokens: int
    ) -> tuple[float | None, dict[str, float]]:
        """This run's cost and its cost by model, from the result's (see the module's doc)."""

        def size(model: Mapping[str, Any]) -> int:
            return _input_tokens(model, camel=True) + _int(model.get("outputTokens"))

        def costs(of: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
            return {k: _number(m.get("costUSD")) or 0.0 for k, m in of.items()}

        if sum(size(m) for m in models.values()) == tokens:
            return total, costs(models)
        base_models = {str(k): _dict(m) for k, m in _dict(self._baseline.get("models")).items()}
        base_cost = _number(self._baseline.get("cost"))
        if total is None or base_cost is None or not base_models:
            return None, {}
        grown: dict[str, dict[str, Any]] = {}
        for name, model in models.items():
            before = base_models.get(name, {})
            grown[name] = {
                key: (_number(model.get(key)) or 0) - (_number(before.get(key)) or 0)
                for key in (
                    "inputTokens",
                    "outputTokens",
                    "cacheReadInputTokens",
                    "cacheCreationInputTokens",
                    "costUSD",
                )
            }
        sized = sum(
            int(m["inputTokens"] + m["outputTokens"])
            + int(m["cacheReadInputTokens"] + m["cacheCreationInputTokens"])
            for m in grown.values()
        )
        if sized != tokens or total < base_cost:
            return None, {}
        return max(0.0, total - base_cost), {k: max(0.0, v) for k, v in costs(grown).items()}

    def _settled_calls(
        self, usage: Mapping[str, Any], model_costs: Mapping[str, float]
    ) -> tuple[Call, ...]:
        """This run's calls, made to add up to the result's `usage`, with its reported cost by
        model spread over them."""
        calls = list(self._calls.values())
        if usage:
            main = self._model or next((c.model for c in calls if c.model), None)
            rest = Call(
                "result",
                main,
                input=_int(usage.get("input_tokens")) - sum(c.input for c in calls),
                output=0,
                cache_read=_int(usage.get("cache_read_input_tokens"))
                - sum(c.cache_read for c in calls),
                cache_write=_int(usage.get("cache_creation_input_tokens"))
                - sum(c.cache_write for c in calls),
            )
            if min(rest.input, rest.cache_read, rest.cache_write) >= 0 and (
                rest.input or rest.cache_read or rest.cache_write
            ):
                calls.append(rest)
            more = _int(usage.get("output_tokens")) - sum(c.output for c in calls)
            if more > 0 and calls:
                share, extra = divmod(more, len(calls))
                calls = [
                    c._replace(output=c.output + share + (extra if i == len(calls) - 1 else 0))
                    for i, c in enumerate(calls)
                ]
        if model_costs:

            def weight(c: Call) -> float:
                rest = c.output * RELATIVE_PRICE["output"]
                rest += c.cache_read * RELATIVE_PRICE["cache_read"]
                return c.input + rest + c.cache_write * RELATIVE_PRICE["cache_write"]

            spread = []
            for model, cost in model_costs.items():
                mine = [c for c in calls if (c.model or "").split("[")[0] == model.split("[")[0]]
                weights = sum(weight(c) for c in mine)
                spread += [
                    c._replace(cost=cost * weight(c) / weights if weights else 0.0) for c in mine
                ]
            if len(spread) == len(calls):
                calls = spread
        return tuple(calls)

    def session_totals(self) -> dict[str, object] | None:
        return self._totals

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
