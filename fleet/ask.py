"""fleet-ask: the agent's tools for one task, served as an MCP server on stdin and stdout.

The coder starts it with FLEET_TASK_ID (and FLEET_HOME) in its environment. Invariants:
- a question this process asks never stays pending once its call has returned: it was answered
  by a person, expired at its deadline, or cancelled (the agent dropped the call); and when the
  attempt ends, `Store.finish` cancels whatever is still pending;
- waiting costs no CPU and no polling: the call sleeps on inotify for the task directory's
  `.question` sentinel, which `fleet answer` touches after its commit, and on one timer for the
  progress notifications that keep the MCP call alive and for the deadline;
- every change of a question is touched on the same sentinel, so fleet-run's status line follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

# Imported here, not in server(): the SDK reads the tools' (string) annotations in this
# module's namespace to build their schemas and to find the Context parameter.
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from fleet import coordination, inputs, questions, taskdir
from fleet.asktools import TOOLS
from fleet.errors import Conflict, FleetError, InputError
from fleet.events import MSG_ANSWER, MSG_QUESTION
from fleet.journal import Journal, Value
from fleet.model import Question, QuestionStatus, Status
from fleet.paths import Paths, ensure_dir, resolve
from fleet.redact import Redactor
from fleet.store import Actor, Store, open_store
from fleet.timeutil import iso

F = TypeVar("F", bound=Callable[..., Any])
PROGRESS_EVERY = 15.0  # OpenCode's default tool timeout is 60 s; each notification resets it

INSTRUCTIONS = """\
These tools connect you to the person who gave you this task, and to fleet, the queue that runs
it. Ask with ask_human only when you cannot reasonably decide yourself (a real ambiguity, a
risky or irreversible step, missing access); the task waits, and a person is notified. When
the work is finished call task_done; when you cannot go on without a person call task_blocked.
Record a checkpoint (with a summary a fresh session could continue from) at milestones.
Split off independent parts with spawn_subtask; hand the task to another coder or model with
handoff when it is better suited.

Other agents may work in the same directory. Say what you work on with set_focus; claim a
file or area (a path, a module, a name) before you change it and release it when done; a
refused claim names the task that holds it and when its lease ends: work on something else
or send_message it. list_agents shows who does what. Messages for you come at the end of
any fleet tool's result (read_messages reads them too); answer with send_message.
"""


def in_task_unit() -> bool:
    """Whether this process runs inside a fleet-task@ unit (journald then files our entries
    under that unit, whatever environment the coder passed on to us)."""
    try:
        return "/fleet-task@" in Path("/proc/self/cgroup").read_text()
    except OSError:
        return False


class Asker:
    """The task's side of the tools: its store, its directory, its journal."""

    def __init__(self, paths: Paths, task_id: str) -> None:
        from fleet.config import load_or_last_good

        self.paths = paths
        self.config = load_or_last_good(paths)
        self.store: Store = open_store(paths, Actor("agent", "fleet-ask"))
        self.task_id = self.store.resolve(task_id)
        self.directory = taskdir.task_dir(paths, self.task_id)
        ensure_dir(self.directory)
        self.journal = Journal() if in_task_unit() else None
        # Every text the agent gives a tool passes fleet.inputs, which checks and redacts it as
        # it does the agent's `fleet close --reason`; the journal's lines are redacted again.
        self.redact = inputs.redactor() or Redactor()
        self.asked: set[str] = set()
        self._changed = asyncio.Event()
        self._inotify: object = None

    # -- the sentinel and the journal --------------------------------------------------------

    def touch(self) -> None:
        questions.ring(self.directory)

    def log(self, message_id: str, text: str, q: Question, **fields: Value) -> None:
        """A journal entry about question `q` (standard error off systemd)."""
        self._entry(
            text,
            q.attempt,
            MESSAGE_ID=message_id,
            FLEET_EVENT="question",
            FLEET_QUESTION=q.id,
            FLEET_QUESTION_STATUS=str(q.status),
            **fields,
        )

    def _entry(self, text: str, attempt: int, **fields: Value) -> None:
        text = self.redact(text)
        if self.journal is None:
            from fleet.eventlog import EventLog
            from fleet.output import emit_text
            from fleet.timeutil import now_iso

            emit_text(f"fleet-ask: {text}", err=True)
            # An attempt by hand: its transcript is the task's event log (see fleet logs).
            record = {"time": now_iso(), "message": text, "attempt": attempt}
            EventLog(self.directory).append({**record, "event": fields.get("FLEET_EVENT")})
            return
        with contextlib.suppress(OSError):
            self.journal.send(
                {
                    "MESSAGE": text,
                    "PRIORITY": 5,
                    "SYSLOG_IDENTIFIER": "fleet-ask",
                    "FLEET_TASK_ID": self.task_id,
                    "FLEET_ATTEMPT": attempt,
                    **fields,
                }
            )

    # -- waiting -----------------------------------------------------------------------------

    def _watch(self) -> asyncio.Event:
        """The event that the next change of the sentinel sets (watching starts on first use).

        Taken before the question is read, so a change between the read and the wait is
        never lost: the event is then already set.
        """
        if self._inotify is None:
            from inotify_simple import INotify
            from inotify_simple import flags as iflags

            inotify = INotify()
            mask = iflags.CREATE | iflags.ATTRIB | iflags.CLOSE_WRITE | iflags.MOVED_TO
            inotify.add_watch(self.directory, mask)

            def readable() -> None:
                if any(e.name == questions.SENTINEL for e in inotify.read(timeout=0)):
                    self._changed.set()
                    self._changed = asyncio.Event()

            asyncio.get_running_loop().add_reader(inotify.fileno(), readable)
            self._inotify = inotify
        return self._changed

    async def wait(self, q: Question, ctx: Context | None) -> Question:
        """Block until `q` is no longer pending; expire it at its deadline."""
        from fleet.timeutil import parse

        deadline = parse(q.expires_at)
        # At least four notifications per timeout, so a short one is seen to keep the call alive.
        every = min(PROGRESS_EVERY, max(0.25, (deadline - parse(q.asked_at)) / 4))
        started = time.monotonic()
        while True:
            changed = self._watch()
            current = self.store.question(q.id)
            if current.status != QuestionStatus.PENDING:
                return current
            left = deadline - time.time()
            if left <= 0:
                ended = self.store.end_question(q.id, QuestionStatus.EXPIRED)
                if ended is not None:
                    self.touch()
                    return ended
                continue  # answered at the last moment
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, every))
            if ctx is not None and not changed.is_set():
                waited = time.monotonic() - started
                with contextlib.suppress(Exception):  # a client without progress support
                    await ctx.report_progress(waited, None, f"waiting for a person ({q.id})")

    async def ask(
        self,
        text: str,
        kind: str,
        options: list[str] | None,
        multi_select: bool,
        ctx: Context | None,
    ) -> str:
        qkind, text, opts = questions.check_question(kind, text, options, multi_select)
        timeout = self.config.get_int("question_timeout_seconds")
        expires = iso(time.time() + timeout)
        q = self.store.ask(self.task_id, qkind, text, opts, multi_select, expires)
        self.asked.add(q.id)
        self.touch()
        self.log(
            MSG_QUESTION,
            f"question {q.id} ({q.kind}): {questions.for_person(q)}",
            q,
            FLEET_QUESTION_KIND=str(q.kind),
        )
        self.alert(q)
        try:
            done = await self.wait(q, ctx)
        except BaseException:
            # The agent dropped the call (notifications/cancelled) or we are going away.
            with contextlib.suppress(FleetError):
                if self.store.end_question(q.id, QuestionStatus.CANCELLED) is not None:
                    self.touch()
                    self.log(MSG_ANSWER, f"question {q.id} cancelled", self.store.question(q.id))
            raise
        finally:
            self.asked.discard(q.id)
        if done.status == QuestionStatus.ANSWERED:
            self.log(
                MSG_ANSWER,
                f"answer to {q.id} by {done.answered_by}: {done.answer}"
                + (f" ({done.comment})" if done.comment else ""),
                done,
            )
        else:
            self.log(MSG_ANSWER, f"question {q.id} {done.status}", done)
        return questions.for_agent(done, timeout)

    def alert(self, q: Question) -> None:
        from fleet import alerts

        task = self.store.get(self.task_id)
        alerts.fire(
            self.paths,
            self.config,
            "question",
            f"{task.id} asks: {questions.for_person(q)}",
            task=task,
            question=q.id,
            kind=str(q.kind),
            options=list(q.options),
            hint=f"fleet answer {q.id} ...",
        )

    def notify(self, message: str) -> str:
        from fleet import alerts

        message = inputs.text("message", message, inputs.MAX_REASON, required=True)
        task = self.store.get(self.task_id)
        self._entry(f"notice: {message}", task.attempts, FLEET_EVENT="notice")
        alerts.fire(self.paths, self.config, "notice", f"{task.id}: {message}", task=task)
        return "Sent. Carry on; this does not wait for a reply."

    def close(self, summary: str) -> str:
        task = self.store.close_task(self.task_id, inputs.reason(summary, "summary") or None)
        return f"{task.id} is now done. End your turn with a short final message."

    def block(self, reason: str) -> str:
        reason = inputs.reason(reason)
        if not reason:
            raise InputError("give the reason a person needs in order to unblock the task")
        task = self.store.block(self.task_id, reason)
        assert task.status == Status.BLOCKED
        return f"{task.id} is now blocked; a person will look at it. End your turn now."

    def checkpoint(self, summary: str) -> str:
        from fleet import checkpoints

        text = checkpoints.check_summary(summary)
        cp = checkpoints.take(self.store, self.task_id, "agent", text)
        where = f"your work in progress is at {cp.ref}" if cp.ref else f"no git ref ({cp.note})"
        return f"Checkpoint {cp.n} recorded; {where}. Carry on with the task."

    def spawn(
        self,
        title: str,
        description: str,
        coder: str | None,
        model: str | None,
        depends: bool,
    ) -> str:
        from fleet import lineage, wake

        parent = self.store.get(self.task_id)
        if coder:
            self.config.check_coder(inputs.name("coder", coder))
        spec = lineage.subtask(
            parent,
            inputs.title(title),
            inputs.free_text("description", description),
            coder or None,
            inputs.name("model", model) if model else None,
            depends,
        )
        (child,) = self.store.add([spec])
        wake.poke(self.paths)
        if depends:
            return (
                f"Subtask {child.id} added, and this task waits for it. Add any other subtasks,"
                " then end your turn without task_done: fleet starts this task again once its"
                " subtasks are done, with their outcomes in the prompt."
            )
        return f"Subtask {child.id} added; it runs on its own. Carry on with your task."

    def handoff(self, coder: str, model: str | None, context: str) -> str:
        from fleet import lineage, wake

        successor = lineage.handoff(self.store, self.config, self.task_id, coder, model, context)
        # This attempt is over: its runner stops the agent, and fleet-reap finds the task
        # handed off, which counts as nothing. The successor is claimed only once this
        # attempt has ended (and its work is on the branch); the poke is for other work.
        taskdir.ring(self.directory, taskdir.KILL)
        wake.poke(self.paths)
        return f"Handed off to {successor.id} ({coder}). Stop working now: this attempt ends."

    def set_focus(self, text: str) -> str:
        text = coordination.focus_text(text)
        self.store.set_focus(self.task_id, text)
        taskdir.ring(self.directory, taskdir.FOCUS)  # the runner's status line follows
        return f"Focus set: {text}"

    def accept_handoff(self, task: str, accept: bool, reason: str) -> str:
        from fleet import offers, stopping, wake

        offered = self.store.resolve(inputs.one_line("task", task, 100))
        made = offers.open_offer(self.store, offered)
        mine = self.store.get(self.task_id).coder or self.config.get_str("default_coder")
        if made.coder != mine:
            raise Conflict(f"offer {made.id} is for coder {made.coder}; you run as {mine}")
        if not accept:
            offers.decline(self.store, self.paths, offered, reason, self.task_id)
            return f"Declined offer {made.id}; {offered} goes on as it was. Carry on."
        successor = offers.accept(self.store, self.config, offered)
        # The original's attempt is over: its runner stops its agent (as after a handoff),
        # on whichever host runs it.
        stopping.ring(self.paths, self.store, [self.store.get(offered)])
        wake.poke(self.paths)
        return (
            f"Accepted offer {made.id}: {offered} goes on as {successor.id} ({made.coder})."
            " Carry on with your own task."
        )

    def cancel_mine(self) -> None:
        """At exit: questions of calls still open are cancelled, never left pending."""
        for qid in list(self.asked):
            with contextlib.suppress(FleetError):
                self.store.end_question(qid, QuestionStatus.CANCELLED)
        if self.asked:
            self.touch()


@contextlib.contextmanager
def for_the_agent() -> Iterator[None]:
    """A FleetError becomes the tool's error result, with its hint, for the model to read."""
    try:
        yield
    except FleetError as e:
        raise ToolError(e.message + (f" ({e.hint})" if e.hint else "")) from None


def server(asker: Asker) -> MCPServer:
    app = MCPServer("fleet", instructions=INSTRUCTIONS)
    served: list[str] = []

    def mail(result: str) -> str:
        """Every tool's result brings the messages that arrived meanwhile: no polling. Then
        the store's connection is let go until the next tool call (Store.rest)."""
        try:
            return coordination.with_messages(asker.store, asker.paths, asker.task_id, result)
        finally:
            asker.store.rest()

    def tool(func: F) -> F:
        """Serve `func` as the tool of its name, with the registry's description."""
        app.tool(description=TOOLS[func.__name__].description, structured_output=False)(func)
        served.append(func.__name__)
        return func

    @tool
    async def ask_human(
        question: Annotated[str, Field(description="The question, complete on its own.")],
        ctx: Context,
        kind: Annotated[
            Literal["input", "choice", "approval"],
            Field(description="input (free text), choice (pick from options) or approval."),
        ] = "input",
        options: Annotated[
            list[str] | None, Field(description="The options of a choice question.")
        ] = None,
        multi_select: Annotated[
            bool, Field(description="Whether a choice question takes several options.")
        ] = False,
    ) -> str:
        with for_the_agent():
            return mail(await asker.ask(question, kind, options, multi_select, ctx))

    @tool
    def notify_human(
        message: Annotated[str, Field(description="What the person should know.")],
    ) -> str:
        with for_the_agent():
            return mail(asker.notify(message))

    @tool
    def task_done(
        summary: Annotated[str, Field(description="What was done and how it was checked.")],
    ) -> str:
        with for_the_agent():
            return mail(asker.close(summary))

    @tool
    def task_blocked(
        reason: Annotated[str, Field(description="What a person must do to unblock it.")],
    ) -> str:
        with for_the_agent():
            return mail(asker.block(reason))

    @tool
    def checkpoint(
        summary: Annotated[
            str,
            Field(description="Done, in progress, decisions, findings and next steps."),
        ],
    ) -> str:
        with for_the_agent():
            return mail(asker.checkpoint(summary))

    @tool
    def spawn_subtask(
        title: Annotated[str, Field(description="One line: what the subtask is to do.")],
        description: Annotated[
            str, Field(description="Complete instructions; its agent has none of your context.")
        ] = "",
        coder: Annotated[
            str | None, Field(description="The coder to run it (default: the queue's).")
        ] = None,
        model: Annotated[str | None, Field(description="The model (default: the coder's).")] = None,
        depends: Annotated[
            bool, Field(description="Whether this task waits for the subtask to be done.")
        ] = False,
    ) -> str:
        with for_the_agent():
            return mail(asker.spawn(title, description, coder, model, depends))

    @tool
    def handoff(
        coder: Annotated[str, Field(description="The coder to take the task over.")],
        context: Annotated[
            str, Field(description="What is done, what is left, and anything learned.")
        ],
        model: Annotated[str | None, Field(description="The model (default: the coder's).")] = None,
    ) -> str:
        with for_the_agent():
            return mail(asker.handoff(coder, model, context))

    @tool
    def claim(
        resource: Annotated[
            str, Field(description="What you will change: a path, a module, or a name.")
        ],
        ttl_seconds: Annotated[
            float, Field(description="How long the lease lasts unless released or renewed.")
        ] = coordination.DEFAULT_LEASE_S,
        note: Annotated[str, Field(description="What you are doing with it, for others.")] = "",
    ) -> str:
        with for_the_agent():
            return mail(coordination.claim(asker.store, asker.task_id, resource, ttl_seconds, note))

    @tool
    def release(
        resource: Annotated[str, Field(description="The resource you claimed.")],
    ) -> str:
        with for_the_agent():
            return mail(coordination.release(asker.store, asker.task_id, resource))

    @tool
    def claims() -> str:
        with for_the_agent():
            return mail(coordination.listing(asker.store, asker.task_id))

    @tool
    def send_message(
        to: Annotated[
            str,
            Field(description="A task id, or parent, children, siblings or all (running tasks)."),
        ],
        text: Annotated[str, Field(description="The message, complete on its own.")],
    ) -> str:
        with for_the_agent():
            sent = coordination.send(
                asker.store, asker.paths, asker.task_id, asker.task_id, to, text
            )
            return mail(coordination.sent_text(sent))

    @tool
    def read_messages() -> str:
        with for_the_agent():
            return coordination.read(asker.store, asker.task_id)

    @tool
    def list_agents() -> str:
        with for_the_agent():
            return mail(coordination.agents(asker.store, asker.paths, asker.task_id))

    @tool
    def set_focus(
        text: Annotated[str, Field(description="One line: what you are working on now.")],
    ) -> str:
        with for_the_agent():
            return mail(asker.set_focus(text))

    @tool
    def accept_handoff(
        task: Annotated[str, Field(description="The task whose handoff was offered.")],
        accept: Annotated[bool, Field(description="Accept it (false: decline it).")] = True,
        reason: Annotated[str, Field(description="Why you decline it.")] = "",
    ) -> str:
        with for_the_agent():
            return mail(asker.accept_handoff(task, accept, reason))

    if sorted(served) != sorted(TOOLS):
        raise RuntimeError(f"fleet-ask serves {served}, but fleet.asktools declares {[*TOOLS]}")
    return app


def serve() -> None:
    task_id = os.environ.get("FLEET_TASK_ID", "")
    if not task_id:
        raise InputError(
            "FLEET_TASK_ID is not set",
            hint="fleet-ask is started by a coder that fleet-run configured, with the task's id",
        )
    asker = Asker(resolve(), task_id)
    asker.store.rest()  # until the agent's first tool call
    try:
        server(asker).run("stdio")
    finally:
        asker.cancel_mine()
        asker.store.close()
