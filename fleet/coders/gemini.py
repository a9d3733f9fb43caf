"""The `gemini` coder: Gemini CLI in headless mode, one JSON event per output line.

    gemini --output-format stream-json --approval-mode yolo [--model M] ARGS... < prompt.md

runs in the task's directory. The prompt is its standard input (the CLI runs headless when
standard input is not a terminal, and takes what it reads there as the prompt, up to 8 MiB), not
an argument: on the command line any local user could read it in /proc/PID/cmdline, and Linux
refuses one argument over 128 KiB. What fleet decides for it:

* **Where its state lives.** The CLI keeps everything under `$GEMINI_CLI_HOME/.gemini`
  (default `~/.gemini`): settings, credentials, and per project its chats (sessions), history and
  a project registry. Each task gets its own home, `TASK_DIR/gemini` (`GEMINI_CLI_HOME`), so
  that fleet can write the settings an attempt needs without touching the user's file, and so
  that parallel tasks never race on one project registry. The user is not cut off from their
  own setup: the home's `settings.json` is the user's own (from `$GEMINI_CLI_HOME` or `$HOME` of
  `[coders.gemini] env`, else of fleet's environment) with fleet's keys merged in, and every
  other entry of the user's `.gemini` (`oauth_creds.json`, `google_accounts.json`, `.env`,
  `GEMINI.md`, commands, skills, extensions, policies, …) is a symlink to the user's own, as are
  `~/.env` and `~/.agents`; a login or token refresh therefore lands in the user's files. Only
  the CLI's per-project state stays in the task (`tmp/`, `history/`, `projects.json`,
  `trustedFolders.json`): the sessions of a task persist with the task, and the next attempt,
  which runs with the same home and the same directory, can resume them (`gemini --resume ID`
  with `GEMINI_CLI_HOME=TASK_DIR/gemini` works for a person too). `HOME` itself is left alone.
  `TMPDIR` is `TASK_DIR/tmp`, emptied before each attempt: the CLI leaves `gemini-shell-*`
  directories there when it is killed, and error reports on API errors.
* **Runtime settings** merged into that `settings.json`: an MCP server `fleet` running
  `fleet-ask` (next to this `fleet-run`) with FLEET_TASK_ID and FLEET_HOME, trusted, and a
  tool-call timeout of 2**31-1 ms (~24.8 days, the largest value the CLI accepts: above it the
  timeout becomes 1 ms and the server silently disappears), so that a person's answer may take
  hours; the CLI has no notion of a required server, and a server that fails to start only
  prints "MCP issues detected" on stderr while the task runs on. `general.maxAttempts` = 1 caps
  the CLI's own retries (by default 10 attempts, about 3.5 minutes on a 429; with one, a 429
  ends the run in about 2 s), and `enableAutoUpdate` = false keeps it from reinstalling itself
  in the middle of a task. FLEET_* variables are exempt from the CLI's environment redaction,
  which would hide them from the shell tool on a CI machine (`GITHUB_SHA` set), and `fleet` is
  added to an `mcp.allowed` list the user may have. When the user chose no auth type and
  GEMINI_API_KEY is set, the auth type becomes `gemini-api-key`: with `GOOGLE_GEMINI_BASE_URL`
  set the CLI would otherwise pick `gateway` and exit 41.
* **Environment:** `GEMINI_CLI_TRUST_WORKSPACE=true` (an untrusted folder silently turns
  `yolo` back into asking, and refuses stdio MCP servers) and `GEMINI_CLI_NO_RELAUNCH=true`: by
  default the CLI relaunches itself as a child node process and the parent ignores SIGTERM, so a
  signal to the pid alone never stops it; with one process it starts faster too. Values from
  `[coders.gemini] env` win over these, except GEMINI_CLI_HOME, which names the user's home
  to take settings and credentials from. Nothing more is needed as root.
* **Stop:** SIGTERM to the process group. The CLI then exits at once with status 0 and no
  `result` line, and leaves a running shell tool (which lives in its own session) behind; under
  systemd the unit's cgroup takes care of those.

Reading the stream: `init` carries the session id, `message` the user's prompt (dropped: it is
in `prompt.md`) or deltas of assistant text, `tool_use`/`tool_result` one tool call each (paired
by `tool_id`), `error` a warning or a non-fatal error, and `result` the end with `stats`, the
token totals of this process run (all models, routing calls included): `input_tokens` (cached
ones included) and `output_tokens`. The stream gives no usage before the result and no cost at
all (fleet estimates it). Per model, `stats.models` gives the run's input (`cached` of it read
from the cache) and output tokens, the rest of the model's total being its thoughts, which count
as output; the calls are not told apart, so each model's tokens are priced as tool_calls + 1
calls of equal size. The context size is not in it either; the result gives a lower bound: per
model, its prompt tokens divided by the number of calls it can have made (tool calls + 1), since
a conversation only grows until the CLI compresses it. Retries are not in it (the CLI writes
them to stderr), and with one attempt there are none.

Rate limits: the CLI reads no rate-limit headers. A 429 ends the run with a `result` error
`[API Error: …]` (with "Please wait and try again later…" for API keys) and exit status 173
(429 mod 256); its message carries the server's retry delay ("Suggested retry after 3s.",
"Please retry in 3s."), which becomes the reset time. Each becomes a `rejected` rate-limit event.
A daily quota with no delay resets at midnight, Pacific time.

Verdict (the notes, §5.4): success only with `result.status == "success"`; a 429 is
rate-limited; no result and a signal, or no result and status 0 (which is how the CLI ends on
SIGTERM, SIGINT or SIGHUP), is killed; anything else fails. Exit statuses are HTTP statuses mod
256 on API errors (500 → 244, 401 → 145), 41 for bad auth, 42 for bad input.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import pwd
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fleet.coders.base import Call, Coder, CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.fsutil import write_atomic
from fleet.paths import program

MCP_SERVER = "fleet"
MCP_TIMEOUT_MS = 2**31 - 1  # the largest the CLI keeps; more becomes 1 ms
RATE_LIMIT_EXIT = 429 % 256  # the CLI exits with the HTTP status of an API error, mod 256
HOME_DIR = "gemini"  # TASK_DIR/gemini is GEMINI_CLI_HOME
TMP_DIR = "tmp"
# What the CLI writes per project and per run: kept in the task's home, never linked.
OWN_STATE = frozenset({"settings.json", "tmp", "history", "projects.json", "trustedFolders.json"})
HOME_LINKS = (".env", ".agents")  # read from the home directory itself, beside .gemini
FLEET_VARIABLES = ("FLEET_TASK_ID", "FLEET_TASK_DIR", "FLEET_ARTIFACT_DIR", "FLEET_HOME")
TOOL_TEXT = 200
RESULT_TEXT = 4000
QUOTA_ERRORS = frozenset({"TerminalQuotaError", "RetryableQuotaError"})
RATE_LIMITED = re.compile(
    r"\b429\b|RESOURCE_EXHAUSTED|Too Many Requests|Please wait and try again later"
    r"|exhausted your (?:daily )?(?:quota|capacity)|quota limitations",
    re.IGNORECASE,
)
RETRY_DELAY = re.compile(
    r'(?:Suggested retry after|Please retry in|"retryDelay":\s*")'
    r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s)\b"
)
DAILY = re.compile(r"daily quota|PerDay|per day", re.IGNORECASE)
PER_MINUTE = re.compile(r"PerMinute|per minute", re.IGNORECASE)
# Keys whose value says best what a tool call does, in this order.
TOOL_KEYS = (
    "command",
    "file_path",
    "absolute_path",
    "dir_path",
    "path",
    "pattern",
    "query",
    "url",
    "question",
    "prompt",
)


class GeminiCoder(Coder):
    name = "gemini"
    default_binary = "gemini"
    stop_signal = signal.SIGTERM
    default_context = 1_048_576  # the Gemini 2.5 and 3 models
    tested_versions = ("0.61.0",)
    resumes = True
    prompt_on_stdin = True

    def __init__(self, settings: CoderSettings) -> None:
        super().__init__(settings)
        self._tools: dict[str, str] = {}  # tool_id -> tool name, for the results
        self._text: list[str] = []  # assistant text since the last tool call
        self._error: str | None = None  # the last error event's message

    # ------------------------------------------------------------------ starting it

    def argv(self, run: RunSpec) -> list[str]:
        argv = [self.binary, "--output-format", "stream-json", "--approval-mode", "yolo"]
        model = self.model(run)
        if model:
            argv += ["--model", model]
        if run.resume:  # the task's own GEMINI_CLI_HOME and directory hold its sessions
            argv += ["--resume", run.resume]
        return argv + list(self.settings.args)

    def environ(self, run: RunSpec) -> dict[str, str]:
        env = {
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "TMPDIR": str(run.task_dir / TMP_DIR),
        }
        env.update(self.settings.env)
        env["GEMINI_CLI_HOME"] = str(run.task_dir / HOME_DIR)
        return env

    def prepare(self, run: RunSpec) -> None:
        home = run.task_dir / HOME_DIR
        dot = home / ".gemini"
        dot.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = run.task_dir / TMP_DIR
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, exist_ok=True)
        source = self.user_home()
        user: dict[str, Any] = {}
        if source is not None and _real(source) != _real(home):
            user = read_settings(source / ".gemini" / "settings.json")
            link_entries(source / ".gemini", dot, skip=OWN_STATE)
            link_entries(source, home, only=HOME_LINKS)
        settings = self.runtime_settings(run, user)
        text = json.dumps(settings, indent=2, ensure_ascii=False) + "\n"
        write_atomic(dot / "settings.json", text.encode("utf-8"))

    def effective_env(self) -> dict[str, str]:
        return {**os.environ, **self.settings.env}

    def user_home(self) -> Path | None:
        """The home whose `.gemini` holds the user's settings and credentials."""
        env = self.effective_env()
        for name in ("GEMINI_CLI_HOME", "HOME"):
            if env.get(name):
                return Path(env[name])
        with contextlib.suppress(KeyError):
            return Path(pwd.getpwuid(os.getuid()).pw_dir)
        return None

    def runtime_settings(self, run: RunSpec, user: Mapping[str, Any]) -> dict[str, Any]:
        """The user's settings with what fleet needs for this attempt merged in."""
        settings = copy.deepcopy(dict(user))
        general = _table(settings, "general")
        general["maxAttempts"] = 1
        general["enableAutoUpdate"] = False
        _table(settings, "mcpServers")[MCP_SERVER] = self.mcp_server(run)
        mcp = settings.get("mcp")
        if isinstance(mcp, dict):
            allowed = mcp.get("allowed")
            if isinstance(allowed, list) and MCP_SERVER not in allowed:
                allowed.append(MCP_SERVER)
            excluded = mcp.get("excluded")
            if isinstance(excluded, list):
                mcp["excluded"] = [name for name in excluded if name != MCP_SERVER]
        security = _table(settings, "security")
        redaction = _table(security, "environmentVariableRedaction")
        allowed_vars = redaction.get("allowed")
        if not isinstance(allowed_vars, list):
            allowed_vars = redaction["allowed"] = []
        allowed_vars.extend(v for v in (*FLEET_VARIABLES, "FLEET_SCOPE") if v not in allowed_vars)
        auth = _table(security, "auth")
        env = self.effective_env()
        chose = env.get("GOOGLE_GENAI_USE_GCA") == "true" or (
            env.get("GOOGLE_GENAI_USE_VERTEXAI") == "true"
        )
        if not auth.get("selectedType") and env.get("GEMINI_API_KEY") and not chose:
            auth["selectedType"] = "gemini-api-key"
        return settings

    def mcp_server(self, run: RunSpec) -> dict[str, Any]:
        env = {"FLEET_TASK_ID": run.task_id}
        if os.environ.get("FLEET_HOME"):
            env["FLEET_HOME"] = os.environ["FLEET_HOME"]
        return {
            "command": program("fleet-ask"),
            "args": [],
            "env": env,
            "timeout": MCP_TIMEOUT_MS,
            "trust": True,
        }

    # ------------------------------------------------------------------ reading it

    def parse(self, line: str) -> Sequence[Event]:
        try:
            return self._parse(line)
        except Exception:  # a line of a shape never seen must not end the attempt
            return (Event(Kind.RAW, line),)

    def _parse(self, line: str) -> Sequence[Event]:
        try:
            obj = json.loads(line)
        except ValueError:
            return (Event(Kind.RAW, line),)
        if not isinstance(obj, dict):
            return (Event(Kind.RAW, line),)
        kind = obj.get("type")
        if kind == "init":
            session = _str(obj.get("session_id"))
            if not session:
                return (Event(Kind.RAW, line),)
            model = _str(obj.get("model"))
            text = f"session {session}" + (f" (model {model})" if model else "")
            return (Event(Kind.SESSION, text, session=session),)
        if kind == "message":
            role = obj.get("role")
            content = _str(obj.get("content"))
            if role == "assistant":
                self._text.append(content)
                return (Event(Kind.TEXT, content),) if content else ()
            if role == "user":
                return ()  # the prompt, as given
            return (Event(Kind.RAW, line),)
        if kind == "tool_use":
            tool = _str(obj.get("tool_name")) or "tool"
            self._tools[_str(obj.get("tool_id"))] = tool
            self._text.clear()
            return (Event(Kind.TOOL_CALL, describe(obj.get("parameters")), tool=tool),)
        if kind == "tool_result":
            called = self._tools.get(_str(obj.get("tool_id")))
            failed = obj.get("status") == "error"
            error = obj.get("error")
            text = _str(obj.get("output"))
            if failed and isinstance(error, dict) and not text:
                text = _str(error.get("message"))
            return (Event(Kind.TOOL_RESULT, _cut(text, RESULT_TEXT), tool=called, is_error=failed),)
        if kind == "error":
            message = _str(obj.get("message"))
            if message:
                self._error = message
            events: list[Event] = []
            if RATE_LIMITED.search(message):
                events.append(rate_limit(message, obj.get("timestamp")))
            events.append(Event(Kind.ERROR, message, is_error=obj.get("severity") != "warning"))
            return events
        if kind == "result":
            return self._result(obj)
        return (Event(Kind.RAW, line),)

    def _result(self, obj: Mapping[str, Any]) -> list[Event]:
        stats = obj.get("stats")
        tokens_in = tokens_out = context = None
        events: list[Event] = []
        if isinstance(stats, dict):
            tokens_in = _int(stats.get("input_tokens"))
            tokens_out = _int(stats.get("output_tokens"))
            context = context_floor(stats)
            events.append(
                Event(
                    Kind.USAGE,
                    tokens_in=tokens_in,
                    tokens_out=tokens_out,
                    context=context,
                    calls=model_calls(stats),
                )
            )
        ok = obj.get("status") == "success"
        if ok:
            text = "".join(self._text).strip()
        else:
            error = obj.get("error")
            kind = message = ""
            if isinstance(error, dict):
                kind = _str(error.get("type"))
                message = _str(error.get("message"))
            if kind in QUOTA_ERRORS or (
                message.startswith("[API Error") and RATE_LIMITED.search(message)
            ):
                events.append(rate_limit(message, obj.get("timestamp")))
            if message:
                events.append(Event(Kind.ERROR, message, is_error=True))
            text = message or self._error or f"status {_str(obj.get('status')) or 'missing'}"
        events.append(
            Event(
                Kind.RESULT,
                _cut(text, RESULT_TEXT),
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                is_error=not ok,
            )
        )
        return events

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        if tally.result_seen and not tally.result_error:
            return Verdict.SUCCESS
        if tally.rate_status == "rejected" or returncode == RATE_LIMIT_EXIT:
            return Verdict.RATE_LIMITED
        if not tally.result_seen and returncode <= 0:
            return Verdict.KILLED  # a signal, or the CLI's own exit 0 on SIGTERM/SIGINT/SIGHUP
        return Verdict.FAILURE


# ---------------------------------------------------------------------- helpers


def describe(params: Any) -> str:
    """A short text of a tool call's input: its command or path, else its JSON."""
    if isinstance(params, dict):
        for key in TOOL_KEYS:
            value = params.get(key)
            if isinstance(value, str) and value.strip():
                return _cut(" ".join(value.split()), TOOL_TEXT)
    if params is None or params == {}:
        return ""
    return _cut(json.dumps(params, ensure_ascii=False, sort_keys=True), TOOL_TEXT)


def context_floor(stats: Mapping[str, Any]) -> int | None:
    """The least the last request's prompt can have been: a model's prompt tokens over the
    calls it can have made (every call but the first follows a tool call)."""
    calls = (_int(stats.get("tool_calls")) or 0) + 1
    models = stats.get("models")
    prompts = [_int(stats.get("input_tokens")) or 0]
    if isinstance(models, dict) and models:
        prompts = [_int(m.get("input_tokens")) or 0 for m in models.values() if isinstance(m, dict)]
    best = max(prompts, default=0)
    return math.ceil(best / calls) if best > 0 else None


def model_calls(stats: Mapping[str, Any]) -> tuple[Call, ...]:
    """The run's tokens by model, each model's as tool_calls + 1 calls of equal size."""
    models = stats.get("models")
    if not isinstance(models, dict):
        return ()
    count = (_int(stats.get("tool_calls")) or 0) + 1
    calls = []
    for name, model in sorted(models.items()):
        if not isinstance(model, dict):
            continue
        prompt = _int(model.get("input_tokens")) or 0
        cached = min(prompt, _int(model.get("cached")) or 0)
        output = _int(model.get("output_tokens")) or 0
        total = _int(model.get("total_tokens")) or 0
        calls.append(
            Call(
                f"model:{name}",
                str(name),
                input=prompt - cached,
                output=max(output, total - prompt),  # thoughts are output
                cache_read=cached,
                times=count,
            )
        )
    return tuple(calls)


def rate_limit(message: str, timestamp: Any) -> Event:
    """A rejected rate limit, with its reset when the message gives a delay."""
    now = _epoch(timestamp)
    resets: float | None = None
    if match := RETRY_DELAY.search(message):
        delay = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
        resets = now + delay
    limit_type = None
    if DAILY.search(message):
        limit_type = "daily"
        resets = resets if resets is not None else pacific_midnight(now)
    elif PER_MINUTE.search(message):
        limit_type = "minute"
    return Event(
        Kind.RATE_LIMIT,
        message.splitlines()[0] if message else "rate limited",
        rate_status="rejected",
        resets_at=resets,
        limit_type=limit_type,
    )


def pacific_midnight(now: float) -> float:
    """When the next day starts in US Pacific time, where the Gemini API's daily quotas reset.

    UTC-8, and UTC-7 from 2:00 on the second Sunday of March to 2:00 on the first Sunday of
    November (computed here: a fresh machine may have no time zone database)."""
    utc = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
    local = utc + _pacific_offset(utc)
    midnight = datetime.combine(local.date() + timedelta(days=1), datetime.min.time())
    # A midnight is never within a change of offset, which happens at 2:00.
    start = midnight - _pacific_offset(midnight + timedelta(hours=8))
    return start.replace(tzinfo=UTC).timestamp()


def _pacific_offset(utc: datetime) -> timedelta:
    def sunday(month: int, nth: int) -> datetime:
        first = datetime(utc.year, month, 1)
        return first + timedelta(days=(6 - first.weekday()) % 7 + 7 * (nth - 1))

    summer = sunday(3, 2) + timedelta(hours=10) <= utc < sunday(11, 1) + timedelta(hours=9)
    return timedelta(hours=-7 if summer else -8)


def read_settings(path: Path) -> dict[str, Any]:
    """The user's settings.json (JSON with comments), or {} if it is missing or unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
        obj = json.loads(strip_comments(text))
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def strip_comments(text: str) -> str:
    """JSON with // and /* */ comments outside strings -> JSON."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def link_entries(
    source: Path,
    target: Path,
    skip: frozenset[str] = frozenset(),
    only: tuple[str, ...] | None = None,
) -> None:
    """Symlink the entries of `source` into `target`; drop links whose source went away.

    A regular file that the CLI left in place of a link (a token refresh written by rename) is
    replaced by the link again: the user's file is the one that counts. Directories the CLI
    made itself are left alone.
    """
    try:
        names = set(only) if only is not None else set(os.listdir(source))
    except OSError:
        names = set()
    for name in sorted(names):
        if name in skip or name.endswith(".tmp"):
            continue
        src, dst = source / name, target / name
        if not os.path.lexists(src):
            continue
        if dst.is_symlink() and os.readlink(dst) == str(src):
            continue
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif os.path.lexists(dst):
            continue
        os.symlink(src, dst)
    if only is None:
        with os.scandir(target) as entries:
            stale = [e.path for e in entries if e.is_symlink() and not os.path.exists(e.path)]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _table(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _epoch(timestamp: Any) -> float:
    """An ISO 8601 timestamp of the stream in epoch seconds; now if there is none."""
    if isinstance(timestamp, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    return time.time()
