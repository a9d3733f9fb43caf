"""fleet-run ID: one attempt of one task, from spawn to outcome file.

The runner owns nothing but the attempt: it claims the task only when started by hand for a
claimable task, spawns the coder in its own process group, turns every output line into events,
keeps systemd informed (READY, STATUS, WATCHDOG), renews the lease, and stops the agent on
SIGTERM or a `.kill` file. It ends by writing the outcome file; what that means for the task
(done, retry, block) is fleet-reap's decision. The loop blocks in one select() on the agent's
stdout, a pidfd, inotify and the signal pipe, so a silent agent costs no CPU.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from fleet import (
    checkpoints,
    coders,
    coordination,
    ids,
    lineage,
    live,
    outcome,
    pricing,
    questions,
    repolock,
    taskdir,
    usage,
    worktree,
)
from fleet.coders.base import Coder, Event, Kind, RunSpec, Tally, Verdict
from fleet.config import Config, load
from fleet.errors import Conflict, FleetError, InputError
from fleet.eventlog import EventLog
from fleet.events import MSG_ENDED, MSG_REFUSED, MSG_STARTED, Context, Sink
from fleet.host import owner
from fleet.journal import Journal, under_journald
from fleet.model import Status, Task
from fleet.notify import Notifier
from fleet.paths import Paths, ensure_dir, program, resolve
from fleet.proc import child_env
from fleet.redact import Redactor, secret_values
from fleet.store import Actor, Store, open_store
from fleet.timeutil import iso

MAX_LINE = 8 << 20  # a longer line is cut here and the rest of it skipped, never buffered
STATUS_EVERY = 0.25
EXIT = {
    "success": 0,
    "failure": 1,
    "killed": 3,
    "refused": 4,
    "error": 5,
    "rate-limited": 6,
    "context-pressure": 7,
    "budget": 8,
}
PRESSURE = "context-pressure"
BUDGET = "budget"
# How far systemd's current timeout (start, stop) is pushed out while git prepares a worktree or
# commits the work an agent left; every git call has its own timeout too.
GIT_GRACE_USEC = 300_000_000
# While a question waits, the unit's runtime limit is pushed this far ahead (renewed every third
# of it); it is also the least time the agent has left once the answer arrives.
EXTEND_WAIT = 300.0


def full_id(text: str) -> str:
    task_id = ids.check_ref(text)
    if not ids.is_full(task_id):
        raise InputError(f"{text!r} is not a full task id", hint="fleet-run takes the whole id")
    return task_id


def take(store: Store, config: Config, task_id: str, me: str, under_systemd: bool) -> Task:
    """The task, claimed for this attempt; Conflict if this runner may not run it."""
    task = store.get(task_id)
    if task.claimed_by == me and task.status != Status.READY:
        if not under_systemd:
            raise Conflict(
                f"{task_id} is already running under systemd",
                hint=f"follow it with `fleet logs -f {task_id}`",
            )
        if task.status != Status.RUNNING:
            # Suspended, handed off, closed... between the claim and this unit's start: the
            # `.kill` a person's command left would be cleared by taskdir.prepare, so this is
            # where the attempt is refused. fleet-reap then releases the claim.
            raise Conflict(f"{task_id} is not claimable: it was {task.status} before it started")
        return task
    if task.claimed_by is None:
        claimed = store.claim_task(
            task_id,
            me,
            config.get_int("lease_seconds"),
            config.get_str("default_coder"),
            config.get_str("default_model"),
        )
        if claimed is not None:
            return claimed
        why = f"it is {task.status}" if task.status != Status.READY else "it waits on others"
        raise Conflict(f"{task_id} is not claimable: {why}")
    raise Conflict(f"{task_id} is claimed by {task.claimed_by}")


class Limits(NamedTuple):
    """When to stop for context pressure or the task's budget, and when to hold a coder back
    for its rate limit."""

    context: int  # the model's window, tokens
    pressure_pct: int
    rate_pct: int
    backoff: float
    # The task's budgets over all its attempts (None: none), and what its earlier ones spent.
    max_cost: float | None = None
    max_tokens: int | None = None
    spent_cost: float = 0.0
    spent_tokens: int = 0

    @classmethod
    def of(
        cls,
        config: Config,
        coder: Coder,
        model: str | None,
        task: Task,
        spent: tuple[float, int] = (0.0, 0),
    ) -> Limits:
        """`spent`: what the task's budget has used up so far (lineage.spent)."""
        table: dict[str, int] = config.values["context_limits"]
        keys = [k for k in table if model and k in model]
        window = table[max(keys, key=len)] if keys else coder.default_context
        max_cost, max_tokens = budgets(config, task)
        return cls(
            window,
            config.get_int("context_pressure_pct"),
            config.get_int("rate_limit_pct"),
            float(config.get_int("rate_limit_backoff_seconds")),
            max_cost,
            max_tokens,
            *spent,
        )

    def pressure(self, context: int | None) -> bool:
        return context is not None and context * 100 >= self.context * self.pressure_pct

    def over_budget(self, spent: usage.Spend) -> str | None:
        """What reached the task's budget, with the figure; None while within it."""
        cost = self.spent_cost + (spent.cost or 0.0)
        if self.max_cost is not None and cost >= self.max_cost:
            how = f", {spent.source}" if spent.cost is not None and spent.source else ""
            return f"max_cost_usd {self.max_cost:g} reached: ${cost:.4f} spent{how}"
        tokens = self.spent_tokens + spent.tokens
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"max_tokens {self.max_tokens} reached: {tokens} tokens used"
        return None


def budgets(config: Config, task: Task) -> tuple[float | None, int | None]:
    """The task's budgets: its own, else the settings'; 0 means none."""
    cost = task.max_cost_usd if task.max_cost_usd is not None else config.values["max_cost_usd"]
    tokens = task.max_tokens if task.max_tokens is not None else config.get_int("max_tokens")
    return (float(cost) or None), (int(tokens) or None)


class Attempt:
    """One attempt while its coder runs: what the main loop reads and changes."""

    def __init__(
        self,
        task: Task,
        coder: Coder,
        sink: Sink,
        notifier: Notifier,
        store: Store,
        me: str,
        lease_s: float,
        grace: float,
        pgid: int,
        limits: Limits,
        prices: pricing.Table | None = None,
        paths: Paths | None = None,
    ) -> None:
        self.task = task
        self.coder = coder
        self.sink = sink
        self.notifier = notifier
        self.store = store
        self.me = me
        self.lease_s = lease_s
        self.grace = grace
        self.pgid = pgid
        self.limits = limits
        self.tally = Tally()
        self.asking: str | None = None  # "q-…: the question" while the agent waits for a person
        self.focus: str | None = None  # what the agent said it works on (set_focus)
        self.stopped_by: str | None = None
        self.kill_at: float | None = None
        self.recorded: str | None = None  # the session id noted on the attempt's row
        self.prices = prices or pricing.Table({})
        self.paths = paths  # where the live figures go (fleet.live); None: nowhere
        self.spent = usage.NOTHING
        self.budget: str | None = None  # what reached the task's budget
        self._published: dict[str, object] = {}
        self.started_at = iso(time.time())
        self._partial = bytearray()
        self._skipping = False

    def status_line(self) -> str:
        t = self.tally
        parts = [f"waiting for a person: {self.asking}"] if self.asking else []
        if self.focus:
            parts.append(f"focus: {self.focus}")
        parts.append(self.task.coder or "?")
        if self.task.model:
            parts.append(self.task.model)
        parts.append(f"turns {t.turns}")
        if t.tokens_in is not None or t.tokens_out is not None:
            parts.append(f"tokens {t.tokens_in or 0}/{t.tokens_out or 0}")
        if self.spent.cost is not None:
            parts.append(f"${self.spent.cost:.4f}")
        if t.last_tool:
            parts.append(f"last tool {t.last_tool}")
        if self.stopped_by:
            parts.append(f"stopping ({self.stopped_by})")
        return " · ".join(parts)

    def feed(self, chunk: bytes) -> None:
        self._partial += chunk
        if b"\n" not in chunk:
            if len(self._partial) > MAX_LINE:
                if not self._skipping:
                    self.line(bytes(self._partial[:MAX_LINE]), truncated=True)
                self._skipping = True
                self._partial.clear()
            return
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            self.line(bytes(raw[:MAX_LINE]), truncated=len(raw) > MAX_LINE)

    def flush(self) -> None:
        if self._partial and not self._skipping:
            self.line(bytes(self._partial[:MAX_LINE]), truncated=len(self._partial) > MAX_LINE)
        self._partial.clear()
        # What the CLI wrote elsewhere after its last line (codex's rollout file, when it was
        # stopped in the middle of a tool) still counts for this attempt.
        try:
            left = self.coder.leftover()
        except Exception as e:  # a parser bug must not end the attempt
            left = (Event(Kind.ERROR, f"cannot read what the coder left: {e}"),)
        if left:
            self.take(left, None)

    def line(self, raw: bytes, truncated: bool = False) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        if truncated:
            self.sink.emit(Event(Kind.RAW, text + f" [cut at {MAX_LINE} bytes]"), None)
            return
        try:
            events = self.coder.parse(text)
        except Exception as e:  # a parser bug must not end the attempt
            events = (Event(Kind.RAW, text), Event(Kind.ERROR, f"cannot parse line: {e}"))
        self.take(events, text)

    def take(self, events: Sequence[Event], text: str | None) -> None:
        """Count, echo and act on the events of one line (`text`; None for what a coder left)."""
        counted = False
        for event in events:
            self.tally.add(event)
            counted = counted or bool(event.calls) or event.tokens_in is not None
            counted = counted or event.cost is not None
            self.sink.emit(event, text)
            if event.kind == Kind.RATE_LIMIT:
                self.rate_limit(event)
            if event.kind == Kind.SESSION and event.session and event.session != self.recorded:
                # A checkpoint taken while the attempt runs names this session.
                self.store.record_session(self.task.id, self.me, self.task.attempts, event.session)
                self.recorded = event.session
        if self.limits.pressure(self.tally.context):
            self.stop(PRESSURE)
        if counted:
            self.spent = usage.of(self.tally, self.prices, self.task.model)
            reached = self.limits.over_budget(self.spent)
            if reached and self.stopped_by is None:
                self.budget = reached
                self.stop(BUDGET)

    def publish(self) -> None:
        """Rewrite the live figures (fleet.live) if they changed."""
        if self.paths is None:
            return
        t, spent = self.tally, self.spent
        figures: dict[str, object] = {
            "task": self.task.id,
            "attempt": self.task.attempts,
            "started_at": self.started_at,
            "coder": self.coder_name,
            "model": spent.model or self.task.model,
            "phase": "stopping" if self.stopped_by else "asking" if self.asking else "working",
            "turns": t.turns,
            "context": t.context,
            "context_pct": (
                round(100 * t.context / self.limits.context, 1)
                if t.context is not None and self.limits.context
                else None
            ),
            "tokens_in": spent.tokens_in,
            "tokens_out": spent.tokens_out,
            "cache_read": spent.cache_read,
            "cache_write": spent.cache_write,
            "cost": spent.cost,
            "cost_source": spent.source,
            "last_tool": t.last_tool,
            "asking": self.asking,
            "focus": self.focus,
            "stopping": self.stopped_by,
            "session": t.session,
            "usage": usage.models_json(spent.models),
        }
        if figures != self._published:
            self._published = figures
            live.write(self.paths, self.task.id, {**figures, "updated_at": iso(time.time())})

    def rate_limit(self, event: Event) -> None:
        """Hold this coder back in fleet-claim when its provider refuses or nears the limit."""
        coder = self.coder_name
        window = event.limit_type or "default"
        resets = event.resets_at
        self.store.record_gauge(coder, window, event.rate_status, event.utilization, resets)
        used = event.utilization is not None and event.utilization * 100 >= self.limits.rate_pct
        if event.rate_status == "rejected" or used:
            until = resets if resets and resets > time.time() else time.time() + self.limits.backoff
            why = f"{coder} {window} limit: {event.rate_status or 'near'}"
            self.store.set_gate(f"coder:{coder}", iso(until), why, "rate-limit", window)

    def questions_changed(self) -> None:
        """Re-read which question (if any) the agent waits on, after fleet-ask or `fleet
        answer` rang the task's sentinel."""
        qid = self.store.get(self.task.id).question
        if qid is None:
            self.asking = None
            return
        q = self.store.question(qid)
        text = " ".join(q.text.split())
        self.asking = f"{q.id} ({q.kind}) " + (text if len(text) <= 100 else text[:99] + "…")

    def focus_changed(self) -> None:
        """Re-read the agent's focus, after its set_focus rang the task's sentinel."""
        found = self.store.focuses().get(self.task.id)
        self.focus = found[0] if found else None

    @property
    def coder_name(self) -> str:
        return self.task.coder or self.coder.name

    def stop(self, why: str) -> None:
        if self.stopped_by is None:
            self.stopped_by = why
            self.kill_at = time.monotonic() + self.grace
            signal_group(self.pgid, self.coder.stop_signal)


def descendant_sessions(root: int) -> set[int]:
    """Session ids of every process below `root` (ppid chains from /proc).

    Agent CLIs run their tools in sessions of their own, which a signal to the agent's process
    group never reaches. Under systemd the unit's cgroup takes care of them; run by hand, the
    runner remembers these sessions and kills them when the attempt ends.
    """
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            with contextlib.suppress(OSError):
                found.add(os.getsid(child))
    return found


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def loop(run: Attempt, proc: subprocess.Popen[bytes], directory: Path) -> int:
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    out_fd = proc.stdout.fileno()
    os.set_blocking(out_fd, False)
    sel.register(out_fd, selectors.EVENT_READ, "out")
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    inotify = INotify()
    inotify.add_watch(
        directory, iflags.CREATE | iflags.MOVED_TO | iflags.ATTRIB | iflags.CLOSE_WRITE
    )
    sel.register(inotify.fileno(), selectors.EVENT_READ, "inotify")
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    old_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    sel.register(wake_r.fileno(), selectors.EVENT_READ, "signal")
    watchdog = run.notifier.watchdog_interval()
    now = time.monotonic()
    next_ping = now if watchdog else float("inf")
    next_renew = now + run.lease_s / 3
    next_status = now
    next_extend = float("inf")
    exited = eof = False
    drain_until = float("inf")
    # Only by hand: under systemd the cgroup holds every tool, and scanning costs CPU.
    sweep = not os.environ.get("INVOCATION_ID")
    next_scan = now if sweep else float("inf")
    sessions: set[int] = set()
    last_status = ""
    if (directory / taskdir.KILL).exists():
        run.stop("kill-file")
    try:
        while not (eof and exited):
            now = time.monotonic()
            wake_at = min(
                next_ping,
                next_renew,
                next_status,
                next_extend,
                drain_until,
                next_scan,
                run.kill_at or 1e18,
            )
            for key, _ in sel.select(max(0.0, wake_at - now)):
                what = key.data
                if what == "out":
                    try:
                        chunk = os.read(out_fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        run.feed(chunk)
                        next_status = min(next_status, time.monotonic() + STATUS_EVERY)
                    else:
                        eof = True
                        sel.unregister(out_fd)
                elif what == "exit":
                    exited = True
                    sel.unregister(pidfd)
                    proc.wait()
                    # A tool still holding stdout open must not keep the attempt alive.
                    drain_until = time.monotonic() + 1.0
                    next_scan = float("inf")
                elif what == "inotify":
                    names = {e.name for e in inotify.read(timeout=0)}
                    if taskdir.KILL in names:
                        run.stop("kill-file")
                    if taskdir.FOCUS in names:
                        run.focus_changed()
                        next_status = now
                    if questions.SENTINEL in names:
                        run.questions_changed()
                        next_status = now
                        next_extend = now if run.asking else float("inf")
                elif what == "signal":
                    data = wake_r.recv(64)
                    if data:
                        run.stop(f"signal {signal.Signals(data[-1]).name}")
            now = time.monotonic()
            if now >= next_ping and watchdog:
                run.notifier.ping()
                next_ping = now + watchdog
            if now >= next_extend:
                # Time spent waiting for a person does not run down RuntimeMaxSec=.
                run.notifier.send(extend_timeout_usec=int(EXTEND_WAIT * 1e6))
                next_extend = now + EXTEND_WAIT / 3 if run.asking else float("inf")
            if now >= next_status:
                line = run.status_line()
                run.publish()
                if line != last_status:  # an idle agent causes no wake-ups but the watchdog's
                    run.notifier.status(line)
                    last_status = line
                    next_status = now + STATUS_EVERY
                else:
                    next_status = float("inf")
            if now >= next_renew:
                next_renew = now + run.lease_s / 3
                if not run.store.renew(run.task.id, run.me, run.lease_s):
                    run.stop("lease-lost")
            if run.kill_at is not None and now >= run.kill_at:
                signal_group(proc.pid, signal.SIGKILL)
                run.kill_at = None
            if not exited and now >= next_scan:
                sessions |= descendant_sessions(proc.pid)
                next_scan = now + 1.0
            if exited and not eof and now >= drain_until:
                signal_group(proc.pid, signal.SIGKILL)
                eof = True
        run.flush()
        for sid in sessions - {proc.pid, os.getsid(0)}:
            signal_group(sid, signal.SIGKILL)  # tools the agent left behind in their sessions
    finally:
        signal.set_wakeup_fd(old_fd)
        sel.close()
        os.close(pidfd)
        inotify.close()
        wake_r.close()
        wake_w.close()
    return proc.returncode


def keep(sink: Sink, place: worktree.Place, message: str) -> None:
    """Commit what the agent left uncommitted; a failure (a full disk) is an error event and
    leaves the files where they are, for the next attempt or a person."""
    try:
        commit = worktree.commit_leftovers(place.worktree, message)
    except (FleetError, OSError) as e:
        text = e.message if isinstance(e, FleetError) else str(e)
        sink.emit(
            Event(Kind.ERROR, f"could not commit the work left in {place.worktree}: {text}"), None
        )
        return
    if commit:
        sink.lifecycle(None, f"committed the uncommitted work as {commit} on {place.branch}")


def attempt(task_id: str) -> int:
    paths = resolve()
    config = load(paths)
    store = open_store(paths, Actor("fleet-run", "fleet-run"))
    try:
        return _attempt(paths, config, store, task_id)
    finally:
        store.close()


def _attempt(paths: Paths, config: Config, store: Store, task_id: str) -> int:
    invocation = os.environ.get("INVOCATION_ID", "")
    journal = Journal() if under_journald() else None
    me = owner()
    directory = taskdir.task_dir(paths, task_id)
    try:
        task = take(store, config, task_id, me, bool(invocation))
    except Conflict as e:
        attempts = store.get(task_id).attempts
        ctx = Context(task_id, attempts, "-", None)
        Sink(ctx, Redactor(), journal).lifecycle(MSG_REFUSED, f"not started: {e.message}")
        if invocation:
            # Tell fleet-reap that this invocation started no attempt, so it changes nothing.
            ensure_dir(directory)
            outcome.write(
                directory,
                outcome.Outcome(task_id, attempts, invocation, "refused", reason=e.message),
            )
        raise
    coder_name = task.coder or config.get_str("default_coder")
    ctx = Context(task.id, task.attempts, coder_name, task.model)
    # Secrets may come from our environment or from a [coders.NAME] env table.
    coder_env = dict(config.values.get(f"coders.{coder_name}.env", {}))
    names = config.values["secret_variables"]
    redact = Redactor(secret_values({**os.environ, **coder_env}, names))
    # By hand (no journal), `fleet logs` reads the events from the task's directory instead.
    sink = Sink(ctx, redact, journal, None if journal else EventLog(directory))
    notifier = Notifier()
    directory, artifacts = taskdir.prepare(paths, task)
    prices = pricing.of_config(config)

    def finish(verdict: str, reason: str, rc: int | None, tally: Tally, **kw: object) -> int:
        spent = usage.of(tally, prices, task.model)
        result = outcome.Outcome(
            task.id,
            task.attempts,
            invocation,
            verdict,
            reason=redact(reason),
            exit_status=rc if rc is not None and rc >= 0 else None,
            signal=signal.Signals(-rc).name if rc is not None and rc < 0 else None,
            tokens_in=spent.tokens_in,
            tokens_out=spent.tokens_out,
            cost=spent.cost,
            session=tally.session,
            cache_read=spent.cache_read,
            cache_write=spent.cache_write,
            cost_source=spent.source,
            model=spent.model,
            usage=usage.models_json(spent.models),
            **kw,  # type: ignore[arg-type]
        )
        outcome.write(directory, result)
        sink.lifecycle(
            MSG_ENDED,
            f"attempt {task.attempts} ended: {verdict}" + (f" ({result.reason})" if reason else ""),
            {"FLEET_VERDICT": verdict},
        )
        notifier.send(status=f"ended: {verdict}", stopping=1)
        return EXIT[verdict]

    try:
        coder = coders.get(config, coder_name)
    except FleetError as e:
        notifier.ready("not started")
        return finish("error", e.message, None, Tally())
    spent = lineage.spent(store, task)
    reached = Limits.of(config, coder, task.model, task, spent).over_budget(usage.NOTHING)
    if reached:  # its earlier attempts spent it all: never start an agent that must stop
        notifier.ready("not started")
        return finish(BUDGET, reached, None, Tally())
    place: worktree.Place | None = None
    if task.isolated:
        # git may take a while on a large repository: keep systemd's start timeout at bay.
        notifier.send(
            status="preparing the worktree", watchdog=1, extend_timeout_usec=GIT_GRACE_USEC
        )
        try:
            start = lineage.start_branch(store, task)
            # Under the repository's lock: a sweep or a merge-back that decided on this
            # worktree before the task was retried finishes first, and is then seen to have.
            with repolock.hold(paths, repolock.common_dir(task.cwd)):
                place = worktree.ensure(task.id, task.cwd, task.base or "", paths.worktrees, start)
            task = store.set_worktree(task.id, me, place.branch, str(place.worktree))
        except FleetError as e:
            notifier.ready("not started")
            return finish("error", f"no worktree: {e.message}", None, Tally())
        how = "created" if place.created else "reused"
        sink.lifecycle(None, f"worktree {place.worktree} {how}, on branch {place.branch}")
        # A runner killed before it could commit (SIGKILL, a crash) left its agent's work here.
        keep(
            sink, place, f"fleet: work left uncommitted before attempt {task.attempts} of {task.id}"
        )
    workdir = str(place.workdir) if place else task.cwd
    history = store.attempts(task.id)
    previous = history[-2].outcome if len(history) > 1 else None
    prompt = taskdir.compose_prompt(
        task, artifacts, previous, paths.config_file.parent, workdir=workdir
    )
    notes = lineage.prompt_notes(paths, store, task)
    if notes:
        prompt = prompt.rstrip("\n") + "\n\n" + notes
    plan = resumption(store, task, coder_name, previous)
    if plan:  # the leases its checkpoint saved, taken back where still free (fleet.coordination)
        plan = coordination.resumed_with_claims(store, task.id, plan)
    resume = plan.session if plan and coder.resumes else None
    baseline = store.session_totals(task.id, resume) if resume else None
    fresh = prompt + ("\n" + plan.fresh_note if plan else "")
    spec = RunSpec(
        task.id,
        task.attempts,
        task.title,
        task.description,
        workdir,
        task.model,
        directory,
        artifacts,
        plan.resumed_prompt if resume and plan else fresh,
        taskdir.write_prompt(directory, plan.resumed_prompt if resume and plan else fresh),
        resume=resume,
        baseline=baseline,
    )
    bindir = os.path.dirname(program("fleet"))

    def launch(coder: Coder, spec: RunSpec) -> tuple[Attempt, int] | int:
        """Run the coder once: (its run, exit status), or the attempt's exit code if it could
        not start."""
        env = child_env(
            {
                **coder.environ(spec),
                "FLEET_TASK_ID": task.id,
                "FLEET_TASK_DIR": str(directory),
                "FLEET_ARTIFACT_DIR": str(artifacts),
                "FLEET_HOME": str(paths.home),
                "PATH": bindir + os.pathsep + os.environ.get("PATH", os.defpath),
            }
        )
        argv = coder.argv(spec)
        try:
            coder.prepare(spec)
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            notifier.ready("not started")
            return finish("error", f"cannot start {argv[0]}: {e.strerror}", None, Tally())
        run = Attempt(
            task,
            coder,
            sink,
            notifier,
            store,
            me,
            float(config.get_int("lease_seconds")),
            float(config.get_int("stop_grace_seconds")),
            proc.pid,
            Limits.of(config, coder, coder.model(spec), task, spent),
            prices,
            paths,
        )
        how = f", resuming session {spec.resume}" if spec.resume else ""
        store.note(task.id, "started", attempt=task.attempts, coder=coder_name, pid=proc.pid)
        sink.lifecycle(
            MSG_STARTED,
            f"attempt {task.attempts} started: {coder_name} in {workdir} (pid {proc.pid}){how}",
            {"FLEET_PID": proc.pid},
        )
        notifier.ready(run.status_line())
        return run, loop(run, proc, directory)

    ran = launch(coder, spec)
    if isinstance(ran, int):
        return ran
    run, rc = ran
    if plan and spec.resume and run.stopped_by is None and coder.resume_failed(rc, run.tally):
        # The session is gone (deleted, or its CLI's store was reset): the same attempt goes
        # on in a fresh session that reads the checkpoint's summary instead; it is no failure.
        why = run.tally.last_error or f"exit status {rc}"
        sink.lifecycle(
            None,
            f"session {spec.resume} could not be resumed ({why}); starting a fresh session"
            f" from checkpoint {plan.checkpoint.n}",
        )
        coder = coders.get(config, coder_name)
        spec = spec._replace(
            prompt=fresh,
            prompt_file=taskdir.write_prompt(directory, fresh),
            resume=None,
            baseline=None,
        )
        ran = launch(coder, spec)
        if isinstance(ran, int):
            return ran
        run, rc = ran
    if place is not None:
        # Also while stopping: the commit may take longer than what is left of TimeoutStopSec=.
        notifier.send(watchdog=1, extend_timeout_usec=GIT_GRACE_USEC)
        keep(sink, place, f"fleet: work in progress of {task.id}, attempt {task.attempts}")
    if run.stopped_by == PRESSURE:
        verdict = Verdict.CONTEXT_PRESSURE
    elif run.stopped_by == BUDGET:
        verdict = Verdict.BUDGET
    else:
        verdict = Verdict.KILLED if run.stopped_by else coder.verdict(rc, run.tally)
    # A coder's non-fatal notices are not the reason a successful attempt ended.
    last = run.tally.last_error if verdict != Verdict.SUCCESS else None
    reason = run.budget or run.stopped_by or last or (f"exit status {rc}" if rc else "")
    return finish(
        str(verdict),
        reason,
        rc,
        run.tally,
        stopped_by=run.stopped_by,
        closes_on_success=coder.closes_on_success,
        resets_at=run.tally.resets_at,
        session_totals=coder.session_totals(),
    )


def resumption(
    store: Store, task: Task, coder_name: str, previous: str | None
) -> checkpoints.Resumption | None:
    """What this attempt starts from: the checkpoint `fleet resume` named (its session, where
    the coder can resume it), or after a context-pressure stop the newest checkpoint, always in
    a fresh session (the old one is the full context being left behind); else nothing."""
    if task.resume_from is not None:
        why, cp = "resumed", store.checkpoint(task.id, task.resume_from)
    elif previous == PRESSURE:
        taken = store.checkpoints(task.id)
        if not taken:
            return None
        why, cp = "restarted", taken[-1]
    else:
        return None
    asked = []
    for qid in cp.questions:
        with contextlib.suppress(FleetError):
            asked.append(store.question(qid).text)
    return checkpoints.plan(cp, coder_name, asked, why)
