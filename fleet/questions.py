"""Questions an agent asks a person: what a valid question and a valid answer are, and the words
the agent receives back.

Invariant: the store only ever records an answer that `resolve` accepted for its question, so a
choice answer names existing options (exactly one unless multi_select), an approval answer is a
yes or no, and the text the agent receives is built here and nowhere else. Every answer, from
`fleet answer` or from Telegram, goes through `give`: checked, committed (the first answer
wins), then announced to the waiting agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from fleet.errors import Conflict, InputError
from fleet.model import Question, QuestionKind, QuestionStatus, Reply

if TYPE_CHECKING:
    from fleet.paths import Paths
    from fleet.store.base import Store

MAX_TEXT = 8000  # characters of a question or an answer; a longer one is refused, not cut
MAX_OPTIONS = 26
MAX_OPTION = 300
SENTINEL = ".question"  # rung in the task's directory whenever its questions change


def ring(task_dir: Path) -> None:
    """Announce a change of the task's questions on the sentinel (fleet.taskdir.ring: inotify
    reports IN_CREATE or IN_CLOSE_WRITE). No directory means nobody waits there."""
    from fleet import taskdir

    taskdir.ring(task_dir, SENTINEL)


def not_pending(q: Question) -> Conflict:
    """The error for answering a question that is no longer pending."""
    if q.status == QuestionStatus.ANSWERED:
        return Conflict(
            f"{q.id} was already answered by {q.answered_by} at {q.answered_at}: {q.answer}",
            hint="the first answer wins; the agent has already received it",
        )
    return Conflict(f"{q.id} is {q.status} and takes no answer any more")


def give(paths: Paths, store: Store, q: Question, reply: Reply) -> Question:
    """Answer `q` with `reply`: checked against the question, committed if it is still
    pending (Conflict saying who answered first otherwise), and the agent woken. Returns the
    answered question."""
    from fleet import taskdir

    if q.status != QuestionStatus.PENDING:
        raise not_pending(q)
    resolved = resolve(q, reply)
    done = store.answer(
        q.id, reply.by, resolved.answer, resolved.choices, resolved.approved, resolved.comment
    )
    ring(taskdir.task_dir(paths, q.task))
    return done


class Resolved(NamedTuple):
    """An answer checked against its question, in the store's terms."""

    answer: str
    choices: tuple[str, ...] = ()
    approved: bool | None = None
    comment: str | None = None


def check_question(
    kind: str, text: str, options: Sequence[str] | None, multi_select: bool
) -> tuple[QuestionKind, str, tuple[str, ...]]:
    """The question as the store keeps it, checked (and redacted) by fleet.inputs as all the
    agent's text is; InputError (its message goes back to the agent)."""
    from fleet import inputs

    try:
        qkind = QuestionKind(kind)
    except ValueError:
        raise InputError(f"kind must be input, choice or approval, not {kind!r}") from None
    text = inputs.text("question", text, MAX_TEXT, required=True)
    opts = tuple(o.strip() for o in options or ())
    if qkind != QuestionKind.CHOICE:
        if opts:
            raise InputError(f"options belong to choice questions, not to {qkind} ones")
        if multi_select:
            raise InputError("multi_select belongs to choice questions")
        return qkind, text, ()
    if len(opts) < 2:
        raise InputError("a choice question needs at least two options")
    if len(opts) > MAX_OPTIONS:
        raise InputError(f"a choice question takes at most {MAX_OPTIONS} options")
    if any(not o or len(o) > MAX_OPTION for o in opts):
        raise InputError(f"every option must be 1 to {MAX_OPTION} characters")
    opts = tuple(inputs.one_line("option", o, MAX_OPTION) for o in opts)
    if len({o.casefold() for o in opts}) != len(opts):
        raise InputError("the options must differ from each other")
    return qkind, text, opts


def _pick(q: Question, wanted: str) -> str:
    """The option `wanted` names: its text (any case) or its number from 1."""
    key = wanted.strip()
    if key.isdigit() and 1 <= int(key) <= len(q.options):
        return q.options[int(key) - 1]
    for option in q.options:
        if option.casefold() == key.casefold():
            return option
    listed = "; ".join(f"{n}) {o}" for n, o in enumerate(q.options, 1))
    raise InputError(f"{wanted!r} is not an option of {q.id}", hint=f"the options: {listed}")


def resolve(q: Question, reply: Reply) -> Resolved:
    """Check `reply` against `q`; InputError with a hint when it does not fit."""
    from fleet import inputs

    text = inputs.text("answer", reply.text, MAX_TEXT) if reply.text is not None else None
    if q.kind == QuestionKind.INPUT:
        if reply.choices or reply.approved is not None:
            raise InputError(f"{q.id} asks for text", hint=f"fleet answer {q.id} 'YOUR ANSWER'")
        if not text:
            raise InputError(f"{q.id} needs an answer text", hint=f"fleet answer {q.id} 'TEXT'")
        return Resolved(text)
    if q.kind == QuestionKind.APPROVAL:
        if reply.approved is None:
            raise InputError(
                f"{q.id} asks for approval",
                hint=f"fleet answer {q.id} --approve (or --deny) [COMMENT]",
            )
        verdict = "approved" if reply.approved else "denied"
        return Resolved(verdict, approved=reply.approved, comment=text or None)
    if reply.approved is not None:
        raise InputError(f"{q.id} is a choice question", hint=f"fleet answer {q.id} --choice N")
    if not reply.choices:
        raise InputError(
            f"{q.id} needs a choice",
            hint=f"fleet answer {q.id} --choice N (the options: {', '.join(q.options)})",
        )
    picked: list[str] = []
    for wanted in reply.choices:
        option = _pick(q, wanted)
        if option not in picked:
            picked.append(option)
    if len(picked) > 1 and not q.multi_select:
        raise InputError(f"{q.id} takes one choice, not {len(picked)}")
    return Resolved(", ".join(picked), choices=tuple(picked), comment=text or None)


def for_agent(q: Question, timeout_s: int) -> str:
    """What the agent's ask_human call returns once the question is no longer pending."""
    if q.status == "answered":
        who = f" ({q.answered_by})" if q.answered_by else ""
        if q.kind == QuestionKind.APPROVAL:
            head = f"The person{who} {'APPROVED' if q.approved else 'DENIED'} it."
        elif q.kind == QuestionKind.CHOICE:
            head = f"The person{who} chose: {q.answer}"
        else:
            head = f"The person{who} answered: {q.answer}"
        return head + (f"\nTheir comment: {q.comment}" if q.comment else "")
    if q.status == "expired":
        return (
            f"No answer came within {timeout_s} s; the question expired. Go on with the most"
            " cautious reasonable choice and say in your final message what you assumed, or"
            " call task_blocked if you cannot go on without a person."
        )
    return "The question was withdrawn (the task is being stopped). Stop working and end your turn."


def for_person(q: Question) -> str:
    """One line for listings: the question, and its options when it has some."""
    text = " ".join(q.text.split())
    if q.kind == QuestionKind.CHOICE:
        many = " (one or more)" if q.multi_select else ""
        text += f" [{' | '.join(f'{n}) {o}' for n, o in enumerate(q.options, 1))}]{many}"
    elif q.kind == QuestionKind.APPROVAL:
        text += " [approve/deny]"
    return text
