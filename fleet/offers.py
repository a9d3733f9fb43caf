"""Handoffs as offer → accept: `fleet handoff ID --to C[:M] --offer`, `fleet accept ID`,
`fleet decline ID`, and a running agent of the receiving coder with accept_handoff.

An offer changes nothing but the offer's row: the task goes on as it is until the offer is
accepted, which then does exactly what a direct handoff does (fleet.lineage.handoff: the
successor added, the original handed off; the caller stops the original's attempt). A
declined or expired offer leaves the task as it was, and a declined one is told to the
task's agent as a message. Invariants: an offer is decided once (the store's compare-and-set),
and an accepted offer whose handoff is refused is recorded as failed, with the reason.
"""

from __future__ import annotations

from fleet import coordination, inputs, lineage
from fleet.config import Config
from fleet.errors import Conflict, FleetError, InputError
from fleet.model import Status, Task
from fleet.paths import Paths
from fleet.store import Store, TaskFilter
from fleet.store.coord import Offer


def open_offer(store: Store, task_id: str) -> Offer:
    """The task's open offer; Conflict saying what became of the last one otherwise."""
    found = store.offers(task_id)
    if found and found[-1].status == "offered":
        return found[-1]
    if found:
        last = found[-1]
        by = f" by {last.decided_by}" if last.decided_by else ""
        raise Conflict(
            f"{task_id} has no open handoff offer (offer {last.id} was {last.status}{by})"
        )
    raise Conflict(
        f"{task_id} has no handoff offer",
        hint=f"`fleet handoff {task_id} --to CODER --offer` makes one",
    )


def offer(
    store: Store,
    paths: Paths,
    config: Config,
    task_id: str,
    coder: str,
    model: str | None,
    context: str | None,
    seconds: float | None = None,
) -> Offer:
    """Offer the task to `coder` (checked as a handoff is), and tell the running agents of
    that coder; under the `accept` policy, accepted at once (the caller then stops the
    original's attempt, as after a direct handoff)."""
    coder, model, context = lineage.check_handoff(config, coder, model, context)
    wait = config.get_int("handoff_offer_seconds") if seconds is None else seconds
    made = store.offer_handoff(task_id, coder, model, context, wait)
    if config.get_str("handoff_offers") == "accept":
        accept(store, config, task_id)
        return store.offers(task_id)[-1]
    tell_receivers(store, paths, made)
    return made


def tell_receivers(store: Store, paths: Paths, made: Offer) -> None:
    """A message to every running agent of the offered coder (its own task's aside)."""
    task = store.get(made.task)
    to = [
        t.id
        for t in store.tasks(TaskFilter(statuses=(Status.RUNNING,)))
        if t.coder == made.coder and t.id != made.task
    ]
    if not to:
        return
    target = made.coder + (f":{made.model}" if made.model else "")
    text = (
        f"Handoff offer {made.id}: task"
        f" {task.id} ({task.title}) is offered to {target} until {made.expires_at}."
        + (f" Context: {made.context}" if made.context else "")
        + f" Accept with accept_handoff(task={task.id!r}) (a new {made.coder} task takes"
        " it over), or decline with accept_handoff(task=..., accept=false, reason=...)."
    )
    coordination.post(store, paths, to, coordination.message_text(text), made.offered_by, None)


def accept(store: Store, config: Config, task_id: str) -> Task:
    """Accept the task's open offer: the handoff it offered, done now; the successor."""
    made = open_offer(store, task_id)
    store.decide_offer(made.id, "accepted")
    try:
        successor = lineage.handoff(store, config, task_id, made.coder, made.model, made.context)
    except FleetError as e:
        store.decide_offer(made.id, "failed", reason=e.message, expect="accepted")
        raise
    store.decide_offer(made.id, "accepted", successor=successor.id, expect="accepted")
    return successor


def decline(
    store: Store, paths: Paths, task_id: str, reason: str, sender_task: str | None = None
) -> Offer:
    """Decline the task's open offer with `reason`; its agent, if running, is told."""
    reason = inputs.reason(reason)
    if not reason:
        raise InputError("give the reason for declining", hint="--reason TEXT")
    made = store.decide_offer(open_offer(store, task_id).id, "declined", reason=reason)
    task = store.get(task_id)
    if task.status == Status.RUNNING:
        text = (
            f"Your task's handoff offer {made.id} to {made.coder} was declined by"
            f" {made.decided_by}: {reason}. Carry on with the task yourself."
        )
        by = store.actor.by
        coordination.post(store, paths, [task_id], coordination.message_text(text), by, sender_task)
    return made
