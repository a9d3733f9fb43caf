"""The agent's tools, declared once: each one's name, a one-line summary and the description
the model reads.

fleet.ask serves exactly these (it refuses to start if a tool it registers is missing here, or
one here is not registered), and fleet-ask's --help and fleet-ask(1) list them from this table,
so that neither can drift from what an agent is offered. Only text: importing it loads nothing.
"""

from __future__ import annotations

from typing import NamedTuple


class Tool(NamedTuple):
    name: str
    summary: str  # for --help and the man page
    description: str  # for the model


ASK = """\
Ask the person responsible for this task a question, and wait for the answer (possibly hours).

Use it only when you cannot reasonably decide yourself: requirements that contradict each
other, a destructive or irreversible action (deleting data, force-pushing, migrations), money,
credentials you do not have, or a choice between approaches that the person clearly cares
about. Do not ask for permission to do what the task already asks of you.

A good question stands on its own, because the person may read it hours later without your
context: say what you are doing, what exactly you need decided, and what you would do by
default. Kinds:
- "input": a free-text answer.
- "choice": the person picks from `options` (2 to 26 short, distinct strings); with
  multi_select true they may pick several.
- "approval": the person approves or denies what you describe, maybe with a comment.

The result says what the person answered. If no answer arrives in time the question expires
and the result says so: then go on with the most cautious choice, or call task_blocked.
"""

NOTIFY = """\
Tell the person something without waiting for a reply: a milestone, a finding they should
know now, or a heads-up about something that will need them later. Do not use it for questions
(use ask_human) or for a final summary (use task_done).
"""

DONE = """\
Mark this task as done, with a short summary of what you did and how you checked it. Call it
once, when the work is complete and verified; then end your turn. Equivalent to running
`fleet close $FLEET_TASK_ID --reason SUMMARY` in the shell.
"""

BLOCKED = """\
Mark this task as blocked: you cannot finish it without a person (missing access, a decision
nobody answered, a failure outside your control). Give the reason a person needs in order to
unblock it; then end your turn. Equivalent to `fleet block $FLEET_TASK_ID --reason REASON`.
"""


CHECKPOINT = """\
Record a checkpoint of this task: fleet saves your work in progress in git (a ref of its own;
your files, branch and staging area stay exactly as they are), your session, and the summary
you give. If the task is suspended, or restarted in a fresh context, the next session starts
from the newest checkpoint: a fresh one sees only your summary, so make it complete.

Call it after a milestone, before a long or risky step, and when your context is getting long.
The summary should say what is done (and verified), what is in progress and how far, the
decisions you made and why, what you learned that is not written down anywhere else, and the
next concrete steps. It does not end your turn: carry on with the work.
"""


SPAWN = """\
Add a subtask of this task to fleet's queue: another agent works on it, in the same directory
(and the same kind of git isolation) unless you say otherwise. Give it a title and a
description complete on their own: its agent sees nothing of your context. `coder` and `model`
choose who runs it (default: the queue's default coder).

With depends true, this task waits for its subtasks: finish your turn after adding them (do
not call task_done); fleet runs them, then starts this task again, and the new prompt lists
each subtask's status and summary. With depends false the subtask runs on its own.
"""

HANDOFF = """\
Hand this task over to another coder (and model), e.g. one better suited to what is left.
fleet accepts only a coder that is configured and installed here; then it adds a successor
task with the same title and description, whose prompt carries your `context` and the
summary of your latest checkpoint, and this attempt is stopped at once. Record a checkpoint
first, and say in `context` what is done and what is left. If fleet refuses, the result says
why and you carry on.
"""

CLAIM = """\
Claim an advisory lease on a resource before you change it, so that other agents working in
the same directory leave it alone: a path ("fleet/run.py", "docs/"), a module, or any agreed
name ("db-migrations"). Exactly one task holds a resource at a time. The lease lasts
ttl_seconds, until you release it, or until this attempt ends; claim again to extend it.

If another task holds it, the claim is refused and the result names that task, its note and
when its lease runs out: then work on something else, or send it a message, and claim later.
Leases are advisory: nothing stops an edit, so claim before editing shared areas.
"""

RELEASE = """\
Release your lease on a resource as soon as you are done with it, so another agent can claim
it.
"""

CLAIMS = """\
List the leases in force in this task's directory: each resource, the task holding it, its
note and when it runs out.
"""
SEND = """\
Send a message to the agents of other tasks: `to` is a task id, `parent` (the task that
spawned this one), `children` (its running subtasks), `siblings` (the other running subtasks
of its parent) or `all` (every running task). Tell them what they need: a finding that
changes their work, a question, that you are done with something they wait for. Keep it
short and complete on its own; the person sees it too.
"""

READ = """\
Read the messages sent to this task since you last saw any. You rarely need it: the result
of every fleet tool call already ends with the messages that arrived meanwhile.
"""
AGENTS = """\
List the other agents: the running tasks (each one's coder and model, phase, focus and the
resources it holds) and the latest other tasks of this directory with their status. Look
before starting a piece of work that another agent may already be doing.
"""

FOCUS = """\
Say in one line what you are working on now ("fixing the lock timeout in fleet/store"), so
that people and other agents see it (list_agents, fleet ls, fleet status, systemctl status).
Set it when you start something new.
"""
ACCEPT = """\
Accept (or decline) a handoff offered to your coder: when a person offers another task to
the coder you run as, you get a message with the offer's context. Read it; accept and a new
task of your coder takes that task over (you go on with your own task); decline with a
reason and the original goes on as it was.
"""

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("ask_human", "ask a person and wait for the answer (text, choice, approval)", ASK),
        Tool("notify_human", "tell a person something, without waiting", NOTIFY),
        Tool("task_done", "mark the task done, with a summary (fleet close)", DONE),
        Tool("task_blocked", "mark the task blocked, with the reason (fleet block)", BLOCKED),
        Tool(
            "checkpoint",
            "record the work in progress, the session and a summary to resume from",
            CHECKPOINT,
        ),
        Tool("spawn_subtask", "add a subtask to the queue, maybe waiting for it", SPAWN),
        Tool("handoff", "hand the task over to another coder or model", HANDOFF),
        Tool("claim", "take an advisory lease on a resource (a path, a module, a name)", CLAIM),
        Tool("release", "release a lease on a resource", RELEASE),
        Tool("claims", "list the leases in force in the task's directory", CLAIMS),
        Tool("send_message", "message a task, its parent, children, siblings or all", SEND),
        Tool("read_messages", "read the messages that arrived since the last read", READ),
        Tool("list_agents", "who runs now, with what, doing what, holding what", AGENTS),
        Tool("set_focus", "say in one line what you are working on now", FOCUS),
        Tool("accept_handoff", "accept or decline a handoff offered to your coder", ACCEPT),
    )
}


def listing() -> str:
    """The tools, one per line, for help text (a click `\\b` block: kept as it is)."""
    width = max(len(name) for name in TOOLS)
    return "\b\n" + "\n".join(f"{t.name:<{width}}  {t.summary}" for t in TOOLS.values())
