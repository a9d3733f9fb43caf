"""`fleet questions` and `fleet answer`: what agents asked, and a person's answers.

An answer is committed first (the store's compare-and-set on `pending`, so the first answer
wins) and then announced by touching the task's `.question` sentinel, which wakes the agent's
fleet-ask through inotify.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.app import SECONDS, App, cli, pass_app
from fleet.errors import Conflict, InputError, TimedOut
from fleet.model import Question, Reply
from fleet.output import emit_object, emit_objects, emit_table, fmt_of, output_options, shorten
from fleet.timeutil import poll_ms

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


class QuestionRef(click.ParamType[str]):
    """A question id (or prefix), or a task id; completes the questions waiting now."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return str(value)

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        from fleet import questions
        from fleet.errors import FleetError
        from fleet.paths import resolve
        from fleet.store import open_store

        try:
            store = open_store(resolve())
            try:
                waiting = store.questions()
            finally:
                store.close()
        except FleetError:
            return []
        from fleet.output import for_terminal

        typed = incomplete.strip().lower()
        return [
            CompletionItem(ref, help=for_terminal(shorten(questions.for_person(q), 60)))
            for q in waiting
            for ref in (q.id, q.task)
            if ref.startswith(typed)
        ]


def _table(qs: Sequence[Question], everything: bool) -> None:
    from fleet import questions
    from fleet.timeutil import ago

    headers = ["ID", "TASK", "KIND", "ASKED", "QUESTION"]
    if everything:
        headers[3:3] = ["STATUS"]
        headers.append("ANSWER")
    rows = []
    for q in qs:
        row = [q.id, q.task, str(q.kind), ago(q.asked_at), shorten(questions.for_person(q), 70)]
        if everything:
            row[3:3] = [str(q.status)]
            answer = (
                q.answer
                if q.answer is None or not q.answered_by
                else f"{q.answer} ({q.answered_by})"
            )
            row.append(shorten(answer or "-", 40))
        rows.append(row)
    emit_table(headers, rows)


@cli.command("questions")
@click.option("-a", "--all", "everything", is_flag=True, help="Also answered, expired, cancelled.")
@click.option("--task", "task_ref", metavar="ID", help="Only the questions of this task.")
@click.option(
    "-w",
    "--wait",
    is_flag=True,
    help="Block until at least one question is pending, then list the pending ones.",
)
@click.option("-t", "--timeout", type=SECONDS, help="With --wait: give up after SECONDS.")
@output_options
@pass_app
def questions_cmd(
    app: App,
    everything: bool,
    task_ref: str | None,
    wait: bool,
    timeout: float | None,
    fmt: str | None,
) -> None:
    """List the questions agents are waiting on (with --all, every question).

    Answer one with `fleet answer`. With --wait it sleeps on inotify until an agent asks, which
    suits a notifier script: `fleet questions --wait --json | ...`; it exits 124 on timeout.
    """
    task_id = app.store.resolve(task_ref) if task_ref else None
    if wait:
        _wait_for_one(app, task_id, timeout)
    found = app.store.questions(task_id, pending=not everything or wait)
    if fmt_of(fmt) == "table":
        _table(found, everything and not wait)
    else:
        emit_objects((q.to_json() for q in found), fmt_of(fmt))


def _wait_for_one(app: App, task_id: str | None, timeout: float | None) -> None:
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    deadline = None if timeout is None else time.monotonic() + timeout
    inotify = INotify()
    # The store touches fleet.lock after every commit (see fleet.store.litestore).
    inotify.add_watch(app.paths.lock, iflags.ATTRIB)
    try:
        while not app.store.questions(task_id):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimedOut("no question was asked in time")
            inotify.read(timeout=poll_ms(left))
    finally:
        inotify.close()


def _target(app: App, ref: str) -> Question:
    """The question `ref` names: a question id (or prefix), or a task with one pending."""
    from fleet import ids

    if ids.is_question_ref(ref):
        return app.store.question(app.store.resolve_question(ref))
    task = app.store.get(app.store.resolve(ref))
    pending = app.store.questions(task.id)
    if not pending:
        raise Conflict(f"{task.id} has no question waiting", hint="`fleet questions` lists them")
    if len(pending) > 1:
        listed = ", ".join(q.id for q in pending)
        raise InputError(
            f"{task.id} has {len(pending)} questions waiting: {listed}",
            hint="answer one of them by its question id",
        )
    return pending[0]


def refuse_agents() -> None:
    """An agent's answer would reach an agent as a person's decision: refuse it."""
    from fleet.audit import agent_task
    from fleet.errors import FleetError

    task = agent_task()
    if task is not None:
        raise FleetError(
            f"an agent cannot answer questions (this runs as the agent of {task})",
            hint="a question waits for a person, who has been notified; a person's shell"
            " has no FLEET_TASK_ID",
        )


@cli.command("answer")
@click.argument("ref", metavar="ID", type=QuestionRef())
@click.argument("text", required=False)
@click.option(
    "-c",
    "--choice",
    "choices",
    multiple=True,
    metavar="OPTION",
    help="Pick an option of a choice question, by its text or number (repeatable when the"
    " question takes several).",
)
@click.option("--approve", "approved", flag_value=True, default=None, help="Approve.")
@click.option("--deny", "approved", flag_value=False, help="Deny.")
@click.option("--by", metavar="NAME", help="Who answers (default: user@host).")
@click.option("--json", "as_json", is_flag=True, help="Print the answered question as JSON.")
@pass_app
def answer(
    app: App,
    ref: str,
    text: str | None,
    choices: tuple[str, ...],
    approved: bool | None,
    by: str | None,
    as_json: bool,
) -> None:
    """Answer a question: ID is the question's id, or a task's when it has one waiting.

    TEXT is the answer to a free-text question, or a comment with --choice, --approve or
    --deny (`-` reads it from standard input). The first answer wins: a later one fails with
    exit status 4 and says who answered. The agent receives the answer at once.

    Only a person answers: run by an agent (FLEET_TASK_ID is set, or the command runs inside a
    fleet-task@ unit) it is refused with exit status 1 and changes nothing, so that no agent is
    ever told that a person decided what it decided itself.
    """
    from fleet import inputs, questions
    from fleet.audit import person

    refuse_agents()
    who = inputs.by(by) if by is not None else person()
    if text == "-":  # bounded: a longer answer is refused anyway
        text = inputs.read_arg("-", "answer", 4 * questions.MAX_TEXT)
    q = _target(app, ref)
    done = questions.give(app.paths, app.store, q, Reply(who, text, choices, approved))
    if as_json:
        emit_object(done.to_json())
    else:
        sys.stdout.write(done.id + "\n")
