"""Merge-back of worktree tasks with real git repositories: each strategy, conflicts and their
resolution, a busy user checkout, faults (a deleted base, a deleted worktree, an interrupted
merge, a failing commit), the per-repository lock, the sweep, and the v3 -> v4 store migration;
by hand (fleet-run in the foreground merges as fleet-reap would) and under systemd."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import merge, repolock, sweep
from fleet.config import load
from fleet.paths import resolve
from fleet.store import open_store
from tests import sandbox, test_worktree
from tests.conftest import Fleet, run_in_background, store_at_version
from tests.conftest import fleet_run as run
from tests.sandbox import Sandbox, wait_for
from tests.test_systemd import Fleet as UnitFleet
from tests.test_worktree import git, make_repo, subjects, worktree_of

systemd = sandbox.systemd


# The same repository and git configuration as the worktree tests.
no_system_gitconfig = test_worktree.no_system_gitconfig
repo = test_worktree.repo


@pytest.fixture
def go(tmp_path: Path) -> Path:
    """A file whose absence fails the agents of `started`: their worktree then stays, made from
    main as it was, while other tasks merge."""
    return tmp_path / "go"


def started(fleet: Fleet, repo: Path, go: Path, script: str, *args: str) -> str:
    """A worktree task whose first attempt has run (and failed): its branch starts at main."""
    tid = fleet.add(
        "t", "--coder", "command", "-d", f"{script}; test -e {go}", "--isolation", "worktree",
        *args,
    )  # fmt: skip
    assert run(tid, repo).returncode == 1
    return tid


def finish(fleet: Fleet, repo: Path, go: Path, tid: str) -> dict[str, object]:
    go.touch()
    try:
        result = run(tid, repo)
    finally:
        go.unlink()
    assert result.returncode == 0, result.stderr
    return fleet.show(tid)


def done(fleet: Fleet, repo: Path, script: str, *args: str) -> dict[str, object]:
    tid = fleet.add("t", "--coder", "command", "-d", script, "--isolation", "worktree", *args)
    result = run(tid, repo)
    assert result.returncode == 0, result.stderr
    return fleet.show(tid)


def parents(repo: Path, rev: str) -> int:
    return len(git(repo, "rev-list", "--parents", "-1", rev).split()) - 1


def test_two_tasks_editing_different_files_both_merge(
    fleet: Fleet, repo: Path, go: Path, home: Path
) -> None:
    a = started(fleet, repo, go, "echo a > a.txt")
    b = started(fleet, repo, go, "echo b > b.txt")
    first, second = finish(fleet, repo, go, a), finish(fleet, repo, go, b)
    for task in (first, second):
        assert (task["status"], task["merge_state"], task["ahead"]) == ("done", "merged", 0)
        assert parents(repo, str(task["merged_commit"])) == 2  # merge commits
        assert not worktree_of(home, str(task["id"])).exists()
        assert git(repo, "branch", "--list", f"fleet/{task['id']}") == ""
    assert second["merged_commit"] == git(repo, "rev-parse", "main")
    # main was checked out and clean: the user's checkout is at the new commit, still clean.
    assert (repo / "a.txt").read_text() == "a\n" and (repo / "b.txt").read_text() == "b\n"
    assert git(repo, "status", "--porcelain") == ""
    assert subjects(repo, "main")[0] == f"Merge fleet/{b} into main: t"
    table = fleet.ok("show", a)
    assert "merge state    merged" in table and "(removed)" in table


def test_the_same_lines_conflict_then_merge_once_resolved(
    fleet: Fleet, repo: Path, go: Path, home: Path
) -> None:
    a = started(fleet, repo, go, "echo from a > README")
    b = started(fleet, repo, go, "echo from b > README")
    assert finish(fleet, repo, go, a)["merge_state"] == "merged"
    main_before = git(repo, "rev-parse", "main")
    tip = git(repo, "rev-parse", f"fleet/{b}")
    task = finish(fleet, repo, go, b)
    assert (task["status"], task["merge_state"]) == ("blocked", "conflict")
    assert f"merging fleet/{b} into main conflicts in README" in str(task["reason"])
    # Aborted cleanly: base, branch (with the WIP of attempt 2) and worktree as they were.
    assert git(repo, "rev-parse", "main") == main_before
    tree = worktree_of(home, b)
    assert git(tree, "status", "--porcelain") == ""
    assert git(tree, "symbolic-ref", "HEAD") == f"refs/heads/fleet/{b}"
    assert git(repo, "rev-parse", f"fleet/{b}") == tip
    assert (tree / "README").read_text() == "from b\n"
    assert not (home / "tasks" / b / merge.MARKER).exists()
    # A person resolves it on the branch, then asks again.
    subprocess.run(["git", "-C", str(tree), "merge", "-q", "main"], capture_output=True)
    (tree / "README").write_text("from a and b\n")
    git(tree, "commit", "-qam", "resolve")
    out = fleet.ok("merge", b)
    assert out.startswith(f"{b}: merged, main is at ")
    assert (repo / "README").read_text() == "from a and b\n"
    assert fleet.show(b)["merge_state"] == "merged"
    again = fleet("merge", b)
    assert again.code == 4 and "already merged" in again.err


def test_rebase_gives_a_linear_history(fleet: Fleet, repo: Path, go: Path) -> None:
    # The strategy per task, over the configuration's (merge): on the command line, and as a
    # batch key.
    a = started(fleet, repo, go, "echo a > a.txt", "--merge", "rebase")
    line = {"title": "b", "coder": "command", "description": f"echo b > b.txt; test -e {go}",
            "isolation": "worktree", "merge": "rebase"}  # fmt: skip
    batch = go.with_name("batch.jsonl")
    batch.write_text(json.dumps(line) + "\n")
    (b,) = fleet.ok("add", "--batch", str(batch)).split()
    assert run(b, repo).returncode == 1
    assert fleet.show(a)["merge"] == fleet.show(b)["merge"] == "rebase"
    finish(fleet, repo, go, a)
    task = finish(fleet, repo, go, b)
    assert task["merge_state"] == "merged"
    assert git(repo, "rev-list", "--merges", "main") == ""
    assert subjects(repo, "main") == [
        f"fleet: work in progress of {b}, attempt 1",
        f"fleet: work in progress of {a}, attempt 1",
        "init",
    ]
    assert (repo / "a.txt").exists() and (repo / "b.txt").exists()


@pytest.mark.parametrize(
    ("args", "line", "error"),
    [
        (["--merge", "rebase"], None, "--merge only applies with worktree isolation"),
        (["--merge", "squash", "--isolation", "worktree"], None, "'squash' is not one of"),
        (["--merge", "rebase"], "{}", "--merge do not apply to --batch"),
        ([], '{"title": "t", "merge": "squash", "isolation": "worktree"}',
         "line 1: merge must be one of merge, rebase, ff-only, branch, not 'squash'"),
        ([], '{"title": "t", "merge": "rebase"}',
         "line 1: merge only applies with worktree isolation"),
    ],
)  # fmt: skip
def test_a_merge_strategy_needs_worktree_isolation(
    fleet: Fleet, repo: Path, tmp_path: Path, args: list[str], line: str | None, error: str
) -> None:
    batch = tmp_path / "batch.jsonl"
    if line is not None:
        batch.write_text(line + "\n")
        args = ["--batch", str(batch), *args]
    else:
        args = ["t", *args]
    result = fleet("add", *args)
    assert result.code == 2 and error in result.err, result.err
    assert json.loads(fleet.ok("ls", "--json")) == []


def test_a_rebase_conflict_is_aborted(fleet: Fleet, repo: Path, go: Path, home: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=rebase")
    a = started(fleet, repo, go, "echo from a > README")
    b = started(fleet, repo, go, "echo from b > README")
    finish(fleet, repo, go, a)
    tip = git(repo, "rev-parse", f"fleet/{b}")
    task = finish(fleet, repo, go, b)
    assert task["merge_state"] == "conflict"
    assert f"rebasing fleet/{b} onto main conflicts in README" in str(task["reason"])
    tree = worktree_of(home, b)
    assert not Path(git(tree, "rev-parse", "--absolute-git-dir"), "rebase-merge").exists()
    assert git(tree, "symbolic-ref", "HEAD") == f"refs/heads/fleet/{b}"
    assert git(repo, "merge-base", "--is-ancestor", tip, f"fleet/{b}") == ""


def test_ff_only_refuses_when_base_moved(fleet: Fleet, repo: Path, go: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=ff-only")
    alone = done(fleet, repo, "echo x > x.txt")
    assert alone["merge_state"] == "merged" and parents(repo, "main") == 1  # a fast-forward
    a = started(fleet, repo, go, "echo a > a.txt")
    b = started(fleet, repo, go, "echo b > b.txt")
    finish(fleet, repo, go, a)
    before = git(repo, "rev-parse", "main")
    task = finish(fleet, repo, go, b)
    assert (task["status"], task["merge_state"]) == ("blocked", "failed")
    assert "main has moved on since" in str(task["reason"]) and "ff-only" in str(task["reason"])
    assert git(repo, "rev-parse", "main") == before
    assert fleet.ok("merge", b, "--strategy", "rebase").startswith(f"{b}: merged")
    assert git(repo, "rev-list", "--merges", "main") == ""


def test_branch_leaves_the_branch(fleet: Fleet, repo: Path, home: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=branch", "merge_delete_branch=true")
    task = done(fleet, repo, "echo x > x.txt")
    assert (task["status"], task["merge_state"], task["ahead"]) == ("done", "branch", 1)
    assert f"branch fleet/{task['id']} left for a pull request into main" in str(
        task["merge_reason"]
    )
    assert subjects(repo, "main") == ["init"]
    assert git(repo, "show", f"fleet/{task['id']}:x.txt") == "x"
    assert not worktree_of(home, str(task["id"])).exists()
    # Later, a person merges it after all.
    assert fleet.ok("merge", str(task["id"]), "--strategy", "merge").startswith(str(task["id"]))
    assert (repo / "x.txt").exists()


def test_a_dirty_checkout_postpones_the_merge(fleet: Fleet, repo: Path, home: Path) -> None:
    (repo / "README").write_text("a person's edit\n")
    task = done(fleet, repo, "echo x > x.txt")
    tid = str(task["id"])
    assert (task["status"], task["merge_state"]) == ("merging", "pending")
    assert task["merge_reason"] == f"the checkout at {repo} of main has uncommitted changes"
    assert subjects(repo, "main") == ["init"]
    listed = {t["id"]: t for t in json.loads(fleet.ok("ls", "--json"))}
    assert listed[tid]["status"] == "merging" and listed[tid]["ahead"] == 1
    assert " merging " in fleet.ok("ls")
    assert json.loads(fleet.ok("ls", "--status", "merging", "--json"))[0]["id"] == tid
    assert json.loads(fleet.ok("ready", "--json")) == []  # never claimable
    still = fleet("merge", tid)
    assert still.code == 1 and "still waits to merge: the checkout at" in still.err
    # An untracked file does not count; once the edit is gone, the next pass merges it.
    (repo / "scratch.txt").write_text("mine\n")
    git(repo, "checkout", "--", "README")
    paths = resolve()
    store = open_store(paths)
    try:
        (after,) = merge.retry_pending(paths, store, load(paths))
    finally:
        store.close()
    assert (after.status, after.merge_state) == ("done", "merged")
    assert (repo / "x.txt").read_text() == "x\n" and (repo / "scratch.txt").exists()
    assert git(repo, "status", "--porcelain") == "?? scratch.txt"


def test_a_pass_with_merged_tasks_and_none_waiting_wakes_no_other(fleet: Fleet, repo: Path) -> None:
    # A pass that woke the next one for a task merged long ago would wake passes forever.
    from fleet import wake

    task = done(fleet, repo, "echo x > x.txt")
    assert (task["status"], task["merge_state"]) == ("done", "merged")
    paths = resolve()
    wake.consume(paths)
    store = open_store(paths)
    try:
        assert store.pending_merges() == []
        merge.claim_pass(paths, store, load(paths))
    finally:
        store.close()
    assert not (wake.wake_dir(paths) / "poke").exists()


def test_base_not_checked_out_moves_by_compare_and_swap(fleet: Fleet, repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")  # the user's checkout: a detached HEAD
    (repo / "README").write_text("dirty, but main is not checked out here\n")
    head = git(repo, "rev-parse", "HEAD")
    task = done(fleet, repo, "echo x > x.txt", "--base", "main")
    assert task["merge_state"] == "merged"
    assert git(repo, "rev-parse", "main") == task["merged_commit"]
    assert git(repo, "rev-parse", "HEAD") == head and not (repo / "x.txt").exists()
    assert git(repo, "status", "--porcelain") == "M README"


def test_a_base_deleted_meanwhile_blocks(fleet: Fleet, repo: Path, go: Path) -> None:
    git(repo, "branch", "feature")
    tid = started(fleet, repo, go, "echo x > x.txt", "--base", "feature")
    git(repo, "branch", "-D", "feature")
    task = finish(fleet, repo, go, tid)
    assert (task["status"], task["merge_state"]) == ("blocked", "failed")
    assert "the base branch 'feature' no longer exists" in str(task["reason"])
    assert git(repo, "show", f"fleet/{tid}:x.txt") == "x"


def test_a_worktree_deleted_by_hand_is_recreated_to_merge(
    fleet: Fleet, repo: Path, home: Path
) -> None:
    (repo / "README").write_text("busy\n")
    tid = str(done(fleet, repo, "echo x > x.txt")["id"])
    subprocess.run(["rm", "-rf", str(worktree_of(home, tid))], check=True)
    git(repo, "checkout", "--", "README")
    assert fleet.ok("merge", tid).startswith(f"{tid}: merged")
    assert (repo / "x.txt").read_text() == "x\n"


@pytest.mark.parametrize("interrupted", ["merge", "rebase"])
def test_an_interrupted_merge_is_undone_and_done_again(
    fleet: Fleet, repo: Path, home: Path, interrupted: str
) -> None:
    (repo / "README").write_text("busy\n")
    script = "echo x > x.txt; echo y > y.txt; git add x.txt; git commit -qm x"
    tid = str(done(fleet, repo, script)["id"])
    tree = worktree_of(home, tid)
    tip = git(tree, "rev-parse", "HEAD")
    # As a merge-back killed half-way leaves it: the marker, and git stopped mid-operation.
    (home / "tasks" / tid / merge.MARKER).write_text("killed\n")
    if interrupted == "merge":
        git(tree, "checkout", "-q", "--detach", "main")
        git(tree, "merge", "-q", "--no-ff", "--no-commit", f"fleet/{tid}")
        assert Path(git(tree, "rev-parse", "--absolute-git-dir"), "MERGE_HEAD").exists()
    else:
        stopped = subprocess.run(
            [
                "git",
                "-C",
                str(tree),
                "-c",
                "sequence.editor=:",
                "rebase",
                "-q",
                "-i",
                "--exec",
                "false",
                "HEAD~2",
            ],
            capture_output=True,
        )
        assert stopped.returncode != 0  # stopped by the failing --exec, mid-rebase
        assert Path(git(tree, "rev-parse", "--absolute-git-dir"), "rebase-merge").exists()
    git(repo, "checkout", "--", "README")
    assert fleet.ok("merge", tid).startswith(f"{tid}: merged")
    assert git(repo, "show", "main:x.txt") == "x" and git(repo, "show", "main:y.txt") == "y"
    assert git(repo, "merge-base", "--is-ancestor", tip, "main") == ""
    assert not (home / "tasks" / tid / merge.MARKER).exists()


def test_a_merge_fleet_did_not_start_is_left_alone(fleet: Fleet, repo: Path, home: Path) -> None:
    (repo / "README").write_text("busy\n")
    tid = str(done(fleet, repo, "echo x > x.txt")["id"])
    tree = worktree_of(home, tid)
    git(repo, "checkout", "--", "README")
    git(repo, "commit", "-q", "--allow-empty", "-m", "moved")
    git(tree, "merge", "-q", "--no-ff", "--no-commit", "main")  # a person's, say
    result = fleet("merge", tid)
    assert result.code == 1 and "a merge that fleet did not start is in progress" in result.err
    assert Path(git(tree, "rev-parse", "--absolute-git-dir"), "MERGE_HEAD").exists()
    assert fleet.show(tid)["status"] == "blocked"


def test_merge_refuses_tasks_without_a_branch(fleet: Fleet, repo: Path) -> None:
    plain = fleet.add("x")
    result = fleet("merge", plain)
    assert result.code == 4 and "no branch to merge" in result.err
    fresh = fleet.add("y", "--isolation", "worktree")
    result = fleet("merge", fresh)
    assert result.code == 4 and "has no branch of its own" in result.err


def test_merges_into_one_repository_take_turns(repo: Path, tmp_path: Path) -> None:
    paths = resolve()
    common = repolock.common_dir(repo)
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"))
    assert repolock.common_dir(repo / "sub") == repolock.common_dir(tmp_path / "linked") == common
    with repolock.hold(paths, common) as first:
        assert first
        with repolock.hold(paths, common, wait=False) as second:
            assert not second
        other = repolock.common_dir(make_repo(tmp_path / "other"))
        with repolock.hold(paths, other, wait=False) as third:
            assert third


def test_the_sweep_removes_only_what_is_safe(
    fleet: Fleet, repo: Path, go: Path, home: Path
) -> None:
    # Cancelled with nothing of its own: removed, its branch too.
    empty = started(fleet, repo, go, "true")
    fleet.ok("cancel", empty)
    # Cancelled with a commit main lacks: kept. Another with a loose file: kept.
    ahead = started(fleet, repo, go, "echo a > a.txt")
    fleet.ok("cancel", ahead)
    loose = started(fleet, repo, go, "true")
    (worktree_of(home, loose) / "loose.txt").write_text("not committed\n")
    fleet.ok("cancel", loose)
    # Still blocked or ready: not looked at.
    live = started(fleet, repo, go, "echo l > l.txt")
    # A task the store no longer knows, whose branch is merged: removed.
    orphan = "fl-zzzzzz"
    git(repo, "worktree", "add", "-q", "-b", f"fleet/{orphan}", str(worktree_of(home, orphan)))
    report = fleet("doctor", "--json")
    rows = [r for r in json.loads(report.out) if r["check"] == "worktree"]
    assert {r["detail"].split()[0]: r["ok"] for r in rows} == {
        str(worktree_of(home, t)): False for t in (empty, ahead, loose, orphan)
    }
    fixed = fleet("doctor", "--fix", "--json")
    rows = [r for r in json.loads(fixed.out) if r["check"] == "worktree"]
    outcome = {Path(r["detail"].split()[0]).name: r for r in rows}
    assert outcome[empty]["ok"] and "removed" in outcome[empty]["detail"]
    assert outcome[orphan]["ok"]
    assert "1 commits not in main" in outcome[ahead]["detail"] and not outcome[ahead]["ok"]
    assert "uncommitted changes" in outcome[loose]["detail"]
    assert outcome[loose]["fix"].startswith(f"fleet merge {loose}")
    assert not worktree_of(home, empty).exists() and not worktree_of(home, orphan).exists()
    assert git(repo, "branch", "--list", f"fleet/{empty}") == ""
    for kept in (ahead, loose, live):
        assert worktree_of(home, kept).exists()
    assert (worktree_of(home, loose) / "loose.txt").exists()
    # The pass's sweep is due at once, then not again for a while.
    paths = resolve()
    store = open_store(paths)
    try:
        sweep.when_due(paths, store, load(paths))
        stamp = (home / "worktrees" / sweep.STAMP).stat().st_mtime
        sweep.when_due(paths, store, load(paths))
        assert (home / "worktrees" / sweep.STAMP).stat().st_mtime == stamp
    finally:
        store.close()


def test_a_version_3_store_is_migrated(home: Path, project: Path) -> None:
    db = store_at_version(home, 3)
    now = "2026-01-01T00:00:00Z"
    for n, tid in enumerate(("fl-000001", "fl-000002"), 1):
        db.execute(
            "INSERT INTO tasks (seq, id, title, cwd, created_at, updated_at, isolation, base,"
            " branch) VALUES (?, ?, 'old', ?, ?, ?, 'worktree', 'main', ?)",
            (n * 10, tid, str(project), now, now, f"fleet/{tid}"),
        )
    db.execute("INSERT INTO deps (task, after) VALUES ('fl-000002', 'fl-000001')")
    db.execute(
        "INSERT INTO attempts (task, n, owner, started_at) VALUES ('fl-000001', 1, 'me', ?)",
        (now,),
    )
    db.commit()
    db.close()
    store = open_store(resolve())
    try:
        old = store.get("fl-000002")
        assert (old.branch, old.after, old.merge, old.merge_state, old.ahead) == (
            "fleet/fl-000002", ("fl-000001",), None, None, None,
        )  # fmt: skip
        assert [a.n for a in store.attempts("fl-000001")] == [1]
        from fleet.model import TaskSpec

        (new,) = store.add([TaskSpec("new", str(project), merge="rebase")])
        assert new.merge == "rebase"
    finally:
        store.close()
    db = sqlite3.connect(home / "fleet.db")
    assert db.execute("SELECT seq FROM tasks WHERE id = ?", (new.id,)).fetchone()[0] > 20
    db.execute("UPDATE tasks SET status = 'merging' WHERE id = 'fl-000001'")  # allowed now
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


# ------------------------------------------------------------------------------ under systemd


@pytest.fixture
def units(systemd: Sandbox, tmp_path: Path) -> Iterator[UnitFleet]:
    project = make_repo(tmp_path / "project")
    f = UnitFleet(systemd, tmp_path / "home", project)
    f.setup("default_coder=command", "lease_seconds=10", "isolation=worktree", "max_concurrent=2")
    yield f
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("reset-failed", check=False)


def test_two_tasks_editing_the_same_lines_under_systemd(units: UnitFleet, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # Both agents start from the same main (each waits for the other to start), then both
    # rewrite README: whichever is reaped first merges, the other conflicts.
    script = (
        f'touch {marks}/$FLEET_TASK_ID; for i in $(seq 300); do [ "$(ls {marks} | wc -l)" -ge 2 ]'
        f" && break; sleep 0.1; done; echo $FLEET_TASK_ID > README"
    )
    task_ids = [units.add(script + f" # {i}") for i in range(2)]
    assert units.wait(*task_ids) == 1
    tasks = {t: units.show(t) for t in task_ids}
    (merged,) = [t for t in task_ids if tasks[t]["status"] == "done"]
    (blocked,) = [t for t in task_ids if tasks[t]["status"] == "blocked"]
    assert tasks[merged]["merge_state"] == "merged"
    assert (units.project / "README").read_text() == f"{merged}\n"
    assert tasks[blocked]["merge_state"] == "conflict"
    assert f"merging fleet/{blocked} into main conflicts in README" in tasks[blocked]["reason"]
    assert git(units.project, "show", f"fleet/{blocked}:README") == blocked  # branch intact
    tree = Path(tasks[blocked]["worktree"])
    subprocess.run(["git", "-C", str(tree), "merge", "-q", "main"], capture_output=True)
    (tree / "README").write_text("both\n")
    git(tree, "commit", "-qam", "resolved by a person")
    assert units("merge", blocked).stdout.startswith(f"{blocked}: merged")
    assert (units.project / "README").read_text() == "both\n"
    assert git(units.project, "status", "--porcelain") == ""


def test_a_dispatch_pass_finishes_a_postponed_merge(units: UnitFleet) -> None:
    readme = units.project / "README"
    readme.write_text("a person's edit\n")
    task_id = units.add("echo x > x.txt")
    units.box.wait_for(
        lambda: units.show(task_id)["status"] == "merging", what=f"{task_id} merging"
    )
    git(units.project, "checkout", "--", "README")
    # What the timer (or the next wake-up) does: one pass of fleet-claim.service.
    units.box.systemctl("start", "fleet-claim.service")
    task = units.show(task_id)
    assert (task["status"], task["merge_state"]) == ("done", "merged")
    assert (units.project / "x.txt").read_text() == "x\n"
    assert git(units.project, "status", "--porcelain") == ""


def test_a_slow_merge_back_outlasts_the_watchdog(units: UnitFleet, tmp_path: Path) -> None:
    # fleet-run merges back as it settles its attempt, still the unit's main process: a merge
    # slower than WatchdogSec= (git on a large repository; here a git that sleeps first) must
    # not get the runner killed.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(
        '#!/bin/sh\ncase " $* " in *" merge --no-ff "*) sleep 7;; esac\nexec /usr/bin/git "$@"\n'
    )
    (shim / "git").chmod(0o755)
    units.setup("watchdog_seconds=5")
    dropin = "fleet-task@.service.d/slow-git.conf"
    units.box.write_unit(dropin, f"[Service]\nEnvironment=PATH={shim}:/usr/bin:/bin\n")
    try:
        task_id = units.add("echo x > x.txt")
        assert units.wait(task_id, timeout=60) == 0
    finally:
        (units.box.units / dropin).unlink()
        units.box.systemctl("daemon-reload")
    task = units.show(task_id)
    assert (task["status"], task["merge_state"]) == ("done", "merged")
    assert units.outcomes(task_id) == ["success"]
    assert (units.project / "x.txt").read_text() == "x\n"
    # Merged by the runner itself, not undone by the watchdog and redone by the next pass.
    result = units.box.systemctl("show", "-p", "Result", "--value", f"fleet-task@{task_id}")
    assert result.stdout.strip() == "success"


def test_a_successor_goes_on_from_the_branch_and_merges_into_the_base(
    fleet: Fleet, repo: Path, go: Path
) -> None:
    a = started(fleet, repo, go, "echo a > a.txt", "--merge", "rebase")
    wip = git(repo, "rev-parse", f"fleet/{a}")
    successor = fleet.ok("handoff", a, "--to", "command").strip()
    shown = fleet.show(successor)
    assert (shown["isolation"], shown["base"], shown["merge"]) == ("worktree", "main", "rebase")
    task = finish(fleet, repo, go, successor)
    assert (task["status"], task["merge_state"]) == ("done", "merged")
    # Its branch started at the predecessor's work, and both went back into main.
    assert git(repo, "merge-base", "--is-ancestor", wip, "main") == ""
    assert (repo / "a.txt").read_text() == "a\n"
    assert subjects(repo, "main")[-2:] == [f"fleet: work in progress of {a}, attempt 1", "init"]


def history(tid: str) -> list[tuple[str, str, dict[str, object]]]:
    store = open_store(resolve())
    try:
        return [(e.action, e.by, e.detail) for e in store.history(tid)]
    finally:
        store.close()


def test_a_merge_back_holds_its_task_and_a_killed_one_is_taken_over(
    fleet: Fleet, repo: Path, home: Path, tmp_path: Path
) -> None:
    import os
    import shutil
    import signal
    import time

    from fleet import claim
    from fleet.host import owner
    from tests.conftest import fleet_exe

    (repo / "README").write_text("busy\n")
    tid = str(done(fleet, repo, "echo x > x.txt")["id"])
    git(repo, "checkout", "--", "README")
    # A git whose merge waits (as a slow one on a large repository would) until told to go on.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *" merge --no-ff "*) touch {tmp_path}/entered;'
        f" while [ ! -e {tmp_path}/release ]; do sleep 0.05; done;; esac\n"
        f'exec {shutil.which("git")} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    merging = subprocess.Popen(
        [fleet_exe(), "merge", tid], cwd=repo, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(600):
            if (tmp_path / "entered").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "entered").exists()
        # Mid-merge the worktree is detached at main: no person's change may pull the task.
        assert str(fleet.show(tid)["claimed_by"]).startswith("merge:")
        person = (
            ["retry", tid],
            ["cancel", tid],
            ["block", tid, "-r", "x"],
            ["edit", tid, "--title", "u"],
        )
        for args in person:
            refused = fleet(*args)
            assert refused.code == 4, (args, refused)
            assert "a merge-back is in progress; try again in a moment" in refused.err
        # A dispatch pass leaves it to the merge-back holding the repository.
        paths = resolve()
        store = open_store(paths)
        try:
            assert merge.retry_pending(paths, store, load(paths)) == []
        finally:
            store.close()
    finally:
        os.killpg(merging.pid, signal.SIGKILL)  # the merge-back dies half-way
        merging.wait()
    task = fleet.show(tid)
    assert task["status"] == "merging" and str(task["claimed_by"]).startswith("merge:")
    paths = resolve()
    store = open_store(paths)
    try:
        # fleet-claim's recovery of lost leases does not take a merge claim for one.
        assert claim.recover(store, "user", owner()) == []
        assert store.get(tid).claimed_by == task["claimed_by"]
        # The repository's lock is free: the next pass takes the dead merge-back's claim over.
        (after,) = merge.retry_pending(paths, store, load(paths))
    finally:
        store.close()
    assert (after.status, after.merge_state, after.claimed_by) == ("done", "merged", None)
    assert (repo / "x.txt").read_text() == "x\n"
    assert not (home / "tasks" / tid / merge.MARKER).exists()


def test_merge_takes_only_a_task_its_merge_back_blocked_and_never_a_merged_one(
    fleet: Fleet, repo: Path, go: Path
) -> None:
    tid = started(fleet, repo, go, "echo a > a.txt")
    fleet.ok("block", tid, "-r", "the agent got it wrong")
    refused = fleet("merge", tid)
    assert refused.code == 4 and "not by its merge-back" in refused.err
    assert subjects(repo, "main") == ["init"]
    assert fleet.show(tid)["status"] == "blocked"
    # Merged, its branch deleted: `--strategy` does not make it mergeable again.
    fleet.ok("config", "set", "merge_delete_branch=true")
    merged = done(fleet, repo, "echo x > x.txt")
    again = fleet("merge", str(merged["id"]), "--strategy", "rebase")
    assert again.code == 4 and "already merged" in again.err
    after = fleet.show(str(merged["id"]))
    assert (after["status"], after["merge_state"]) == ("done", "merged")


def test_merge_backs_are_in_the_audit_trail(fleet: Fleet, repo: Path, go: Path) -> None:
    from fleet.audit import person

    (repo / "README").write_text("busy\n")
    tid = str(done(fleet, repo, "echo x > x.txt")["id"])
    paths = resolve()
    store = open_store(paths)
    try:
        merge.retry_pending(paths, store, load(paths))  # waits again, for the same reason
    finally:
        store.close()
    git(repo, "checkout", "--", "README")
    fleet.ok("merge", tid)
    rows = [r for r in history(tid) if r[0].startswith("merge")]
    assert [(a, d.get("state")) for a, _, d in rows] == [
        ("merge-waits", "pending"),
        ("merge-requested", None),
        ("merged-back", "merged"),
    ]
    assert rows[0][2]["reason"] == f"the checkout at {repo} of main has uncommitted changes"
    assert rows[1][1] == person()
    assert rows[2][2]["commit"] == git(repo, "rev-parse", "main")
    # A conflict is a merge-blocked row with its reason.
    a = started(fleet, repo, go, "echo from a > README")
    b = started(fleet, repo, go, "echo from b > README")
    finish(fleet, repo, go, a)
    finish(fleet, repo, go, b)
    (blocked,) = [r for r in history(b) if r[0] == "merge-blocked"]
    assert blocked[2]["state"] == "conflict" and "conflicts in README" in str(blocked[2]["reason"])


def worktree_rows(fleet: Fleet) -> dict[str, dict[str, object]]:
    fixed = fleet("doctor", "--fix", "--json")
    rows = [r for r in json.loads(fixed.out) if r["check"] == "worktree"]
    return {Path(r["detail"].split()[0]).name: r for r in rows}


def test_the_sweep_looks_at_handed_off_tasks(
    fleet: Fleet, repo: Path, go: Path, home: Path
) -> None:
    # Handed off with nothing of its own: kept while its successor may branch from it.
    empty = started(fleet, repo, go, "true")
    successor = fleet.ok("handoff", empty, "--to", "command").strip()
    # Handed off with a commit main lacks, its successor cancelled: kept for that commit.
    ahead = started(fleet, repo, go, "echo a > a.txt")
    fleet.ok("cancel", fleet.ok("handoff", ahead, "--to", "command").strip())
    rows = worktree_rows(fleet)
    assert f"{successor} goes on from its branch" in str(rows[empty]["detail"])
    assert "1 commits not in main" in str(rows[ahead]["detail"])
    assert worktree_of(home, empty).exists() and worktree_of(home, ahead).exists()
    assert git(repo, "branch", "--list", f"fleet/{empty}") != ""
    # Once the successor is settled, the predecessor's empty worktree and branch go.
    fleet.ok("cancel", successor)
    rows = worktree_rows(fleet)
    assert rows[empty]["ok"] and "removed" in str(rows[empty]["detail"])
    assert not worktree_of(home, empty).exists()
    assert git(repo, "branch", "--list", f"fleet/{empty}") == ""
    assert worktree_of(home, ahead).exists()


def test_a_successor_of_a_successor_that_never_ran_starts_from_the_first_branch(
    fleet: Fleet, repo: Path, go: Path
) -> None:
    a = started(fleet, repo, go, "echo a > a.txt")
    b = fleet.ok("handoff", a, "--to", "command").strip()
    c = fleet.ok("handoff", b, "--to", "command").strip()  # before b ever ran
    assert fleet.show(b)["branch"] is None
    task = finish(fleet, repo, go, c)
    assert (task["status"], task["merge_state"]) == ("done", "merged")
    assert (repo / "a.txt").read_text() == "a\n"  # a's work went on in c, and back into main
    assert f"fleet: work in progress of {a}, attempt 1" in subjects(repo, "main")


def test_a_subtask_merges_into_its_parents_branch(fleet: Fleet, repo: Path, go: Path) -> None:
    """The parent's next attempt, told how its subtasks ended, finds their work on its branch
    (checked out in its worktree, clean between attempts)."""
    from fleet import lineage

    parent = started(fleet, repo, go, "echo p > p.txt", "--merge", "rebase")
    child = fleet.add("c", "--coder", "command", "-d", "echo c > c.txt", "--parent", parent)
    shown = fleet.show(child)
    assert (shown["isolation"], shown["base"], shown["merge"]) == (
        "worktree",
        f"fleet/{parent}",
        "rebase",
    )
    result = run(child, repo)
    assert result.returncode == 0, result.stderr
    assert fleet.show(child)["merge_state"] == "merged"
    assert git(repo, "show", f"fleet/{parent}:c.txt") == "c"
    assert (Path(fleet.show(parent)["worktree"]) / "c.txt").read_text() == "c\n"
    assert not (repo / "c.txt").exists()  # main has it once the parent is merged back
    store = open_store(resolve())
    try:
        spawned = lineage.subtask(store.get(parent), "through the MCP server")
    finally:
        store.close()
    assert spawned.base == f"fleet/{parent}"


def test_a_merge_task_is_told_where_each_source_is(fleet: Fleet, repo: Path, go: Path) -> None:
    from fleet import lineage

    one = done(fleet, repo, "echo 1 > one.txt")
    two = started(fleet, repo, go, "echo 2 > two.txt", "--merge", "branch")
    merger = fleet.ok("merge-tasks", str(one["id"]), two, "--title", "both").strip()
    paths = resolve()
    store = open_store(paths)
    try:
        note = lineage.prompt_notes(paths, store, store.get(merger))
    finally:
        store.close()
    commit = str(one["merged_commit"])[:12]
    assert f"{one['id']} 't' (done): its work is already in main (at {commit})" in note
    assert f"{two} 't' (ready): its work is on branch fleet/{two}" in note


def test_a_worktree_is_prepared_under_the_repositorys_lock(
    fleet: Fleet, repo: Path, home: Path, tmp_path: Path
) -> None:
    # A sweep (or a merge-back) holds the lock while it decides on a worktree and removes it:
    # a task retried meanwhile must not start in that worktree before it is done.
    tid = fleet.add("t", "--coder", "command", "-d", "echo x > x.txt", "--isolation", "worktree")
    with contextlib.ExitStack() as lock:
        lock.enter_context(repolock.hold(resolve(), repolock.common_dir(repo)))
        with run_in_background(tid, repo, tmp_path / "out") as runner:

            def waits_for_the_lock() -> bool:
                locks = Path("/proc/locks").read_text().splitlines()
                return any("->" in x and f" {runner.pid} " in x for x in locks)

            wait_for(waits_for_the_lock, what="fleet-run waiting for the repository's lock")
            assert not worktree_of(home, tid).exists()
            lock.close()
            assert runner.wait(timeout=60) == 0
    assert fleet.show(tid)["merge_state"] == "merged"
