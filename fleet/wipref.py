"""A snapshot of a work tree as a commit, made without touching the work tree or its index.

Invariant: nothing a person or an agent sees in `git status` changes. The snapshot is staged in
a temporary index file (GIT_INDEX_FILE, seeded from HEAD), so the real index keeps exactly what
was staged and unstaged; `write-tree` and `commit-tree -p HEAD` only add objects, and the commit
is reachable only from the ref the caller names, never from a branch or HEAD. Every git call
goes through fleet.proc.run; a failure is a FleetError with git's own last line.
"""

from __future__ import annotations

import os
import tempfile
from typing import NamedTuple

from fleet.proc import run
from fleet.worktree import git, identity, toplevel


def ref_prefix(task_id: str) -> str:
    """The refs of a task's checkpoints are this plus the checkpoint's number."""
    return f"refs/fleet/{task_id}/checkpoints/"


class Snapshot(NamedTuple):
    repo: str  # the top of the work tree
    commit: str


def snapshot(directory: str, message: str) -> Snapshot | None:
    """A commit of everything in the work tree holding `directory` (tracked changes, staged or
    not, and untracked files that are not ignored), whose parent is HEAD; None outside git."""
    top = toplevel(directory)
    if top is None:
        return None
    head = run(["git", "-C", top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"], check=False)
    parent = head.stdout.strip() if head.returncode == 0 else ""
    with tempfile.TemporaryDirectory(prefix="fleet-checkpoint-") as scratch:
        env = {"GIT_INDEX_FILE": os.path.join(scratch, "index")}
        if parent:
            git(top, "read-tree", parent, env=env)
        git(top, "add", "-A", env=env)
        tree = git(top, "write-tree", env=env)
    parents = ["-p", parent] if parent else []
    commit = git(top, *identity(top), "commit-tree", tree, *parents, "-m", message)
    return Snapshot(top, commit)


def point(repo: str, ref: str, commit: str) -> None:
    """Create `ref` at `commit`; FleetError if it already exists (a checkpoint is never moved)."""
    git(repo, "update-ref", ref, commit, "")
