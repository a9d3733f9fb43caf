"""The task and attempt records, and their JSON form, declared once.

`TASK_FIELDS` and `ATTEMPT_FIELDS` are the documented, stable `--json` schema: the store builds
its SQL from them and the docs list them, so the three can never disagree. Fields are only ever
added at the end, never renamed or removed.

The records are NamedTuples rather than dataclasses: every fleet process imports this module at
start-up, and creating eight frozen dataclasses cost about 12 ms of each start (three per task).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Status(enum.StrEnum):
    READY = "ready"  # waiting to be claimed (once every task it depends on is done)
    RUNNING = "running"  # claimed; an attempt holds the lease
    MERGING = "merging"  # finished in its worktree; its branch waits to be merged back
    BLOCKED = "blocked"  # needs a person: retry limit reached, or blocked by hand or by the agent
    DONE = "done"  # closed as finished
    CANCELLED = "cancelled"  # withdrawn; never runs again unless retried
    SUSPENDED = "suspended"  # checkpointed and stopped by a person; never claimed until resumed
    HANDED_OFF = "handed-off"  # its work goes on in a successor task (another coder or model)

    @property
    def final(self) -> bool:
        return self in (Status.DONE, Status.CANCELLED, Status.HANDED_OFF)


MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 4, 2
ISOLATIONS = ("none", "worktree")  # where the agent works: the task's cwd, or a worktree of it
SANDBOXES = ("none", "standard", "strict")  # the walls around an agent (fleet.containment)
MERGE_STRATEGIES = ("merge", "rebase", "ff-only", "branch")  # how a worktree's branch goes back


class Field(NamedTuple):
    name: str
    kind: str  # "text", "int", "real", "bool", "list" (a JSON array of strings), "object"
    doc: str


def _values(fields: tuple[Field, ...], obj: dict[str, Any]) -> dict[str, Any]:
    """A record's constructor arguments from its JSON object (lists become tuples)."""
    values = {f.name: obj[f.name] for f in fields}
    for f in fields:
        value = values[f.name]
        if f.kind == "list":
            values[f.name] = tuple(value)
        elif f.kind == "bool" and value is not None:
            values[f.name] = bool(value)
    return values


def _json(fields: tuple[Field, ...], record: tuple[Any, ...]) -> dict[str, Any]:
    """A record as its JSON object (tuples become lists, enums their values)."""
    out: dict[str, Any] = {}
    for f in fields:
        value = getattr(record, f.name)
        out[f.name] = list(value) if f.kind == "list" else value
        if isinstance(value, enum.Enum):
            out[f.name] = value.value
    return out


TASK_FIELDS: tuple[Field, ...] = (
    Field("id", "text", "task id, `fl-` and six base32 characters"),
    Field("title", "text", "one-line title"),
    Field("description", "text", "longer instructions for the agent (may be empty)"),
    Field(
        "status",
        "text",
        "ready, running, merging (finished, its branch waits to be merged back), blocked, done,"
        " cancelled, suspended or handed-off",
    ),
    Field("priority", "int", "0 (highest) to 4 (lowest)"),
    Field("cwd", "text", "absolute project directory the agent works in"),
    Field("coder", "text", "coder name; null until the first claim freezes the default"),
    Field("model", "text", "model name; null means the coder's default"),
    Field("labels", "list", "free-form labels"),
    Field("after", "list", "ids of the tasks this one depends on"),
    Field(
        "waiting_on",
        "list",
        "the dependencies that are not done yet, and a predecessor whose attempt has not ended",
    ),
    Field("parent", "text", "id of the parent task, or null"),
    Field("attempts", "int", "number of attempts started"),
    Field("failures", "int", "failed attempts since the last retry"),
    Field("noclose", "int", "attempts that ended without closing the task, since the last retry"),
    Field("claimed_by", "text", "owner of the current claim, or null"),
    Field("lease_until", "text", "when the current claim expires unless renewed, or null"),
    Field("reason", "text", "why the task was last closed, blocked or cancelled, or null"),
    Field("created_at", "text", "UTC ISO 8601 time the task was added"),
    Field("updated_at", "text", "UTC ISO 8601 time of the last change"),
    Field("started_at", "text", "UTC ISO 8601 time of the first claim, or null"),
    Field("finished_at", "text", "UTC ISO 8601 time it was last done or cancelled, or null"),
    Field("tokens_in", "int", "input tokens of all attempts (cached included), or null"),
    Field("tokens_out", "int", "output tokens of all attempts, or null"),
    Field(
        "cost",
        "real",
        "cost of all attempts in US dollars, as reported or estimated (see cost_source), or null",
    ),
    Field("question", "text", "id of the agent's question waiting for an answer, or null"),
    Field(
        "isolation",
        "text",
        "none (the agent works in cwd) or worktree (in a git worktree of its own), fixed when"
        " the task is added; null for a task added before fleet knew isolation, which means none",
    ),
    Field("base", "text", "with worktree isolation, the branch the task's branch starts from"),
    Field("branch", "text", "the task's git branch (fleet/ID) once its worktree exists, or null"),
    Field("worktree", "text", "absolute path of the task's git worktree once created, or null"),
    Field(
        "merge",
        "text",
        "with worktree isolation, how the branch goes back into base once the task is done:"
        " merge, rebase, ff-only or branch; null means the merge_strategy setting at that time",
    ),
    Field(
        "merge_state",
        "text",
        "null until the agent finishes; then pending (waiting, see merge_reason), merged,"
        " branch (left for a pull request), conflict or failed (blocked, see reason)",
    ),
    Field("merge_reason", "text", "why the merge-back waits, failed, or what it left behind"),
    Field("merged_commit", "text", "the commit the merge-back moved the base branch to, or null"),
    Field(
        "ahead",
        "int",
        "commits on the task's branch that its base has not, as counted when an attempt or a"
        " merge-back last ended; null before",
    ),
    Field(
        "resume_from",
        "int",
        "the checkpoint the next attempt resumes from (set by `fleet resume ID`), or null",
    ),
    Field("predecessor", "text", "the task this one took over from by a handoff, or null"),
    Field("merged_from", "list", "ids of the tasks whose work this one consolidates"),
    Field("handoff", "text", "the context the predecessor handed over, or null"),
    Field(
        "tokens_cache_read",
        "int",
        "of tokens_in, those read from the model's cache, where the coder tells them apart",
    ),
    Field("tokens_cache_write", "int", "of tokens_in, those written into the model's cache"),
    Field(
        "cost_source",
        "text",
        "reported (every attempt's cost as its coder reported it), estimated (from the price"
        " table), mixed, or null while there is no cost",
    ),
    Field(
        "max_cost_usd",
        "real",
        "the task's budget in US dollars over all its attempts; null means the max_cost_usd"
        " setting",
    ),
    Field(
        "max_tokens",
        "int",
        "the task's budget in tokens (input and output) over all its attempts; null means the"
        " max_tokens setting",
    ),
    Field(
        "sandbox",
        "text",
        "the walls around the task's agent (none, standard or strict); null means its coder's"
        " sandbox setting, else the sandbox setting",
    ),
    Field(
        "limits",
        "object",
        "the task's own resource limits (fleet.toml(5), coders.NAME.limits: name to value), over"
        " its coder's and its labels'; null: none of its own",
    ),
    Field(
        "host",
        "text",
        "the host of the task's newest claim: the one running it, else the one that ran its"
        " last attempt; null before its first claim",
    ),
    Field(
        "lost_streak",
        "int",
        "attempts in a row that ended lost (their host or runner gone); any other end resets it,"
        " and at max_lost the task is blocked",
    ),
    Field(
        "pinned_host",
        "text",
        "the only host that may run the task (`fleet add --host`, its `uname -n`), or null for any",
    ),
    Field(
        "needs",
        "list",
        "labels a host must advertise (its host_labels setting) to run the task; [] for none",
    ),
)

ATTEMPT_FIELDS: tuple[Field, ...] = (
    Field("task", "text", "task id"),
    Field("n", "int", "attempt number, from 1"),
    Field("owner", "text", "the host that claimed it (its name, as `fleet hosts` lists it)"),
    Field("started_at", "text", "UTC ISO 8601 start time"),
    Field("ended_at", "text", "UTC ISO 8601 end time, or null while running"),
    Field("outcome", "text", "how the attempt ended, or null while running"),
    Field("exit_status", "int", "the coder's exit status, or null"),
    Field("tokens_in", "int", "input tokens, or null"),
    Field("tokens_out", "int", "output tokens, or null"),
    Field(
        "cost",
        "real",
        "its own cost in US dollars (a resumed session's earlier share taken out), reported by"
        " the coder or else estimated from the price table (see cost_source), or null",
    ),
    Field("session_id", "text", "the coder's session id, or null"),
    Field("coder", "text", "the coder it ran"),
    Field("model", "text", "the model that did most of its work, or null if not known"),
    Field("tokens_cache_read", "int", "of tokens_in, those read from the model's cache, or null"),
    Field("tokens_cache_write", "int", "of tokens_in, those written into the cache, or null"),
    Field(
        "cost_source",
        "text",
        "reported (by the coder), estimated (from the price table), or null with no cost",
    ),
)


class Task(NamedTuple):
    id: str
    title: str
    description: str
    status: Status
    priority: int
    cwd: str
    coder: str | None
    model: str | None
    labels: tuple[str, ...]
    after: tuple[str, ...]
    waiting_on: tuple[str, ...]
    parent: str | None
    attempts: int
    failures: int
    noclose: int
    claimed_by: str | None
    lease_until: str | None
    reason: str | None
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    tokens_in: int | None
    tokens_out: int | None
    cost: float | None
    question: str | None
    isolation: str | None
    base: str | None
    branch: str | None
    worktree: str | None
    merge: str | None
    merge_state: str | None
    merge_reason: str | None
    merged_commit: str | None
    ahead: int | None
    resume_from: int | None
    predecessor: str | None
    merged_from: tuple[str, ...]
    handoff: str | None
    tokens_cache_read: int | None
    tokens_cache_write: int | None
    cost_source: str | None
    max_cost_usd: float | None
    max_tokens: int | None
    sandbox: str | None
    limits: dict[str, str] | None
    host: str | None
    lost_streak: int
    pinned_host: str | None
    needs: tuple[str, ...]

    @property
    def isolated(self) -> bool:
        """Whether the agent works in a git worktree of its own."""
        return self.isolation == "worktree"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Task:
        values = _values(TASK_FIELDS, obj)
        values["status"] = Status(values["status"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return _json(TASK_FIELDS, self)


class Attempt(NamedTuple):
    task: str
    n: int
    owner: str
    started_at: str
    ended_at: str | None
    outcome: str | None
    exit_status: int | None
    tokens_in: int | None
    tokens_out: int | None
    cost: float | None
    session_id: str | None
    coder: str | None
    model: str | None
    tokens_cache_read: int | None
    tokens_cache_write: int | None
    cost_source: str | None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in ATTEMPT_FIELDS}


class QuestionKind(enum.StrEnum):
    INPUT = "input"  # free text
    CHOICE = "choice"  # one (or with multi_select several) of the options
    APPROVAL = "approval"  # approve or deny, with an optional comment


class QuestionStatus(enum.StrEnum):
    PENDING = "pending"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


QUESTION_FIELDS: tuple[Field, ...] = (
    Field("id", "text", "question id, `q-` and six base32 characters"),
    Field("task", "text", "id of the task whose agent asked"),
    Field("attempt", "int", "the attempt that asked"),
    Field("kind", "text", "input (free text), choice or approval"),
    Field("text", "text", "the question as the agent put it"),
    Field("options", "list", "the options of a choice question"),
    Field("multi_select", "bool", "whether a choice question takes several options"),
    Field("status", "text", "pending, answered, expired or cancelled"),
    Field("answer", "text", "the answer as the agent receives it, or null"),
    Field("choices", "list", "the options chosen (choice questions)"),
    Field("approved", "bool", "true or false for an approval question once answered, else null"),
    Field("comment", "text", "free text given with a choice or approval, or null"),
    Field("answered_by", "text", "who answered (user@host), or null"),
    Field("asked_at", "text", "UTC ISO 8601 time the agent asked"),
    Field("answered_at", "text", "UTC ISO 8601 time it was answered, expired or cancelled"),
    Field("expires_at", "text", "UTC ISO 8601 time it expires unless answered"),
)


class Question(NamedTuple):
    id: str
    task: str
    attempt: int
    kind: QuestionKind
    text: str
    options: tuple[str, ...]
    multi_select: bool
    status: QuestionStatus
    answer: str | None
    choices: tuple[str, ...]
    approved: bool | None
    comment: str | None
    answered_by: str | None
    asked_at: str
    answered_at: str | None
    expires_at: str

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Question:
        values = _values(QUESTION_FIELDS, obj)
        values["kind"] = QuestionKind(values["kind"])
        values["status"] = QuestionStatus(values["status"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return _json(QUESTION_FIELDS, self)


class Reply(NamedTuple):
    """A person's answer to a question, before the store checks it against the question."""

    by: str
    text: str | None = None  # the answer (input) or a comment (choice, approval)
    choices: tuple[str, ...] = ()
    approved: bool | None = None


class TaskSpec(NamedTuple):
    """What a person asks for when adding a task; validated before it reaches the store."""

    title: str
    cwd: str
    description: str = ""
    coder: str | None = None
    model: str | None = None
    priority: int = DEFAULT_PRIORITY
    labels: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # full ids, or `ref:NAME` for a task earlier in the same batch
    parent: str | None = None
    ref: str | None = None  # batch-local name other lines may depend on
    isolation: str | None = None  # "none" or "worktree", resolved by `fleet add`
    base: str | None = None  # with worktree isolation: the branch to start from
    merge: str | None = None  # with worktree isolation: the merge-back strategy, None: setting
    parent_waits: bool = False  # the parent depends on this task (its `after` gains it)
    merged_from: tuple[str, ...] = ()  # the tasks it consolidates (full ids)
    max_cost_usd: float | None = None  # budgets over all attempts; None: the settings'
    max_tokens: int | None = None
    sandbox: str | None = None  # none, standard, strict; None: the coder's or the setting
    limits: dict[str, str] | None = None  # checked by fleet.limits; None: none of its own
    pinned_host: str | None = None  # the only host that may run it (fleet.affinity); None: any
    needs: tuple[str, ...] = ()  # labels its host must have


class TaskEdit(NamedTuple):
    """Changes to a task; None leaves a field alone."""

    title: str | None = None
    description: str | None = None
    cwd: str | None = None
    coder: str | None = None
    model: str | None = None
    priority: int | None = None
    parent: str | None = None
    add_labels: tuple[str, ...] = ()
    remove_labels: tuple[str, ...] = ()
    add_after: tuple[str, ...] = ()
    remove_after: tuple[str, ...] = ()
    clear: frozenset[str] = frozenset()  # fields to set to null
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    limits: dict[str, str] | None = None  # merged into the task's own; "" removes a name
    pinned_host: str | None = None  # the only host that may run it; clear it for any host
    add_needs: tuple[str, ...] = ()
    remove_needs: tuple[str, ...] = ()

    @property
    def touches_run(self) -> bool:
        """Whether it changes what a running attempt was started with."""
        given = (self.cwd, self.coder, self.model, self.limits)
        return any(v is not None for v in given) or bool(self.clear & {"coder", "model"})


class AttemptEnd(NamedTuple):
    """How an attempt ended, as recorded on its row (its own tokens and cost, fleet.usage)."""

    outcome: str
    exit_status: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    session_id: str | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    cost_source: str | None = None  # reported, estimated, or None
    model: str | None = None
    # (model, calls, input, output, cache_read, cache_write, cost, cost_source) per model
    usage: tuple[tuple[Any, ...], ...] = ()
    session_totals: str | None = None  # JSON: what the CLI reported for its whole session


class MergeMark(NamedTuple):
    """What a merge-back attempt leaves on its task."""

    state: str  # pending, merged, branch, conflict or failed
    reason: str | None = None  # why it waits or failed, or what it left behind
    commit: str | None = None  # the commit the base branch now points at (merged)
    ahead: int | None = None  # the branch's commits its base has not, None: unchanged


CHECKPOINT_FIELDS: tuple[Field, ...] = (
    Field("task", "text", "task id"),
    Field("n", "int", "checkpoint number within the task, from 1"),
    Field("attempt", "int", "the attempt it was taken in (0: before the first one)"),
    Field("created_at", "text", "UTC ISO 8601 time it was taken"),
    Field("by", "text", "who took it: `agent`, or the person (user@host)"),
    Field("summary", "text", "the context summary: where the work stands and what comes next"),
    Field("ref", "text", "the git ref holding the work in progress, or null (see note)"),
    Field("commit", "text", "the commit that ref points at, or null"),
    Field("repo", "text", "the git work tree the ref was made in, or null"),
    Field("note", "text", "why there is no ref (no git repository, git failed), or null"),
    Field("coder", "text", "the coder whose session it records, or null"),
    Field("session_id", "text", "the coder's session id of the attempt, or null"),
    Field("questions", "list", "ids of the task's questions that were pending"),
)


class Checkpoint(NamedTuple):
    task: str
    n: int
    attempt: int
    created_at: str
    by: str
    summary: str
    ref: str | None
    commit: str | None
    repo: str | None
    note: str | None
    coder: str | None
    session_id: str | None
    questions: tuple[str, ...]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Checkpoint:
        return cls(**_values(CHECKPOINT_FIELDS, obj))

    def to_json(self) -> dict[str, Any]:
        return _json(CHECKPOINT_FIELDS, self)


AUDIT_FIELDS: tuple[Field, ...] = (
    Field("id", "int", "the entry's number, increasing across the whole queue"),
    Field("task", "text", "task id"),
    Field("at", "text", "UTC ISO 8601 time of the action"),
    Field("action", "text", "what was done: added, claimed, started, ended, closed, …"),
    Field("by", "text", "who did it: the person (user@host), `agent`, or a program"),
    Field("detail", "object", "what the action needs said (attempt, outcome, related tasks…)"),
)


class AuditEntry(NamedTuple):
    id: int
    task: str
    at: str
    action: str
    by: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class CheckpointSpec(NamedTuple):
    """What a checkpoint records, before the store numbers it."""

    by: str
    summary: str
    ref_prefix: str | None = None  # the ref is this plus the number; None: no ref
    commit: str | None = None
    repo: str | None = None
    note: str | None = None
