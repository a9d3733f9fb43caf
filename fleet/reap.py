"""fleet-reap ID: classify how an attempt ended and apply the policy to its task.

Run as the unit's ExecStopPost, it reads the runner's outcome file (only if it belongs to this
invocation and attempt), systemd's $SERVICE_RESULT / $EXIT_CODE / $EXIT_STATUS and the cgroup's
OOM counter. The classification is one of OUTCOMES; the policy maps it to the task's next
state with the retry and no-close limits. A person's close, block, cancel, suspend or handoff
during the attempt always stands (a suspended or handed-off attempt counts as nothing, and so
does one that ended on its own after its task was blocked: by its agent, usually), and an
attempt that ends well but leaves its task waiting for subtasks it spawned is `waiting`: the
task is ready again without counting, and claimed once they are done. A runner that died without an
outcome (SIGKILL) could not commit its agent's work in a task's worktree, so that is committed
here first. A worktree task whose attempt succeeded is not done yet: it goes to `merging`, and
its branch is merged back here and now (fleet.merge), leaving it done, blocked, or merging still
(retried by every dispatch pass). Then it wakes fleet-claim, since a slot is free, and when the
task is left blocked (other than by a person's kill) it notifies a person through fleet.alerts.
A runner that refused to start (the task was suspended, handed off or closed between its claim
and the unit's start) leaves a `refused` outcome: the claim, this host's, is released with the
attempt `not-started` and the person's status kept.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NamedTuple

from fleet import inputs, live, taskdir, usage, wake
from fleet import outcome as outcome_file
from fleet.config import Config
from fleet.errors import Conflict, FleetError
from fleet.host import owner
from fleet.model import AttemptEnd, Status, Task
from fleet.paths import Paths
from fleet.store import Store
from fleet.store.base import Count

OUTCOMES = (
    "success",
    "noclose",
    "failure",
    "killed",
    "timeout",
    "oom",
    "watchdog",
    "lost",
    "interrupted",  # stopped by a shutdown, not by a person: requeued without counting
    "rate-limited",  # the provider refused: requeued, the coder held back until its reset
    "context-pressure",  # fleet stopped it at context_pressure_pct: requeued, fresh context
    "suspended",  # a person suspended the task: it stays suspended until resumed, no count
    "handed-off",  # the task went to a successor meanwhile: it stays handed-off, no count
    "waiting",  # ended well, waiting for subtasks: ready again once they are done, no count
    "blocked",  # ended on its own with its task blocked meanwhile (by the agent): no count
    "budget",  # stopped at the task's max_cost_usd or max_tokens: blocked with the figure
    "unstartable",  # the coder's program cannot be started: blocked at once, no count
)
REQUEUED = ("interrupted", "rate-limited", "context-pressure")
FAILURES = ("failure", "timeout", "oom", "watchdog", "lost")


class Service(NamedTuple):
    """What systemd tells ExecStopPost about the main process."""

    result: str  # success, exit-code, signal, timeout, watchdog, core-dump, …
    code: str  # exited, killed, dumped
    status: str  # exit status number or signal name
    invocation: str
    oom_kills: int

    @classmethod
    def from_env(cls) -> Service | None:
        env = os.environ
        if "SERVICE_RESULT" not in env:
            return None
        return cls(
            env.get("SERVICE_RESULT", ""),
            env.get("EXIT_CODE", ""),
            env.get("EXIT_STATUS", ""),
            env.get("INVOCATION_ID", ""),
            oom_kills(),
        )


def oom_kills() -> int:
    """The OOM-kill counter of our own cgroup (ExecStopPost runs in the unit's cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return 0
    candidates: list[Path] = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidates.append(Path(f"/sys/fs/cgroup/memory{group}/memory.oom_control"))
        elif controllers == "":
            candidates.append(Path(f"/sys/fs/cgroup/unified{group}/memory.events"))
            candidates.append(Path(f"/sys/fs/cgroup{group}/memory.events"))
    for path in candidates:
        try:
            for row in path.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return 0


def shutting_down() -> bool:
    from fleet import systemd

    try:
        state = systemd.systemctl(systemd.current_scope(), "is-system-running", check=False)
    except FleetError:
        return False
    return state.strip() == "stopping"


def classify(
    task: Task,
    found: outcome_file.Outcome | None,
    service: Service | None,
    spawned: tuple[str, ...] = (),
) -> tuple[str, str]:
    """(outcome, reason) for the attempt that just ended; `spawned`: the subtasks this attempt
    added for the task to wait for."""
    if task.status == Status.SUSPENDED:
        # Suspended while it ran: however the stop ended it, that was the person's doing.
        return "suspended", task.reason or "suspended"
    if task.status == Status.HANDED_OFF:
        return "handed-off", task.reason or "handed off"
    if service is not None:
        if service.result == "watchdog":
            return "watchdog", "the runner stopped answering the watchdog"
        if service.result == "timeout":
            return "timeout", "the attempt ran longer than its time limit"
        if service.oom_kills:
            return "oom", "out of memory"
    if found is None:
        if service is not None and service.code in ("killed", "dumped"):
            return "killed", f"the runner was killed by SIG{service.status}"
        return "lost", "the runner ended without recording an outcome"
    if task.status == Status.BLOCKED and found.verdict in ("success", "failure"):
        # `fleet block` or task_blocked during the attempt, by its agent (or a person), and
        # then the agent ended: the block is this attempt's outcome, neither a failure nor
        # an attempt that forgot to close its task.
        return "blocked", task.reason or "blocked"
    if found.verdict == "success":
        waits = (*task.waiting_on, *(s for s in spawned if s not in task.waiting_on))
        if task.status == Status.RUNNING and waits:
            # Its subtasks are the work now (a command's exit status closes nothing yet), and
            # the next attempt reads their outcomes, even if they were quicker than this one.
            return "waiting", "waiting for subtasks " + ", ".join(waits)
        if task.status == Status.DONE or found.closes_on_success:
            return "success", found.reason
        return "noclose", "the agent finished without closing the task"
    if found.stopped_by == outcome_file.LEASE_LOST:
        # Not a person's stop: its runner could not renew the claim in time (the store was
        # unreachable), so the attempt is lost, and the task run again.
        return "lost", "its runner could not renew the claim in time and stopped the agent"
    if found.verdict == "killed":
        return "killed", found.stopped_by or found.reason
    if found.verdict in ("rate-limited", "context-pressure", "budget", "unstartable"):
        return found.verdict, found.reason or found.verdict
    return "failure", found.reason or "failed"


def policy(task: Task, kind: str, reason: str, config: Config) -> tuple[Status, str | None]:
    """The task's next status and reason after an attempt classified as `kind`."""
    if kind == "success":
        return Status.DONE, task.reason or reason or None
    if kind == "killed":
        return Status.BLOCKED, f"stopped by a person ({reason})"
    if kind == "suspended":  # `finish` keeps the status a person set during the attempt
        return Status.SUSPENDED, reason
    if kind == "handed-off":
        return Status.HANDED_OFF, reason
    if kind == "waiting":
        return Status.READY, reason
    if kind == "blocked":  # `finish` keeps the block and its reason
        return Status.BLOCKED, reason
    if kind == "budget":
        return Status.BLOCKED, f"budget: {reason}"
    if kind == "unstartable":  # every retry would fail alike: a person must act first
        return Status.BLOCKED, f"unstartable: {reason}"
    if kind in REQUEUED:
        return Status.READY, f"{kind}: {reason}"
    if kind == "noclose":
        limit = config.get_int("noclose_limit")
        if task.noclose + 1 >= limit:
            return Status.BLOCKED, f"ended {task.noclose + 1} times without closing the task"
        return Status.READY, reason
    limit = config.get_int("retry_limit")
    if task.failures + 1 >= limit:
        return Status.BLOCKED, f"{kind}: {reason} (after {task.failures + 1} failed attempts)"
    return Status.READY, f"{kind}: {reason}"


def settle(
    paths: Paths, store: Store, config: Config, task_id: str, service: Service | None = None
) -> str | None:
    """Reap the current attempt of `task_id`; the outcome, or None if there was nothing to.

    `service` describes how the runner ended; by default it is read from ExecStopPost's
    environment.
    """
    service = service or Service.from_env()
    task = store.get(task_id)
    found = outcome_file.read(taskdir.task_dir(paths, task_id))
    if found is not None and (
        found.attempt != task.attempts
        or (service is not None and found.invocation != service.invocation)
    ):
        found = None  # an older attempt's file
    if found is not None and found.verdict == "refused":
        return release_refused(paths, store, task, found, service)
    if found is not None:
        # Its reason is the coder's last words (redacted by the runner), bound for the store.
        found = found._replace(reason=inputs.tamed(found.reason))
    if task.claimed_by != owner():
        return None
    kind, reason = classify(task, found, service, spawned_now(store, task))
    if found is None and task.worktree:
        keep_work(task, kind)
    if kind == "killed" and service is not None and shutting_down():
        # Not a person's decision: the machine or the session is going down. Run it again.
        store.release(
            task_id, owner(), AttemptEnd("interrupted", exit_status=None), attempt=task.attempts
        )
        return "interrupted"
    status, why = policy(task, kind, reason, config)
    ahead = None
    if task.isolated and task.branch and task.base:
        from fleet import worktree

        ahead = worktree.commits_ahead(task.worktree or task.cwd, task.base, task.branch)
        if kind == "success":
            status = Status.MERGING
    if kind == "rate-limited":
        hold_back(paths, store, config, task, found)
    count: Count | None = (
        "failure" if kind in FAILURES else "noclose" if kind == "noclose" else None
    )
    end = ending(paths, task, kind, found, service)
    try:
        after = store.finish(
            task_id, owner(), end, status, why, count, ahead, attempt=task.attempts
        )
    except Conflict:
        return None  # someone else reaped it meanwhile
    live.remove(paths, task_id)
    if after.status == Status.MERGING:
        after = merge_back(paths, store, config, after)
    wake.poke(paths)
    alert(paths, config, task, after, kind)
    return kind


def ending(
    paths: Paths,
    task: Task,
    kind: str,
    found: outcome_file.Outcome | None,
    service: Service | None,
) -> AttemptEnd:
    """The attempt's record: what its runner wrote, or for a runner that died without an
    outcome, its spend as its live figures last had it (fleet.live)."""
    if found is None:
        return usage.attempt_end(
            kind, live.spent(paths, task.id, task.attempts), _exit_status(service)
        )
    return usage.attempt_end(kind, found._asdict(), found.exit_status, found.session_totals)


def release_refused(
    paths: Paths,
    store: Store,
    task: Task,
    found: outcome_file.Outcome,
    service: Service | None,
) -> str | None:
    """A unit whose runner refused to start an attempt: if the claim is this host's for that
    very attempt and the task is no longer running (suspended, handed off or closed between
    the claim and the start), the attempt never started: release the claim, keeping the
    status a person set, and wake fleet-claim (a successor may wait for this). Anything else
    (a task that was not claimable, or claimed elsewhere) is left as it is."""
    if (
        service is None
        or not found.invocation
        or task.claimed_by != owner()
        or task.status == Status.RUNNING
        or found.attempt != task.attempts
    ):
        return None
    try:
        store.finish(
            task.id, owner(), AttemptEnd("not-started"), task.status, attempt=task.attempts
        )
    except Conflict:
        return None  # released meanwhile
    wake.poke(paths)
    return "not-started"


def merge_back(paths: Paths, store: Store, config: Config, task: Task) -> Task:
    """Merge the task's branch back now (waiting for the repository's lock); a failure here is
    written to the journal, and the task stays in merging for the next pass to retry."""
    from fleet import merge

    try:
        return merge.merge_back(paths, store, config, task.id) or task
    except FleetError as e:
        sys.stderr.write(f"fleet-reap: merge-back of {task.id}: {e.message}\n")
        return task


def spawned_now(store: Store, task: Task) -> tuple[str, ...]:
    """The subtasks the current attempt added and made its task wait for."""
    if not task.after:
        return ()
    attempts = store.attempts(task.id)
    if not attempts:
        return ()
    since = attempts[-1].started_at
    return tuple(
        c.id for c in store.children(task.id) if c.id in task.after and c.created_at >= since
    )


def keep_work(task: Task, kind: str) -> None:
    """The runner died before it could commit its agent's work (SIGKILL: out of memory, the
    watchdog, a time limit): commit it now, so a blocked task does not sit on loose files."""
    from fleet import worktree

    message = f"fleet: work left when attempt {task.attempts} of {task.id} ended ({kind})"
    try:
        commit = worktree.commit_leftovers(Path(task.worktree or ""), message)
        text = f"committed the work left in {task.worktree} as {commit}" if commit else ""
    except (FleetError, OSError) as e:
        why = e.message if isinstance(e, FleetError) else str(e)
        text = f"could not commit the work left in {task.worktree}: {why}"
    if text:  # under systemd, standard error is the unit's journal
        sys.stderr.write(f"fleet-reap: {text}\n")


def alert_event(before: Task, after: Task, kind: str) -> str | None:
    """The notification an attempt's end calls for: "failed" when the retry limit blocked the
    task, "blocked" when it is blocked otherwise (the no-close limit, or a `fleet block` during
    the attempt, usually the agent's own); none after a person's kill, or when not blocked."""
    if after.status != Status.BLOCKED or kind == "killed":
        return None
    applied = before.status == Status.RUNNING  # else a block made during the attempt stands
    return "failed" if applied and kind in FAILURES else "blocked"


def alert(paths: Paths, config: Config, before: Task, after: Task, kind: str) -> None:
    event = alert_event(before, after, kind)
    if event is None:
        return
    from fleet import alerts

    state = "failed for good" if event == "failed" else "is blocked"
    message = f"{after.id} ({after.title}) {state}" + (f": {after.reason}" if after.reason else "")
    alerts.fire(paths, config, event, message, task=after, outcome=kind)


def hold_back(
    paths: Paths, store: Store, config: Config, task: Task, found: outcome_file.Outcome | None
) -> None:
    """Gate the coder until its reset (unless the runner already did), and wake fleet-claim
    then with a transient timer, so the queue resumes on time rather than on the next tick."""
    import time

    from fleet import systemd
    from fleet.timeutil import iso, parse

    coder = task.coder or config.get_str("default_coder")
    gate = store.gates().get(f"coder:{coder}")
    if gate is None or gate[0] is None:
        resets = found.resets_at if found and found.resets_at else None
        until = resets or time.time() + config.get_int("rate_limit_backoff_seconds")
        store.set_gate(f"coder:{coder}", iso(until), f"{coder} rate-limited", kind="rate-limit")
        wake_at = until
    else:
        wake_at = parse(gate[0])
    delay = max(1, int(wake_at - time.time()) + 1)
    unit = f"fleet-wake-{coder}"
    scope = systemd.current_scope()
    with contextlib.suppress(FleetError):
        systemd.systemctl(scope, "stop", f"{unit}.timer", check=False)
        systemd.run_later(scope, unit, delay, paths)


def _exit_status(service: Service | None) -> int | None:
    if service is not None and service.code == "exited" and service.status.isdigit():
        return int(service.status)
    return None
