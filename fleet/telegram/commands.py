"""What fleet-telegram does with one update: commands, answers by reply, button presses.

Invariants:
- an update from a chat not in `telegram_chats`, or from a user not in `telegram_users` (when
  that is set), gets no answer at all, only one journal line;
- a person's action goes through the function the command line uses (`questions.give` for an
  answer, the store's transitions, `dispatch_or_wake`), with the store's actor set to
  `telegram:<user id>`, so every rule and audit row is the same whoever acts, from wherever;
- an answer that comes after the question was settled is told who answered first, and every
  message of the question is edited at once to show how it ended;
- every reply is escaped HTML within Telegram's limit (fleet.telegram.text).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from fleet import questions
from fleet.audit import Actor
from fleet.config import Config
from fleet.errors import Conflict, FleetError, InputError
from fleet.model import Question, QuestionKind, QuestionStatus, Reply, Status, TaskSpec
from fleet.paths import Paths
from fleet.store.base import Outgoing, Store, TaskFilter
from fleet.telegram import outbox, text
from fleet.telegram.api import ApiError, Bot

PROGRAM = "fleet-telegram"
LISTED = 30  # tasks /tasks shows
TRANSCRIPT = 10  # transcript lines /task shows
SENT_WAIT = 5.0  # seconds a press or reply waits for its message's id to be recorded
YES = {"yes", "y", "approve", "approved", "ok", "go", "👍", "✅"}
NO = {"no", "n", "deny", "denied", "reject", "stop", "👎", "❌"}

HELP = """\
fleet answers here. Reply to a question's message to answer it in words, or press its buttons.

/status — what runs, waits and asks
/tasks [STATUS] — the tasks that are not finished (or those in STATUS, or all)
/task ID — one task, with the last lines of its transcript
/new TITLE — add a task (more lines: its description)
/answer ID TEXT — answer a question (its id, or its task's)
/kill ID — stop a running task
/retry ID — put a task back to ready
/pause [REASON] — start no new tasks
/resume [ID] — start tasks again (with ID: resume a suspended task)
/help — this"""


class Sender(NamedTuple):
    chat: int
    user: int
    name: str
    message: int | None  # the message to reply to

    @property
    def by(self) -> str:
        return f"telegram:{self.user}"


def allowed(config: Config, chat: int, user: int) -> bool:
    users = config.values["telegram_users"]
    return chat in config.values["telegram_chats"] and (not users or user in users)


class Handler:
    """Handles updates with one store connection and the configuration of this cycle."""

    def __init__(
        self, paths: Paths, store: Store, bot: Bot, config: Config, log: Callable[[str], None]
    ) -> None:
        self.paths = paths
        self.store = store
        self.bot = bot
        self.config = config
        self.log = log

    # -- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def acting(self, who: Sender) -> Iterator[None]:
        """The store's changes meanwhile are `who`'s in the audit trail."""
        before = self.store.actor
        self.store.actor = Actor(who.by, PROGRAM)
        try:
            yield
        finally:
            self.store.actor = before

    def reply(self, who: Sender, html: str, markup: dict[str, Any] | None = None) -> None:
        params: dict[str, Any] = {
            "chat_id": who.chat,
            "text": html,
            "parse_mode": "HTML",
            "link_preview_options": {"is_disabled": True},
        }
        if who.message is not None:
            params["reply_parameters"] = {
                "message_id": who.message,
                "allow_sending_without_reply": True,
            }
        if markup:
            params["reply_markup"] = markup
        try:
            self.bot.send("sendMessage", params, 2, time.monotonic() + 3 * self.bot.timeout)
        except ApiError as e:
            self.log(f"cannot reply in chat {who.chat}: {e.message}")

    def refuse(self, who: Sender, error: FleetError) -> None:
        said = "⚠️ " + error.message + (f"\n{error.hint}" if error.hint else "")
        self.reply(who, text.plain(said))

    # -- one update --------------------------------------------------------------------------

    def handle(self, update: dict[str, Any]) -> None:
        if isinstance(update.get("callback_query"), dict):
            self._button(update["callback_query"])
        elif isinstance(update.get("message"), dict):
            self._message(update["message"])

    def _sender(self, frm: Any, chat: Any, message: int | None) -> Sender | None:
        user = frm.get("id") if isinstance(frm, dict) else None
        chat_id = chat.get("id") if isinstance(chat, dict) else None
        if not isinstance(user, int) or not isinstance(chat_id, int):
            return None
        name = str(frm.get("username") or frm.get("first_name") or user)
        who = Sender(chat_id, user, name, message)
        if not allowed(self.config, chat_id, user):
            self.log(
                f"ignored an update from user {user} (@{name}) in chat {chat_id}: not in"
                " telegram_chats"
                + (" / telegram_users" if self.config.values["telegram_users"] else "")
            )
            return None
        return who

    def _message(self, message: dict[str, Any]) -> None:
        who = self._sender(message.get("from"), message.get("chat"), message.get("message_id"))
        said = message.get("text")
        if who is None or not isinstance(said, str):
            return
        try:
            replied = message.get("reply_to_message")
            if isinstance(replied, dict) and not said.startswith("/"):
                q = self._question_of(who.chat, replied)
                if q is not None:
                    self._answer(who, q, said)
                    return
            if said.startswith("/"):
                self._command(who, said)
            else:
                self.reply(who, text.plain("Reply to a question's message to answer it; /help"))
        except FleetError as e:
            self.refuse(who, e)

    def _sent(self, chat: int, message_id: Any) -> Outgoing | None:
        """The outbox row of the bot's message `message_id` in `chat`. Its sender records the
        message id once Telegram has answered the send, which a quick press or reply may beat:
        a row not there yet is waited for, on the store's commits, for up to SENT_WAIT s."""
        from inotify_simple import INotify
        from inotify_simple import flags as iflags

        if not isinstance(message_id, int):
            return None
        ref = str(message_id)
        found = self.store.sent_message(outbox.CHANNEL, str(chat), ref)
        if found is not None:
            return found
        inotify = INotify()
        try:
            inotify.add_watch(self.paths.lock, iflags.ATTRIB)
            deadline = time.monotonic() + SENT_WAIT
            while (left := deadline - time.monotonic()) > 0:
                found = self.store.sent_message(outbox.CHANNEL, str(chat), ref)
                if found is not None or not self.store.spooled(outbox.CHANNEL):
                    return found
                inotify.read(timeout=int(left * 1000) + 1)
            return None
        finally:
            inotify.close()

    def _question_of(self, chat: int, replied: dict[str, Any]) -> Question | None:
        frm = replied.get("from")
        if not isinstance(frm, dict) or not frm.get("is_bot"):
            return None
        sent = self._sent(chat, replied.get("message_id"))
        if sent is None or sent.question is None:
            return None
        return self.store.question(sent.question)

    # -- answers -----------------------------------------------------------------------------

    def _answer(self, who: Sender, q: Question, said: str) -> None:
        try:
            with self.acting(who):
                done = questions.give(self.paths, self.store, q, reply_of(q, said, who.by))
        finally:
            outbox.settle(self.store, self.bot, self.log)  # late or not: show how it ended
        self.reply(who, text.plain(f"✅ {done.id} answered; {done.task} goes on."))

    def _button(self, query: dict[str, Any]) -> None:
        found = query.get("message")
        message: dict[str, Any] = found if isinstance(found, dict) else {}
        who = self._sender(query.get("from"), message.get("chat"), None)
        qid, data = str(query.get("id")), str(query.get("data") or "")
        if who is None:
            return
        verb, _, rest = data.partition(":")
        ref, _, arg = rest.partition(":")
        said, alert = "", False
        try:
            q = self.store.question(self.store.resolve_question(ref))
            if q.status != QuestionStatus.PENDING:
                raise questions.not_pending(q)
            if verb == "t":
                said = self._toggle(who, message, q, arg)
            else:
                reply = self._pressed(who, message, q, verb, arg)
                with self.acting(who):
                    done = questions.give(self.paths, self.store, q, reply)
                said = f"Answered: {done.answer}"
        except FleetError as e:
            said, alert = e.message, True
        finally:
            if verb != "t":
                outbox.settle(self.store, self.bot, self.log)
        with contextlib.suppress(ApiError):
            self.bot.call(
                "answerCallbackQuery",
                {"callback_query_id": qid, "text": text.clip(said, 190), "show_alert": alert},
            )

    def _pressed(
        self, who: Sender, message: dict[str, Any], q: Question, verb: str, arg: str
    ) -> Reply:
        if verb == "c" and arg.isdigit():
            return Reply(who.by, None, (arg,))
        if verb == "a" and arg in ("0", "1"):
            return Reply(who.by, None, (), arg == "1")
        if verb == "s":
            picked = self._spooled(who, message).picked
            if not picked:
                raise InputError("pick at least one option first")
            return Reply(who.by, None, picked)
        raise InputError(f"this button ({verb}) means nothing to fleet")

    def _spooled(self, who: Sender, message: dict[str, Any]) -> Outgoing:
        sent = self._sent(who.chat, message.get("message_id"))
        if sent is None:
            raise InputError("fleet did not send this message")
        return sent

    def _toggle(self, who: Sender, message: dict[str, Any], q: Question, arg: str) -> str:
        sent = self._spooled(who, message)
        if not arg.isdigit() or not 1 <= int(arg) <= len(q.options):
            raise InputError("no such option")
        option = q.options[int(arg) - 1]
        picked = [o for o in q.options if (o in sent.picked) != (o == option)]
        sent = self.store.pick(sent.id, picked)
        outbox.show_picked(self.store, self.bot, sent, q)
        return f"Picked: {', '.join(picked) or 'nothing yet'}"

    # -- commands ----------------------------------------------------------------------------

    def _command(self, who: Sender, said: str) -> None:
        head, _, rest = said.partition("\n")
        word, _, args = head.strip().partition(" ")
        name = word[1:].split("@", 1)[0].lower()
        args = args.strip()
        action = {
            "start": lambda: self.reply(who, text.plain(HELP)),
            "help": lambda: self.reply(who, text.plain(HELP)),
            "status": lambda: self.reply(who, text.pre(self.status())),
            "tasks": lambda: self.reply(who, text.pre(self.tasks(args))),
            "task": lambda: self.reply(who, text.pre(self.task(args))),
            "new": lambda: self.new(who, args, rest),
            "answer": lambda: self.answer(who, args + (f"\n{rest}" if rest else "")),
            "kill": lambda: self.kill(who, args),
            "retry": lambda: self.retry(who, args),
            "pause": lambda: self.pause(who, args),
            "resume": lambda: self.resume(who, args),
        }.get(name)
        if action is None:
            raise InputError(f"unknown command /{name}", hint="/help lists them")
        action()

    def _task(self, ref: str, usage: str) -> str:
        if not ref.split():
            raise InputError("which task?", hint=usage)
        return self.store.resolve(ref.split()[0])

    def status(self) -> str:
        from fleet.host import owner

        tasks = list(self.store.tasks(TaskFilter()))
        counts = {s: sum(t.status == s for t in tasks) for s in Status if not s.final}
        line = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to do"
        gates = self.store.gates()
        out = [f"fleet on {owner()}: {line}"]
        asking = self.store.questions()
        if asking:
            out.append(f"{len(asking)} question{'s' if len(asking) > 1 else ''} waiting")
        if "pause" in gates:
            out.append(f"paused{': ' + gates['pause'][1] if gates['pause'][1] else ''}")
        for name, (until, _) in sorted(gates.items()):
            if name.startswith("coder:"):
                out.append(f"{name[6:]} held back until {until or 'resumed'}")
        waiting = self.store.spooled()
        if waiting:
            out.append(f"{waiting} notification{'s' if waiting > 1 else ''} not delivered yet")
        return "\n".join(out)

    def tasks(self, args: str) -> str:
        word = args.split()[0].lower() if args.split() else ""
        if word == "all":
            flt = TaskFilter(include_final=True)
        elif word:
            try:
                flt = TaskFilter(statuses=(Status(word),))
            except ValueError:
                known = ", ".join(s.value for s in Status)
                raise InputError(f"no status {word!r}", hint=f"one of {known}, or all") from None
        else:
            flt = TaskFilter()
        found = list(self.store.tasks(flt))
        if not found:
            return "no tasks"
        lines = [
            f"{t.id} {'asking' if t.question else t.status!s:<9} {text.clip(t.title, 60)}"
            for t in found[-LISTED:]
        ]
        more = len(found) - LISTED
        return "\n".join(([f"… and {more} more"] if more > 0 else []) + lines)

    def task(self, args: str) -> str:
        task = self.store.get(self._task(args, "/task ID"))
        out = [f"{task.id} {'asking' if task.question else task.status}: {task.title}"]
        out.append(f"in {task.cwd}, coder {task.coder or '(default)'}, attempts {task.attempts}")
        if task.reason:
            out.append(f"reason: {task.reason}")
        for q in self.store.questions(task.id):
            out.append(f"asks ({q.id}): {questions.for_person(q)}")
        transcript = self._transcript(task.id)
        if transcript:
            out += ["", *transcript]
        return "\n".join(out)

    def _transcript(self, task_id: str) -> list[str]:
        import json

        from fleet.cli.logs import entry, journal_argv, line
        from fleet.proc import run
        from fleet.systemd import scope_for

        remote = self.config.get_str("journal_dir")  # as fleet logs: a central journal's files
        argv = journal_argv(scope_for(self.paths), task_id, None, TRANSCRIPT, False, None, remote)
        try:
            out = run(argv, check=False, timeout=10).stdout
        except FleetError:
            return []
        return [line(entry(json.loads(r))) for r in out.splitlines() if r.startswith("{")]

    def new(self, who: Sender, title: str, description: str) -> None:
        from fleet import inputs
        from fleet.claim import dispatch_or_wake

        where = self.config.get_str("telegram_cwd").strip()
        if not where:
            raise InputError(
                "/new needs a directory for its tasks",
                hint="fleet config set telegram_cwd=DIR (and telegram_coder=NAME)",
            )
        if not title:
            raise InputError("/new needs a title", hint="/new TITLE, then the description below")
        cwd = inputs.cwd(where)
        coder = self.config.get_str("telegram_coder").strip() or None
        if coder:
            self.config.check_coder(inputs.name("coder", coder))
        isolation = self.config.get_str("isolation")
        base = None
        if isolation == "worktree":
            from fleet import worktree

            base = worktree.check_add(cwd, None)
        spec = TaskSpec(
            inputs.title(title),
            cwd,
            inputs.free_text("description", description.strip()),
            coder,
            isolation=isolation,
            base=base,
        )
        with self.acting(who):
            (task,) = self.store.add([spec])
            dispatch_or_wake(self.paths, self.store)
        self.reply(who, text.plain(f"Added {task.id}: {task.title}"))

    def answer(self, who: Sender, args: str) -> None:
        from fleet import ids

        ref, _, said = args.partition(" ")
        if not ref or not said.strip():
            raise InputError("/answer needs an id and the answer", hint="/answer q-4k1z blue")
        if ids.is_question_ref(ref):
            q = self.store.question(self.store.resolve_question(ref))
        else:
            task_id = self.store.resolve(ref)
            pending = self.store.questions(task_id)
            if len(pending) != 1:
                raise Conflict(
                    f"{task_id} has {len(pending) or 'no'} questions waiting",
                    hint="answer by the question's id" if pending else None,
                )
            q = pending[0]
        self._answer(who, q, said.strip())

    def kill(self, who: Sender, args: str) -> None:
        from fleet import systemd

        task = self.store.get(self._task(args, "/kill ID"))
        if task.claimed_by is None:
            raise Conflict(f"not running: {task.id}", hint="only running tasks can be killed")
        systemd.stop(systemd.scope_for(self.paths), [task.id], block=False)
        self.log(f"{who.by} stopped {task.id}")
        self.reply(who, text.plain(f"Stopping {task.id}."))

    def retry(self, who: Sender, args: str) -> None:
        from fleet.claim import dispatch_or_wake

        task_id = self._task(args, "/retry ID")
        with self.acting(who):
            task = self.store.retry(task_id)
            dispatch_or_wake(self.paths, self.store)
        self.reply(who, text.plain(f"{task.id} is {task.status} again."))

    def pause(self, who: Sender, reason: str) -> None:
        self.store.set_gate("pause", None, reason or f"paused by {who.by}")
        self.reply(who, text.plain("Paused: no new task starts; running ones go on."))

    def resume(self, who: Sender, args: str) -> None:
        from fleet.claim import dispatch_or_wake

        with self.acting(who):
            if args.split():
                task = self.store.resume_task(self._task(args, "/resume ID"), None)
                said = f"{task.id} is ready again."
            else:
                self.store.clear_gate("pause")
                said = "Resumed: tasks start again."
            dispatch_or_wake(self.paths, self.store)
        self.reply(who, text.plain(said))


def reply_of(q: Question, said: str, by: str) -> Reply:
    """A person's words as an answer to `q`: the text itself; option numbers or names
    (several separated by commas); or yes/no, then a comment."""
    said = said.strip()
    if q.kind == QuestionKind.INPUT:
        return Reply(by, said)
    if q.kind == QuestionKind.APPROVAL:
        word, _, comment = said.partition(" ")
        verdict = word.strip(".,!").lower()
        if verdict in YES or verdict in NO:
            return Reply(by, comment.strip() or None, (), verdict in YES)
        raise InputError(
            f"{q.id} asks for approval", hint="reply yes or no, a comment after it if you like"
        )
    names = {o.casefold() for o in q.options}
    if said.casefold() in names:
        return Reply(by, None, (said,))
    return Reply(by, None, tuple(p.strip() for p in said.split(",") if p.strip()))
