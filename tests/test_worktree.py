"""Worktree isolation with real git repositories: checks at `fleet add`, the worktree and branch
of each task, WIP commits of what an agent leaves uncommitted, and reporting; by hand and under
systemd."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import sandbox
from tests.conftest import Fleet, run_fleet, store_at_version
from tests.conftest import fleet_run as run
from tests.sandbox import Sandbox
from tests.test_systemd import Fleet as UnitFleet

systemd = sandbox.systemd


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def make_repo(path: Path, identity: bool = True) -> Path:
    path.mkdir(exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    if identity:
        git(path, "config", "user.name", "Tester")
        git(path, "config", "user.email", "tester@example.com")
    (path / "sub").mkdir()
    (path / "sub" / "keep.txt").write_text("kept\n")
    (path / "README").write_text("hello\n")
    git(path, "add", "-A")
    ident = ["-c", "user.name=Tester", "-c", "user.email=tester@example.com"]
    git(path, *ident, "commit", "-q", "-m", "init")
    return path


@pytest.fixture(autouse=True)
def no_system_gitconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test's HOME is empty; without /etc/gitconfig either, only the repository's own
    # configuration gives git an identity.
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture
def repo(project: Path) -> Path:
    return make_repo(project)


def subjects(repo: Path, rev: str) -> list[str]:
    return git(repo, "log", "--format=%s", rev).splitlines()


def worktree_of(home: Path, task_id: str) -> Path:
    return home / "worktrees" / task_id


# ------------------------------------------------------------------------------ fleet add


def test_worktree_isolation_needs_a_git_repository(fleet: Fleet, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    result = fleet("add", "x", "--cwd", str(plain), "--isolation", "worktree")
    assert result.code == 2
    error, hint = result.err.splitlines()
    assert (
        error == f"fleet: error: {plain} is not in a git repository, which worktree isolation needs"
    )
    assert hint.startswith("fleet: hint: give --isolation none")
    fleet.ok("config", "set", "isolation=worktree")  # the default applies the same check
    assert fleet("add", "x", "--cwd", str(plain)).code == 2
    assert fleet.show(fleet.add("x", "--cwd", str(plain), "--isolation", "none"))["isolation"] == (
        "none"
    )
    assert len(json.loads(fleet.ok("ls", "--json"))) == 1  # the refused ones were not added


def test_a_detached_head_needs_base(fleet: Fleet, repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    result = fleet("add", "x", "--isolation", "worktree")
    assert result.code == 2
    error, hint = result.err.splitlines()
    assert "has a detached HEAD" in error and "--base BRANCH" in hint
    task = fleet.show(fleet.add("x", "--isolation", "worktree", "--base", "main"))
    assert (task["isolation"], task["base"], task["branch"]) == ("worktree", "main", None)


def test_base_must_be_a_local_branch(fleet: Fleet, repo: Path) -> None:
    result = fleet("add", "x", "--isolation", "worktree", "--base", "nope")
    assert result.code == 2 and "'nope' is not a local branch" in result.err
    result = fleet("add", "x", "--base", "main")
    assert result.code == 2 and "only applies with worktree isolation" in result.err
    batch = repo / "batch.jsonl"
    batch.write_text(
        json.dumps({"title": "a", "isolation": "worktree"})
        + "\n"
        + json.dumps({"title": "b", "isolation": "worktree", "base": "gone"})
        + "\n"
    )
    result = fleet("add", "--batch", str(batch))
    assert result.code == 2 and result.err.startswith(f"fleet: error: {batch} line 2: 'gone'")
    assert json.loads(fleet.ok("ls", "--json")) == []


def test_the_configured_default_applies_and_is_fixed_at_add(fleet: Fleet, repo: Path) -> None:
    fleet.ok("config", "set", "isolation=worktree")
    task = fleet.show(fleet.add("x"))
    assert (task["isolation"], task["base"]) == ("worktree", "main")
    fleet.ok("config", "set", "isolation=none")
    assert fleet.show(task["id"])["isolation"] == "worktree"
    bad = fleet("--set", "isolation=sometimes", "add", "y")
    assert bad.code == 5 and "isolation must be one of none, worktree" in bad.err


def test_a_version_2_store_is_migrated(home: Path, project: Path) -> None:
    db = store_at_version(home, 2)
    db.execute(
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
        ("fl-000001", "old task", str(project), "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    )
    db.commit()
    db.close()
    shown = run_fleet("show", "fl-000001", "--json")
    assert shown.code == 0, shown.err
    obj = json.loads(shown.out)
    assert [obj[k] for k in ("isolation", "base", "branch", "worktree")] == [None] * 4
    assert re.search(r"^isolation +none$", run_fleet("show", "fl-000001").out, re.M)


# ------------------------------------------------------------------------ fleet-run by hand


def test_the_agent_works_in_its_own_worktree(fleet: Fleet, repo: Path, home: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=branch")  # keep the branch, leave main alone
    tid = fleet.add("x", "--coder", "command", "-d", "echo hi > new.txt", "--isolation", "worktree")
    result = run(tid, repo)
    assert result.returncode == 0, result.stderr
    tree = worktree_of(home, tid)
    assert git(repo, "status", "--porcelain") == "" and not (repo / "new.txt").exists()
    assert git(repo, "branch", "--show-current") == "main"
    assert git(repo, "show", f"fleet/{tid}:new.txt") == "hi"
    assert not tree.exists()  # the branch holds it all: the worktree was removed
    assert subjects(repo, f"fleet/{tid}") == [
        f"fleet: work in progress of {tid}, attempt 1",
        "init",
    ]
    assert git(repo, "show", "--name-only", "--format=", f"fleet/{tid}") == "new.txt"
    assert git(repo, "log", "-1", "--format=%ae", f"fleet/{tid}") == "tester@example.com"
    task = fleet.show(tid)
    assert task["status"] == "done"
    want = {
        "isolation": "worktree",
        "base": "main",
        "branch": f"fleet/{tid}",
        "worktree": str(tree),
    }
    assert {k: task[k] for k in want} == want
    (listed,) = json.loads(fleet.ok("ls", "--all", "--json"))
    assert {k: listed[k] for k in want} == want
    assert (task["merge_state"], task["ahead"]) == ("branch", 1)
    table = fleet.ok("show", tid)
    assert f"branch         fleet/{tid}" in table and "commits ahead  1 (of main)" in table
    assert f"worktree       {tree} (removed)" in table
    prompt = (home / "tasks" / tid / "prompt.md").read_text()
    assert f"in {tree}." in prompt and f"on branch fleet/{tid} (from main)" in prompt
    assert "Commit your work" in prompt


def test_a_prompt_template_of_ones_own_gets_the_branch(
    fleet: Fleet, repo: Path, home: Path
) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "prompt.md").write_text("Do $title in $cwd.\n")
    plain = fleet.add("plain", "--coder", "command", "-d", "true")
    tid = fleet.add("isolated", "--coder", "command", "-d", "true", "--isolation", "worktree")
    assert run(plain, repo).returncode == 0 and run(tid, repo).returncode == 0
    assert (home / "tasks" / plain / "prompt.md").read_text() == f"Do plain in {repo}.\n"
    prompt = (home / "tasks" / tid / "prompt.md").read_text()
    assert prompt.startswith(f"Do isolated in {worktree_of(home, tid)}.\n\n")
    assert f"on branch fleet/{tid} (from main)" in prompt


def test_a_subdirectory_cwd_maps_into_the_worktree(fleet: Fleet, repo: Path, home: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=branch")
    tid = fleet.add(
        "x", "--cwd", str(repo / "sub"), "--coder", "command", "-d", "pwd > where.txt",
        "--isolation", "worktree",
    )  # fmt: skip
    assert run(tid, repo).returncode == 0
    sub = worktree_of(home, tid) / "sub"
    assert git(repo, "show", f"fleet/{tid}:sub/where.txt") == str(sub)


def test_later_attempts_reuse_the_worktree(fleet: Fleet, repo: Path, home: Path) -> None:
    script = "echo x >> log.txt; echo $PWD; exit 1"  # failed attempts: nothing is merged
    tid = fleet.add("x", "--coder", "command", "-d", script, "--isolation", "worktree")
    first = run(tid, repo)
    assert first.returncode == 1 and "created, on branch" in first.stderr
    tree = worktree_of(home, tid)
    (tree / "untracked-marker").write_text("left by a person\n")  # survives only a reuse
    fleet.ok("retry", tid)
    second = run(tid, repo)
    assert second.returncode == 1 and "reused, on branch" in second.stderr
    # The person's file was committed before attempt 2 began, then attempt 2's work after it.
    assert subjects(repo, f"fleet/{tid}") == [
        f"fleet: work in progress of {tid}, attempt 2",
        f"fleet: work left uncommitted before attempt 2 of {tid}",
        f"fleet: work in progress of {tid}, attempt 1",
        "init",
    ]
    assert (tree / "log.txt").read_text() == "x\nx\n"
    assert "commits ahead  3 (of main)" in fleet.ok("show", tid)


def test_a_task_with_a_branch_keeps_its_repository(
    fleet: Fleet, repo: Path, tmp_path: Path
) -> None:
    tid = fleet.add("x", "--coder", "command", "-d", "true", "--isolation", "worktree")
    other = make_repo(tmp_path / "other")
    fleet.ok("edit", tid, "--cwd", str(other))  # no branch yet: it may still move
    assert run(tid, other).returncode == 0
    fleet.ok("retry", tid)
    moved = fleet("edit", tid, "--cwd", str(repo))
    assert moved.code == 4 and f"works on branch fleet/{tid}" in moved.err
    assert fleet.show(tid)["cwd"] == str(other)


def test_a_worktree_deleted_by_hand_is_recreated(fleet: Fleet, repo: Path, home: Path) -> None:
    script = "echo x >> log.txt; exit 1"  # a failed attempt: its worktree stays
    tid = fleet.add("x", "--coder", "command", "-d", script, "--isolation", "worktree")
    assert run(tid, repo).returncode == 1
    tree = worktree_of(home, tid)
    shutil.rmtree(tree)
    assert "commits ahead  1 (of main)" in fleet.ok("show", tid)  # asked of the repository
    fleet.ok("retry", tid)
    again = run(tid, repo)
    assert again.returncode == 1, again.stderr
    assert "created, on branch" in again.stderr
    assert (tree / "log.txt").read_text() == "x\nx\n"  # attempt 1's commit is kept
    assert subjects(repo, f"fleet/{tid}")[:2] == [
        f"fleet: work in progress of {tid}, attempt 2",
        f"fleet: work in progress of {tid}, attempt 1",
    ]
    assert git(repo, "worktree", "list").count(str(tree)) == 1


def test_an_agent_that_commits_leaves_no_wip_commit(fleet: Fleet, repo: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=branch")
    script = "echo hi > new.txt && git add new.txt && git commit -q -m 'agent work'"
    tid = fleet.add("x", "--coder", "command", "-d", script, "--isolation", "worktree")
    result = run(tid, repo)
    assert result.returncode == 0, result.stderr
    assert subjects(repo, f"fleet/{tid}") == ["agent work", "init"]
    assert "committed the uncommitted work" not in result.stderr


def test_without_an_identity_fleet_commits_as_itself(fleet: Fleet, tmp_path: Path) -> None:
    fleet.ok("config", "set", "merge_strategy=branch")
    repo = make_repo(tmp_path / "anonymous", identity=False)
    tid = fleet.add(
        "x", "--cwd", str(repo), "--coder", "command", "-d", "echo hi > new.txt",
        "--isolation", "worktree",
    )  # fmt: skip
    assert run(tid, repo).returncode == 0
    who = git(repo, "log", "-1", "--format=%an <%ae>", f"fleet/{tid}")
    assert who == f"fleet <fleet@{socket.gethostname()}>"


def test_a_failing_commit_loses_nothing(fleet: Fleet, repo: Path, home: Path) -> None:
    # The agent holds the index lock, as a crashed git would: the WIP commit cannot be made.
    script = 'echo hi > new.txt; touch "$(git rev-parse --git-dir)/index.lock"'
    tid = fleet.add("x", "--coder", "command", "-d", script, "--isolation", "worktree")
    result = run(tid, repo)
    assert result.returncode == 0, result.stderr
    errors = [json.loads(line) for line in result.stdout.splitlines()]
    assert any(
        e["event"] == "error" and "could not commit the work left in" in e["text"] for e in errors
    )
    # Nor can the merge-back's: the task is blocked, saying why, and nothing is lost.
    task = fleet.show(tid)
    assert (task["status"], task["merge_state"]) == ("blocked", "failed")
    assert "could not commit the work left in" in task["reason"]
    assert (worktree_of(home, tid) / "new.txt").read_text() == "hi\n"
    assert subjects(repo, f"fleet/{tid}") == ["init"]
    assert subjects(repo, "main") == ["init"]


def test_a_deleted_base_branch_ends_the_attempt_as_an_error(fleet: Fleet, repo: Path) -> None:
    git(repo, "branch", "feature")
    tid = fleet.add(
        "x", "--coder", "command", "-d", "true", "--isolation", "worktree", "--base", "feature"
    )
    git(repo, "branch", "-D", "feature")
    result = run(tid, repo)
    assert result.returncode != 0
    task = fleet.show(tid)
    assert [a["outcome"] for a in task["attempt_log"]] == ["failure"]
    assert "the base branch 'feature' no longer exists" in task["reason"]
    assert task["branch"] is None and task["status"] == "ready"  # retried by the policy


# ------------------------------------------------------------------------------ under systemd


@pytest.fixture
def units(systemd: Sandbox, tmp_path: Path) -> Iterator[UnitFleet]:
    project = make_repo(tmp_path / "project")
    f = UnitFleet(systemd, tmp_path / "home", project)
    f.setup("default_coder=command", "lease_seconds=10", "isolation=worktree")
    yield f
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("reset-failed", check=False)


def test_a_worktree_task_runs_to_done_under_systemd(units: UnitFleet) -> None:
    task_id = units.add("echo from the unit > work.txt")
    assert units.wait(task_id) == 0
    task = units.show(task_id)
    assert task["status"] == "done" and task["branch"] == f"fleet/{task_id}"
    assert Path(task["worktree"]) == units.home / "worktrees" / task_id
    # Merged back: main (checked out and clean) fast-forwarded, worktree and branch gone.
    assert task["merge_state"] == "merged"
    assert task["merged_commit"] == git(units.project, "rev-parse", "main")
    assert (units.project / "work.txt").read_text() == "from the unit\n"
    assert git(units.project, "status", "--porcelain") == ""
    assert not Path(task["worktree"]).exists()
    assert git(units.project, "branch", "--list", f"fleet/{task_id}") == ""


def test_two_tasks_in_one_repository_run_at_once(units: UnitFleet, tmp_path: Path) -> None:
    units.setup("max_concurrent=2")
    marks = tmp_path / "marks"
    marks.mkdir()
    # Each agent waits (up to 30 s) until both have started, so both succeed only together.
    script = (
        f'touch {marks}/$FLEET_TASK_ID; for i in $(seq 300); do [ "$(ls {marks} | wc -l)" -ge 2 ]'
        f' && break; sleep 0.1; done; [ "$(ls {marks} | wc -l)" -ge 2 ] || exit 1;'
        " echo $FLEET_TASK_ID > out-$FLEET_TASK_ID.txt"
    )
    task_ids = [units.add(script + f" # {i}") for i in range(2)]
    assert units.wait(*task_ids) == 0
    trees = set()
    for task_id in task_ids:
        task = units.show(task_id)
        assert units.outcomes(task_id) == ["success"]
        assert task["merge_state"] == "merged"
        # Both merged back, one after the other: each file is on main, each merge commit
        # has two parents.
        assert (units.project / f"out-{task_id}.txt").read_text() == f"{task_id}\n"
        assert (
            len(git(units.project, "rev-list", "--parents", "-1", task["merged_commit"]).split())
            == 3
        )
        trees.add(task["worktree"])
    assert len(trees) == 2
    assert git(units.project, "status", "--porcelain") == ""


def test_a_killed_agents_work_is_committed(units: UnitFleet) -> None:
    task_id = units.add("echo half done > half.txt; sleep 600")
    tree = units.home / "worktrees" / task_id
    units.box.wait_for(lambda: (tree / "half.txt").exists(), what="the agent wrote its file")
    units("kill", task_id)
    assert units.wait(task_id) == 1
    assert units.outcomes(task_id) == ["killed"]
    assert subjects(units.project, "main") == ["init"]  # not finished: nothing merged
    assert units.show(task_id)["merge_state"] is None
    assert git(units.project, "show", f"fleet/{task_id}:half.txt") == "half done"
    assert subjects(units.project, f"fleet/{task_id}")[0] == (
        f"fleet: work in progress of {task_id}, attempt 1"
    )
    journal = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert f"worktree {tree} created, on branch fleet/{task_id}" in journal
    assert "committed the uncommitted work as" in journal


def test_a_runner_killed_outright_has_its_agents_work_committed_by_the_reaper(
    units: UnitFleet,
) -> None:
    units.setup("retry_limit=1")
    task_id = units.add("echo half done > half.txt; sleep 600")
    tree = units.home / "worktrees" / task_id
    units.box.wait_for(lambda: (tree / "half.txt").exists(), what="the agent wrote its file")
    # SIGKILL to fleet-run itself (as the OOM killer or the watchdog would): it commits nothing.
    units.box.systemctl("kill", "--kill-who=main", "-s", "KILL", f"fleet-task@{task_id}")
    assert units.wait(task_id) == 1
    assert git(units.project, "show", f"fleet/{task_id}:half.txt") == "half done"
    (subject, *_) = subjects(units.project, f"fleet/{task_id}")
    assert subject.startswith(f"fleet: work left when attempt 1 of {task_id} ended (")
    journal = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert f"fleet-reap: committed the work left in {tree} as " in journal


def test_the_git_helpers_say_what_a_work_tree_is_doing(repo: Path, tmp_path: Path) -> None:
    from fleet import worktree

    assert worktree.head_ref(repo) == "refs/heads/main"
    assert worktree.in_progress(repo) is None
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "README").write_text("other\n")
    git(repo, "commit", "-qam", "other")
    git(repo, "checkout", "-q", "main")
    (repo / "README").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    subprocess.run(["git", "-C", str(repo), "merge", "-q", "other"], capture_output=True)
    assert worktree.in_progress(repo) == "merge"
    git(repo, "merge", "--abort")
    git(repo, "checkout", "-q", "--detach")
    assert worktree.head_ref(repo) == "" and worktree.head_ref(tmp_path / "nowhere") == ""
    assert worktree.last_line("a\nb\n", "none") == "b" and worktree.last_line(" ", "none") == "none"
    assert worktree.toplevel(str(tmp_path / "nowhere")) is None
    # env= reaches git: an index of one's own leaves the real one alone.
    index = str(tmp_path / "index")
    worktree.git(repo, "read-tree", "HEAD", env={"GIT_INDEX_FILE": index})
    assert Path(index).exists()
