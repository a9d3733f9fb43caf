"""The lineage of tasks as a forest: where each task came from, drawn once.

Invariant: every task appears exactly once, under the task it came from: its parent (it is a
subtask), else its predecessor (it took over by a handoff), else the first task it merges (a
merge task); a task that came from none of these, or whose origin is not in the set, is a root.
The other links (dependencies, the other merged tasks) are written on the task's line. Links
that would loop (an edited parent can point anywhere) are cut where the walk meets them again,
so the drawing always ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.model import Status, Task


@dataclass
class Node:
    task: Task
    relation: str | None  # how it came from the node above: subtask, successor, merge
    below: list[Node] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        t = self.task
        return {
            "id": t.id,
            "title": t.title,
            "status": state(t),
            "relation": self.relation,
            "parent": t.parent,
            "predecessor": t.predecessor,
            "merged_from": list(t.merged_from),
            "after": list(t.after),
            "below": [n.to_json() for n in self.below],
        }


def state(task: Task) -> str:
    """The status as `fleet ls` shows it (a ready task still waiting on others: waiting)."""
    if task.status == Status.READY and task.waiting_on:
        return "waiting"
    return str(task.status)


def origin(task: Task) -> tuple[str, str] | None:
    """(the task it came from, how), or None."""
    if task.parent:
        return task.parent, "subtask"
    if task.predecessor:
        return task.predecessor, "successor"
    if task.merged_from:
        return task.merged_from[0], "merge"
    return None


def forest(tasks: Iterable[Task]) -> list[Node]:
    """The roots, oldest first; below each node, what came from it, oldest first."""
    ordered = list(tasks)
    known = {t.id for t in ordered}
    below: dict[str, list[Task]] = {}
    roots: list[Task] = []
    for t in ordered:
        came = origin(t)
        if came is None or came[0] not in known or came[0] == t.id:
            roots.append(t)
        else:
            below.setdefault(came[0], []).append(t)
    seen: set[str] = set()

    def grow(task: Task, relation: str | None) -> Node:
        seen.add(task.id)
        node = Node(task, relation)
        for child in below.get(task.id, []):
            if child.id not in seen:
                came = origin(child)
                node.below.append(grow(child, came[1] if came else None))
        return node

    nodes = [grow(t, None) for t in roots]
    # What is left sits on a loop: each loop starts a tree of its own at its oldest task.
    for t in ordered:
        if t.id not in seen:
            nodes.append(grow(t, None))
    return nodes


def root_of(tasks: Sequence[Task], task_id: str) -> str:
    """The root of the tree that holds `task_id`."""
    by_id = {t.id: t for t in tasks}
    current, visited = task_id, {task_id}
    while True:
        came = origin(by_id[current])
        if came is None or came[0] not in by_id or came[0] in visited:
            return current
        current = came[0]
        visited.add(current)


def line(node: Node) -> str:
    t = node.task
    text = f"{node.relation + ' ' if node.relation else ''}{t.id}  {state(t)}  {t.title}"
    notes = []
    if t.merged_from:
        notes.append("merges " + ", ".join(t.merged_from))
    waits = [a for a in t.after if a not in t.merged_from]  # a merge waits for what it merges
    if waits:
        notes.append("after " + ", ".join(waits))
    return text + (f"  [{'; '.join(notes)}]" if notes else "")


def render(nodes: Sequence[Node]) -> list[str]:
    """The forest as text lines, drawn with box-drawing characters like tree(1)."""
    out: list[str] = []

    def draw(node: Node, prefix: str, last: bool, top: bool) -> None:
        if top:
            out.append(line(node))
            inner = ""
        else:
            out.append(prefix + ("└── " if last else "├── ") + line(node))
            inner = prefix + ("    " if last else "│   ")
        for i, child in enumerate(node.below):
            draw(child, inner, i == len(node.below) - 1, False)

    for node in nodes:
        draw(node, "", True, True)
    return out
