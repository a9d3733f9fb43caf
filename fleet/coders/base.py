"""The coder interface: how fleet starts one agent CLI and understands its output.

A coder turns a task into an argv, an environment and runtime files, turns each raw output line
into zero or more `Event`s of one small model, and judges the finished process. It never touches
the store or systemd: the runner does. `parse` must never raise on any input: a line it does not
understand becomes a `raw` event. The tokens and cost a coder reports are its attempt's own,
never its session's: a CLI that reports a resumed session's totals has its earlier share taken
out here, by its coder.
"""

from __future__ import annotations

import enum
import signal
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, NamedTuple


class Kind(enum.StrEnum):
    SESSION = "session"  # the coder's session started (id known)
    TEXT = "text"  # assistant text
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    USAGE = "usage"  # token counts
    RATE_LIMIT = "rate_limit"
    RETRY = "retry"
    ERROR = "error"
    RESULT = "result"  # the coder's own final verdict
    OUTPUT = "output"  # a plain output line (command coder)
    RAW = "raw"  # a line nobody understood


class Call(NamedTuple):
    """One model call's own tokens, as a coder learned them; the four counts are disjoint.

    `id` names the call within the attempt: a later Call with the same id replaces an earlier
    one (a CLI may say a call's output only provisionally at first). `times` > 1 stands for
    that many calls of equal size, for a CLI that reports only per-model totals; `cost` is what
    the CLI itself charged for them, if it says.
    """

    id: str
    model: str | None
    input: int = 0  # prompt tokens read neither from nor into the cache
    output: int = 0  # reasoning included
    cache_read: int = 0
    cache_write: int = 0
    times: int = 1
    cost: float | None = None

    @property
    def prompt(self) -> int:
        """Every input token of one of the calls: what decides a long-context price tier."""
        return (self.input + self.cache_read + self.cache_write) // max(1, self.times)


class Event(NamedTuple):
    kind: Kind
    text: str = ""
    tool: str | None = None
    session: str | None = None
    # Totals of the run so far (USAGE) or final (RESULT); input counts cached tokens too.
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    is_error: bool = False
    context: int | None = None  # tokens in the model's context window right now
    # RATE_LIMIT events: allowed, allowed_warning or rejected; when the window resets (epoch
    # seconds); how much of it is used (0-1); which window (five_hour, seven_day, …).
    rate_status: str | None = None
    resets_at: float | None = None
    utilization: float | None = None
    limit_type: str | None = None
    calls: tuple[Call, ...] = ()  # model calls whose own tokens this event tells (see Call)


class CoderSettings(NamedTuple):
    """The `[coders.NAME]` table: where the binary is and what to add to its command line."""

    binary: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = MappingProxyType({})
    models: Mapping[str, str] = MappingProxyType({})  # alias -> model name


class RunSpec(NamedTuple):
    """Everything about one attempt that a coder may need to build its command."""

    task_id: str
    attempt: int
    title: str
    description: str
    cwd: str
    model: str | None
    task_dir: Path
    artifact_dir: Path
    prompt: str
    prompt_file: Path
    # The coder's own session to resume (after `fleet resume`), for a coder that can; the
    # prompt is then the message that continues it.
    resume: str | None = None
    # With `resume`: what the CLI reported for that whole session when the attempt that last
    # ran it ended (`Coder.session_totals`), for a CLI that reports session totals, not its
    # run's, so that this attempt's own share can be taken from them.
    baseline: Mapping[str, object] | None = None


class Tally:
    """What the runner learned from the events of one attempt."""

    def __init__(
        self,
        *,
        result_seen: bool = False,
        result_error: bool = False,
        rate_status: str | None = None,
    ) -> None:
        self.session: str | None = None
        self.started = False  # the coder announced its session (a SESSION event)
        self.turns = 0
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.cost: float | None = None
        self.last_tool: str | None = None
        self.result_seen = result_seen
        self.result_error = result_error
        self.last_error: str | None = None
        self.context: int | None = None
        self.rate_status = rate_status
        self.resets_at: float | None = None
        self.utilization: float | None = None
        self.limit_type: str | None = None
        self.calls: dict[str, Call] = {}  # this attempt's model calls, by id

    def add(self, event: Event) -> None:
        if event.session:
            self.session = event.session
        if event.kind == Kind.SESSION:
            self.started = True
        if event.kind == Kind.TEXT:
            self.turns += 1
        if event.kind == Kind.TOOL_CALL and event.tool:
            self.last_tool = event.tool
        if event.kind in (Kind.USAGE, Kind.RESULT):
            if event.tokens_in is not None:
                self.tokens_in = event.tokens_in
            if event.tokens_out is not None:
                self.tokens_out = event.tokens_out
            if event.cost is not None:
                self.cost = event.cost
        for call in event.calls:
            self.calls[call.id] = call
        if event.context is not None:
            self.context = event.context
        if event.kind == Kind.RATE_LIMIT:
            self.rate_status = event.rate_status or self.rate_status
            if event.resets_at is not None:
                self.resets_at = event.resets_at
            if event.utilization is not None:
                self.utilization = event.utilization
            self.limit_type = event.limit_type or self.limit_type
        if event.kind == Kind.ERROR:
            self.last_error = event.text
        if event.kind == Kind.RESULT:
            self.result_seen = True
            self.result_error = event.is_error


class Verdict(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    KILLED = "killed"
    RATE_LIMITED = "rate-limited"  # the provider refused: not the task's fault
    CONTEXT_PRESSURE = "context-pressure"  # fleet stopped it to start over with a fresh context
    BUDGET = "budget"  # fleet stopped it at the task's max_cost_usd or max_tokens


class Coder(ABC):
    name: ClassVar[str]
    default_binary: ClassVar[str]
    stop_signal: ClassVar[int] = signal.SIGTERM
    default_context: ClassVar[int] = 200_000  # tokens, when the model's window is not known
    # The versions this coder class was verified against (`fleet doctor` says if others run).
    tested_versions: ClassVar[tuple[str, ...]] = ()
    # A command's exit 0 means the task is done; an agent must close its task explicitly.
    closes_on_success: ClassVar[bool] = False
    # The runner gives the CLI its prompt file (RunSpec.prompt_file, 0600) as standard input,
    # and argv() leaves the prompt off the command line, which any local user can read in
    # /proc/PID/cmdline; otherwise standard input is /dev/null.
    prompt_on_stdin: ClassVar[bool] = False

    def __init__(self, settings: CoderSettings) -> None:
        self.settings = settings

    @property
    def binary(self) -> str:
        return self.settings.binary or self.default_binary

    def model(self, run: RunSpec) -> str | None:
        """The model to pass on: the task's, through the coder's aliases."""
        if run.model is None:
            return None
        return self.settings.models.get(run.model, run.model)

    @abstractmethod
    def argv(self, run: RunSpec) -> list[str]: ...

    def environ(self, run: RunSpec) -> dict[str, str]:
        return dict(self.settings.env)

    def prepare(self, run: RunSpec) -> None:  # noqa: B027  (optional hook, not abstract)
        """Write runtime configuration before the spawn (nothing by default)."""

    @abstractmethod
    def parse(self, line: str) -> Sequence[Event]: ...

    def leftover(self) -> Sequence[Event]:
        """Events the CLI left outside its stream after the last line (read once it has ended)."""
        return ()

    # Whether argv() honours RunSpec.resume; a coder that cannot resume always starts afresh.
    resumes: ClassVar[bool] = False

    def session_totals(self) -> dict[str, object] | None:
        """What the CLI reported for its whole session so far, when that is not the run's own
        (the next resumed attempt's `RunSpec.baseline`); None for a CLI that reports per run."""
        return None

    def resume_failed(self, returncode: int, tally: Tally) -> bool:
        """Whether a run started with RunSpec.resume failed because the session is gone (or
        belongs elsewhere): the CLIs then exit with an error before announcing any session,
        and before any turn."""
        return (
            not tally.started
            and tally.turns == 0
            and tally.last_tool is None
            and self.verdict(returncode, tally) != Verdict.SUCCESS
        )

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        """Judge the finished process (`returncode` < 0 means killed by that signal)."""
        if tally.rate_status == "rejected":
            return Verdict.RATE_LIMITED
        if returncode < 0 and not tally.result_seen:
            return Verdict.KILLED
        if tally.result_seen:
            return Verdict.FAILURE if tally.result_error else Verdict.SUCCESS
        return Verdict.SUCCESS if returncode == 0 else Verdict.FAILURE
