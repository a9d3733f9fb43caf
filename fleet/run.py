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
from collections.abc import Iterator, Sequence
from functools import partial
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
    ratelimit,
    repolock,
    taskdir,
    usage,
    worktree,
)
from fleet.coders.base import Coder, Event, Kind, RunSpec, Tally, Verdict
from fleet.config import Config, load
from fleet.errors import Conflict, FleetError, InputError, StoreError
from fleet.eventlog import EventLog
from fleet.events import MSG_ENDED, MSG_REFUSED, MSG_STARTED, Context, Sink
from fleet.host import owner
from fleet.journal import Journal, under_journald
from fleet.model import QuestionStatus, Status, Task
from fleet.notify import Notifier
from fleet.outage import Kept
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
    "unstartable": 5,
    "rate-limited": 6,
    "context-pressure": 7,
    "budget": 8,
}
PRESSURE = "context-pressure"
UNSTARTABLE = "unstartable"  # the coder's program cannot be started: blocked at once
BUDGET = "budget"
# How far systemd's current timeout (start, stop) is pushed out while git prepares a worktree or
# commits the work an agent left; every git call has its own timeout too.
GIT_GRACE_USEC = 300_000_000
# While a question waits, the unit's runtime limit is pushed this far ahead (renewed every third
# of it); it is also the least time the agent has left once the answer arrives.
EXTEND_WAIT = 300.0
RENEW_RETRY_S = 2.0  # how soon a renewal the store could not take is asked again


def full_id(text: str) -> str:
    task_id = ids.check_ref(text)
    if not ids.is_full(task_id):
        raise InputError(f"{text!r} is not a full task id", hint="fleet-run takes the whole id")
    return task_id


def take(store: Store, config: Config, task_id: str, me: str, under_systemd: bool) -> Task:
    """The task, claimed for this attempt; Conflict if this runner may not run it."""
    from fleet.affinity import Placement, host_labels
    from fleet.caps import global_caps

    task = store.get(task_id)
    if task.claimed_by is None:
        labels = host_labels(config.values["host_labels"])
        claimed = store.claim_task(
            task_id,
            me,
            config.get_int("lease_seconds"),
            config.get_str("default_coder"),
            config.get_str("default_model"),
            labels=labels,
            caps=global_caps(config),
        )
        if claimed is not None:
            return claimed
        # Not claimable, or claimed a moment ago by another runner: say which it is now,
        # and never take over that runner's claim.
        task = store.get(task_id)
        if task.claimed_by is None:
            why = Placement(task.pinned_host, task.needs).refusal(me, labels)
            if why is None and task.status != Status.READY:
                why = f"it is {task.status}"
            elif why is None and any(h == me for h, _ in store.missing_on(task_id)):
                why = f"its directory {task.cwd} does not exist on this host"
            elif why is None and not task.waiting_on and global_caps(config):
                why = "its coder has as many tasks running as its global_max_concurrent"
            raise Conflict(f"{task_id} is not claimable: {why or 'it waits on others'}")
        under_systemd = False
    if task.claimed_by == me and task.status != Status.READY:
        if not under_systemd:
            # Its unit, or another fleet-run (this host's claims are all alike).
            raise Conflict(
                f"{task_id} is already running on this host",
                hint=f"follow it with `fleet logs -f {task_id}`",
            )
        if task.status != Status.RUNNING:
            # Suspended, handed off, closed... between the claim and this unit's start: the
            # `.kill` a person's command left would be cleared by taskdir.prepare, so this is
            # where the attempt is refused. fleet-reap then releases the claim.
            raise Conflict(f"{task_id} is not claimable: it was {task.status} before it started")
        return task
    raise Conflict(f"{task_id} is claimed by {task.claimed_by}")


class Limits(NamedTuple):
    """When to stop for context pressure or the task's budget, and when to hold a coder back
    for its rate limit."""

    context: int  # the model's window, tokens
    pressure_pct: int
    rate: ratelimit.Policy
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
            ratelimit.Policy.of(config, task.coder or coder.name),
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
        self.asking_id: str | None = None  # that question's id
        # wakeups = "poll": no fleet-listen rings this host's sentinels for a person's command
        # on another host, so each renewal looks the kill requests and answers up itself.
        self.polls = False
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
        self.sessions: set[int] = set()  # sessions seen below the agent (by hand only)
        self._partial = bytearray()
        self._skipping = False
        # What the store could not take while it was unreachable (fleet.outage).
        self.kept = Kept(lambda text: self.sink.lifecycle(None, text))

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
                self.kept.do(
                    "the session id",
                    partial(
                        self.store.record_session,
                        self.task.id,
                        self.me,
                        self.task.attempts,
                        event.session,
                    ),
                )
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
        window = ratelimit.window_of(event)
        resets, status, used = event.resets_at, event.rate_status, event.utilization
        self.kept.do(
            f"the {coder} rate gauge",
            lambda: self.store.record_gauge(coder, window, status, used, resets),
        )
        if held := ratelimit.hold(event, coder, self.limits.rate, time.time()):
            until = iso(held.until)
            self.kept.do(
                f"the hold on {coder}",
                lambda: self.store.set_gate(
                    f"coder:{coder}", until, held.why, "rate-limit", window
                ),
            )

    def questions_changed(self) -> None:
        """Re-read which question (if any) the agent waits on, after fleet-ask or `fleet
        answer` rang the task's sentinel."""
        qid = self.store.get(self.task.id).question
        self.asking_id = qid
        if qid is None:
            self.asking = None
            return
        q = self.store.question(qid)
        text = " ".join(q.text.split())
        self.asking = f"{q.id} ({q.kind}) " + (text if len(text) <= 100 else text[:99] + "…")

    def kill_reason(self) -> str:
        """What the rung `.kill` stands for: a person's `fleet kill` on another host, which
        the store keeps (fleet.store.signals), or the file a person touched here."""
        try:
            asked = self.store.kill_requested(self.task.id, self.task.attempts)
        except StoreError:
            asked = False
        return "kill-request" if asked else "kill-file"

    def poll_signals(self, directory: Path) -> None:
        """In poll-only mode, at a renewal: what fleet-listen would have rung. A kill request
        stops the agent; a settled question is rung for the fleet-ask that waits on it, an
        unread message for the coder's hook."""
        if self.store.kill_requested(self.task.id, self.task.attempts):
            self.stop("kill-request")
        qid = self.asking_id
        if qid is not None and self.store.question(qid).status != QuestionStatus.PENDING:
            questions.ring(directory)
        if self.store.has_messages(self.task.id):
            taskdir.ring(directory, taskdir.MAIL)

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
    group never reaches. Under systemd the runner finds them in its unit's cgroup instead
    (unit_processes); run by hand, it remembers these sessions and kills them when the
    attempt ends.
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


def adopt_orphans() -> None:
    """Make this runner the child subreaper of what it starts (PR_SET_CHILD_SUBREAPER): a tool
    whose parent ends (`setsid tool &` in a shell that exits) is re-parented here instead of to
    init, so the runner's scans still find it below itself, and end it with the attempt."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def stop_tree(proc: subprocess.Popen[bytes], sessions: set[int]) -> None:
    """SIGKILL the agent's process group and every session below the runner (those seen
    before, and those there now), and reap the agent."""
    with contextlib.suppress(OSError):
        sessions = sessions | descendant_sessions(os.getpid())
    for sid in (sessions | {proc.pid}) - {os.getsid(0)}:
        signal_group(sid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


# The signals that stop an attempt: systemd's SIGTERM (KillMode=mixed sends it to the runner
# alone), and a terminal's SIGINT and SIGHUP by hand.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: list[int] = []  # stop signals taken before the loop could hear them


def hold_stop_signals() -> None:
    """From the agent's start on, a stop signal never ends the runner: it is noted, and the
    loop stops the agent with its coder's own stop signal (the agent gets no other one, so it
    always has its graceful stop)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda got, _frame: _received.append(got))


def unit_processes() -> set[int]:
    """The other processes in the runner's own fleet-task@ unit's cgroup (systemd's: the
    unified hierarchy, or name=systemd on a hybrid host); empty outside such a unit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return set()
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if "/fleet-task@" not in group:
            continue
        if controllers == "":
            bases = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        elif controllers == "name=systemd":
            bases = ["/sys/fs/cgroup/systemd"]
        else:
            continue
        for base in bases:
            try:
                text = Path(f"{base}{group}/cgroup.procs").read_text()
            except OSError:
                continue
            return {int(pid) for pid in text.split()} - {os.getpid()}
    return set()


def end_leftovers(proc: subprocess.Popen[bytes], sessions: set[int], unit: bool) -> None:
    """SIGKILL what is left of the agent's tree once the agent has exited: its process group,
    the sessions seen below the runner (by hand), and under systemd (`unit`) everything else
    in the unit's cgroup (tools in sessions of their own, which the runner does not scan for
    there), so that none of it holds the agent's output open or still writes in its worktree
    while the attempt ends, and the unit's stop needs no kill of its own."""
    for sid in (sessions | {proc.pid}) - {os.getsid(0)}:
        signal_group(sid, signal.SIGKILL)
    for pid in unit_processes() if unit else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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
    hold_stop_signals()
    old_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    sel.register(wake_r.fileno(), selectors.EVENT_READ, "signal")
    watchdog = run.notifier.watchdog_interval()
    now = time.monotonic()
    next_ping = now if watchdog else float("inf")
    next_renew = now + run.lease_s / 3
    # Until when the claim surely holds by this host's clock: the lease, counted from before
    # the last renewal was asked for (the claim's own lease began before this runner).
    held_until = now + run.lease_s
    next_status = now
    next_extend = float("inf")
    exited = eof = False
    drain_until = float("inf")
    # Only by hand: under systemd the cgroup holds every tool, and scanning costs CPU.
    sweep = not os.environ.get("INVOCATION_ID")
    next_scan = now if sweep else float("inf")
    sessions = run.sessions
    last_status = ""
    if _received:  # a stop between the agent's start and the wakeup fd's
        run.stop(f"signal {signal.Signals(_received[-1]).name}")
    # A kill requested from another host before this attempt's directory was prepared (which
    # clears a stale `.kill`) is in the store.
    if (directory / taskdir.KILL).exists() or run.kill_reason() == "kill-request":
        run.stop(run.kill_reason())
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
                run.kept.due,
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
                    if run.stopped_by:  # the rest of the tree goes with it, at once
                        end_leftovers(proc, sessions, not sweep)
                    # A tool still holding stdout open must not keep the attempt alive.
                    drain_until = time.monotonic() + 1.0
                    next_scan = float("inf")
                elif what == "inotify":
                    names = {e.name for e in inotify.read(timeout=0)}
                    if taskdir.KILL in names:
                        run.stop(run.kill_reason())
                    if taskdir.FOCUS in names:
                        run.kept.do("the focus", run.focus_changed)
                        next_status = now
                    if questions.SENTINEL in names:
                        run.kept.do("the question", run.questions_changed)
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
                try:
                    renewed = run.store.renew(run.task.id, run.me, run.lease_s, run.task.attempts)
                except StoreError as e:
                    # The store is away (a PostgreSQL outage): the agent runs on while the
                    # claim surely holds, asking again soon; once it may not, it stops.
                    if now + RENEW_RETRY_S >= held_until:
                        run.stop(outcome.LEASE_LOST)
                    else:
                        next_renew = now + RENEW_RETRY_S
                        run.sink.lifecycle(
                            None, f"cannot renew the claim, trying again: {e.message}"
                        )
                else:
                    if renewed:
                        held_until = now + run.lease_s
                        if run.polls:
                            with contextlib.suppress(StoreError):  # asked again next time
                                run.poll_signals(directory)
                    else:
                        run.stop(outcome.LEASE_LOST)
            if now >= run.kept.due:
                run.kept.retry()
            if run.kill_at is not None and now >= run.kill_at:
                signal_group(proc.pid, signal.SIGKILL)
                run.kill_at = None
            if not exited and now >= next_scan:
                sessions |= descendant_sessions(os.getpid())  # orphans are ours (adopt_orphans)
                next_scan = now + 1.0
            if exited and not eof and now >= drain_until:
                signal_group(proc.pid, signal.SIGKILL)
                eof = True
            # No database connection held between uses (a renewal every third of the lease):
            # one per running agent on every host would use up a shared server's slots.
            run.store.rest()
        run.flush()
        if run.kept.left():
            run.kept.retry()
        if run.kept.left():  # the outcome file holds what the attempt's record needs
            run.sink.lifecycle(None, "never recorded in the store: " + ", ".join(run.kept.left()))
        if sweep:
            sessions |= descendant_sessions(os.getpid())
        # What the agent left behind: tools in its own process group that closed its output,
        # and tools in sessions of their own.
        end_leftovers(proc, sessions, not sweep)
    finally:
        signal.set_wakeup_fd(old_fd)
        sel.close()
        os.close(pidfd)
        inotify.close()
        wake_r.close()
        wake_w.close()
    return proc.returncode


@contextlib.contextmanager
def open_prompt(coder: Coder, spec: RunSpec) -> Iterator[int]:
    """The coder's standard input: its prompt file if it reads the prompt there, else
    /dev/null; closed in the runner once the child has it."""
    fd = os.open(spec.prompt_file if coder.prompt_on_stdin else os.devnull, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


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
        return Runner(paths, config, store, task_id).run()
    finally:
        store.close()


class Runner:
    """One attempt of one task, in the steps `run` takes: claim the task, set up where the
    events go, find the coder, check the budget, prepare the worktree, compose what the coder
    is given, launch it (once more in a fresh session if the one to resume is gone), keep the
    work it left, and write the outcome."""

    def __init__(self, paths: Paths, config: Config, store: Store, task_id: str) -> None:
        self.paths = paths
        self.config = config
        self.store = store
        self.task_id = task_id
        self.invocation = os.environ.get("INVOCATION_ID", "")
        self.journal = Journal() if under_journald() else None
        self.me = owner()
        self.directory = taskdir.task_dir(paths, task_id)

    def run(self) -> int:
        self.task = self.claim()
        self.set_up()
        try:
            coder = coders.get(self.config, self.coder_name)
        except FleetError as e:
            return self.not_started("error", e.message)
        self.spent = lineage.spent(self.store, self.task)
        limits = Limits.of(self.config, coder, self.task.model, self.task, self.spent)
        reached = limits.over_budget(usage.NOTHING)
        if reached:  # its earlier attempts spent it all: never start an agent that must stop
            return self.not_started(BUDGET, reached)
        try:
            place = self.prepare_worktree()
        except FleetError as e:
            return self.not_started("error", f"no worktree: {e.message}")
        spec, plan, fresh = self.compose(coder, place)
        ran = self.launch(coder, spec)
        if isinstance(ran, int):
            return ran
        run, rc = ran
        if plan and spec.resume and run.stopped_by is None and coder.resume_failed(rc, run.tally):
            why = run.tally.last_error or f"exit status {rc}"
            coder, ran = self.start_afresh(spec, plan, fresh, why)
            if isinstance(ran, int):
                return ran
            run, rc = ran
        if place is not None:
            # Also while stopping: the commit may take longer than what is left of TimeoutStopSec=.
            self.notifier.send(watchdog=1, extend_timeout_usec=GIT_GRACE_USEC)
            keep(
                self.sink,
                place,
                f"fleet: work in progress of {self.task.id}, attempt {self.task.attempts}",
            )
        return self.conclude(coder, run, rc)

    def claim(self) -> Task:
        """The task, claimed for this attempt; a refusal is recorded, then raised."""
        try:
            return take(self.store, self.config, self.task_id, self.me, bool(self.invocation))
        except Conflict as e:
            if self.journal is not None:  # by hand the error line says it all
                attempts = self.store.get(self.task_id).attempts
                ctx = Context(self.task_id, attempts, "-", None)
                Sink(ctx, Redactor(), self.journal).lifecycle(
                    MSG_REFUSED, f"not started: {e.message}"
                )
            if self.invocation:
                # Tell fleet-reap that this invocation started no attempt, so it changes nothing.
                ensure_dir(self.directory)
                attempts = self.store.get(self.task_id).attempts
                refused = outcome.Outcome(
                    self.task_id, attempts, self.invocation, "refused", reason=e.message
                )
                outcome.write(self.directory, refused)
            raise

    def set_up(self) -> None:
        """Where the attempt's events, status and files go, and what is redacted from them."""
        task = self.task
        self.coder_name = task.coder or self.config.get_str("default_coder")
        ctx = Context(task.id, task.attempts, self.coder_name, task.model)
        # Secrets may come from our environment or from a [coders.NAME] env table.
        coder_env = dict(self.config.values.get(f"coders.{self.coder_name}.env", {}))
        names = self.config.values["secret_variables"]
        # API keys from systemd credentials (fleet.credentials): secrets whatever their names.
        from fleet.credentials import load as load_credentials
        from fleet.store import store_url
        from fleet.store.pgauth import store_passwords
        from fleet.systemd import current_scope

        self.secrets = load_credentials(self.config.values, self.coder_name, current_scope())
        self.redact = Redactor(
            [
                *secret_values({**os.environ, **coder_env}, names),
                *secret_values(self.secrets, self.secrets),
                *store_passwords(store_url(self.paths), self.config.get_str("store_passfile")),
            ]
        )
        # By hand (no journal), `fleet logs` reads the events from the task's directory instead.
        log = None if self.journal else EventLog(self.directory)
        self.sink = Sink(ctx, self.redact, self.journal, log)
        self.notifier = Notifier()
        self.directory, self.artifacts = taskdir.prepare(self.paths, task)
        self.prices = pricing.of_config(self.config)

    def not_started(self, verdict: str, reason: str) -> int:
        self.notifier.ready("not started")
        return self.finish(verdict, reason, None, Tally())

    def finish(self, verdict: str, reason: str, rc: int | None, tally: Tally, **kw: object) -> int:
        """Write the outcome file and say how the attempt ended; the runner's exit status."""
        task = self.task
        spent = usage.of(tally, self.prices, task.model)
        result = outcome.Outcome(
            task.id,
            task.attempts,
            self.invocation,
            verdict,
            reason=self.redact(reason),
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
        outcome.write(self.directory, result)
        self.sink.lifecycle(
            MSG_ENDED,
            f"attempt {task.attempts} ended: {verdict}" + (f" ({result.reason})" if reason else ""),
            {"FLEET_VERDICT": verdict},
        )
        self.notifier.send(status=f"ended: {verdict}", stopping=1)
        return EXIT[verdict]

    def prepare_worktree(self) -> worktree.Place | None:
        """The task's worktree, created or reused (None for a task that runs in its cwd)."""
        if not self.task.isolated:
            return None
        task = self.task
        # git may take a while on a large repository: keep systemd's start timeout at bay.
        self.notifier.send(
            status="preparing the worktree", watchdog=1, extend_timeout_usec=GIT_GRACE_USEC
        )
        start = lineage.start_branch(self.store, task)
        # Under the repository's lock: a sweep or a merge-back that decided on this worktree
        # before the task was retried finishes first, and is then seen to have.
        with repolock.hold(self.paths, repolock.common_dir(task.cwd)):
            place = worktree.ensure(task.id, task.cwd, task.base or "", self.paths.worktrees, start)
        self.task = self.store.set_worktree(task.id, self.me, place.branch, str(place.worktree))
        how = "created" if place.created else "reused"
        self.sink.lifecycle(None, f"worktree {place.worktree} {how}, on branch {place.branch}")
        # A runner killed before it could commit (SIGKILL, a crash) left its agent's work here.
        keep(
            self.sink,
            place,
            f"fleet: work left uncommitted before attempt {task.attempts} of {task.id}",
        )
        return place

    def compose(
        self, coder: Coder, place: worktree.Place | None
    ) -> tuple[RunSpec, checkpoints.Resumption | None, str]:
        """What the coder is given: (the spec, the checkpoint it resumes from if any, the
        prompt of a fresh session)."""
        task = self.task
        self.workdir = str(place.workdir) if place else task.cwd
        history = self.store.attempts(task.id)
        previous = history[-2].outcome if len(history) > 1 else None
        prompt = taskdir.compose_prompt(
            task, self.artifacts, previous, self.paths.config_file.parent, workdir=self.workdir
        )
        notes = lineage.prompt_notes(self.paths, self.store, task)
        if notes:
            prompt = prompt.rstrip("\n") + "\n\n" + notes
        plan = resumption(self.store, task, self.coder_name, previous)
        if (
            plan
        ):  # the leases its checkpoint saved, taken back where still free (fleet.coordination)
            plan = coordination.resumed_with_claims(self.store, task.id, plan)
        resume = plan.session if plan and coder.resumes else None
        baseline = self.store.session_totals(task.id, resume) if resume else None
        fresh = prompt + ("\n" + plan.fresh_note if plan else "")
        given = plan.resumed_prompt if resume and plan else fresh
        spec = RunSpec(
            task.id,
            task.attempts,
            task.title,
            task.description,
            self.workdir,
            task.model,
            self.directory,
            self.artifacts,
            given,
            taskdir.write_prompt(self.directory, given),
            resume=resume,
            baseline=baseline,
        )
        return spec, plan, fresh

    def launch(self, coder: Coder, spec: RunSpec) -> tuple[Attempt, int] | int:
        """Run the coder once: (its run, exit status), or the attempt's exit code if it could
        not start."""
        task, directory = self.task, self.directory
        env = child_env(
            {
                **coder.environ(spec),
                **self.secrets,
                "FLEET_TASK_ID": task.id,
                "FLEET_TASK_DIR": str(directory),
                "FLEET_ARTIFACT_DIR": str(self.artifacts),
                "FLEET_HOME": str(self.paths.home),
                "PATH": os.path.dirname(program("fleet"))
                + os.pathsep
                + os.environ.get("PATH", os.defpath),
            }
        )
        argv = coder.argv(spec)
        if not self.invocation:
            adopt_orphans()  # under systemd the unit's cgroup holds every tool
        hold_stop_signals()  # a stop from here on must reach the agent as its stop signal
        try:
            coder.prepare(spec)
            # The prompt file (0600) as standard input keeps the prompt off the command line,
            # which any local user can read in /proc/PID/cmdline.
            with open_prompt(coder, spec) as stdin:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.workdir,
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
        except OSError as e:
            why = f"cannot start {argv[0]}: {e.strerror}"
            if e.filename == argv[0]:
                # The program itself (missing, not executable, not a program): every retry
                # would fail alike, so the task is blocked at once, with what to do.
                return self.not_started(UNSTARTABLE, f"{why}; {self.start_hint(argv[0], env)}")
            return self.not_started("error", why)
        run: Attempt | None = None
        try:
            run = Attempt(
                task,
                coder,
                self.sink,
                self.notifier,
                self.store,
                self.me,
                float(self.config.get_int("lease_seconds")),
                float(self.config.get_int("stop_grace_seconds")),
                proc.pid,
                Limits.of(self.config, coder, coder.model(spec), task, self.spent),
                self.prices,
                self.paths,
            )
            run.polls = self.config.get_str("wakeups") == "poll"
            how = f", resuming session {spec.resume}" if spec.resume else ""
            run.kept.do(
                "the start",
                lambda: self.store.note(
                    task.id, "started", attempt=task.attempts, coder=self.coder_name, pid=proc.pid
                ),
            )
            from fleet.containment import profile_of

            self.sink.lifecycle(
                MSG_STARTED,
                f"attempt {task.attempts} started: {self.coder_name} in {self.workdir}"
                f" (pid {proc.pid}){how}",
                # The walls the dispatch pass wrote for this attempt (fleet.containment).
                {"FLEET_PID": proc.pid, "FLEET_SANDBOX": profile_of(task, self.config)},
            )
            self.notifier.ready(run.status_line())
            return run, loop(run, proc, directory)
        except BaseException:
            # The runner fails (a full disk under the store, a bug): an agent nobody would
            # supervise any more, whose task may be claimed again, must not go on. Its whole
            # tree is stopped, and the error then ends the runner.
            stop_tree(proc, run.sessions if run else set())
            raise

    def start_hint(self, binary: str, env: dict[str, str]) -> str:
        """What to do about a coder program that cannot be started."""
        setting = f"coders.{self.coder_name}.binary"
        if os.sep in binary:
            return f"install it there, or set {setting} to the program's path"
        return (
            f"it is not on the PATH the runner gives it ({env.get('PATH', os.defpath)}):"
            f" set {setting} to its absolute path, or run `fleet setup` again from a shell"
            " that finds it"
        )

    def start_afresh(
        self, spec: RunSpec, plan: checkpoints.Resumption, fresh: str, why: str
    ) -> tuple[Coder, tuple[Attempt, int] | int]:
        """The session to resume is gone (deleted, or its CLI's store was reset): the same
        attempt goes on in a fresh session that reads the checkpoint's summary instead; it is
        no failure. (The coder for it, and what `launch` made of it.)"""
        self.sink.lifecycle(
            None,
            f"session {spec.resume} could not be resumed ({why}); starting a fresh session"
            f" from checkpoint {plan.checkpoint.n}",
        )
        coder = coders.get(self.config, self.coder_name)
        spec = spec._replace(
            prompt=fresh,
            prompt_file=taskdir.write_prompt(self.directory, fresh),
            resume=None,
            baseline=None,
        )
        return coder, self.launch(coder, spec)

    def conclude(self, coder: Coder, run: Attempt, rc: int) -> int:
        """The outcome of an attempt whose coder ran: its verdict and why."""
        if run.stopped_by == PRESSURE:
            verdict = Verdict.CONTEXT_PRESSURE
        elif run.stopped_by == BUDGET:
            verdict = Verdict.BUDGET
        else:
            verdict = Verdict.KILLED if run.stopped_by else coder.verdict(rc, run.tally)
        # A coder's non-fatal notices are not the reason a successful attempt ended.
        last = run.tally.last_error if verdict != Verdict.SUCCESS else None
        reason = run.budget or run.stopped_by or last or (f"exit status {rc}" if rc else "")
        return self.finish(
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
