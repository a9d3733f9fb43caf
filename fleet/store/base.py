"""The store interface: every state change of a task is one method here, and one transaction.

Semantics every backend must keep (SQLite and PostgreSQL, both fleet.store.sql):
- each method is atomic, and each transition names the state it expects (compare-and-set), so
  concurrent callers can never claim a task twice or resurrect a finished one;
- `claim` takes the highest-priority, oldest ready tasks whose dependencies are all done,
  of those the claiming host may run (fleet.store.placement: the task's host, the labels it
  needs, its directory present there), never more tasks of a coder with a global cap than
  the cap allows on all hosts together;
- a person's close/block/cancel wins over a running attempt: when that attempt ends, `finish`
  keeps the person's status and only records the attempt;
- a suspended task is never claimed: only `resume_task` makes it ready again, naming the
  checkpoint its next attempt resumes from (`resume_from`, cleared when that attempt ends);
- checkpoints of a task are numbered 1, 2, … in the order they are taken, and each records the
  session of the task's newest attempt that has one and the questions pending at that moment;
- a handoff ends the original as `handed-off` (a running attempt goes on until stopped, and
  `finish` keeps the status) and adds its successor in one transaction; tasks that waited for
  the original wait for the successor instead;
- a subtask added with `parent_waits` becomes a dependency of its parent, in the same
  transaction, so the parent is claimed again only once the subtask is done;
- every change writes its audit row (`history`) in its own transaction, as `actor`;
- a question leaves `pending` exactly once (answered, expired or cancelled), so the first answer
  wins; `finish` cancels the questions the ending attempt left pending; `tasks.question` names
  the newest pending question of the task, or nothing;
- a worktree task whose attempt succeeded goes to `merging` (`finish` with Status.MERGING, which
  also takes a task closed during the attempt), and leaves it only through `record_merge`
  (done, blocked, or still merging), a person's block, cancel or retry; `merging` is never
  claimed;
- a merge-back holds its task by a merge claim (`claimed_by` = MERGE_CLAIM + host, taken by
  `take_merge` under the repository's lock and released by `record_merge` in the transaction
  that records its verdict); while it is there every person's change (retry, cancel, block,
  close, edit, request_merge aside) is refused with a Conflict, and no attempt is claimed;
- `request_merge` takes a blocked task only when its merge-back blocked it (merge state
  conflict or failed), and never a task already merged;
- an attempt records its coder and model when claimed, and when it ends its own tokens (input,
  output, cache reads and writes), its cost with where it came from (reported or estimated)
  and its tokens and cost by model (`attempt_usage`); the task adds them to its totals;
- every gate that opens is also a `gate_log` row, extended while it stays open and ended when
  it is lifted before its time, so the timeline outlives the gate;
- `request_merge` and `record_merge` write their audit rows: `merge-requested`, and
  `merged-back`, `merge-blocked` or `merge-waits` (the last only when the reason changes, as a
  waiting merge is tried again on every dispatch pass);
- a spooled message (a notification channel's outbox) is sent by one deliverer at a time: it
  is taken with a claim that only runs out after the deliverer's bound, and it stays spooled,
  with its tries and last error, until `spool_sent`; a question's message is then kept, with
  the channel's message id, until it has been edited to show how the question was settled;
- a schedule's slot fires once: `fire` records (schedule, slot) under a unique key in the
  transaction that adds the slot's tasks (fleet.schedules);
- a task's `host` is the owner of its newest claim (kept once the claim ends); its
  `lost_streak` counts the attempts in a row that ended lost, and any other end resets it;
- the hosts sharing the queue keep the invariants of fleet.store.hosts;
- a lease has one holder at a time: another owner takes it only once it has run out, and only
  its holder changes the value it carries (which outlives the holder);
- what agents coordinate with (leases on resources, `Coordinating`) keeps the invariants of
  fleet.store.coord.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from fleet.audit import Actor
from fleet.errors import InputError
from fleet.model import (
    Attempt,
    AttemptEnd,
    AuditEntry,
    Checkpoint,
    CheckpointSpec,
    MergeMark,
    Question,
    QuestionKind,
    QuestionStatus,
    Status,
    Task,
    TaskEdit,
    TaskSpec,
)
from fleet.schedules import Schedule, ScheduleRun
from fleet.store.coord import Coordinating
from fleet.store.hosts import Hosting
from fleet.store.signals import Signalling

Count = Literal["failure", "noclose"]

# The claim a merge-back holds on its task: distinct from any runner's (the host name alone),
# so that neither fleet-claim's recovery of lost leases nor a runner's `finish` matches it.
MERGE_CLAIM = "merge:"


def is_merge_claim(owner: str | None) -> bool:
    return owner is not None and owner.startswith(MERGE_CLAIM)


class BadSpec(InputError):
    """One task of an `add` is invalid; `index` is its position (0-based) in the batch."""

    def __init__(self, index: int, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.index = index


class TaskFilter(NamedTuple):
    statuses: tuple[Status, ...] = ()  # empty: every status not final, unless include_final
    include_final: bool = False
    label: str | None = None
    cwd: str | None = None  # the directory or anything below it
    limit: int | None = None  # at most this many, oldest first
    coder: str | None = None  # the task's coder (a task naming none has default_coder)
    default_coder: str = ""
    search: str | None = None  # words the title holds, in any case (LIKE, not a full scan index)
    offset: int = 0  # skip this many first (a page of a long list)
    newest_first: bool = False


class OutgoingSpec(NamedTuple):
    """A message to spool: for `target` (a chat) of `channel`, about `event`."""

    channel: str
    target: str
    event: str
    body: dict[str, Any]
    task: str | None = None
    question: str | None = None


class Outgoing(NamedTuple):
    """A spooled message; `ref` is the channel's id of it once sent."""

    id: int
    channel: str
    target: str
    event: str
    body: dict[str, Any]
    task: str | None
    question: str | None
    created_at: str
    tries: int
    error: str | None
    ref: str | None
    settled: bool
    picked: tuple[str, ...]


class Lease(NamedTuple):
    name: str
    owner: str | None  # None: nobody holds it
    until: str | None
    value: str | None


class Store(Coordinating, Hosting, Signalling, Protocol):
    actor: Actor  # whom the audit trail names for this connection's changes

    def close(self) -> None: ...

    def rest(self) -> None:
        """Let go of the database connection until the next use takes one again (PostgreSQL),
        so that a long-lived program that uses its store now and then (a runner between
        renewals) holds none meanwhile; nothing on SQLite, whose file costs nothing to hold."""
        ...

    # Reading
    def resolve(self, ref: str) -> str:
        """The full id for a full id or an unambiguous prefix (NotFound / InputError)."""
        ...

    def get(self, task_id: str) -> Task: ...

    def tasks(self, flt: TaskFilter) -> Iterator[Task]: ...

    def list_json(self, flt: TaskFilter) -> Iterator[str]:
        """The same tasks as `tasks`, each already encoded as a JSON object (fast path)."""
        ...

    def count(self, flt: TaskFilter) -> int:
        """How many tasks `tasks(flt)` would list without its limit."""
        ...

    def ready(
        self,
        limit: int | None = None,
        coders: tuple[str, ...] | None = None,
        default_coder: str = "",
        among: bool = True,
        here: tuple[str, Sequence[str]] | None = None,
    ) -> list[Task]:
        """What `claim` would take next, in claim order, gates aside; with `coders`, only the
        tasks of those coders (a task naming none has `default_coder`), or with among=False
        only those of the others; with `here` (host name, its labels), only what that host
        may claim."""
        ...

    def attempts(self, task_id: str) -> list[Attempt]: ...

    def session_totals(self, task_id: str, session_id: str) -> dict[str, Any] | None:
        """What the coder reported for session `session_id` as a whole when the newest attempt
        of the task that ran it ended (`Coder.session_totals`), or None."""
        ...

    def children(self, task_id: str) -> list[Task]:
        """The task's subtasks, oldest first."""
        ...

    def history(self, task_id: str) -> list[AuditEntry]:
        """The task's audit trail, oldest first."""
        ...

    def heir(self, task_id: str) -> str:
        """The task that carries `task_id`'s work on: its last successor if it was handed
        off, else itself."""
        ...

    def note(self, task_id: str, action: str, **detail: Any) -> None:
        """An audit row for an action that changes nothing in the store (`started`)."""
        ...

    def claims(self, owner: str | None = None) -> list[Task]:
        """Tasks with a claim (of `owner`, or of anyone)."""
        ...

    def stale_claims(self, owner: str, boot: str | None) -> list[Task]:
        """The claims of host `owner`, now in boot `boot`, that may have lost their process:
        their lease ran out, or they were made in another boot of the host (every process of
        which is gone). A claim whose boot is unknown is stale only once its lease runs out."""
        ...

    def gates(self) -> dict[str, tuple[str | None, str | None]]:
        """Open gates: name -> (until or None for indefinitely, reason)."""
        ...

    def ids_with_prefix(self, prefix: str, limit: int) -> list[tuple[str, str]]:
        """(id, title) pairs for shell completion."""
        ...

    # A person's changes
    def add(self, specs: Sequence[TaskSpec]) -> list[Task]:
        """Add all or none."""
        ...

    def edit(self, task_id: str, change: TaskEdit) -> Task: ...

    def close_task(self, task_id: str, reason: str | None) -> Task: ...

    def block(self, task_id: str, reason: str) -> Task: ...

    def cancel(self, task_id: str, reason: str | None) -> Task: ...

    def retry(self, task_id: str) -> Task:
        """Back to ready with failure, no-close and lost counters reset."""
        ...

    def suspend(self, task_id: str, reason: str, checkpoint: int | None = None) -> Task:
        """A ready or running task becomes suspended (a running attempt goes on until its unit
        is stopped, and `finish` then keeps the status)."""
        ...

    def resume_task(self, task_id: str, checkpoint: int | None) -> Task:
        """A suspended task, its attempt over, back to ready, to resume from `checkpoint` (by
        default the newest; none if it has none); Conflict or NotFound otherwise."""
        ...

    def handoff(self, task_id: str, successor: TaskSpec, context: str | None) -> Task:
        """End the task as handed-off and add `successor` (its predecessor link and the handed
        over `context` recorded); Conflict if the task is finished. Returns the successor."""
        ...

    def add_checkpoint(self, task_id: str, spec: CheckpointSpec) -> Checkpoint:
        """Record the next checkpoint of the task, with its coder's session and the pending
        questions."""
        ...

    def drop_checkpoint_ref(self, task_id: str, n: int, note: str) -> Checkpoint:
        """The ref of checkpoint `n` could not be made: record why instead."""
        ...

    def checkpoint(self, task_id: str, n: int) -> Checkpoint: ...

    def checkpoints(self, task_id: str) -> list[Checkpoint]: ...

    def set_gate(
        self,
        name: str,
        until: str | None,
        reason: str | None,
        kind: str | None = None,
        window: str | None = None,
    ) -> None:
        """Stop claims: `pause` stops all, `coder:NAME` only that coder's tasks. `kind` says
        why in a word (pause, rate-limit, budget; by default pause or rate-limit), `window`
        which rate-limit window closed it; the gate's timeline row opens or is extended."""
        ...

    def open_gates(self) -> list[dict[str, Any]]:
        """Open gates with name, until, reason, kind, by, window and since."""
        ...

    def gate_log(self, since: str | None, until: str | None) -> list[dict[str, Any]]:
        """Every gate that was open at some time within [since, until), oldest first."""
        ...

    # Figures (fleet.status, fleet.stats, daily budgets)
    def status_counts(self) -> dict[str, int]:
        """How many tasks are in each status."""
        ...

    def ready_by_coder(
        self, default_coder: str, here: tuple[str, Sequence[str]] | None = None
    ) -> dict[str, int]:
        """How many tasks `claim` could take now (gates aside), by coder; with `here` (host
        name, its labels), on that host."""
        ...

    def attempt_rows(
        self, since: str | None, until: str | None, tasks: bool = False
    ) -> list[tuple[Any, ...]]: ...

    def attempt_sums(
        self, since: str | None, until: str | None, dims: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """Attempts that ended in [since, until) (not-started and unstartable aside: the coder
        never ran), summed by `dims` (coder, model, cwd, hour: the UTC hour of their end) and
        outcome: (*dims, outcome, count,
        tokens_in, tokens_out, cache_read, cache_write, cost, estimated cost, attempts with
        tokens but no cost, first start)."""
        ...

    def attempt_durations(
        self, since: str | None, until: str | None, dims: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """The same attempts one by one: (*dims, outcome, duration in seconds, the UTC hour
        they ended in, cost)."""
        ...

    def usage_sums(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]: ...

    def usage_rows(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]: ...

    def finished_by_hour(self, since: str | None, until: str | None) -> list[tuple[Any, ...]]: ...

    def spent_since(self, since: str) -> dict[str, float]: ...

    def attempt_usage(self, task_id: str) -> dict[int, list[dict[str, Any]]]: ...

    def clear_gate(self, name: str) -> bool: ...

    def record_gauge(
        self,
        coder: str,
        window: str,
        status: str | None,
        utilization: float | None,
        resets_at: float | None,
    ) -> None:
        """Keep the latest rate-limit reading of a coder's provider for one window."""
        ...

    def gauges(self) -> list[dict[str, Any]]: ...

    # The runner's changes
    def claim(
        self,
        n: int,
        owner: str,
        lease_s: float,
        default_coder: str,
        default_model: str | None,
        boot: str | None = None,
        labels: Sequence[str] = (),
        caps: Mapping[str, int] | None = None,
    ) -> list[Task]:
        """Claim up to `n` ready tasks for host `owner`, in boot `boot` of it (None: this
        process's, fleet.host.boot_id), each with a lease of `lease_s` seconds: tasks for any
        host or for `owner`, needing none but `labels`, whose directory exists here (one that
        does not is passed over and recorded: `missing_on`), and no more of a coder of `caps`
        (coder -> tasks at once on all hosts) than its cap leaves room for."""
        ...

    def claim_task(
        self,
        task_id: str,
        owner: str,
        lease_s: float,
        default_coder: str,
        default_model: str | None,
        boot: str | None = None,
        labels: Sequence[str] = (),
        caps: Mapping[str, int] | None = None,
    ) -> Task | None:
        """Claim this one task if it is claimable now by this host (as `claim` does, its
        directory looked for whatever was recorded); None otherwise."""
        ...

    def recheck_missing(self, owner: str) -> list[str]:
        """Look again for the directories host `owner` was recorded to lack; forget those
        found (and those of tasks finished or moved elsewhere). The ready tasks found again."""
        ...

    def missing_on(self, task_id: str) -> list[tuple[str, str]]:
        """(host, since when) of the hosts that lack the task's directory."""
        ...

    def missing_ready(self) -> dict[str, tuple[str, ...]]:
        """Ready tasks with hosts that lack their directory: id -> those hosts."""
        ...

    def placed_apart(self, limit: int) -> list[Task]:
        """Up to `limit` ready tasks, oldest first, that not every host may run: pinned to a
        host, needing labels, or with hosts lacking their directory."""
        ...

    def renew(self, task_id: str, owner: str, lease_s: float, attempt: int | None = None) -> bool:
        """Extend the lease by `lease_s` from now (the store's clock) iff `owner` still holds
        the claim (of attempt number `attempt`, if given)."""
        ...

    def now(self) -> str:
        """The store's clock as an ISO time, which leases are set and compared by: the
        database's on PostgreSQL, so that hosts whose clocks disagree agree on leases."""
        ...

    def record_session(self, task_id: str, owner: str, attempt: int, session_id: str) -> None:
        """Note the coder's session id on the running attempt as soon as it is known, so that a
        checkpoint taken meanwhile can name it."""
        ...

    def set_worktree(self, task_id: str, owner: str, branch: str, worktree: str) -> Task:
        """Record the branch and worktree of a worktree task, by the runner holding its claim;
        the branch, once recorded, never changes (Conflict otherwise)."""
        ...

    def release(
        self, task_id: str, owner: str, end: AttemptEnd, attempt: int | None = None
    ) -> Task:
        """End the attempt and put the task back to ready without counting anything."""
        ...

    def recover_lost(
        self, task_id: str, owner: str, end: AttemptEnd, attempt: int, max_lost: int, by: str
    ) -> Task:
        """Release attempt `attempt` of `owner`'s claim, lost, as host `by` recovering it (an
        audit row `recovered` names both when they differ); a task whose `max_lost`-th attempt
        in a row this is gets blocked, the reason naming the hosts it was lost on. Conflict
        unless `owner` still holds that attempt (so of two recoverers only one releases)."""
        ...

    def finish(
        self,
        task_id: str,
        owner: str,
        end: AttemptEnd,
        status: Status,
        reason: str | None = None,
        count: Count | None = None,
        ahead: int | None = None,
        attempt: int | None = None,
    ) -> Task:
        """End the attempt; `status` applies unless a person changed the task meanwhile
        (MERGING also applies over a close made during the attempt). `ahead`, if given, is the
        branch's count of commits its base has not. Conflict unless `owner` holds the claim
        (of attempt number `attempt`, if given: a claim taken over since is not the caller's)."""
        ...

    # Merge-back of worktree tasks
    def pending_merges(self) -> list[Task]:
        """Tasks in `merging`, oldest first (one indexed query: cheap when there are none)."""
        ...

    def request_merge(
        self, task_id: str, allowed: tuple[Status, ...], strategy: str | None
    ) -> Task:
        """A person's `fleet merge`: a worktree task with a branch, in one of `allowed` and with
        no attempt running (a merge claim may be there), back to `merging` (with `strategy`
        from now on, if given); a blocked one only if its merge-back blocked it, never one
        already merged; Conflict otherwise."""
        ...

    def take_merge(self, task_id: str, owner: str) -> Task | None:
        """Claim a task in `merging` for a merge-back as `owner` (a merge claim), taking over a
        merge claim already there: the caller holds the repository's lock, which a live
        merge-back keeps until it has recorded its verdict, so such a claim is a dead one's.
        None if the task is not in `merging` or an attempt holds it."""
        ...

    def record_merge(
        self,
        task_id: str,
        expected: Status,
        status: Status,
        mark: MergeMark,
        reason: str | None = None,
        owner: str | None = None,
    ) -> Task:
        """What a merge-back did, iff the task is still in `expected` and claimed by `owner`
        (idle if None; Conflict if not): its new status, merge state, and `reason` (kept as it
        was if None), the claim released."""
        ...

    # Questions from agents
    def ask(
        self,
        task_id: str,
        kind: QuestionKind,
        text: str,
        options: Sequence[str],
        multi_select: bool,
        expires_at: str,
    ) -> Question:
        """Record a question of the running attempt (Conflict if the task is not running)."""
        ...

    def question(self, qid: str) -> Question: ...

    def resolve_question(self, ref: str) -> str:
        """The full question id for a full id or an unambiguous prefix."""
        ...

    def questions(self, task_id: str | None = None, pending: bool = True) -> list[Question]:
        """Questions (only pending ones unless told), oldest first."""
        ...

    def answer(
        self,
        qid: str,
        by: str,
        answer: str,
        choices: Sequence[str] = (),
        approved: bool | None = None,
        comment: str | None = None,
    ) -> Question:
        """Answer a pending question; Conflict ("already answered by ...") otherwise."""
        ...

    def end_question(self, qid: str, status: QuestionStatus) -> Question | None:
        """Expire or cancel a pending question; None if it was no longer pending."""
        ...

    # The outbox of notification channels, and named leases
    def spool(self, specs: Sequence[OutgoingSpec]) -> list[Outgoing]: ...

    def take_spooled(
        self,
        channel: str,
        owner: str,
        seconds: float,
        limit: int,
        ids: Sequence[int] = (),
        before: int | None = None,
    ) -> list[Outgoing]:
        """Claim for `seconds` the unsent messages that are due, or spooled before message
        `before` even if not due yet (only `ids`, if given, due or not), oldest first; a claim
        of another owner still in force is left alone."""
        ...

    def spool_sent(self, msg_id: int, owner: str, ref: str) -> None:
        """Sent as `ref`: a question's message is kept, any other removed."""
        ...

    def spool_failed(self, msg_id: int, owner: str, error: str, next_at: float) -> None:
        """Not sent this time: counted, the error kept, due again at `next_at` (epoch s)."""
        ...

    def spooled(self, channel: str | None = None) -> int:
        """How many messages wait to be sent."""
        ...

    def sent_message(self, channel: str, target: str, ref: str) -> Outgoing | None: ...

    def unsettled(self, channel: str) -> list[Outgoing]:
        """Sent messages of questions that are no longer pending, not yet edited to say so."""
        ...

    def settle_message(self, msg_id: int) -> None: ...

    def pick(self, msg_id: int, picked: Sequence[str]) -> Outgoing:
        """Record the options toggled so far on a multi-select question's message."""
        ...

    # Schedules (fleet.schedules)
    def add_schedule(self, schedule: Schedule) -> Schedule:
        """Conflict if one of that name exists."""
        ...

    def schedules(self) -> list[Schedule]: ...

    def schedule(self, name: str) -> Schedule: ...

    def drop_schedule(self, name: str) -> None:
        """With its runs; the tasks it added stay."""
        ...

    def schedule_runs(
        self, name: str, limit: int = 1, manual: bool = True, added: bool = False
    ) -> list[ScheduleRun]:
        """The newest `limit` runs, newest first (`manual`: with those of `fleet schedule
        run`; `added`: only runs that added tasks)."""
        ...

    def fire(self, name: str, slot: str, specs: Sequence[TaskSpec]) -> ScheduleRun:
        """Add `specs` for the schedule's `slot`, once: in one transaction with the run's
        row, unique per (schedule, slot); the run of a slot that fired before is returned
        with fresh=False. The schedule's overlap decides against the newest run that added
        tasks, while one of them (or its heir) is ready, running or merging: skip records
        a skipped run, queue makes every spec wait for those tasks."""
        ...

    def take_lease(self, name: str, owner: str, seconds: float) -> Lease:
        """Take or renew lease `name` for `owner` unless another owner's is still in force;
        returns the lease as it then stands (its owner says who holds it)."""
        ...

    def drop_lease(self, name: str, owner: str) -> None: ...

    def set_lease_value(self, name: str, owner: str, value: str) -> bool:
        """Change the lease's value if `owner` holds it; whether it did."""
        ...
