"""What an agent's coordination tools say and check: leases on resources, in words a model
reads (fleet-ask serves them; `fleet claims` lists the same leases for a person).

Every text an agent gives passes fleet.inputs, as all it writes does. A refused claim names
the holder, its note and when the lease runs out, so the agent can decide without asking.
"""

from __future__ import annotations

from fleet import inputs
from fleet.checkpoints import Resumption
from fleet.errors import InputError
from fleet.store import Store
from fleet.store.coord import ResourceClaim, SavedClaim

MAX_RESOURCE = 300
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
