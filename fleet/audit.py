"""The audit trail: what a person, an agent or a fleet program did to a task, and who did it.

Invariants:
- the store writes one `audit` row per action, in the transaction of the change it records, so
  a change that is refused or rolled back leaves no row, and the trail survives journal
  rotation (`fleet history ID` reads the rows);
- after the commit, each row also becomes a journal entry with the action's MESSAGE_ID (which
  systemd/fleet.catalog explains), FLEET_TASK_ID, FLEET_ACTION, FLEET_BY and one FLEET_<KEY>
  field per detail key; actions whose entry a program already writes with more to say
  (`started` by fleet-run, `asked` and `answered` by fleet-ask) are not written twice;
- the journal is the trail, the rows are the record: a host without journald simply gets no
  entries, and a journal that cannot take one never fails the action.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from fleet.journal import SOCKET, Journal, Value

MSG_CHECKPOINTED = "ec5777e0babb47078a6721a402479b6c"
MSG_SUSPENDED = "1da9762d8594425c9bf1bae62c0761b0"
MSG_RESUMED = "ca4f1926b7a742adb7aef743b1f4e99f"


class Action(NamedTuple):
    message_id: str
    subject: str
    explanation: str  # for the catalog; @FIELD@ is replaced by journalctl -x


ACTIONS: dict[str, Action] = {
    "added": Action(
        "b6a0fc8dc9b94882a3d27a4d9fa485f7",
        "A fleet task was added",
        "@FLEET_BY@ added fleet task @FLEET_TASK_ID@ to the queue. It is claimed once a slot is"
        " free and every task it depends on is done; `fleet history @FLEET_TASK_ID@` lists"
        " what happens to it.",
    ),
    "claimed": Action(
        "8c36b6e2bbdf4a2f9ca4070f60a40384",
        "A fleet task was claimed",
        "@FLEET_BY@ claimed fleet task @FLEET_TASK_ID@ for attempt @FLEET_ATTEMPT@ (owner"
        " @FLEET_OWNER@); its fleet-task@ unit runs the attempt.",
    ),
    "ended": Action(
        "e34aec7ecf804acaa5242aa4d8784272",
        "The end of a fleet task attempt was applied",
        "Attempt @FLEET_ATTEMPT@ of fleet task @FLEET_TASK_ID@ was classified as @FLEET_OUTCOME@"
        " by @FLEET_BY@, and the policy left the task @FLEET_STATUS@.",
    ),
    "checkpointed": Action(
        MSG_CHECKPOINTED,
        "A fleet task was checkpointed",
        "@FLEET_BY@ took checkpoint @FLEET_CHECKPOINT@ of fleet task @FLEET_TASK_ID@: a"
        " context summary, the coder's session, the pending questions and, when the task"
        " works in a git repository, its work in progress as a ref (made without touching"
        " the work tree or the index). `fleet checkpoints @FLEET_TASK_ID@` lists them.",
    ),
    "suspended": Action(
        MSG_SUSPENDED,
        "A fleet task was suspended",
        "@FLEET_BY@ suspended fleet task @FLEET_TASK_ID@ after checkpoint"
        " @FLEET_CHECKPOINT@; a running attempt is stopped and does not count as a failure."
        " The task is not claimed again until `fleet resume @FLEET_TASK_ID@`.",
    ),
    "resumed": Action(
        MSG_RESUMED,
        "A fleet task was resumed",
        "@FLEET_BY@ resumed fleet task @FLEET_TASK_ID@ from checkpoint @FLEET_CHECKPOINT@."
        " Its next attempt resumes the coder's own session where the coder supports it,"
        " and otherwise starts a fresh session whose prompt carries the checkpoint's"
        " summary.",
    ),
    "spawned": Action(
        "c9e35d9685e04ecf852d71a9665ab540",
        "A fleet task spawned a subtask",
        "@FLEET_BY@ added subtask @FLEET_CHILD@ of fleet task @FLEET_TASK_ID@. When the parent"
        " waits for it (FLEET_PARENT_WAITS=1), the parent is claimed again only once the"
        " subtask is done, and its prompt then lists its subtasks' outcomes.",
    ),
    "handed-off": Action(
        "8a710d05170e4fb6a755423cc00a968c",
        "A fleet task was handed off",
        "@FLEET_BY@ handed fleet task @FLEET_TASK_ID@ off to @FLEET_CODER@; its work goes on"
        " in the successor task @FLEET_TO@, whose prompt carries the handoff context and the"
        " latest checkpoint summary. The original is handed-off and never claimed again.",
    ),
    "merged": Action(
        "d3f2837b850c4114939c19027d9c383b",
        "fleet tasks were merged",
        "@FLEET_BY@ added a task that consolidates the branches and artifacts of other tasks:"
        " FLEET_FROM names the tasks merged into @FLEET_TASK_ID@, FLEET_INTO the task a merged"
        " task goes into. `fleet tree @FLEET_TASK_ID@` shows the lineage.",
    ),
    "merge-requested": Action(
        "cbd4255342fc4cb5b294c47b4dbd6e16",
        "A merge-back of a fleet task was asked for",
        "@FLEET_BY@ asked for fleet task @FLEET_TASK_ID@'s branch to be merged back into its"
        " base (`fleet merge`; FLEET_STRATEGY names a strategy given for it). The task is in"
        " merging until the merge-back's verdict, which follows as its own entry.",
    ),
    "merged-back": Action(
        "f62d3945f25d4f0386f37e453d7a8f09",
        "A fleet task was merged back",
        "@FLEET_BY@ merged fleet task @FLEET_TASK_ID@'s branch back (FLEET_STATE=merged: its"
        " base is now at @FLEET_COMMIT@) or left it for a pull request (FLEET_STATE=branch);"
        " the task is done. FLEET_REASON notes what was kept.",
    ),
    "merge-blocked": Action(
        "08ba2794892047c49610422cd422403a",
        "A fleet task's merge-back was blocked",
        "The merge-back of fleet task @FLEET_TASK_ID@ by @FLEET_BY@ ended in @FLEET_STATE@:"
        " @FLEET_REASON@. Nothing was merged, and the branch and worktree are as they were;"
        " once that is dealt with, `fleet merge @FLEET_TASK_ID@` tries again.",
    ),
    "merge-waits": Action(
        "4ef4642504cd4fce96b0fa5410efec0b",
        "A fleet task's merge-back waits",
        "The merge-back of fleet task @FLEET_TASK_ID@ by @FLEET_BY@ could not move the base"
        " yet: @FLEET_REASON@. Every dispatch pass tries again; an entry is written only when"
        " the reason changes.",
    ),
    "closed": Action(
        "4de2732d69344b60b28b6727d3c4c0c7",
        "A fleet task was closed",
        "@FLEET_BY@ marked fleet task @FLEET_TASK_ID@ done.",
    ),
    "blocked": Action(
        "b939acc4ab3445b29a97638371b69574",
        "A fleet task was blocked",
        "@FLEET_BY@ blocked fleet task @FLEET_TASK_ID@; it waits for a person (`fleet retry"
        " @FLEET_TASK_ID@` when the reason is dealt with).",
    ),
    "cancelled": Action(
        "0f07d7f6a6334b35a1dfda0b2dd8e752",
        "A fleet task was cancelled",
        "@FLEET_BY@ cancelled fleet task @FLEET_TASK_ID@: it is never claimed again unless"
        " retried.",
    ),
    "recovered": Action(
        "a3152e3cb97d42088748c3fa1093ce6d",
        "A lost fleet task attempt was recovered from another host",
        "Host @FLEET_BY_HOST@ released attempt @FLEET_ATTEMPT@ of fleet task @FLEET_TASK_ID@,"
        " claimed by host @FLEET_HOST@: its lease had run out and that host had been silent"
        " longer than host_dead_after. The task is ready to run again (or blocked, if it was"
        " lost max_lost times in a row).",
    ),
    "retried": Action(
        "d174c4e118664224903da4b58d144a15",
        "A fleet task was put back to ready",
        "@FLEET_BY@ retried fleet task @FLEET_TASK_ID@: it is ready again, its failure and"
        " no-close counters reset.",
    ),
    "edited": Action(
        "b87c582d10f64b769cabaae2059a1d87",
        "A fleet task was changed",
        "@FLEET_BY@ changed fields of fleet task @FLEET_TASK_ID@ (FLEET_FIELDS names them).",
    ),
    "leased": Action(
        "5b0f4a3e9c2d4e8a8f61d0c7b2a94e13",
        "A fleet task's agent claimed a resource",
        "The agent of fleet task @FLEET_TASK_ID@ holds the advisory lease on @FLEET_RESOURCE@"
        " (in the task's directory) until @FLEET_UNTIL@, its release, or the end of its"
        " attempt; other agents' claims of it are refused meanwhile. `fleet claims` lists"
        " the leases in force.",
    ),
    "lease-released": Action(
        "a7c3e1d95b2f4c06b8e4f9a1d3c56e70",
        "A fleet task's agent released a resource",
        "The agent of fleet task @FLEET_TASK_ID@ released its lease on @FLEET_RESOURCE@.",
    ),
    "messaged": Action(
        "3e9b7d2c6a1f4b58a0c4e2f7d91b6a35",
        "A message was sent to a fleet task's agent",
        "@FLEET_SENDER@ sent message @FLEET_MESSAGE@ to the agent of fleet task"
        " @FLEET_TASK_ID@; the agent sees it with the result of its next fleet tool call (or"
        " read_messages). `fleet messages @FLEET_TASK_ID@` lists them.",
    ),
    "handoff-offered": Action(
        "0c1d6e4b8a3f4f27b95e7a2d4c8b1f60",
        "A fleet task was offered for handoff",
        "@FLEET_BY@ offered fleet task @FLEET_TASK_ID@ to coder @FLEET_CODER@ (offer"
        " @FLEET_OFFER@) until @FLEET_EXPIRES_AT@. Nothing changes until it is accepted (`fleet"
        " accept @FLEET_TASK_ID@`, the handoff_offers policy, or an agent of that coder): the"
        " task goes on meanwhile, and goes on as it is if the offer is declined or expires.",
    ),
    "handoff-accepted": Action(
        "6a2e9f1c3b7d4e05a8c6d2f4b1e97a38",
        "A handoff offer was accepted",
        "@FLEET_BY@ accepted handoff offer @FLEET_OFFER@ of fleet task @FLEET_TASK_ID@ to coder"
        " @FLEET_CODER@; the handoff follows as its own entry.",
    ),
    "handoff-declined": Action(
        "d48b2c7e9f1a4b63a5e0c8d7f2b6e914",
        "A handoff offer was declined",
        "@FLEET_BY@ declined handoff offer @FLEET_OFFER@ of fleet task @FLEET_TASK_ID@ to coder"
        " @FLEET_CODER@: @FLEET_REASON@. The task goes on as it was.",
    ),
    "handoff-expired": Action(
        "91f3a6d2c4e84b7fa0d5e6c2b8a7f153",
        "A handoff offer expired",
        "Handoff offer @FLEET_OFFER@ of fleet task @FLEET_TASK_ID@ was neither accepted nor"
        " declined in time; the task goes on as it was.",
    ),
    "handoff-failed": Action(
        "b5e8c1a7d3f24e96b0a4c9d6e2f81a27",
        "An accepted handoff offer could not be carried out",
        "Handoff offer @FLEET_OFFER@ of fleet task @FLEET_TASK_ID@ was accepted by @FLEET_BY@,"
        " but the handoff was refused: @FLEET_REASON@. The task goes on as it was.",
    ),
    "kill-requested": Action(
        "4c2f7e9a1b8d4e63a5f0c7d2e9b14a86",
        "A person asked another host to stop a fleet task",
        "@FLEET_BY@ asked host @FLEET_HOST@, which runs fleet task @FLEET_TASK_ID@, to stop its"
        " attempt (`fleet kill` on another host). That host's fleet-listen, or the runner's next"
        " renewal in poll-only mode, stops the agent; the task is then blocked as stopped by a"
        " person.",
    ),
}
# Written by the program that did it, with its own MESSAGE_ID (fleet.events) and fields.
JOURNALED_ELSEWHERE = ("started", "asked", "answered")
KNOWN = (*ACTIONS, *JOURNALED_ELSEWHERE)


class Actor(NamedTuple):
    """Who changes the store through one connection, and the program they use."""

    by: str  # the person (user@host), `agent`, or the program (fleet-claim, …)
    program: str  # SYSLOG_IDENTIFIER of the journal entries


class Row(NamedTuple):
    task: str
    action: str
    by: str
    detail: dict[str, Any]


def describe(row: Row) -> str:
    """One line for the journal's MESSAGE."""
    d = row.detail
    extra = {
        "added": lambda: f" ({d['title']})" if d.get("title") else "",
        "claimed": lambda: f" for attempt {d.get('attempt')}",
        "ended": lambda: f": attempt {d.get('attempt')} {d.get('outcome')}, now {d.get('status')}",
        "checkpointed": lambda: f": checkpoint {d.get('checkpoint')}",
        "suspended": lambda: f" at checkpoint {d.get('checkpoint')}",
        "resumed": lambda: f" from checkpoint {d.get('checkpoint') or 'none'}",
        "spawned": lambda: f" subtask {d.get('child')}",
        "handed-off": lambda: f" to {d.get('to')} ({d.get('coder')})",
        "merge-requested": lambda: f" ({d['strategy']})" if d.get("strategy") else "",
        "merged-back": lambda: f": {d.get('state')} {str(d.get('commit') or '')[:12]}".rstrip(),
        "merge-blocked": lambda: f": {d.get('state')}",
        "merge-waits": lambda: f": {d.get('reason')}",
        "leased": lambda: f" {d.get('resource')} until {d.get('until')}",
        "lease-released": lambda: f" {d.get('resource')}",
        "messaged": lambda: f": message {d.get('message')} from {d.get('sender')}",
        "handoff-offered": lambda: f" to {d.get('coder')} (offer {d.get('offer')})",
        "handoff-declined": lambda: f": {d.get('reason')}",
        "handoff-failed": lambda: f": {d.get('reason')}",
        "kill-requested": lambda: f" on {d.get('host')}",
        "merged": lambda: (
            f" from {' '.join(d['from'])}" if "from" in d else f" into {d.get('into')}"
        ),
    }.get(row.action, lambda: "")()
    return f"{row.task} {row.action} by {row.by}{extra}"


def _fields(detail: Mapping[str, Any]) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for key, value in detail.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, list | tuple):
            value = " ".join(str(v) for v in value)
        elif not isinstance(value, int | float | str):
            value = str(value)
        out["FLEET_" + key.upper()] = value
    return out


def journal(rows: Sequence[Row], program: str) -> None:
    """The journal entries of committed audit rows (none without journald)."""
    rows = [r for r in rows if r.action in ACTIONS]
    if not rows or not os.path.exists(SOCKET):
        return
    if agent_task() is not None:
        # journald records our command line with each entry: an agent's may quote a secret.
        from fleet.inputs import redactor
        from fleet.redact import scrub_command_line

        redact = redactor()
        if redact is not None:
            scrub_command_line(redact)
    sink = Journal()
    try:
        for row in rows:
            entry: dict[str, Value] = {
                **_fields(row.detail),
                "MESSAGE": describe(row),
                "MESSAGE_ID": ACTIONS[row.action].message_id,
                "PRIORITY": 5,
                "SYSLOG_IDENTIFIER": program,
                "FLEET_TASK_ID": row.task,
                "FLEET_EVENT": "audit",
                "FLEET_ACTION": row.action,
                "FLEET_BY": row.by,
            }
            with contextlib.suppress(OSError):
                sink.send(entry)
    finally:
        sink.close()


def person() -> str:
    """Who runs this command: user@host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname() or 'localhost'}"


def agent_task() -> str | None:
    """The task whose agent runs this process, or None for a person (or a script of theirs).

    fleet-run gives the coder FLEET_TASK_ID, and with it every tool the agent starts; under
    systemd an agent that drops the variable is still in its unit's cgroup, which names the
    task (fleet-task@ID.service).
    """
    task = os.environ.get("FLEET_TASK_ID")
    if task:
        return task
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
            groups = f.read()
    except OSError:
        return None
    start = groups.find("/fleet-task@")
    if start < 0:
        return None
    unit = groups[start + len("/fleet-task@") :].split("\n", 1)[0].split("/", 1)[0]
    return unit.removesuffix(".service") or None


def who() -> str:
    """Who runs `fleet` here: the agent of a task (see agent_task), else the person."""
    return "agent" if agent_task() else person()
