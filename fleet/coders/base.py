"""The coder interface: how fleet starts one agent CLI and understands its output.

A coder turns a task into an argv, an environment and runtime files, turns each raw output line
into zero or more `Event`s of one small model, and judges the finished process. It never touches
the store or systemd: the runner does. `parse` must never raise on any input: a line it does not
understand becomes a `raw` event.
"""

from __future__ import annotations

import enum
import signal
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar


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


@dataclass(frozen=True)
class Event:
    kind: Kind
    text: str = ""
    tool: str | None = None
    session: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    is_error: bool = False


@dataclass(frozen=True)
class CoderSettings:
    """The `[coders.NAME]` table: where the binary is and what to add to its command line."""

    binary: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
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


@dataclass
class Tally:
    """What the runner learned from the events of one attempt."""

    session: str | None = None
    turns: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    last_tool: str | None = None
    result_seen: bool = False
    result_error: bool = False
    last_error: str | None = None

    def add(self, event: Event) -> None:
        if event.session:
            self.session = event.session
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
        if event.kind == Kind.ERROR:
            self.last_error = event.text
        if event.kind == Kind.RESULT:
            self.result_seen = True
            self.result_error = event.is_error


class Verdict(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    KILLED = "killed"


class Coder(ABC):
    name: ClassVar[str]
    default_binary: ClassVar[str]
    stop_signal: ClassVar[int] = signal.SIGTERM
    # A command's exit 0 means the task is done; an agent must close its task explicitly.
    closes_on_success: ClassVar[bool] = False

    def __init__(self, settings: CoderSettings) -> None:
        self.settings = settings

    @property
    def binary(self) -> str:
        return self.settings.binary or self.default_binary

    @abstractmethod
    def argv(self, run: RunSpec) -> list[str]: ...

    def environ(self, run: RunSpec) -> dict[str, str]:
        return dict(self.settings.env)

    def prepare(self, run: RunSpec) -> None:  # noqa: B027  (optional hook, not abstract)
        """Write runtime configuration before the spawn (nothing by default)."""

    @abstractmethod
    def parse(self, line: str) -> Sequence[Event]: ...

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        """Judge the finished process (`returncode` < 0 means killed by that signal)."""
        if returncode < 0 and not tally.result_seen:
            return Verdict.KILLED
        if tally.result_seen:
            return Verdict.FAILURE if tally.result_error else Verdict.SUCCESS
        return Verdict.SUCCESS if returncode == 0 else Verdict.FAILURE
