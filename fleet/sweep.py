"""The sweep: worktrees under `$FLEET_HOME/worktrees` that no task needs any more are removed.

Invariants:
- only a worktree whose task no longer exists, or is done, cancelled or handed off, is looked
  at; and not while a task still under way goes on from it (a handoff's successor, which
  branches from its predecessor's branch, or a merge task consolidating it): its worktree and
  branch stay until that task is settled too;
- it is removed only if nothing would be lost: no uncommitted change (untracked files count),
  no operation in progress, and no commit that its task's base lacks (for a task that left its
  branch for a pull request, that the branch lacks; for an unknown task or a deleted base, that
  every other local branch lacks); the others are reported and never touched;
- removal is `git worktree remove` (which refuses a worktree with changes) under the
  repository's lock; the task's branch goes with it, as merge_delete_branch says, only when the
  base has all of it;
- on a dispatch pass it runs at most every SWEEP_INTERVAL seconds, as the stamp file's mtime
  says, so a pass costs one stat.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NamedTuple

from fleet import ids, repolock, worktree
from fleet.config import Config
from fleet.errors import FleetError, NotFound
from fleet.fsutil import touch
from fleet.model import Status, Task
from fleet.paths import Paths
from fleet.proc import run
from fleet.store import Store, TaskFilter
from fleet.worktree import git, git_ok

SWEEP_INTERVAL = 600.0
STAMP = ".swept"
# The statuses whose worktree nothing runs in, or ever will unless a person retries the task.
SETTLED = (Status.DONE, Status.CANCELLED, Status.HANDED_OFF)


class Leftover(NamedTuple):
    path: Path
    task_id: str
    task_state: str  # "gone", "done", "cancelled" or "handed-off"
    action: str  # "removed", "removable" or "kept"
    detail: str


def sweep(paths: Paths, store: Store, config: Config, fix: bool) -> list[Leftover]:
    """Every worktree of a gone, done, cancelled or handed-off task, removed if `fix` and safe."""
    found: list[Leftover] = []
    users = _users(store)
    for path, task in _candidates(paths, store):
        state = "gone" if task is None else str(task.status)
        try:
            safe, detail = _in_use(path.name, users) or inspect(path, task)
        except FleetError as e:
            safe, detail = False, e.message
        if not safe:
            found.append(Leftover(path, path.name, state, "kept", detail))
        elif not fix:
            found.append(Leftover(path, path.name, state, "removable", detail))
        else:
            found.append(_remove(paths, store, config, path, task, state))
    return found


def when_due(paths: Paths, store: Store, config: Config) -> None:
    """The sweep of a dispatch pass: at most every SWEEP_INTERVAL seconds."""
    stamp = paths.worktrees / STAMP
    try:
        if time.time() - stamp.stat().st_mtime < SWEEP_INTERVAL:
            return
    except FileNotFoundError:
        if not paths.worktrees.is_dir():
            return
    touch(stamp)
    for item in sweep(paths, store, config, fix=True):
        if item.action == "removed":
            sys.stderr.write(f"fleet: swept {item.path} ({item.task_state} task): {item.detail}\n")


def _candidates(paths: Paths, store: Store) -> list[tuple[Path, Task | None]]:
    try:
        entries = sorted(paths.worktrees.iterdir())
    except FileNotFoundError:
        return []
    found: list[tuple[Path, Task | None]] = []
    for path in entries:
        if not ids.is_full(path.name) or not path.is_dir():
            continue
        try:
            task: Task | None = store.get(path.name)
        except NotFound:
            task = None
        if task is None or task.status in SETTLED:
            found.append((path, task))
    return found


def _users(store: Store) -> dict[str, str]:
    """For each task whose work a task still under way goes on from, that task's id."""
    users: dict[str, str] = {}
    for task in store.tasks(TaskFilter()):
        for source in (task.predecessor, *task.merged_from):
            if source is not None:
                users.setdefault(source, task.id)
    return users


def _in_use(task_id: str, users: dict[str, str]) -> tuple[bool, str] | None:
    """(False, why) if a task under way may still branch from `task_id`'s branch."""
    if task_id not in users:
        return None
    return False, f"{users[task_id]} goes on from its branch: kept until that task is settled"


def inspect(path: Path, task: Task | None) -> tuple[bool, str]:
    """(whether removing the worktree at `path` loses nothing, why)."""
    if not worktree.is_worktree(path):
        return False, "not a git worktree (moved or broken?): left for a person"
    changed = git(path, "status", "--porcelain").splitlines()
    if changed:
        return False, f"uncommitted changes in {len(changed)} paths"
    busy = worktree.in_progress(path)
    if busy:
        return False, f"a {busy} is in progress"
    own = worktree.head_ref(path)
    if task is not None and task.base and worktree.has_branch(path, task.base):
        against = [f"refs/heads/{task.base}"]
        where = task.base
        if task.merge_state == "branch" and own:
            against.append(own)  # the branch itself is kept for its pull request
            where = f"{task.base} or {own.removeprefix('refs/heads/')}"
    else:
        against = [*([f"--exclude={own}"] if own else []), "--branches"]
        where = "any other branch"
    count = int(git(path, "rev-list", "--count", "HEAD", "--not", *against))
    if count:
        return False, f"{count} commits not in {where}"
    return True, f"nothing in it that {where} lacks"


def _remove(
    paths: Paths, store: Store, config: Config, path: Path, task: Task | None, state: str
) -> Leftover:
    def kept(detail: str) -> Leftover:
        return Leftover(path, path.name, state, "kept", detail)

    common = repolock.common_dir(path)
    with repolock.hold(paths, common, wait=False) as held:
        if not held:
            return kept("its repository is being merged into: next time")
        # Looked at again with the repository ours: a retry may have revived the task.
        try:
            now: Task | None = store.get(path.name)
        except NotFound:
            now = None
        if now is not None and now.status not in SETTLED:
            return kept(f"its task is {now.status} again")
        safe, detail = _in_use(path.name, _users(store)) or inspect(path, now)
        if not safe:
            return kept(detail)
        tip = git(path, "rev-parse", "HEAD")
        done = run(
            ["git", "-C", common, "worktree", "remove", str(path)],
            check=False,
            timeout=worktree.GIT_TIMEOUT,
        )
        if done.returncode != 0:
            return kept(worktree.last_line(done.stderr, "git worktree remove failed"))
        if (
            now is not None
            and now.branch
            and now.base
            and now.merge_state != "branch"
            and config.get_bool("merge_delete_branch")
            and git_ok(common, "merge-base", "--is-ancestor", tip, f"refs/heads/{now.base}")
            and git_ok(common, "update-ref", "-d", f"refs/heads/{now.branch}", tip)
        ):
            detail += f"; branch {now.branch} deleted"
        return Leftover(path, path.name, state, "removed", detail)
