"""A snapshot of a work tree as a commit, made without touching the work tree or its index.

Invariant: nothing a person or an agent sees in `git status` changes. The snapshot is staged in
a temporary index file (GIT_INDEX_FILE, seeded from HEAD), so the real index keeps exactly what
was staged and unstaged; `write-tree` and `commit-tree -p HEAD` only add objects, and the commit
is reachable only from the ref the caller names, never from a branch or HEAD. Every git call
goes through fleet.proc.run; a failure is a FleetError with git's own last line.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import NamedTuple

from fleet.errors import FleetError
from fleet.proc import run

GIT_TIMEOUT = 120.0  # `git add -A` of a large tree takes a while


def ref_prefix(task_id: str) -> str:
    """The refs of a task's checkpoints are this plus the checkpoint's number."""
    return f"refs/fleet/{task_id}/checkpoints/"


def _git(repo: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = run(["git", "-C", repo, *args], check=False, env=env, timeout=GIT_TIMEOUT)
    if result.returncode == 0:
        return result.stdout.strip()
    verb = next(a for a in args if not a.startswith("-") and "=" not in a)
    last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
    raise FleetError(f"git {verb} failed: {last}")


class Snapshot(NamedTuple):
    repo: str  # the top of the work tree
    commit: str


def toplevel(directory: str) -> str | None:
    """The top of the git work tree holding `directory`; None if there is none."""
    if not os.path.isdir(directory):
        return None
    result = run(["git", "-C", directory, "rev-parse", "--show-toplevel"], check=False)
    top = result.stdout.strip()
    return top if result.returncode == 0 and top else None


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
            _git(top, "read-tree", parent, env=env)
        _git(top, "add", "-A", env=env)
        tree = _git(top, "write-tree", env=env)
    ident: list[str] = []
    has_name = run(["git", "-C", top, "config", "user.name"], check=False).returncode == 0
    has_mail = run(["git", "-C", top, "config", "user.email"], check=False).returncode == 0
    if not (has_name and has_mail):
        ident = ["-c", "user.name=fleet", "-c", f"user.email=fleet@{socket.gethostname()}"]
    parents = ["-p", parent] if parent else []
    commit = _git(top, *ident, "commit-tree", tree, *parents, "-m", message)
    return Snapshot(top, commit)


def point(repo: str, ref: str, commit: str) -> None:
    """Create `ref` at `commit`; FleetError if it already exists (a checkpoint is never moved)."""
    _git(repo, "update-ref", ref, commit, "")
