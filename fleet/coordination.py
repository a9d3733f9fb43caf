"""What an agent's coordination tools say and check: leases on resources and messages, in
words a model reads (fleet-ask serves them; `fleet claims`, `fleet message` and `fleet
messages` are the same for a person).

Every text an agent or a person gives passes fleet.inputs, as all they write does (an agent's
is redacted there). A refused claim names the holder, its note and when the lease runs out,
so the agent can decide without asking. A message reaches its agent with the result of its
next fleet tool call (`with_messages`), so an agent never has to poll for them. `list_agents`
is what an agent needs to avoid duplicate work: who runs, with what, doing what, holding what.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from fleet import inputs, taskdir
from fleet.checkpoints import Resumption
from fleet.errors import InputError, NotFound
from fleet.model import Status
from fleet.paths import Paths
from fleet.store import Store, TaskFilter
from fleet.store.coord import Message, ResourceClaim, SavedClaim

MAX_RESOURCE = 300
FLEET_TOOL_PREFIX = "mcp__fleet__"  # how Claude Code names fleet-ask's tools
MAX_NOTE = 500
MIN_LEASE_S, MAX_LEASE_S, DEFAULT_LEASE_S = 1, 24 * 3600, 1800


def resource(text: str) -> str:
    return inputs.one_line("resource", text, MAX_RESOURCE)


def lease_seconds(seconds: float) -> float:
    if not MIN_LEASE_S <= seconds <= MAX_LEASE_S:
        raise InputError(
            f"ttl_seconds must be from {MIN_LEASE_S} to {MAX_LEASE_S}, not {seconds:g}",
            hint="claim for as long as the work should take, and claim again to extend it",
        )
    return float(seconds)


def described(c: ResourceClaim) -> str:
    note = f": {c.note}" if c.note else ""
    return (
        f"{c.resource} held by task {c.task} (attempt {c.attempt}) until {c.until}"
        f" ({int(c.left())} s left){note}"
    )


def claim(store: Store, task_id: str, name: str, seconds: float, note: str) -> str:
    name = resource(name)
    seconds = lease_seconds(seconds)
    note = inputs.text("note", note, MAX_NOTE)
    won, holder = store.claim_resource(task_id, name, seconds, note)
    if won:
        return (
            f"Claimed {name} until {holder.until}. Release it (release) when you are done with"
            " it; it also ends with this attempt."
        )
    return (
        f"Refused: {described(holder)}. Work on something else meanwhile, or ask that task"
        " with send_message, and claim again later."
    )


def release(store: Store, task_id: str, name: str) -> str:
    name = resource(name)
    if store.release_resource(task_id, name):
        return f"Released {name}."
    return f"You held no lease on {name} (it may have run out); nothing to release."


def listing(store: Store, task_id: str) -> str:
    task = store.get(task_id)
    held = store.resource_claims(scope=task.cwd)
    if not held:
        return f"No leases are held in {task.cwd}."
    lines = [f"Leases in force in {task.cwd}:"]
    lines += [f"- {described(c)}" + (" (yours)" if c.task == task_id else "") for c in held]
    return "\n".join(lines)


def resumed_with_claims(store: Store, task_id: str, plan: Resumption) -> Resumption:
    """`plan` with the leases of its checkpoint taken back, and its prompts saying so."""
    said = restore(store, task_id, store.saved_claims(task_id, plan.checkpoint.n))
    if not said:
        return plan
    return plan._replace(
        resumed_prompt=plan.resumed_prompt.rstrip("\n") + "\n\n" + said,
        fresh_note=plan.fresh_note.rstrip("\n") + "\n\n" + said,
    )


def restore(store: Store, task_id: str, saved: list[SavedClaim]) -> str:
    """Take again, for the attempt that resumes, the leases a checkpoint saved; the prompt's
    note on what was taken back and what another task holds now ("" if none were saved)."""
    if not saved:
        return ""
    back: list[str] = []
    lost: list[str] = []
    for s in saved:
        won, holder = store.claim_resource(
            task_id, s.resource, max(float(MIN_LEASE_S), s.seconds), s.note
        )
        if won:
            back.append(f"- {s.resource} (until {holder.until})")
        else:
            lost.append(f"- {described(holder)}")
    text = ""
    if back:
        text += "These leases of yours (fleet claims) were taken back for you:\n" + "\n".join(back)
    if lost:
        text += (
            ("\n" if text else "")
            + "These leases you held are now another task's, so you no longer hold them;"
            " claim them again before you edit those areas:\n" + "\n".join(lost)
        )
    return text + "\n"


# -- messages ----------------------------------------------------------------------------------

GROUPS = ("parent", "children", "siblings", "all")


def message_text(text: str) -> str:
    return inputs.text("message", text, inputs.MAX_REASON, required=True)


def running_tasks(store: Store) -> list[str]:
    return [t.id for t in store.tasks(TaskFilter(statuses=(Status.RUNNING,)))]


def recipients(store: Store, sender_task: str | None, to: str) -> list[str]:
    """The full ids `to` names: a task (id or prefix, whatever its status: it reads them when
    it next runs), `parent`, or the running `children`, `siblings` or `all` tasks (the sender
    aside). InputError if that names nobody."""
    to = to.strip()
    if to not in GROUPS:
        try:
            return [store.resolve(inputs.one_line("recipient", to, 100))]
        except NotFound:
            raise InputError(
                f"no task {to}", hint=f"name a task id, or one of {', '.join(GROUPS)}"
            ) from None
    found = [t for t in group(store, sender_task, to) if t != sender_task]
    if not found:
        raise InputError(
            f"no running task to send to as {to!r}",
            hint="list_agents (or `fleet ls`) shows which tasks run now",
        )
    return found


def group(store: Store, sender_task: str | None, to: str) -> list[str]:
    if to == "all":
        return running_tasks(store)
    if sender_task is None:
        raise InputError(f"only a task's agent can send to its {to}", hint="name a task id")
    me = store.get(sender_task)
    if to == "children":
        return [t.id for t in store.children(me.id) if t.status == Status.RUNNING]
    if me.parent is None:
        raise InputError(
            f"{me.id} has no parent task" + (", so no siblings" if to != "parent" else "")
        )
    if to == "parent":
        return [me.parent]
    return [t.id for t in store.children(me.parent) if t.status == Status.RUNNING]


def send(
    store: Store, paths: Paths, sender: str, sender_task: str | None, to: str, text: str
) -> list[Message]:
    text = message_text(text)
    return post(store, paths, recipients(store, sender_task, to), text, sender, sender_task)


def post(
    store: Store,
    paths: Paths,
    to: Sequence[str],
    text: str,
    sender: str,
    sender_task: str | None,
) -> list[Message]:
    """Store the message (checked text) for each of `to`, then ring each one's mail sentinel:
    a coder's hook between tool calls (see `hook`) delivers it only when the sentinel is
    there, so that a tool call with no mail costs one stat. An agent on another host has its
    sentinel rung there, by that host's fleet-listen (fleet.store.pgnotify's `mail`)."""
    sent = store.send_messages(to, text, sender, sender_task)
    for task_id in to:
        taskdir.ring(taskdir.task_dir(paths, task_id), taskdir.MAIL)
    return sent


def sent_text(sent: list[Message]) -> str:
    return (
        f"Sent to {', '.join(m.recipient for m in sent)}. Replies come with your next tool results."
    )


def shown(messages: list[Message]) -> str:
    """Messages as an agent reads them."""
    return "\n".join(
        f"- message {m.id} from {m.sender} at {m.sent_at}:\n  " + m.text.replace("\n", "\n  ")
        for m in messages
    )


def read(store: Store, task_id: str) -> str:
    got = store.take_messages(task_id)
    if not got:
        return "No new messages."
    return "New messages:\n" + shown(got)


def hook(paths: Paths, task_id: str, event: dict[str, Any]) -> str | None:
    """What a coder's post-tool hook (Claude Code's PostToolUse) adds to the result of a tool
    call of the agent of `task_id`: the messages that arrived, or None. Called only when the
    mail sentinel is there; fleet's own tools deliver with their results, so not for those."""
    if str(event.get("tool_name", "")).startswith(FLEET_TOOL_PREFIX):
        return None
    with contextlib.suppress(FileNotFoundError):
        # First, so that a message stored after the take rings it again.
        (taskdir.task_dir(paths, task_id) / taskdir.MAIL).unlink()
    from fleet.audit import Actor
    from fleet.store import open_store

    store = open_store(paths, Actor("agent", "fleet-ask"))
    try:
        got = store.take_messages(task_id)
    finally:
        store.close()
    if not got:
        return None
    return "Messages for you (from other agents or a person) arrived meanwhile:\n" + shown(got)


def with_messages(store: Store, paths: Paths, task_id: str, result: str) -> str:
    """A tool's result, followed by the messages that arrived for the task since the last
    (the check is a read, so a tool call with none waiting takes no write lock)."""
    if not store.has_messages(task_id):
        return result
    with contextlib.suppress(FileNotFoundError):  # delivered here: the hook need not run
        (taskdir.task_dir(paths, task_id) / taskdir.MAIL).unlink()
    got = store.take_messages(task_id)
    if not got:
        return result
    return (
        result.rstrip("\n")
        + "\n\n---\nMessages for you (from other agents or a person) arrived meanwhile:\n"
        + shown(got)
    )


# -- focus and who is doing what ---------------------------------------------------------------

MAX_FOCUS = 200
RECENT = 10  # finished tasks list_agents shows besides the running ones


def focus_text(text: str) -> str:
    return inputs.one_line("focus", text, MAX_FOCUS)


def agents(store: Store, paths: Paths, task_id: str) -> str:
    """The running tasks (coder/model, phase, focus, leases) and the latest others of this
    task's directory, as an agent reads them."""
    from fleet import live

    me = store.get(task_id)
    focuses = store.focuses()
    held: dict[str, list[str]] = {}
    for c in store.resource_claims():
        held.setdefault(c.task, []).append(c.resource)
    run = list(store.tasks(TaskFilter(statuses=(Status.RUNNING,))))
    lines = [f"Running tasks ({len(run)}):"]
    for t in run:
        figures = live.read(paths, t.id, t.attempts) or {}
        coder = str(figures.get("coder") or t.coder or "?")
        model = figures.get("model") or t.model
        phase = "asking a person" if t.question else str(figures.get("phase") or "starting")
        you = " (you)" if t.id == task_id else ""
        where = "" if t.cwd == me.cwd else f", in {t.cwd}"
        lines.append(
            f"- {t.id}{you}: {t.title} [{coder}{'/' + str(model) if model else ''},"
            f" {phase}, attempt {t.attempts}{where}]"
        )
        if t.id in focuses:
            lines.append(f"  focus: {focuses[t.id][0]}")
        if t.id in held:
            lines.append(f"  holds: {', '.join(held[t.id])}")
    others = [
        t
        for t in store.tasks(
            TaskFilter(cwd=me.cwd, include_final=True, newest_first=True, limit=RECENT + len(run))
        )
        if t.status != Status.RUNNING
    ][:RECENT]
    if others:
        lines.append(f"Latest other tasks in {me.cwd}:")
        lines += [
            f"- {t.id}: {t.title} [{t.status}{', ' + t.reason if t.reason else ''}]" for t in others
        ]
    mine = me.coder or ""
    offered = [o for o in store.offers(open_only=True) if o.coder == mine and o.task != me.id]
    if offered:
        lines.append(f"Open handoff offers to your coder ({mine}; accept_handoff takes one):")
        lines += [
            f"- offer {o.id}: task {o.task}, until {o.expires_at}"
            + (f"; context: {o.context}" if o.context else "")
            for o in offered
        ]
    return "\n".join(lines)
