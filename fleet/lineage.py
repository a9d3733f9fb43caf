"""How work moves between tasks: subtasks, handoffs and merges, and what each one is told.

Invariants:
- a subtask inherits its parent's directory, isolation and base unless told otherwise (in a
  worktree parent's repository, the base is the parent's branch fleet/ID once it exists: the
  subtask's work merges back there, for the parent's next attempt to build on); a
  parent that waits for it depends on it (`after`), so waiting is the queue's ordinary
  dependency rule and needs no state of its own: the parent's attempt ends as `waiting`
  (fleet-reap), and its next attempt is claimed once every subtask it waits for is done;
- a handoff is accepted only for a coder that is configured and whose program is here (the
  check `fleet doctor` makes); a refused one changes nothing and says why;
- a handoff's successor inherits its predecessor's budgets, and what the predecessors spent
  counts against them (`spent`);
- a handoff's successor and a merge task start from the work they continue: a successor of a
  worktree task branches from the predecessor's branch, a merge task depends on the tasks it
  consolidates (or on the successors they were handed off to);
- a successor is never claimed while its predecessor is still claimed (the store's ready
  rule): the predecessor's agent may still be writing, and its work reaches its branch only
  when its runner stops; fleet-reap wakes fleet-claim then;
- the texts added to a prompt (subtasks' outcomes, the handoff context with the predecessor's
  newest checkpoint summary, the branches and artifacts to consolidate) are built here, from
  the store at the start of the attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleet.config import Config
from fleet.errors import Conflict, InputError
from fleet.model import Task, TaskSpec
from fleet.paths import Paths
from fleet.store import Store

MAX_CONTEXT = 20_000  # characters; the successor's model reads it at the start


def subtask(
    parent: Task,
    title: str,
    description: str = "",
    coder: str | None = None,
    model: str | None = None,
    waits: bool = False,
) -> TaskSpec:
    """A subtask of `parent` in its directory, with its isolation and base: the parent's
    branch once it has one, so that the subtask's work merges back where the parent's next
    attempt (told of its outcome) finds it."""
    return TaskSpec(
        title=title,
        cwd=parent.cwd,
        description=description,
        coder=coder,
        model=model,
        priority=parent.priority,
        parent=parent.id,
        isolation=parent.isolation or "none",
        base=(parent.branch or parent.base) if parent.isolated else None,
        merge=parent.merge if parent.isolated else None,
        parent_waits=waits,
        # It works in the same directory: on the same host, with the labels that needs.
        pinned_host=parent.pinned_host,
        needs=parent.needs,
    )


def target(text: str) -> tuple[str, str | None]:
    """CODER[:MODEL] as (coder, model)."""
    coder, _, model = text.strip().partition(":")
    if not coder:
        raise InputError(f"no coder in {text!r}", hint="give CODER or CODER:MODEL")
    return coder, model or None


def handoff(
    store: Store,
    config: Config,
    task_id: str,
    coder: str,
    model: str | None,
    context: str | None,
) -> Task:
    """Offer the task to `coder` (and `model`); the successor if accepted, else InputError
    (no such coder) or Conflict (not usable here, or the task is finished)."""
    coder, model, context = check_handoff(config, coder, model, context)
    # Which statuses may be handed off is the store's rule (its Conflict says so).
    task = store.get(task_id)
    # A successor of a worktree task goes on from the predecessor's branch (its first attempt
    # starts its own branch there) and merges back where the predecessor would have.
    successor = TaskSpec(
        title=task.title,
        cwd=task.cwd,
        description=task.description,
        coder=coder,
        model=model,
        priority=task.priority,
        labels=task.labels,
        after=task.after,
        parent=task.parent,
        isolation=task.isolation,
        base=task.base,
        merge=task.merge,
        merged_from=task.merged_from,  # a merge task handed on still consolidates the same
        # The work goes on, and so does its budget (which counts what its predecessors spent).
        max_cost_usd=task.max_cost_usd,
        max_tokens=task.max_tokens,
        limits=task.limits,
        pinned_host=task.pinned_host,
        needs=task.needs,
    )
    return store.handoff(task_id, successor, context)


def check_handoff(
    config: Config, coder: str, model: str | None, context: str | None
) -> tuple[str, str | None, str | None]:
    """(coder, model, context) checked for a handoff: InputError if no such coder is
    configured, Conflict if it is not usable here."""
    from fleet import inputs
    from fleet.cli.setup import coder_check

    coder = inputs.name("coder", coder)
    model = inputs.name("model", model) if model else None
    context = inputs.text("context", context or "", MAX_CONTEXT) or None
    if coder not in config.coders:
        raise InputError(
            f"handoff refused: no coder {coder!r} is configured",
            hint="configured coders: " + ", ".join(config.coders),
        )
    usable, _, message, hint = coder_check(config, coder)
    if not usable:
        raise Conflict(f"handoff refused: {message}", hint=hint or None)
    return coder, model, context


def spent(store: Store, task: Task) -> tuple[float, int]:
    """(cost, tokens) of the task's attempts and of its predecessors': what its budget has
    used up, since a successor carries its predecessor's work, and its budget, on."""
    cost, tokens, seen = 0.0, 0, set()
    current: Task | None = task
    while current is not None and current.id not in seen:
        seen.add(current.id)
        cost += current.cost or 0.0
        tokens += (current.tokens_in or 0) + (current.tokens_out or 0)
        current = store.get(current.predecessor) if current.predecessor else None
    return cost, tokens


def start_branch(store: Store, task: Task) -> str | None:
    """The branch a successor's worktree starts from: that of its nearest predecessor that
    has one (a predecessor handed on before it ever ran has none, and its work is still on
    the branch of the one before it); None for a task that continues nobody's branch."""
    seen = {task.id}
    current = task
    while current.predecessor and current.predecessor not in seen:
        current = store.get(current.predecessor)
        seen.add(current.id)
        if current.branch:
            return current.branch
    return None


def sources(store: Store, task_ids: Sequence[str]) -> list[str]:
    """What a merge of `task_ids` waits for: each task, or the last successor of one that was
    handed off (whose work is the successor's now)."""
    return list(dict.fromkeys(store.heir(t) for t in task_ids))


# -- what a prompt is told -------------------------------------------------------------------


def subtasks_note(children: Sequence[Task]) -> str:
    """The outcome of each subtask, for the parent's next attempt."""
    if not children:
        return ""
    lines = ["Your subtasks and how they ended (reason or summary):"]
    for c in children:
        reason = " ".join((c.reason or "").split()) or "-"
        lines.append(f"- {c.id} {c.title!r}: {c.status} ({reason})")
    return "\n".join(lines) + "\n"


def handoff_note(predecessor: Task, context: str | None, summary: str | None) -> str:
    """What a successor is told about the task it takes over."""
    text = (
        f"This task was handed off to you from {predecessor.id} (coder"
        f" {predecessor.coder or 'default'}), which worked on it before you."
    )
    if context:
        text += f"\n\nHandoff context:\n\n{context}"
    if summary:
        text += f"\n\nIts latest checkpoint summary:\n\n{summary}"
    return text + "\n"


def merge_note(paths: Paths, merged: Sequence[Task]) -> str:
    """The branches and artifact directories a merge task consolidates."""
    lines = [
        "Consolidate the work of these tasks into one result: merge their git branches and"
        " combine their artifacts.",
    ]
    for t in merged:
        if t.merge_state == "merged":
            # Merged back when it was done (the default strategies), its branch deleted.
            commit = f" (at {t.merged_commit[:12]})" if t.merged_commit else ""
            code = f"its work is already in {t.base}{commit}"
        elif t.isolated:
            code = f"its work is on branch {t.branch or f'fleet/{t.id}'}"
        else:
            code = "no branch (no worktree isolation)"
        artifacts = Path(paths.tasks) / t.id / "artifacts"
        lines.append(f"- {t.id} {t.title!r} ({t.status}): {code}; artifacts in {artifacts}")
    return "\n".join(lines) + "\n"


def prompt_notes(paths: Paths, store: Store, task: Task) -> str:
    """Everything lineage adds to the task's prompt this attempt (may be empty)."""
    notes: list[str] = []
    if task.predecessor:
        before = store.get(task.predecessor)
        taken = store.checkpoints(before.id)
        notes.append(handoff_note(before, task.handoff, taken[-1].summary if taken else None))
    if task.merged_from:
        notes.append(merge_note(paths, [store.get(t) for t in task.merged_from]))
    notes.append(subtasks_note(store.children(task.id)))
    return "\n".join(n for n in notes if n)
