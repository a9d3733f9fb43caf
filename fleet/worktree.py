"""Worktree isolation: each task's agent works in a git worktree of its own, on branch fleet/ID.

Invariants:
- the agent's work is never dropped: whatever it leaves uncommitted is committed to its branch
  as a WIP commit when the attempt ends (however it ends), and nothing here ever deletes a
  branch, a commit or a worktree's files;
- the user's own checkout is never touched here: the worktree lives under
  `$FLEET_HOME/worktrees/ID` and only `git worktree add` / `prune` write to the repository's
  administrative files (moving the base branch is fleet.merge's, under its own rules);
- the first attempt creates branch fleet/ID from the current head of the task's base branch;
  later attempts reuse the worktree, or re-create it from the branch if it was deleted by hand;
- every git call goes through fleet.proc.run, and every failure is a FleetError with git's own
  last line, so that a caller can end the attempt with a clear reason.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from fleet.errors import FleetError, InputError
from fleet.paths import ensure_dir
from fleet.proc import run

GIT_TIMEOUT = 120.0  # a `git add -A` of a large tree takes a while
# The files in a git directory that say an operation is under way, and what it is.
IN_PROGRESS = {
    "MERGE_HEAD": "merge",
    "rebase-merge": "rebase",
    "rebase-apply": "rebase",
    "CHERRY_PICK_HEAD": "cherry-pick",
    "REVERT_HEAD": "revert",
}


def branch_of(task_id: str) -> str:
    return f"fleet/{task_id}"


def last_line(stderr: str, default: str) -> str:
    """The last line of a command's standard error (where git says why), or `default`."""
    return (stderr.strip().splitlines() or [default])[-1]


def git(repo: str | Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """git's standard output; FleetError with git's own last line of stderr if it fails.
    `env` adds to the environment (GIT_INDEX_FILE, say)."""
    result = run(["git", "-C", str(repo), *args], check=False, env=env, timeout=GIT_TIMEOUT)
    if result.returncode == 0:
        return result.stdout.strip()
    verb = next(a for a in args if not a.startswith("-") and "=" not in a)
    last = last_line(result.stderr, f"exit status {result.returncode}")
    raise FleetError(f"git {verb} failed: {last}")


def git_ok(repo: str | Path, *args: str) -> bool:
    return run(["git", "-C", str(repo), *args], check=False, timeout=GIT_TIMEOUT).returncode == 0


def head_ref(tree: str | Path) -> str:
    """The full name of the branch checked out in `tree` (refs/heads/…), "" if HEAD is
    detached (or `tree` is no work tree)."""
    head = run(["git", "-C", str(tree), "symbolic-ref", "--quiet", "HEAD"], check=False)
    return head.stdout.strip()


def in_progress(tree: str | Path) -> str | None:
    """The operation (merge, rebase, …) under way in the work tree `tree`, if any."""
    gitdir = Path(git(tree, "rev-parse", "--absolute-git-dir"))
    return next((what for name, what in IN_PROGRESS.items() if (gitdir / name).exists()), None)


def toplevel(cwd: str) -> str | None:
    """The top directory of the git work tree holding `cwd`, or None if it is in none."""
    if not os.path.isdir(cwd):
        return None  # no git to start for that
    result = run(["git", "-C", cwd, "rev-parse", "--show-toplevel"], check=False)
    top = result.stdout.strip()
    return top if result.returncode == 0 and top else None


def has_branch(repo: str | Path, name: str) -> bool:
    return git_ok(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}^{{commit}}")


def check_add(cwd: str, base: str | None) -> str:
    """For `fleet add` with worktree isolation: the base branch (given, or the repository's
    current branch), after checking that `cwd` is in a git work tree; InputError otherwise."""
    top = toplevel(cwd)
    if top is None:
        raise InputError(
            f"{cwd} is not in a git repository, which worktree isolation needs",
            hint="give --isolation none, or --cwd a directory inside a git work tree",
        )
    if base is None:
        result = run(["git", "-C", cwd, "symbolic-ref", "--quiet", "--short", "HEAD"], check=False)
        base = result.stdout.strip()
        if result.returncode != 0 or not base:
            raise InputError(
                f"{top} has a detached HEAD: there is no current branch to start from",
                hint="name the branch the task starts from with --base BRANCH",
            )
    if not git_ok(cwd, "check-ref-format", "--branch", base) or not has_branch(cwd, base):
        raise InputError(
            f"{base!r} is not a local branch of {top}",
            hint=f"`git -C {top} branch` lists them",
        )
    return base


class Place(NamedTuple):
    """Where an attempt of a worktree task runs."""

    repo: str  # the top level of the user's work tree
    worktree: Path
    branch: str
    workdir: Path  # the agent's cwd: the worktree plus the task's path inside the repository
    created: bool  # whether this call created the worktree (first attempt, or re-created)


def ensure(task_id: str, cwd: str, base: str, root: Path, start: str | None = None) -> Place:
    """The task's worktree under `root`, created or re-created as needed (FleetError if not).

    A new branch starts from the head of `base`, or of `start` when that branch exists (a
    handed-off task's successor goes on from its predecessor's branch, and still merges back
    into `base`)."""
    repo = toplevel(cwd)
    if repo is None:
        raise FleetError(f"{cwd} is no longer in a git repository")
    branch = branch_of(task_id)
    path = root / task_id
    inside = os.path.relpath(os.path.realpath(cwd), os.path.realpath(repo))
    created = False
    if not is_worktree(path):
        ensure_dir(root)
        # A worktree deleted by hand is still registered: forget it before adding it again.
        git_ok(repo, "worktree", "prune")
        if path.exists() and any(path.iterdir()):
            raise FleetError(f"{path} exists and is not a git worktree; move it aside")
        if has_branch(repo, branch):
            git(repo, "worktree", "add", str(path), branch)
        elif start is not None and has_branch(repo, start):
            git(repo, "worktree", "add", "-b", branch, str(path), start)
        elif not has_branch(repo, base):
            raise FleetError(f"the base branch {base!r} no longer exists in {repo}")
        else:
            git(repo, "worktree", "add", "-b", branch, str(path), base)
        created = True
    workdir = path if inside == "." else path / inside
    workdir.mkdir(parents=True, exist_ok=True)
    return Place(repo, path, branch, workdir, created)


def is_worktree(path: Path) -> bool:
    """Whether `path` is the top of a git work tree (a deleted or moved one is not)."""
    if not (path / ".git").exists():
        return False
    top = run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], check=False)
    return top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(path)


def commit_leftovers(worktree: Path, message: str) -> str | None:
    """Commit whatever the agent left uncommitted in `worktree`; the new commit's short hash,
    or None if there was nothing to commit. FleetError (nothing lost) if git fails."""
    if not git(worktree, "status", "--porcelain"):
        return None
    git(worktree, "add", "-A")
    # Hooks must not stand between the agent's work and its branch.
    git(worktree, *committer(worktree), "commit", "--no-verify", "--quiet", "-m", message)
    return git(worktree, "rev-parse", "--short", "HEAD")


def identity(repo: str | Path) -> list[str]:
    """git options that give fleet's identity to a commit in `repo` when the repository has
    none of its own (git would refuse to commit); none when it has one."""
    if git_ok(repo, "config", "user.name") and git_ok(repo, "config", "user.email"):
        return []
    return ["-c", "user.name=fleet", "-c", f"user.email=fleet@{socket.gethostname()}"]


def committer(repo: str | Path) -> list[str]:
    """git options for fleet's own commits in `repo`: the repository's identity, or fleet's
    when it has none; never signed (no one is there to unlock a key)."""
    return [*identity(repo), "-c", "commit.gpgsign=false"]


def commits_ahead(repo: str, base: str, branch: str) -> int | None:
    """How many commits `branch` has that `base` has not; None when git cannot tell."""
    try:
        count = git(repo, "rev-list", "--count", f"refs/heads/{base}..refs/heads/{branch}")
        return int(count)
    except (FleetError, ValueError):
        return None
