"""Checkpoints, suspend and resume without an agent: the git ref that leaves the work tree and
the index alone, what a checkpoint records, the `suspended` status that fleet-claim never
claims, `fleet resume` with and without an ID, the `suspended` outcome in fleet-reap, what the
next attempt is told, and the forward migration of an older store. The real Claude Code CLI
suspended and resumed under systemd is in test_coder_claude.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from fleet import checkpoints
from fleet.coders.base import CoderSettings, RunSpec, Tally
from fleet.coders.claude import ClaudeCoder
from fleet.coders.codex import CodexCoder
from fleet.coders.gemini import GeminiCoder
from fleet.coders.opencode import OpencodeCoder
from fleet.config import load
from fleet.model import AttemptEnd, QuestionKind, Status
from fleet.paths import resolve
from fleet.reap import classify, policy
from fleet.store import open_store
from fleet.store.schema import VERSION
from tests.conftest import ROOT, Fleet, run_fleet, store_at_version
from tests.conftest import fleet_run as run
from tests.test_worktree import git, make_repo

# Every test here runs on each store (SQLite, PostgreSQL) unless marked sqlite_only.
pytestmark = pytest.mark.usefixtures("backend")

FAR = "2099-01-01T00:00:00Z"


@pytest.fixture(autouse=True)
def no_system_gitconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def state(repo: Path) -> tuple[str, str, str, str]:
    """Everything `git status` shows, the index's contents, and HEAD."""
    return (
        git(repo, "status", "--porcelain", "--untracked-files=all"),
        git(repo, "diff", "--cached", "--name-status"),
        git(repo, "ls-files", "--stage"),
        git(repo, "rev-parse", "HEAD"),
    )


def test_a_checkpoint_ref_leaves_the_work_tree_and_the_index_alone(
    fleet: Fleet, project: Path
) -> None:
    repo = make_repo(project, identity=False)
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "README").write_text("changed, not staged\n")
    (repo / "sub" / "new.txt").write_text("untracked\n")
    (repo / "noise.log").write_text("ignored\n")
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    before = state(repo)
    assert fleet.ok("checkpoint", tid, "-s", "halfway") == "1\n"
    assert state(repo) == before  # staged stays staged, unstaged unstaged, untracked untracked
    ref = f"refs/fleet/{tid}/checkpoints/1"
    assert git(repo, "rev-parse", f"{ref}^") == before[3]  # its parent is HEAD
    files = set(git(repo, "ls-tree", "-r", "--name-only", ref).splitlines())
    assert files == {".gitignore", "README", "staged.txt", "sub/keep.txt", "sub/new.txt"}
    assert git(repo, "show", f"{ref}:README") == "changed, not staged"
    assert git(repo, "for-each-ref", "--format=%(refname)", "refs/heads") == "refs/heads/main"
    # A second one gets the next number and its own ref; the first stays where it was.
    first = git(repo, "rev-parse", ref)
    (repo / "README").write_text("changed again\n")
    cp = json.loads(fleet.ok("checkpoint", tid, "--json"))
    assert (cp["n"], cp["ref"]) == (2, f"refs/fleet/{tid}/checkpoints/2")
    assert cp["summary"] == f"checkpoint by {cp['by']}" and "@" in cp["by"]
    assert git(repo, "rev-parse", ref) == first != cp["commit"]
    listed = json.loads(fleet.ok("checkpoints", tid, "--json"))
    assert [c["n"] for c in listed] == [1, 2] and listed[1] == cp
    assert set(listed[0]) == {
        "task", "n", "attempt", "created_at", "by", "summary", "ref", "commit", "repo", "note",
        "coder", "session_id", "questions",
    }  # fmt: skip
    assert (listed[0]["repo"], listed[0]["attempt"], listed[0]["questions"]) == (
        str(repo),
        0,
        [],
    )
    table = fleet.ok("checkpoints", tid).splitlines()
    assert table[0].split()[:3] == ["N", "TAKEN", "BY"] and "halfway" in table[2]


def test_outside_git_a_checkpoint_has_no_ref_and_says_so(fleet: Fleet, project: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    done = fleet("checkpoint", tid, "-s", "no repository here")
    assert (done.code, done.out) == (0, "1\n")
    assert "has no git ref" in done.err and "not in a git repository" in done.err
    (cp,) = json.loads(fleet.ok("checkpoints", tid, "--json"))
    assert (cp["ref"], cp["commit"], cp["summary"]) == (None, None, "no repository here")
    empty = fleet("checkpoint", tid, "-s", "  ")
    assert empty.code == 2 and "summary is empty" in empty.err
    assert json.loads(fleet.ok("checkpoints", "--json", tid)) == [cp]


def test_a_checkpoint_records_the_running_session_and_pending_questions(
    fleet: Fleet, project: Path
) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    store = open_store(resolve())
    try:
        assert [t.id for t in store.claim(1, "me", 60, "command", None)] == [tid]
        store.record_session(tid, "me", 1, "sess-1")
        store.record_session(tid, "someone-else", 1, "not-mine")  # not the claim's owner
        q = store.ask(tid, QuestionKind.INPUT, "Which way?", (), False, FAR)
        cp = checkpoints.take(store, tid, "agent", "asked which way")
        assert (cp.attempt, cp.session_id, cp.questions, cp.coder) == (
            1,
            "sess-1",
            (q.id,),
            "command",
        )
        # The attempt ends (its question is cancelled); a later checkpoint names the same
        # session, the last one known, and no questions.
        store.finish(tid, "me", AttemptEnd("failure"), Status.READY)
        later = checkpoints.take(store, tid, "me@host", "after")
        assert (later.n, later.session_id, later.questions) == (2, "sess-1", ())
        assert store.attempts(tid)[0].session_id == "sess-1"
        # What an attempt resuming from the first would be told.
        plan = checkpoints.plan(cp, "command", ["Which way?"], "resumed")
        assert plan.session == "sess-1"
        assert "is now resumed from checkpoint 1" in plan.resumed_prompt
        assert "asked which way" in plan.fresh_note and "- Which way?" in plan.fresh_note
        assert checkpoints.plan(cp, "claude", [], "resumed").session is None  # another coder
        assert checkpoints.plan(cp, "command", [], "restarted").session is None
    finally:
        store.close()


def test_suspended_tasks_are_never_claimed_until_resumed(fleet: Fleet, project: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    other = fleet.add("other", "--coder", "command", "-d", "true")
    assert fleet.ok("suspend", tid) == "1\n"
    task = fleet.show(tid)
    assert (task["status"], task["resume_from"]) == ("suspended", None)
    assert task["reason"].startswith("suspended by ") and task["reason"].endswith("checkpoint 1")
    assert fleet.ok("ls", "-s", "suspended").splitlines()[2].startswith(tid)
    assert json.loads(fleet.ok("ready", "--json"))[0]["id"] == other
    refused = run(tid, project)
    assert refused.returncode == 4 and "it is suspended" in refused.stderr
    store = open_store(resolve())
    try:
        assert [t.id for t in store.claim(10, "me", 60, "command", None)] == [other]
        store.finish(other, "me", AttemptEnd("success"), Status.DONE)
    finally:
        store.close()
    again = fleet("suspend", tid)
    assert again.code == 4 and "it is suspended" in again.err
    not_yet = fleet("resume", other)
    assert not_yet.code == 4 and "not suspended" in not_yet.err
    missing = fleet("resume", tid, "--from", "7")
    assert missing.code == 3 and "no checkpoint 7" in missing.err
    fleet.ok("checkpoint", tid, "-s", "second")
    assert fleet.ok("resume", tid, "--from", "1") == f"{tid}\n"
    task = fleet.show(tid)
    assert (task["status"], task["resume_from"], task["reason"]) == ("ready", 1, None)
    # It runs again, and that attempt uses the checkpoint up.
    assert run(tid, project).returncode == 0
    assert fleet.show(tid)["resume_from"] is None
    prompt = (resolve().tasks / tid / "prompt.md").read_text()
    assert "resumed from checkpoint 1" in prompt and "suspended by" in prompt


def test_resume_without_an_id_still_lifts_a_pause(fleet: Fleet, project: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    fleet.ok("pause", "--reason", "lunch")
    store = open_store(resolve())
    try:
        assert store.claim(1, "me", 60, "command", None) == []
        assert fleet.ok("resume") == ""
        assert [t.id for t in store.claim(1, "me", 60, "command", None)] == [tid]
    finally:
        store.close()
    bad = fleet("resume", "--from", "1")
    assert bad.code == 2 and "--from needs the ID" in bad.err


def test_a_suspended_attempt_counts_as_nothing(fleet: Fleet, project: Path) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    store = open_store(resolve())
    try:
        store.claim(1, "me", 60, "command", None)
        task = store.suspend(tid, "suspended by me")
        assert (task.status, task.claimed_by) == (Status.SUSPENDED, "me")
        # However the stop ended the attempt, it was the suspension.
        kind, reason = classify(task, None, None)
        assert (kind, reason) == ("suspended", "suspended by me")
        status, why = policy(task, kind, reason, load(resolve()))
        after = store.finish(tid, "me", AttemptEnd(kind), status, why)
        assert (after.status, after.failures, after.noclose) == (Status.SUSPENDED, 0, 0)
        assert store.attempts(tid)[0].outcome == "suspended"
    finally:
        store.close()
    # A person may still close, block or cancel it; retry is refused (resume is the way).
    assert fleet("retry", tid).code == 4
    assert fleet.ok("cancel", tid) == f"{tid}\n"


@pytest.mark.sqlite_only
def test_a_version_3_store_is_migrated(home: Path, project: Path) -> None:
    db = store_at_version(home, 3)
    db.execute(
        "INSERT INTO tasks (id, title, cwd, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
        ("fl-000001", "old task", str(project), "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    )
    db.commit()
    # A connection open since before the migration must see the new status too.
    old = sqlite3.connect(home / "fleet.db", isolation_level=None)
    assert old.execute("SELECT count(*) FROM tasks").fetchone() == (1,)
    shown = run_fleet("show", "fl-000001", "--json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["resume_from"] is None
    assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    db.close()
    assert run_fleet("suspend", "fl-000001", "-s", "from an old store", cwd=project).code == 0
    assert old.execute("SELECT status FROM tasks").fetchone() == ("suspended",)
    old.execute("UPDATE tasks SET status = 'ready'")
    old.execute("UPDATE tasks SET status = 'suspended'")  # its schema was re-read: no CHECK error
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        old.execute("UPDATE tasks SET status = 'sleeping'")
    old.close()
    check = sqlite3.connect(home / "fleet.db")
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    check.close()


def test_a_context_pressure_restart_starts_from_the_newest_checkpoint(
    fleet: Fleet, project: Path
) -> None:
    tid = fleet.add("work", "--coder", "command", "-d", "true")
    store = open_store(resolve())
    try:
        store.claim(1, "me", 60, "command", None)
        store.record_session(tid, "me", 1, "full-context")
        checkpoints.take(store, tid, "agent", "old news")
        checkpoints.take(store, tid, "agent", "parser done; next: the printer")
        store.finish(tid, "me", AttemptEnd("context-pressure"), Status.READY)
    finally:
        store.close()
    assert run(tid, project).returncode == 0
    prompt = (resolve().tasks / tid / "prompt.md").read_text()
    assert "filled its context window" in prompt  # the usual note, then the checkpoint
    assert "restarted from checkpoint 2" in prompt and "parser done; next: the printer" in prompt
    assert "old news" not in prompt and "is now resumed" not in prompt


def spec_resuming(tmp_path: Path) -> RunSpec:
    return RunSpec(
        "fl-abc123", 2, "t", "d", str(tmp_path), None, tmp_path, tmp_path, "go on",
        tmp_path / "prompt.md", resume="SID",
    )  # fmt: skip


def test_each_coder_resumes_its_own_session(tmp_path: Path) -> None:
    run_spec = spec_resuming(tmp_path)
    claude = ClaudeCoder(CoderSettings()).argv(run_spec)
    assert claude[-2:] == ["--resume", "SID"]  # the prompt, "go on", is standard input
    codex = CodexCoder(CoderSettings()).argv(run_spec)
    assert codex[1:3] == ["exec", "resume"] and "-C" not in codex  # `exec resume` has no -C
    assert codex[-3:] == ["--", "SID", "-"]
    opencode = OpencodeCoder(CoderSettings()).argv(run_spec)
    assert opencode[-2:] == ["--session", "SID"]
    assert opencode[opencode.index("--dir") + 1] == str(tmp_path)  # the same --dir, or it hangs
    assert GeminiCoder(CoderSettings()).argv(run_spec)[-2:] == ["--resume", "SID"]
    assert all(c.resumes for c in (ClaudeCoder, CodexCoder, OpencodeCoder, GeminiCoder))


@pytest.mark.parametrize(
    ("stream", "gone"),
    [("claude_resume_wrong_cwd_error.jsonl", True), ("claude_resume.jsonl", False)],
)
def test_a_session_that_cannot_be_resumed_is_told_apart(stream: str, gone: bool) -> None:
    """Claude Code's answer to `--resume` of a session it does not have (recorded): an error
    result before any session starts, exit 1; a resumed session starts and works."""
    coder = ClaudeCoder(CoderSettings())
    tally = Tally()
    for line in (ROOT / "tests" / "fixtures" / "streams" / stream).read_text().splitlines():
        for event in coder.parse(line):
            tally.add(event)
    assert coder.resume_failed(1 if gone else 0, tally) is gone
