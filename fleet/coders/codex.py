"""The `codex` coder: OpenAI's Codex CLI (`codex exec --json`), verified with codex-cli 0.171.0.

Command: `codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox
-C CWD [-m MODEL] -c … -o TASK_DIR/codex-last-message.md [ARGS…] -- - < TASK_DIR/prompt.md`:
the prompt `-` is read from standard input, the prompt file, which ends (codex waits for the
end of its standard input), and is kept off the command line, which any local user can read in
/proc/PID/cmdline. Nothing extra is needed as root.

Where codex's state lives. Under `$CODEX_HOME` (default `~/.codex`) codex keeps the user's login
(`auth.json`, or the OS keyring), their `config.toml` (model provider, profiles, MCP servers),
global `AGENTS.md`, prompts, skills and rules, and its session store
(`sessions/YYYY/MM/DD/rollout-*-<thread id>.jsonl` plus SQLite indexes). fleet runs codex in the
user's own `$CODEX_HOME` (the one `[coders.codex] env` names, else fleet's environment's) and
writes nothing there itself. A per-task home would have to mirror all of that: a link to
`auth.json` would follow token refreshes (codex rewrites the file in place), but a keyring login,
the settings and the rest would not. So the user's login and settings apply as they are, and
every attempt's session lands in the user's own store, resumable with `codex exec resume <thread
id>` (fleet records the id as the attempt's session). codex runs sessions side by side in one
home (checked: six at once). What fleet sets per task rides on the command line as `-c`
overrides, which codex layers over `config.toml` for that process only:

* `mcp_servers.fleet`: `fleet-ask` (next to the running fleet-run) with FLEET_TASK_ID and
  FLEET_HOME, not required, and `tool_timeout_sec` of 24.8 days instead of codex's 300 s (as
  long as the other coders allow, above any question_timeout_seconds), so a person can take
  hours to answer; `mcp_optional_startup_grace_ms` lets the first model request wait (at most
  10 s) for it, which codex otherwise sends before optional servers are up. A server that fails
  to start is dropped silently: nothing on stdout or stderr, and the task runs without the tool.
* `model_providers.<id>.stream_max_retries=0`, only when the provider in use is one the user
  defined (codex refuses to start if a built-in one, `openai`, `ollama`, `lmstudio`,
  `amazon-bedrock`, is named, or an undefined one). That budget is what codex spends on a 429,
  each retry after the server's Retry-After; with 0 the first 429 ends the turn in well under a
  second. `request_max_retries` (5xx and connection errors, not 429) keeps codex's default. With a
  built-in provider codex's own budget applies: five retries.
* `allow_login_shell=false`: codex runs commands in `bash -lc` by default, and a login shell
  re-reads /etc/profile, which on Debian and Ubuntu resets PATH: fleet's bin directory, which the
  runner puts first, is gone and the agent's `fleet close` is "command not found". Commands get
  exactly the task's environment instead.

The only per-task file is `TASK_DIR/codex-last-message.md`, codex's last message of the attempt.

Stream. `thread.started` (session id), `item.started`/`item.completed` (`command_execution`,
`mcp_tool_call`, `agent_message`, non-fatal `error` items, …), `error` (`Reconnecting… n/m` is a
retry), `turn.completed` (usage, cumulative over the thread; no cost) and `turn.failed`. Usage
during the turn, the context size and the provider's rate-limit windows (from `x-codex-*`
headers) appear only in the session's rollout file, which `parse` reads on as lines arrive:
`token_usage_record` lines give each call's own usage (one call per line: its input, cached
input, cache writes and output, reasoning included) and the thread's totals after it,
`turn_context` lines the model, `token_count` lines the windows. A resumed thread (`exec
resume`) appends to the same rollout file and reports the whole thread's usage: the coder reads
only what the file gains after the resume starts, and the thread's totals before this run are
those of its first new record less that record's call, so every figure is this attempt's own. A
429 shows as `… last status: 429 Too Many Requests` (no reset time) or "You've hit your usage
limit … try again at 1:37 PM" (the rollout then holds the exact reset); both become a rejected
rate limit, while a 429 that codex still retries (`Reconnecting… (… 429 …)`) is a retry and a
warning. codex also compacts its history by itself when a call's usage nears the window it
assumes (it did after a call of 250,000 input tokens, with 258,400 assumed for an unknown model;
a compaction request is one without tools); fleet's context pressure stops it first only if the
window fleet knows for the model is smaller than codex's.

Stop: SIGINT, on which codex kills its running tool and what that started (tools run in a
terminal of their own session, out of reach of a signal to codex's process group) and exits 1.
On SIGTERM codex dies at once: the shell it ran dies with it, but what that shell started lives
on, re-parented to init, unless the hangup of its terminal ends it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import re
import shlex
import signal
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.coders.base import Call, Coder, CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.paths import program

MCP_NAME = "fleet"
ASK_TIMEOUT_S = 2_147_483.0  # 24.8 days, as the other coders: above question_timeout_seconds
MCP_GRACE_MS = 10_000
LAST_MESSAGE = "codex-last-message.md"
BUILTIN_PROVIDERS = frozenset({"openai", "ollama", "lmstudio", "amazon-bedrock", "oss"})
SHORT = 200
LONG = 2000
WARN_PCT = 75.0  # where codex's own terminal UI starts warning about a window
SEVERITY = ("allowed", "allowed_warning", "rejected")
WINDOWS = {300: "five_hour", 10080: "seven_day"}  # window_minutes -> fleet's limit_type
LIMITED = re.compile(
    r"\b429\b|too many requests|usage limit|quota exceeded|rate.?limit", re.IGNORECASE
)
RETRYING = re.compile(r"^Reconnecting\.\.\.\s*\d+/\d+")
TRY_AGAIN = re.compile(
    r"try again at (?:(?P<mon>[A-Z][a-z]{2}) (?P<day>\d{1,2})(?:st|nd|rd|th)?, (?P<year>\d{4}) )?"
    r"(?P<hour>\d{1,2}):(?P<minute>\d{2}) ?(?P<ampm>[AP]M)",
    re.IGNORECASE,
)
SHELLS = ("bash", "sh", "zsh")
# The rollout lines the coder reads (any other line is skipped without parsing it).
ROLLOUT_WORDS = (b'"token_usage_record"', b'"token_count"', b'"turn_context"')
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _num(value: object) -> float | None:
    """A finite JSON number, else None (json.loads takes Infinity, NaN and any integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else None
    return value if math.isfinite(value) else None


def _int(value: object) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def _short(text: str, limit: int = SHORT) -> str:
    text = " ".join(text.split()) if limit <= SHORT else text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _command(command: object) -> str:
    """`/bin/bash -lc 'ls -l'` -> `ls -l`: the part the model wrote."""
    text = " ".join(map(str, command)) if isinstance(command, list) else _str(command)
    try:
        words = shlex.split(text)
    except ValueError:
        return text
    shell = words[0].rsplit("/", 1)[-1] if words else ""
    if len(words) == 3 and words[1] in ("-c", "-lc") and shell in SHELLS:
        return words[2]
    return text


def _toml(value: object) -> str:
    """A TOML value for a `-c key=value` override (JSON strings are TOML basic strings)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def overrides(args: Sequence[str]) -> dict[str, object]:
    """The `-c key=value` pairs among codex arguments, values parsed as codex does."""
    found: dict[str, object] = {}
    items = list(args)
    for i, arg in enumerate(items):
        if arg in ("-c", "--config") and i + 1 < len(items):
            pair = items[i + 1]
        elif arg.startswith("--config="):
            pair = arg.removeprefix("--config=")
        elif arg.startswith("-c") and len(arg) > 2 and arg[2] != "-":
            pair = arg[2:]
        else:
            continue
        key, sep, raw = pair.partition("=")
        if not sep:
            continue
        try:
            value: object = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # codex takes what is not TOML as a literal string
        found[key.strip()] = value
    return found


def try_again_at(message: str, now: float | None = None) -> float | None:
    """The end of the minute in "… try again at 1:37 PM" (local time), as epoch seconds."""
    found = TRY_AGAIN.search(message)
    if found is None:
        return None
    now = time.time() if now is None else now
    hour = int(found["hour"]) % 12 + (12 if found["ampm"].upper() == "PM" else 0)
    local = time.localtime(now)
    year, month, day = local.tm_year, local.tm_mon, local.tm_mday
    if found["mon"]:
        if found["mon"].lower() not in MONTHS:
            return None
        year, month, day = (
            int(found["year"]),
            MONTHS.index(found["mon"].lower()) + 1,
            int(found["day"]),
        )
    try:
        at = time.mktime((year, month, day, hour, int(found["minute"]), 0, 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    if not found["mon"] and at + 60 < now - 60:
        at += 86_400  # a time of day already past: tomorrow's
    return at + 60  # codex prints whole minutes; the reset lies within that minute


class CodexCoder(Coder):
    name = "codex"
    default_binary = "codex"
    stop_signal = signal.SIGINT
    default_context = 272_000  # GPT-5-class input window; codex itself budgets 95% of it
    tested_versions = ("codex-cli 0.171.0",)
    resumes = True
    prompt_on_stdin = True

    def __init__(self, settings: CoderSettings) -> None:
        super().__init__(settings)
        self._home: Path | None = None  # set by prepare(): only a real attempt reads files
        self._thread: str | None = None
        self._rollout: Path | None = None
        self._offset = 0
        self._started: set[str] = set()
        self._usage: tuple[int | None, int | None, int | None] | None = None
        self._resumed = False
        self._base: tuple[int, int] | None = None  # the thread's (in, out) before this run
        self._model: str | None = None  # the model codex says it uses (turn_context)
        self._calls = 0
        self._windows: dict[str, tuple[str, float | None, float | None]] = {}
        self._rejected = False  # the provider refused during this attempt
        self._refused: tuple[float, float | None] | None = None  # last refusal: when, reset
        self._last_error = ""
        self._last_text = ""

    # ------------------------------------------------------------------ the command

    def codex_home(self) -> Path:
        """The `$CODEX_HOME` codex will use: its environment's, else ~/.codex."""
        env = {**os.environ, **self.settings.env}
        if env.get("CODEX_HOME"):
            return Path(env["CODEX_HOME"])
        home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
        return Path(home) / ".codex"

    def provider(self) -> tuple[str, bool]:
        """(id of the model provider codex will use, whether the user defined it)."""
        args = list(self.settings.args)
        if "--oss" in args:
            return "oss", False
        layers: list[dict[str, Any]] = []
        home = self.codex_home()
        files = [home / "config.toml"]
        for i, arg in enumerate(args):
            if arg in ("-p", "--profile") and i + 1 < len(args):
                files.append(home / f"{args[i + 1]}.config.toml")
            elif arg.startswith("--profile="):
                files.append(home / f"{arg.removeprefix('--profile=')}.config.toml")
        for path in files:
            try:
                with path.open("rb") as f:
                    layers.append(tomllib.load(f))
            except (OSError, tomllib.TOMLDecodeError):
                continue
        cli = overrides(args)
        chosen = "openai"
        defined: set[str] = set()
        for layer in layers:
            chosen = _str(layer.get("model_provider")) or chosen
            defined |= set(_dict(layer.get("model_providers")))
        chosen = _str(cli.get("model_provider")) or chosen
        for key in cli:
            parts = key.split(".")
            if parts[0] == "model_providers" and len(parts) > 1:
                defined.add(parts[1])
        return chosen, chosen in defined and chosen not in BUILTIN_PROVIDERS

    def mcp_entry(self, run: RunSpec) -> dict[str, object]:
        ask = program("fleet-ask")
        env = {"FLEET_TASK_ID": run.task_id}
        if os.environ.get("FLEET_HOME"):
            env["FLEET_HOME"] = os.environ["FLEET_HOME"]
        return {"command": ask, "args": [], "env": env, "tool_timeout_sec": ASK_TIMEOUT_S}

    def argv(self, run: RunSpec) -> list[str]:
        # `exec resume` continues a thread (from any directory: the runner's is the task's);
        # it has no -C.
        where = ["resume"] if run.resume else []
        argv = [
            self.binary,
            "exec",
            *where,
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            *([] if run.resume else ["-C", run.cwd]),
        ]
        model = self.model(run)
        if model:
            argv += ["-m", model]
        argv += ["-c", f"mcp_servers.{MCP_NAME}={_toml(self.mcp_entry(run))}"]
        argv += ["-c", f"mcp_optional_startup_grace_ms={MCP_GRACE_MS}"]
        argv += ["-c", "allow_login_shell=false"]  # keep the PATH fleet gives: see above
        provider, custom = self.provider()
        if custom and re.fullmatch(r"[A-Za-z0-9_-]+", provider):
            argv += ["-c", f"model_providers.{provider}.stream_max_retries=0"]
        argv += ["-o", str(run.task_dir / LAST_MESSAGE)]
        thread = [run.resume] if run.resume else []
        return [*argv, *self.settings.args, "--", *thread, "-"]

    def prepare(self, run: RunSpec) -> None:
        (run.task_dir / LAST_MESSAGE).unlink(missing_ok=True)  # a killed attempt leaves none
        self._home = self.codex_home()
        self._model = self.model(run)
        if run.resume:
            # The thread's rollout file holds the earlier runs: read only what this one adds.
            self._resumed = True
            self._thread = run.resume
            self._rollout = self.find_rollout(anywhen=True)
            if self._rollout is not None:
                with contextlib.suppress(OSError):
                    self._offset = self._rollout.stat().st_size

    # ------------------------------------------------------------------ the stream

    def parse(self, line: str) -> Sequence[Event]:
        try:
            obj = json.loads(line)
        except ValueError:
            return (Event(Kind.RAW, line),)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return (Event(Kind.RAW, line),)
        kind = obj["type"]
        events: list[Event] = []
        if kind == "thread.started" and _str(obj.get("thread_id")):
            self._thread = obj["thread_id"]
            return (Event(Kind.SESSION, session=self._thread),)
        if kind in ("turn.completed", "turn.failed"):
            events += self.rollout_events()
            events += self.end(obj)
            return events
        events += self.rollout_events()
        if kind == "turn.started":
            return events
        if kind in ("item.started", "item.updated", "item.completed"):
            found = self.item(kind, _dict(obj.get("item")))
            return events + (found if found is not None else [Event(Kind.RAW, line)])
        if kind == "error":
            return events + self.error(_str(obj.get("message")))
        return [*events, Event(Kind.RAW, line)]

    def item(self, kind: str, item: dict[str, Any]) -> list[Event] | None:
        """Events for one item line; None if it says nothing fleet understands."""
        what, key = _str(item.get("type")), _str(item.get("id"))
        started = kind != "item.completed"
        if what == "agent_message" and not started:
            self._last_text = _str(item.get("text"))
            return [Event(Kind.TEXT, self._last_text)]
        if what == "error" and not started:  # non-fatal: e.g. no metadata for the model
            return [Event(Kind.ERROR, _str(item.get("message")))]
        call = self.tool_call(what, item)
        if call is None:
            return None
        if started:
            if key in self._started:
                return []  # an update of a call already shown
            self._started.add(key)
            return [call]
        events = [] if key in self._started else [call]
        self._started.discard(key)
        return [*events, self.tool_result(what, item, call.tool)]

    @staticmethod
    def tool_call(what: str, item: dict[str, Any]) -> Event | None:
        if what == "command_execution":
            return Event(Kind.TOOL_CALL, _short(_command(item.get("command"))), tool="exec_command")
        if what == "mcp_tool_call":
            tool = f"mcp__{_str(item.get('server'))}__{_str(item.get('tool'))}"
            args = item.get("arguments")
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            return Event(Kind.TOOL_CALL, _short(text), tool=tool)
        if what == "file_change":
            changes = item.get("changes")
            paths = (
                [_str(_dict(c).get("path")) for c in changes] if isinstance(changes, list) else []
            )
            return Event(
                Kind.TOOL_CALL, _short(" ".join(p for p in paths if p)), tool="apply_patch"
            )
        if what == "web_search":
            return Event(Kind.TOOL_CALL, _short(_str(item.get("query"))), tool="web_search")
        return None

    @staticmethod
    def tool_result(what: str, item: dict[str, Any], tool: str | None) -> Event:
        status = _str(item.get("status"))
        failed = status in ("failed", "declined")
        text = ""
        if what == "command_execution":
            code = _int(item.get("exit_code"))
            failed = failed or (code is not None and code != 0)
            text = _str(item.get("aggregated_output")) or (
                f"exit {code}" if code is not None else ""
            )
        elif what == "mcp_tool_call":
            error = _str(_dict(item.get("error")).get("message")) or _str(item.get("error"))
            content = _dict(item.get("result")).get("content")
            parts = (
                [_str(_dict(c).get("text")) for c in content] if isinstance(content, list) else []
            )
            text = error or "\n".join(p for p in parts if p)
            failed = failed or bool(error)
        return Event(Kind.TOOL_RESULT, _short(text or status, LONG), tool=tool, is_error=failed)

    def error(self, message: str) -> list[Event]:
        if RETRYING.match(message):
            if LIMITED.search(message):  # refused, but codex tries again: pressure, no gate yet
                return [
                    Event(Kind.RETRY, message),
                    Event(Kind.RATE_LIMIT, message, rate_status="allowed_warning"),
                ]
            return [Event(Kind.RETRY, message)]
        self._last_error = message
        events = [Event(Kind.ERROR, message)]
        if LIMITED.search(message):
            events += self.rejected(message)
        return events

    def rejected(self, message: str) -> list[Event]:
        """The provider refused: a rejected rate limit, unless one was just reported."""
        events = self.rollout_events()  # the exact reset, when codex recorded one
        if self._refused is not None:
            when, resets = self._refused
            if time.time() - when < 60 or (resets is not None and resets > time.time()):
                return events
        at = try_again_at(message)
        self.refusal(at)
        return [*events, Event(Kind.RATE_LIMIT, message, rate_status="rejected", resets_at=at)]

    def refusal(self, resets: float | None) -> None:
        self._rejected = True
        self._refused = (time.time(), resets)

    def end(self, obj: dict[str, Any]) -> list[Event]:
        """The terminal line: the turn's totals and result, or its failure."""
        if obj["type"] == "turn.failed":
            message = _str(_dict(obj.get("error")).get("message")) or "turn failed"
            events = [] if message == self._last_error else self.error(message)
            return [*events, Event(Kind.RESULT, message, is_error=True)]
        usage = _dict(obj.get("usage"))
        tokens_in, tokens_out = self.own(
            _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        )
        parts = [f"tokens in {tokens_in} out {tokens_out}"]
        for key, label in (
            ("cached_input_tokens", "cached"),
            ("reasoning_output_tokens", "reasoning"),
        ):
            if _int(usage.get(key)) is not None:
                parts.append(f"{_int(usage.get(key))} {label}")
        context = self._usage[2] if self._usage else None
        text = _short(self._last_text, LONG)
        return [
            Event(
                Kind.USAGE,
                ", ".join(parts),
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                context=context,
            ),
            Event(Kind.RESULT, text, tokens_in=tokens_in, tokens_out=tokens_out),
        ]

    # ------------------------------------------------------------------ the rollout file

    def find_rollout(self, anywhen: bool = False) -> Path | None:
        """`sessions/YYYY/MM/DD/rollout-…-<thread>.jsonl`, looking only near today's date
        unless `anywhen` (a resumed thread may be older)."""
        if self._home is None or self._thread is None:
            return None
        if anywhen:
            found = sorted(self._home.glob(f"sessions/*/*/*/rollout-*-{self._thread}.jsonl"))
            return found[-1] if found else None
        now = time.time()
        days = {
            time.strftime("%Y/%m/%d", convert(t))
            for t in (now - 86_400, now, now + 86_400)
            for convert in (time.localtime, time.gmtime)
        }
        suffix = f"-{self._thread}.jsonl"
        for day in sorted(days):
            try:
                with os.scandir(self._home / "sessions" / day) as entries:
                    for entry in entries:
                        if entry.name.startswith("rollout-") and entry.name.endswith(suffix):
                            return Path(entry.path)
            except OSError:
                continue
        return None

    def leftover(self) -> Sequence[Event]:
        return self.rollout_events()

    def rollout_events(self) -> list[Event]:
        """Usage, context and rate-limit windows from the rollout lines written since last time."""
        if self._rollout is None:
            self._rollout = self.find_rollout()
            if self._rollout is None:
                return []
        try:
            with self._rollout.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offset += end + 1
        events: list[Event] = []
        for raw in chunk[:end].split(b"\n"):
            if any(word in raw for word in ROLLOUT_WORDS):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    events += self.rollout_line(obj)
        return events

    def rollout_line(self, obj: dict[str, Any]) -> list[Event]:
        payload = _dict(obj.get("payload"))
        if obj.get("type") == "turn_context":
            self._model = _str(payload.get("model")) or self._model
            return []
        if obj.get("type") == "token_usage_record":
            last = _dict(payload.get("usage"))
            call = self.call(last, _str(payload.get("response_id")))
            return self.usage(_dict(payload.get("thread_token_usage")), last, call)
        if obj.get("type") != "event_msg" or payload.get("type") != "token_count":
            return []
        info = _dict(payload.get("info"))
        events = self.usage(
            _dict(info.get("total_token_usage")), _dict(info.get("last_token_usage"))
        )
        return events + self.windows(_dict(payload.get("rate_limits")))

    def call(self, usage: dict[str, Any], response: str) -> Call:
        """One call's own tokens, from a `token_usage_record`'s usage (input counts the cached
        input and the cache writes; output counts the reasoning)."""
        self._calls += 1
        prompt = _int(usage.get("input_tokens")) or 0
        cached = _int(usage.get("cached_input_tokens")) or 0
        written = _int(usage.get("cache_write_input_tokens")) or 0
        return Call(
            response or f"call-{self._calls}",
            self._model,
            input=max(0, prompt - cached - written),
            output=_int(usage.get("output_tokens")) or 0,
            cache_read=cached,
            cache_write=written,
        )

    def own(self, tokens_in: int | None, tokens_out: int | None) -> tuple[int | None, int | None]:
        """This run's share of thread totals (a fresh thread's totals are all its own)."""
        if self._base is None:
            return (None, None) if self._resumed else (tokens_in, tokens_out)
        return (
            None if tokens_in is None else tokens_in - self._base[0],
            None if tokens_out is None else tokens_out - self._base[1],
        )

    def usage(
        self, total: dict[str, Any], last: dict[str, Any], call: Call | None = None
    ) -> list[Event]:
        tokens_in, tokens_out = _int(total.get("input_tokens")), _int(total.get("output_tokens"))
        last_in, last_out = _int(last.get("input_tokens")), _int(last.get("output_tokens"))
        if self._base is None and tokens_in is not None and last_in is not None:
            # The first call this run saw: the thread's totals before it are the run's start.
            self._base = (tokens_in - last_in, (tokens_out or 0) - (last_out or 0))
        tokens_in, tokens_out = self.own(tokens_in, tokens_out)
        # The next request carries the whole last one, input and output: that is the context.
        context = last_in + (last_out or 0) if last_in is not None else None
        now = (tokens_in, tokens_out, context)
        if (now == self._usage and call is None) or (tokens_in is None and context is None):
            return []
        self._usage = now
        calls = (call,) if call is not None else ()
        return [
            Event(
                Kind.USAGE, tokens_in=tokens_in, tokens_out=tokens_out, context=context, calls=calls
            )
        ]

    def windows(self, limits: dict[str, Any]) -> list[Event]:
        events = []
        for role in ("primary", "secondary"):
            window = _dict(limits.get(role))
            used = _num(window.get("used_percent"))
            if used is None:
                continue
            minutes = _int(window.get("window_minutes"))
            name = WINDOWS.get(minutes, role) if minutes is not None else role
            resets = _num(window.get("resets_at"))
            status = (
                "rejected" if used >= 100 else "allowed_warning" if used >= WARN_PCT else "allowed"
            )
            if self._windows.get(name) == (status, used, resets):
                continue
            self._windows[name] = (status, used, resets)
            events.append(
                Event(
                    Kind.RATE_LIMIT,
                    f"{name} window {used:g}% used",
                    rate_status=status,
                    resets_at=resets,
                    utilization=used / 100,
                    limit_type=name,
                )
            )
        for event in events:
            if event.rate_status == "rejected":
                self.refusal(event.resets_at)
        # The fullest window last, so the attempt's tally ends on it.
        return sorted(events, key=lambda e: SEVERITY.index(e.rate_status or "allowed"))

    # ------------------------------------------------------------------ the verdict

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        """`turn.completed` is success, `turn.failed` failure (a refusal: rate-limited); no
        terminal event and a signal is a kill."""
        if tally.result_seen and not tally.result_error:
            return Verdict.SUCCESS
        if self._rejected or tally.rate_status == "rejected":
            return Verdict.RATE_LIMITED
        if not tally.result_seen and returncode < 0:
            return Verdict.KILLED
        return Verdict.FAILURE
