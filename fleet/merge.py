"""Merge-back: a finished worktree task's branch goes back into its base branch.

Invariants:
- nothing is lost: what the agent left uncommitted is committed to its branch first; a conflict
  aborts the merge or rebase, leaving the branch, the worktree and the base as they were; a
  branch is deleted only once its base contains it, by a compare-and-swap on its tip; a
  worktree is removed only by `git worktree remove`, which refuses one with changes;
- the base branch moves only by a compare-and-swap (`git update-ref BASE NEW OLD`) when no
  worktree has it checked out, or by `git merge --ff-only NEW` in the one checkout that has it
  when that checkout is clean; otherwise the task stays in `merging` with the reason, and every
  dispatch pass (`retry_pending`) and `fleet merge` tries again;
- the merge or rebase itself runs in the task's own worktree, never in a person's checkout, and
  under a marker file in the task's directory: a later try that finds the marker (the previous
  one was killed) aborts what it left and starts again; a merge or rebase in progress that fleet
  did not start is left alone, and blocks the task;
- merge-backs into one repository take turns (fleet.repolock); each holds its task by a merge
  claim (fleet.store.base.MERGE_CLAIM), taken by compare-and-swap once the repository's lock is
  held and released by the one compare-and-set that records how it ended: done (merged, or
  branch left), blocked (conflict or failed, with the reason), or still merging. While the
  claim is there no person's retry, cancel or block can pull the task (or its worktree) out
  from under the merge; the lock is held from before the claim until after the verdict, so a
  merge claim found with the lock free is a killed merge-back's, and is taken over;
- `fleet merge` takes a task in `merging`, one its merge-back blocked (conflict or failed), or
  one done without having been merged; never one blocked for another reason, nor one merged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from fleet import repolock, taskdir, worktree
from fleet.config import Config
from fleet.errors import Conflict, FleetError
from fleet.fsutil import write_atomic
from fleet.host import owner
from fleet.model import MergeMark, Status, Task
from fleet.paths import Paths, ensure_dir
from fleet.proc import run
from fleet.store import Store
from fleet.store.base import MERGE_CLAIM, is_merge_claim
from fleet.worktree import git, git_ok

MARKER = "merge-in-progress"
ROUNDS = 3  # the base may move while a merge is computed: then it is computed again


class Verdict(NamedTuple):
    status: Status
    mark: MergeMark
    reason: str | None = None  # the task's own reason (a block's); None keeps it


class Stop(Exception):
    """Ends a merge-back early with its verdict."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.mark.reason)
        self.verdict = verdict


def waits(why: str, ahead: int | None = None) -> Stop:
    return Stop(Verdict(Status.MERGING, MergeMark("pending", why, ahead=ahead)))


def blocks(state: str, why: str, ahead: int | None = None) -> Stop:
    return Stop(Verdict(Status.BLOCKED, MergeMark(state, why, ahead=ahead), why))


def merge_back(
    paths: Paths, store: Store, config: Config, task_id: str, wait: bool = True
) -> Task | None:
    """Try to merge back a task in `merging`; the task afterwards, or None when `wait` is false
    and another merge into the same repository holds its lock."""
    task = store.get(task_id)
    if task.status != Status.MERGING or (task.claimed_by and not is_merge_claim(task.claimed_by)):
        return task
    me = MERGE_CLAIM + owner()
    try:
        common = repolock.common_dir(task.cwd)
    except (FleetError, OSError):
        # No repository, so no lock and no git to run: the verdict is recorded at once.
        if store.take_merge(task_id, me) is None:
            return store.get(task_id)
        why = f"{task.cwd} is no longer in a git repository; branch {task.branch} cannot go back"
        return store.record_merge(
            task_id, Status.MERGING, Status.BLOCKED, MergeMark("failed", why), why, me
        )
    with repolock.hold(paths, common, wait) as held:
        if not held:
            return None
        # The repository is ours. A merge claim still on the task is a dead merge-back's: a live
        # one holds this lock from before it claims until after it has recorded its verdict.
        stale = store.get(task_id).claimed_by
        taken = store.take_merge(task_id, me)
        if taken is None:
            return store.get(task_id)
        if is_merge_claim(stale):
            sys.stderr.write(f"fleet: {task_id}: took over the merge-back {stale} left\n")
        verdict = decide(paths, config, taken)
        return store.record_merge(
            task_id, Status.MERGING, verdict.status, verdict.mark, verdict.reason, me
        )


def decide(paths: Paths, config: Config, task: Task) -> Verdict:
    """Do the merge-back of `task` (the repository's lock held) and say how it ended."""
    try:
        return Job.of(paths, config, task).run()
    except Stop as stop:
        return stop.verdict
    except (FleetError, OSError) as e:
        why = e.message if isinstance(e, FleetError) else str(e)
        return blocks("failed", f"merge-back failed: {why}").verdict


class Job(NamedTuple):
    task: Task
    repo: str  # the top of the user's work tree holding the task's cwd
    base: str
    branch: str
    strategy: str
    marker: Path
    root: Path  # $FLEET_HOME/worktrees
    delete_branch: bool

    @classmethod
    def of(cls, paths: Paths, config: Config, task: Task) -> Job:
        repo = worktree.toplevel(task.cwd)
        if repo is None:
            raise blocks("failed", f"{task.cwd} is no longer in a git repository")
        return cls(
            task,
            repo,
            task.base or "",
            task.branch or worktree.branch_of(task.id),
            task.merge or config.get_str("merge_strategy"),
            taskdir.task_dir(paths, task.id) / MARKER,
            paths.worktrees,
            config.get_bool("merge_delete_branch"),
        )

    def run(self) -> Verdict:
        task, repo, base, branch = self.task, self.repo, self.base, self.branch
        if not worktree.has_branch(repo, branch):
            raise blocks("failed", f"branch {branch} no longer exists in {repo}: nothing to merge")
        if not worktree.has_branch(repo, base):
            raise blocks(
                "failed",
                f"the base branch {base!r} no longer exists in {repo}; branch {branch} is kept",
            )
        # A worktree deleted by hand is re-created from the branch.
        tree = worktree.ensure(task.id, task.cwd, base, self.root).worktree
        self.recover(tree)
        head = worktree.head_ref(tree)
        if head != f"refs/heads/{branch}":
            where = head or "a detached HEAD"
            raise blocks(
                "failed",
                f"{tree} is on {where}, not on branch {branch}: put the work on {branch},"
                f" then `fleet merge {task.id}`",
            )
        try:
            worktree.commit_leftovers(
                tree, f"fleet: work left uncommitted when {task.id} was merged back"
            )
        except (FleetError, OSError) as e:
            why = e.message if isinstance(e, FleetError) else str(e)
            raise blocks(
                "failed", f"could not commit the work left in {tree}: {why}; nothing was merged"
            ) from None
        ahead = worktree.commits_ahead(repo, base, branch)
        if self.strategy == "branch":
            notes = self.remove_worktree(tree)
            note = f"branch {branch} left for a pull request into {base}" + notes
            return Verdict(Status.DONE, MergeMark("branch", note, ahead=ahead))
        for _ in range(ROUNDS):
            old = git(repo, "rev-parse", f"refs/heads/{base}^{{commit}}")
            tip = git(repo, "rev-parse", f"refs/heads/{branch}^{{commit}}")
            if git_ok(repo, "merge-base", "--is-ancestor", tip, old):
                note = f"nothing to merge: {base} already has every commit of {branch}"
                return Verdict(
                    Status.DONE, MergeMark("merged", note + self.clean_up(tree, tip), old, 0)
                )
            checkout = self.checkout_of_base(ahead)
            new = self.compute(tree, old, tip, ahead)
            if self.move(checkout, old, new):
                # After a rebase the branch is the rebased one: that is what base now holds.
                tip = new if self.strategy != "merge" else tip
                return Verdict(
                    Status.DONE, MergeMark("merged", self.clean_up(tree, tip) or None, new, 0)
                )
        raise waits(f"{base} kept moving while {branch} was merged into it", ahead)

    # -- the task's worktree ----------------------------------------------------------------

    def recover(self, tree: Path) -> None:
        """Undo what a killed merge-back left in `tree`; block on anyone else's operation."""
        if self.marker.exists():
            # Whatever git was doing when it was killed with us: its index lock is stale.
            gitdir = Path(git(tree, "rev-parse", "--absolute-git-dir"))
            (gitdir / "index.lock").unlink(missing_ok=True)
            self.restore(tree)
            sys.stderr.write(f"fleet: {self.task.id}: undid an interrupted merge-back in {tree}\n")
            return
        busy = worktree.in_progress(tree)
        if busy:
            raise blocks(
                "failed",
                f"a {busy} that fleet did not start is in progress in {tree}: finish or abort"
                f" it there, then `fleet merge {self.task.id}`",
            )

    def restore(self, tree: Path) -> None:
        """Back on the task's branch with no operation in progress, the marker gone; only
        for a worktree fleet itself took off its branch (clean before it did)."""
        gitdir = Path(git(tree, "rev-parse", "--absolute-git-dir"))
        if (gitdir / "MERGE_HEAD").exists():
            git(tree, "merge", "--abort")
        if (gitdir / "rebase-merge").exists() or (gitdir / "rebase-apply").exists():
            git(tree, "rebase", "--abort")
        if worktree.head_ref(tree) != f"refs/heads/{self.branch}":
            git(tree, "checkout", "--quiet", "--force", self.branch)
        self.marker.unlink(missing_ok=True)

    def compute(self, tree: Path, old: str, tip: str, ahead: int | None) -> str:
        """The commit the base should move to, made in the task's worktree."""
        task, base, branch = self.task, self.base, self.branch
        if self.strategy == "ff-only":
            if not git_ok(self.repo, "merge-base", "--is-ancestor", old, tip):
                raise blocks(
                    "failed",
                    f"{base} has moved on since {branch} left it, and ff-only does not merge:"
                    f" `fleet merge {task.id} --strategy merge` (or rebase) would",
                    ahead,
                )
            return tip
        ensure_dir(self.marker.parent)
        write_atomic(self.marker, f"{self.strategy} {branch} {tip} onto {base} {old}\n".encode())
        try:
            options = worktree.committer(tree)
            if self.strategy == "merge":
                git(tree, "checkout", "--quiet", "--detach", old)
                message = f"Merge {branch} into {base}: {task.title}\n\nfleet task {task.id}"
                argv = [*options, "merge", "--no-ff", "--no-verify", "--quiet", "-m", message, tip]
                verb = "merging"
            else:
                argv = [
                    *options,
                    "-c",
                    "rebase.autoSquash=false",
                    "-c",
                    "rebase.updateRefs=false",
                    "rebase",
                    "--quiet",
                    "--no-verify",
                    old,
                ]
                verb = "rebasing"
            done = run(["git", "-C", str(tree), *argv], check=False, timeout=worktree.GIT_TIMEOUT)
            if done.returncode != 0:
                conflicted = git(tree, "diff", "--name-only", "--diff-filter=U").splitlines()
                if not conflicted:
                    last = worktree.last_line(done.stderr, "failed")
                    raise FleetError(f"git {argv[len(options)]} failed: {last}")
                into = f"{branch} into {base}" if verb == "merging" else f"{branch} onto {base}"
                raise blocks(
                    "conflict",
                    f"{verb} {into} conflicts in {', '.join(conflicted)}: resolve it on"
                    f" {branch} (in {tree}, e.g. merge {base} into it and commit), then"
                    f" `fleet merge {task.id}`",
                    ahead,
                )
            return git(tree, "rev-parse", "HEAD")
        finally:
            self.restore(tree)

    # -- the base branch ------------------------------------------------------------------

    def checkout_of_base(self, ahead: int | None) -> Path | None:
        """The worktree that has the base branch checked out, if one has; waits (Stop) if it
        has uncommitted changes, or the base is being rebased somewhere."""
        base_ref = f"refs/heads/{self.base}"
        found: Path | None = None
        for entry in git(self.repo, "worktree", "list", "--porcelain").split("\n\n"):
            lines = entry.splitlines()
            if not lines or not lines[0].startswith("worktree "):
                continue
            path = Path(lines[0][len("worktree ") :])
            if "bare" in lines or any(x.startswith("prunable") for x in lines):
                continue
            if f"branch {base_ref}" in lines:
                found = path
            elif "detached" in lines and rebasing(path) == base_ref:
                raise waits(f"{self.base} is being rebased in the checkout at {path}", ahead)
        if found is not None:
            dirty = git(found, "status", "--porcelain", "--untracked-files=no")
            if dirty:
                raise waits(
                    f"the checkout at {found} of {self.base} has uncommitted changes", ahead
                )
        return found

    def move(self, checkout: Path | None, old: str, new: str) -> bool:
        """Move the base from `old` to `new`; False if it moved meanwhile (try again)."""
        ref = f"refs/heads/{self.base}"
        if checkout is None:
            message = f"fleet: merge {self.branch} ({self.task.id})"
            return git_ok(self.repo, "update-ref", "-m", message, ref, new, old)
        if git(checkout, "rev-parse", "HEAD") != old:
            return False
        done = run(
            ["git", "-C", str(checkout), "merge", "--ff-only", "--quiet", new],
            check=False,
            timeout=worktree.GIT_TIMEOUT,
        )
        if done.returncode == 0:
            return True
        if git(checkout, "rev-parse", "HEAD") != old:
            return False
        last = worktree.last_line(done.stderr, "failed")
        raise waits(f"the checkout at {checkout} of {self.base} cannot fast-forward: {last}")

    # -- clean-up ---------------------------------------------------------------------------

    def remove_worktree(self, tree: Path) -> str:
        """`git worktree remove` (which refuses a worktree with changes); a note if it did."""
        done = run(
            ["git", "-C", self.repo, "worktree", "remove", str(tree)],
            check=False,
            timeout=worktree.GIT_TIMEOUT,
        )
        if done.returncode == 0:
            return ""
        return f"; worktree {tree} kept: {worktree.last_line(done.stderr, 'failed')}"

    def clean_up(self, tree: Path, tip: str) -> str:
        """Remove the worktree and (as configured) the branch, now that base holds `tip`."""
        note = self.remove_worktree(tree)
        if note or not self.delete_branch:
            return note  # a branch still checked out in a worktree must stay
        ref = f"refs/heads/{self.branch}"
        if git_ok(
            self.repo, "merge-base", "--is-ancestor", tip, f"refs/heads/{self.base}"
        ) and git_ok(self.repo, "update-ref", "-d", ref, tip):
            return ""
        return f"; branch {self.branch} kept: it has commits {self.base} has not"


def rebasing(path: Path) -> str | None:
    """The branch a rebase in progress in the checkout at `path` is rewriting, if any."""
    found = run(["git", "-C", str(path), "rev-parse", "--absolute-git-dir"], check=False)
    if found.returncode != 0:
        return None
    gitdir = Path(found.stdout.strip())
    for name in ("rebase-merge", "rebase-apply"):
        try:
            return (gitdir / name / "head-name").read_text().strip()
        except OSError:
            continue
    return None


# -- who asks for a merge-back ----------------------------------------------------------------


def request(paths: Paths, store: Store, config: Config, task_id: str, strategy: str | None) -> Task:
    """A person's `fleet merge`: merge back now a task that waits, was blocked, or is done
    without having been merged (with `strategy` from now on, if given)."""
    task = store.get(task_id)
    if not task.isolated:
        raise Conflict(
            f"{task_id} works without worktree isolation: it has no branch to merge",
            hint="only tasks added with --isolation worktree are merged back",
        )
    if task.merge_state == "merged":
        # Whatever the strategy: the branch may be gone, and there is nothing left to merge.
        raise Conflict(
            f"{task_id} is already merged into {task.base}",
            hint=f"`fleet retry {task_id}` runs it again, to be merged back anew",
        )
    if task.status == Status.BLOCKED and task.merge_state not in ("conflict", "failed"):
        # Blocked by the retry limit, its agent or a person: its branch is not work to ship.
        raise Conflict(
            f"cannot merge {task_id}: it is blocked ({task.reason}), not by its merge-back",
            hint=f"deal with the reason, then `fleet retry {task_id}`; it merges back once done",
        )
    store.request_merge(task_id, (Status.MERGING, Status.BLOCKED, Status.DONE), strategy)
    after = merge_back(paths, store, config, task_id)
    assert after is not None  # it waited for the lock
    return after


def retry_pending(paths: Paths, store: Store, config: Config) -> list[Task]:
    """For each dispatch pass: try again every task that waits in `merging` (skipping those
    whose repository another merge holds); the tasks that left `merging`. Costs one indexed
    query when none waits. Never raises: a failure is written to standard error."""
    settled: list[Task] = []
    for task in store.pending_merges():
        try:
            after = merge_back(paths, store, config, task.id, wait=False)
        except FleetError as e:
            sys.stderr.write(f"fleet: merge-back of {task.id}: {e.message}\n")
            continue
        if after is None or after.status == Status.MERGING:
            continue
        settled.append(after)
        if after.status == Status.BLOCKED:
            from fleet import alerts

            message = f"{after.id} ({after.title}) is blocked: {after.reason}"
            alerts.fire(paths, config, "blocked", message, task=after, outcome="merge")
    return settled


def claim_pass(paths: Paths, store: Store, config: Config) -> None:
    """What fleet-claim does for merge-back on every pass: retry the merges that wait, wake
    the next pass if one finished (its dependents are ready now), and now and then sweep the
    worktrees left behind. Cheap when there is nothing to do; never raises."""
    from fleet import sweep, wake

    try:
        if any(t.status == Status.DONE for t in retry_pending(paths, store, config)):
            wake.poke(paths)
        sweep.when_due(paths, store, config)
    except (FleetError, OSError) as e:
        why = e.message if isinstance(e, FleetError) else str(e)
        sys.stderr.write(f"fleet: merge-back pass: {why}\n")
