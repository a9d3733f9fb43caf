"""The `opencode` coder: OpenCode (`opencode run --format json`), verified with 1.18.33.

Command: `opencode run --format json --auto --dir CWD --title "ID TITLE" [--model PROVIDER/MODEL]
ARGS... < prompt.md`. The prompt goes in on standard input (the runner's, which `/bin/sh -c
'exec …'` passes on), not as an argument: `run` wraps every argument that contains a space in
double quotes and backslash-escapes the quotes inside it before the model sees it, while
standard input arrives verbatim; and any local user can read a command line. `--auto`
approves what the user's permission rules leave at "ask" (without it `run` rejects those
requests); explicit denials still hold. `--title` names the session after the task, and
spares the model call that would otherwise invent a title. The model is the task's, through
`[coders.opencode] models` aliases, in OpenCode's `provider/model` form.

Where OpenCode's state lives. Nothing of the user's is replaced: HOME and the XDG directories
are left alone, so the user's credentials (`opencode auth login`, `$XDG_DATA_HOME/opencode/`)
and configuration (providers, agents, the plugin packages OpenCode installs into
`$XDG_CONFIG_HOME/opencode/` once) serve every task, and the sessions land in the user's own
store (`opencode.db`), where `opencode run -s SESSION --dir CWD` or the TUI resumes them (the
session id is the attempt's). A config directory per task would make OpenCode npm-install its
plugin package at every start, during which it ignores SIGTERM. Per task is only `TMPDIR`
(`TASK_DIR/tmp`, emptied before each attempt): Bun unpacks a 5.5 MB library there at every
start and never deletes it, and the agent's commands put their scratch files there. OpenCode
creates `opencode.db` on its first start, and two first starts at once collide on it (one fails
with "Failed query: CREATE TABLE"); while the file is missing, the wrapper lets one `opencode
session list` at a time create it under an flock before the task's own start.

Runtime configuration: fleet's additions go in `OPENCODE_CONFIG_CONTENT`, which OpenCode lays
over the user's and the project's `opencode.json` (those still apply), merged into a value the
user set there (in `[coders.opencode] env` or the environment). It declares the MCP server
`fleet` (the `fleet-ask` next to this fleet-run, with FLEET_TASK_ID and FLEET_HOME), not
required (OpenCode has no such notion), with a tool-call timeout of 2,147,483,647 ms, OpenCode's
largest (24.8 days; the default is 60 s and a larger value turns into 1 ms), so that a person's
answer may take hours. The same value bounds the server's start, but a server that exits
(fleet-ask, if it fails to start) only drops its tools with a warning in OpenCode's log: the
task runs on and the run still exits 0. `OPENCODE_DISABLE_AUTOUPDATE=1`: no
task may upgrade the binary that the others share. As root OpenCode needs nothing more.

Retries: OpenCode has no setting for its own retry budget. 1.18.33 retries a 429 or a 5xx five
times (constants in its session code), waiting what `retry-after-ms` or `retry-after` says
(however long that is), else 2 s doubling with up to 25 % jitter, and prints nothing meanwhile:
fleet learns of a rate limit from the final `error` line, whose response headers give the
reset, about 7 s (`retry-after: 1`) to 70 s (no header) after the first 429.

Output: one JSON object per line, `{"type", "timestamp" (ms), "sessionID", "part" | "error"}`:
`step_start`, `tool_use` (call and result in one line, once the tool has finished), `text`,
`reasoning` (with `--thinking`), `step_finish` (per-step tokens and cost) and `error`. There is
no final result line: the last `step_finish` (reason other than "tool-calls") ends a run that
worked, an `error` line one that did not (exit status 1), and SIGTERM (the stop signal; OpenCode
dies within 0.1 s, leaving its tools, which run in their own sessions, to the unit's cgroup) an
interrupted one. Usage is per step (one model call each: its uncached input, cache reads and
writes, output and reasoning, and cost), and only this run's steps are printed, resumed or not;
the coder sums them: tokens in = input + cache read + cache write (the prompt), tokens out =
output + reasoning, and the context is the last step's total. A step's cost is OpenCode's own
estimate from the model's configured prices, and 0 for a model it has none for: then fleet
estimates it instead. The lines do not name the model: it is the one the task asked for.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from fleet.coders.base import Call, Coder, CoderSettings, Event, Kind, RunSpec, Tally, Verdict
from fleet.paths import program

MCP_SERVER = "fleet"  # as for the other coders; OpenCode names the tools fleet_ask_human, …
# Exit statuses a shell reports for a process killed by SIGINT, SIGKILL or SIGTERM.
SIGNAL_EXITS = frozenset(128 + s for s in (signal.SIGINT, signal.SIGKILL, signal.SIGTERM))
MCP_TIMEOUT_MS = 2_147_483_647  # OpenCode's largest tool-call timeout (a larger one means 1 ms)
SUMMARY = 200  # characters of a tool's input or output kept in an event's text
# `sh -c SCRIPT NAME ARGV...`: run ARGV (its standard input is the prompt file, from the runner).
# OpenCode creates its database on its first start, and two first starts at once collide
# ("Failed query: CREATE TABLE ..."), which would fail every task but one of a first batch.
# So while the database is missing, one `session list` at a time creates it, under a lock.
STDIN_SCRIPT = (
    'data="${XDG_DATA_HOME:-$HOME/.local/share}/opencode"; '
    'if [ ! -e "$data/opencode.db" ] && mkdir -p "$data"; then '
    'flock "$data/.fleet-first-start" sh -c \'[ -e "$1" ] || "$2" session list\' '
    'fleet-opencode-init "$data/opencode.db" "$1" >/dev/null 2>&1 </dev/null; fi; '
    'exec "$@"'
)
RATE_TEXT = re.compile(
    r"\b429\b|rate.?limit|too many requests|usage limit|quota|resource.?exhausted", re.I
)
# Windows of the rate-limit headers that OpenAI-style (x-ratelimit-{limit,remaining,reset}-W)
# and Anthropic (anthropic-ratelimit-W-{limit,remaining,reset}) providers send.
WINDOWS = ("requests", "tokens", "input-tokens", "output-tokens")
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")  # Go-style: "6m0s", "1.5s", "20ms"
DURATIONS = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+")
YEAR = 366 * 86400.0  # a reset further away than this is not one


class OpencodeCoder(Coder):
    name = "opencode"
    default_binary = "opencode"
    stop_signal = signal.SIGTERM
    default_context = 200_000
    tested_versions = ("1.18.33",)
    resumes = True
    prompt_on_stdin = True

    def __init__(self, settings: CoderSettings) -> None:
        super().__init__(settings)
        # Per attempt: a coder instance lives for one attempt.
        self.session: str | None = None
        self.steps = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.cost = 0.0
        self.errors = 0
        self.finished = False  # a step that did not ask for tools: the model's last word
        self.rate_limited = False
        self.model_name: str | None = None  # the task's, as passed with --model

    # ------------------------------------------------------------------ starting

    def argv(self, run: RunSpec) -> list[str]:
        model = self.model_name = self.model(run)
        title = " ".join(f"{run.task_id} {run.title}".split())[:120]
        return [
            "/bin/sh",
            "-c",
            STDIN_SCRIPT,
            "fleet-opencode",
            self.binary,
            "run",
            "--format",
            "json",
            "--auto",
            "--dir",
            run.cwd,
            "--title",
            title,
            *(["--model", model] if model else []),
            # A resumed session needs the same --dir, which every attempt passes.
            *(["--session", run.resume] if run.resume else []),
            *self.settings.args,
        ]

    def environ(self, run: RunSpec) -> dict[str, str]:
        env = dict(self.settings.env)
        user = env.get("OPENCODE_CONFIG_CONTENT", os.environ.get("OPENCODE_CONFIG_CONTENT", ""))
        try:
            config = json.loads(user) if user.strip() else {}
        except ValueError:
            config = None  # OpenCode reports its own configuration errors; leave it alone
        if isinstance(config, dict):
            env["OPENCODE_CONFIG_CONTENT"] = json.dumps(merge(config, self.runtime_config(run)))
        env.setdefault("TMPDIR", str(run.task_dir / "tmp"))
        env.setdefault("OPENCODE_DISABLE_AUTOUPDATE", "1")
        return env

    def runtime_config(self, run: RunSpec) -> dict[str, Any]:
        ask = program("fleet-ask")
        environment = {"FLEET_TASK_ID": run.task_id}
        if os.environ.get("FLEET_HOME"):
            environment["FLEET_HOME"] = os.environ["FLEET_HOME"]
        server = {
            "type": "local",
            "command": [ask],
            "environment": environment,
            "enabled": True,
            "timeout": MCP_TIMEOUT_MS,
        }
        return {"mcp": {MCP_SERVER: server}}

    def prepare(self, run: RunSpec) -> None:
        tmp = run.task_dir / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # the previous attempt's leftovers
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)

    # ------------------------------------------------------------------ reading

    def parse(self, line: str) -> Sequence[Event]:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to read
            return (Event(Kind.RAW, line),)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return (Event(Kind.RAW, line),)
        handler = {
            "step_start": self._step_start,
            "text": self._text,
            "reasoning": self._text,
            "tool_use": self._tool_use,
            "step_finish": self._step_finish,
            "error": self._error,
        }.get(obj["type"])
        if handler is None:
            return (*self._session_of(obj), Event(Kind.RAW, line))
        return (*self._session_of(obj), *handler(obj, _dict(obj.get("part"))))

    def _session_of(self, obj: Mapping[str, Any]) -> list[Event]:
        sid = obj.get("sessionID")
        if not isinstance(sid, str) or not sid or sid == self.session:
            return []
        self.session = sid
        return [Event(Kind.SESSION, session=sid)]

    def _step_start(self, obj: Mapping[str, Any], part: Mapping[str, Any]) -> list[Event]:
        return []

    def _text(self, obj: Mapping[str, Any], part: Mapping[str, Any]) -> list[Event]:
        text = _str(part.get("text"))
        if obj["type"] == "reasoning":
            return [Event(Kind.TEXT, f"(thinking) {text}")]
        return [Event(Kind.TEXT, text)]

    def _tool_use(self, obj: Mapping[str, Any], part: Mapping[str, Any]) -> list[Event]:
        tool = _str(part.get("tool")) or "tool"
        state = _dict(part.get("state"))
        args = _dict(state.get("input"))
        shown = args.get("command") or state.get("title") or args
        call = shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)
        failed = state.get("status") == "error"
        result = _str(state.get("error") if failed else state.get("output"))
        return [
            Event(Kind.TOOL_CALL, _short(call), tool=tool),
            Event(Kind.TOOL_RESULT, _short(result), tool=tool, is_error=failed),
        ]

    def _step_finish(self, obj: Mapping[str, Any], part: Mapping[str, Any]) -> list[Event]:
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        prompt = _int(tokens.get("input")) + _int(cache.get("read")) + _int(cache.get("write"))
        self.steps += 1
        output = _int(tokens.get("output")) + _int(tokens.get("reasoning"))
        self.tokens_in += prompt
        self.tokens_out += output
        cost = _num(part.get("cost")) or 0.0
        self.cost += cost
        context = _int(tokens.get("total")) or prompt + output
        call = Call(
            _str(part.get("id")) or f"step-{self.steps}",
            self.model_name,
            input=_int(tokens.get("input")),
            output=output,
            cache_read=_int(cache.get("read")),
            cache_write=_int(cache.get("write")),
            cost=cost if cost > 0 else None,
        )
        events = [
            Event(
                Kind.USAGE,
                tokens_in=self.tokens_in,
                tokens_out=self.tokens_out,
                cost=self.cost or None,
                context=context,
                calls=(call,),
            )
        ]
        reason = _str(part.get("reason"))
        if reason not in ("tool-calls", "tool_calls"):
            self.finished = True
            events.append(self._result(reason or "finished", is_error=False))
        return events

    def _error(self, obj: Mapping[str, Any], part: Mapping[str, Any]) -> list[Event]:
        self.errors += 1
        error = _dict(obj.get("error"))
        name = _str(error.get("name")) or "error"
        data = _dict(error.get("data"))
        status = _int(data.get("statusCode"))
        message = _str(data.get("message")) or _str(error.get("message")) or name
        text = f"{name}{f' {status}' if status else ''}: {message}"
        events = [Event(Kind.ERROR, _short(text, 2000))]
        body = _str(data.get("responseBody"))
        if status == 429 or (not status and RATE_TEXT.search(f"{name} {message} {body}")):
            self.rate_limited = True
            stamp = _num(obj.get("timestamp"))
            base = stamp / 1000 if stamp else time.time()
            events.append(rate_limit(_dict(data.get("responseHeaders")), base, message))
        events.append(self._result(message, is_error=True))
        return events

    def _result(self, text: str, is_error: bool) -> Event:
        counted = self.steps > 0  # no step, no usage: nothing was measured
        return Event(
            Kind.RESULT,
            _short(text),
            tokens_in=self.tokens_in if counted else None,
            tokens_out=self.tokens_out if counted else None,
            cost=self.cost if counted and self.cost > 0 else None,
            is_error=is_error,
        )

    # ------------------------------------------------------------------ judging

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        if self.rate_limited or tally.rate_status == "rejected":
            return Verdict.RATE_LIMITED
        if self.errors:
            return Verdict.FAILURE
        if returncode < 0 or returncode in SIGNAL_EXITS:  # only a run that had finished counts
            return Verdict.SUCCESS if self.finished else Verdict.KILLED
        return Verdict.SUCCESS if returncode == 0 else Verdict.FAILURE


def rate_limit(headers: Mapping[str, Any], base: float, message: str) -> Event:
    """A rejected-rate-limit event, with the reset and window the response headers tell.

    The reset is the latest of the exhausted windows (remaining 0), else `retry-after-ms` or
    `retry-after`; relative values count from `base`, the time OpenCode reported the error.
    """
    h = {str(k).lower(): str(v) for k, v in headers.items()}
    exhausted: list[tuple[float, str]] = []
    for window in WINDOWS:
        for remaining, reset in (
            (f"x-ratelimit-remaining-{window}", f"x-ratelimit-reset-{window}"),
            (f"anthropic-ratelimit-{window}-remaining", f"anthropic-ratelimit-{window}-reset"),
        ):
            left = _num(h.get(remaining))
            at = when(h.get(reset), base)
            if left is not None and left <= 0 and at is not None:
                exhausted.append((at, window))
    if exhausted:
        at, window = max(exhausted, key=lambda found: found[0])  # ties: the first window
        return Event(
            Kind.RATE_LIMIT,
            _short(message),
            rate_status="rejected",
            resets_at=at,
            utilization=1.0,
            limit_type=window,
        )
    retry_ms = _num(h.get("retry-after-ms"))
    if retry_ms is not None:
        at = when(f"{retry_ms}ms", base) if retry_ms >= 0 else None
    else:
        at = when(h.get("retry-after"), base)
    return Event(Kind.RATE_LIMIT, _short(message), rate_status="rejected", resets_at=at)


def when(value: str | None, base: float) -> float | None:
    """Epoch seconds of a reset header: seconds, a duration ("6m0s", "20ms"), an epoch in
    seconds or milliseconds, or a date; None for anything else or beyond a year away."""
    text = (value or "").strip()
    number = _num(text)
    at: float | None = None
    if number is not None:
        at = number / 1000 if number > 1e12 else number if number > 1e9 else base + number
    elif DURATIONS.fullmatch(text):
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        at = base + sum(float(n) * scale[u] for n, u in DURATION.findall(text))
    else:
        for read in (datetime.fromisoformat, email.utils.parsedate_to_datetime):
            try:
                at = read(text).timestamp()
                break
            except (TypeError, ValueError, IndexError, OverflowError, OSError):
                continue
    return at if at is not None and abs(at - base) < YEAR else None


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra` laid over it, tables merged key by key (extra wins)."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if not isinstance(value, int | float | str):
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _int(value: Any) -> int:
    number = _num(value) if not isinstance(value, str) else None
    return int(number) if number is not None and number > 0 else 0


def _short(text: str, limit: int = SUMMARY) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
