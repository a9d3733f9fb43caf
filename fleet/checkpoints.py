"""Taking a checkpoint of a task, and what the attempt after one is told.

A checkpoint is a row of the store (numbered per task: the summary, the coder's session, the
pending questions) plus, when the task works in a git repository, the work in progress as
`refs/fleet/<id>/checkpoints/<n>`, made by fleet.wipref without touching the work tree or the
index. Invariants: the git snapshot is made before the store numbers the checkpoint (git may
be slow, a store transaction must not wait on it), and a checkpoint is recorded even when git
fails, with the reason in `note` instead of a ref; a ref, once made, is never moved.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from fleet.errors import FleetError, InputError
from fleet.model import Checkpoint, CheckpointSpec, Task
from fleet.store import Store

MAX_SUMMARY = 20_000  # characters; a summary is read by a model at the start of an attempt


def check_summary(summary: str) -> str:
    """The summary as fleet.inputs checks (and, an agent's, redacts) all free text."""
    from fleet import inputs

    summary = inputs.text("summary", summary, MAX_SUMMARY)
    if not summary:
        raise InputError(
            "the checkpoint summary is empty",
            hint="say where the work stands and what comes next",
        )
    return summary


def workdir(task: Task) -> str:
    """Where the task's files are: its worktree once it has one, else its directory."""
    if task.worktree and os.path.isdir(task.worktree):
        return task.worktree
    return task.cwd


def take(store: Store, task_id: str, by: str, summary: str) -> Checkpoint:
    """Record the next checkpoint of `task_id` (summary already checked), with its git ref when
    the task works in a git repository, taken by `by`."""
    from fleet import wipref

    task = store.get(task_id)
    where = workdir(task)
    first = summary.splitlines()[0][:200]
    note = None
    snap = None
    try:
        snap = wipref.snapshot(where, f"fleet checkpoint of {task_id}: {first}")
        if snap is None:
            note = f"{where} is not in a git repository: no ref"
    except FleetError as e:
        note = f"no ref: {e.message}"
    spec = CheckpointSpec(
        by,
        summary,
        wipref.ref_prefix(task_id) if snap else None,
        snap.commit if snap else None,
        snap.repo if snap else None,
        note,
    )
    cp = store.add_checkpoint(task_id, spec)
    # The leases the agent holds now: the attempt that resumes from here takes them back.
    store.save_claims(task_id, cp.n)
    if snap is not None and cp.ref:
        try:
            wipref.point(snap.repo, cp.ref, snap.commit)
        except FleetError as e:
            cp = store.drop_checkpoint_ref(task_id, cp.n, f"no ref: {e.message}")
    return cp


class Resumption(NamedTuple):
    """How the next attempt starts after a checkpoint: the coder's session to resume (if any),
    and the text to put in its prompt, for a resumed session or a fresh one."""

    checkpoint: Checkpoint
    session: str | None
    resumed_prompt: str  # the message that continues the coder's own session
    fresh_note: str  # appended to a fresh session's prompt


def plan(cp: Checkpoint, coder: str, questions: list[str], why: str) -> Resumption:
    """`why`: "resumed" (after `fleet resume`) or "restarted" (after context pressure, where
    only a fresh session makes sense). `questions`: the pending questions' texts then."""
    asked = ""
    if questions:
        asked = (
            "\nThese questions of yours were waiting for an answer and were cancelled; ask"
            " again if you still need them:\n" + "\n".join(f"- {q}" for q in questions) + "\n"
        )
    where = f" (git ref {cp.ref})" if cp.ref else ""
    summary = f"Checkpoint {cp.n}{where}, summary:\n\n{cp.summary}\n{asked}"
    session = cp.session_id if why == "resumed" and cp.coder == coder else None
    resumed = (
        f"This session was suspended by fleet and is now resumed from checkpoint {cp.n}."
        " Carry on with the task where you left off; the work tree holds the files as they"
        f" were.\n\n{summary}"
    )
    fresh = (
        f"This task was {why} from checkpoint {cp.n}, taken in an earlier session you cannot"
        f" see. Carry on from what it says.\n\n{summary}"
    )
    return Resumption(cp, session, resumed, fresh)
