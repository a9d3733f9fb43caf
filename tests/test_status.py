"""`fleet status` (the snapshot, its text, --watch in tmux), and held tasks in `ready` and `ls`.

These run in-process against a store filled through the Store API and the command line; the
same snapshot with real units and running attempts is checked under systemd in
tests/test_observe.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet import live, status
from fleet.config import load
from fleet.model import AttemptEnd, QuestionKind, Status, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, open_store
from fleet.timeutil import iso
from tests.conftest import Fleet, fleet_exe
from tests.sandbox import wait_for


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def keys(obj: dict[str, Any], prefix: str = "") -> set[str]:
    """The documented names of a snapshot's keys: `counts.running`, … (one level down)."""
    found = set()
    for key, value in obj.items():
        found.add(prefix + key)
        if isinstance(value, dict) and not prefix and key in ("counts", "units"):
            found |= keys(value, f"{key}.")
    return found


def test_the_snapshot_has_exactly_its_documented_fields(fleet: Fleet, project: Path) -> None:
    fleet.add("one", "--coder", "command", "-d", "true")
    snap = json.loads(fleet.ok("status", "--json"))
    assert keys(snap) == {f.name for f in status.FIELDS}


def test_counts_gates_questions_and_running_tasks(
    store: Store, fleet: Fleet, project: Path, home: Path
) -> None:
    specs = [
        TaskSpec(f"t{i}", str(project), coder="claude" if i < 3 else "codex") for i in range(6)
    ]
    tasks = store.add(specs)
    # t5 waits for t4; t0 runs with live figures and a question; t1 is done.
    store.edit(tasks[5].id, store_edit_after(tasks[4].id))
    (running,) = store.claim(1, "host-a", 600, "claude", None)
    (done,) = store.claim(1, "host-a", 600, "claude", None)
    store.finish(
        done.id, "host-a", AttemptEnd("success", cost=0.5, cost_source="reported"), Status.DONE
    )
    paths = resolve()
    live.write(
        paths,
        running.id,
        {
            "task": running.id,
            "attempt": 1,
            "started_at": iso(time.time()),
            "coder": "claude",
            "model": "claude-sonnet-4-5",
            "phase": "working",
            "context_pct": 41.5,
            "tokens_in": 18_000,
            "tokens_out": 300,
            "cost": 0.0123,
            "cost_source": "estimated",
            "last_tool": "Bash",
        },
    )
    q = store.ask(
        running.id, QuestionKind.INPUT, "Which branch?", [], False, "2099-01-01T00:00:00.000Z"
    )
    until = iso(time.time() + 1800)
    store.set_gate("coder:codex", until, "codex primary limit: rejected", "rate-limit", "primary")
    store.record_gauge("codex", "primary", "rejected", 1.0, time.time() + 1800)
    snap = status.snapshot(paths, store, load(paths), units=False)
    assert snap["counts"] == {
        "running": 1,
        "cap": 4,
        "ready": 1,  # t2 (claude); t3 and t4 are codex's, held; t5 waits
        "held": 2,
        "waiting": 1,
        "merging": 0,
        "blocked": 0,
        "suspended": 0,
        "done": 1,
        "cancelled": 0,
        "handed_off": 0,
        "elsewhere": 0,
    }
    (gate,) = snap["gates"]
    assert (gate["coder"], gate["kind"], gate["until"], gate["window"]) == (
        "codex",
        "rate-limit",
        until,
        "primary",
    )
    (gauge,) = snap["gauges"]
    assert (gauge["coder"], gauge["utilization_pct"], gauge["status"]) == (
        "codex",
        100.0,
        "rejected",
    )
    (question,) = snap["questions"]
    assert (question["id"], question["task"], question["text"]) == (
        q.id,
        running.id,
        "Which branch?",
    )
    assert 0 <= question["age_seconds"] < 60
    (row,) = snap["running"]
    assert (row["id"], row["phase"], row["context_pct"], row["tokens_in"], row["cost"]) == (
        running.id,
        "asking",  # a question is pending: the phase says so whatever the live file says
        41.5,
        18_000,
        0.0123,
    )
    assert (row["question"], row["model"], row["last_tool"]) == (q.id, "claude-sonnet-4-5", "Bash")
    text = status.text(snap)
    assert "running 1/4 · ready 1 · held 2 · waiting 1" in text
    assert "codex" in text and "primary" in text and "Which branch?" in text
    assert "$0.0123 est." in text and "41.5%" in text
    # The pause holds everything, and says who paused and why.
    assert fleet.ok("pause", "--reason", "upgrading the runners") == ""
    snap = status.snapshot(paths, store, load(paths), units=False)
    assert (snap["counts"]["ready"], snap["counts"]["held"]) == (0, 3)
    assert snap["pause"]["reason"] == "upgrading the runners" and "@" in snap["pause"]["by"]
    assert "PAUSED by " in status.text(snap) and "upgrading the runners" in status.text(snap)


def store_edit_after(dep: str) -> Any:
    from fleet.model import TaskEdit

    return TaskEdit(add_after=(dep,))


def test_ready_puts_held_tasks_last_with_the_reason(fleet: Fleet, store: Store) -> None:
    first = fleet.add("claude one", "--coder", "claude")
    second = fleet.add("codex one", "--coder", "codex")
    third = fleet.add("claude two", "--coder", "claude", "-p", "1")
    until = time.time() + 3600
    store.set_gate("coder:claude", iso(until), "claude five_hour limit: rejected", "rate-limit")
    listed = json.loads(fleet.ok("ready", "--json"))
    assert [t["id"] for t in listed] == [second, third, first]  # next first, then held
    clock = time.strftime("%H:%M", time.localtime(until))
    assert [t["held"] for t in listed] == [
        None,
        f"held: claude rate-limited until {clock}",
        f"held: claude rate-limited until {clock}",
    ]
    table = fleet.ok("ready")
    lines = [line for line in table.splitlines() if line.startswith("fl-")]
    assert lines[0].startswith(second) and " ready " in lines[0]
    assert f"held: claude rate-limited until {clock}" in lines[1] and " held " in lines[1]
    assert json.loads(fleet.ok("ready", "-n", "1", "--json"))[0]["id"] == second
    # fleet ls shows the same, in its order.
    (row,) = [line for line in fleet.ok("ls").splitlines() if line.startswith(first)]
    assert " held " in row and f"held: claude rate-limited until {clock}" in row
    fleet.ok("pause", "-r", "lunch")
    assert {t["held"] for t in json.loads(fleet.ok("ready", "--json"))} == {
        "held: fleet paused (lunch)"
    }


def test_a_daily_budget_gate_reads_as_such(fleet: Fleet, store: Store) -> None:
    task = fleet.add("codex", "--coder", "codex")
    store.set_gate("coder:codex", iso(time.time() + 600), "daily budget", "budget")
    (row,) = json.loads(fleet.ok("ready", "--json"))
    assert row["id"] == task and row["held"].startswith("held: codex over its daily budget until")


def test_ls_pages_its_table_and_says_how_many_it_left_out(
    fleet: Fleet, store: Store, project: Path
) -> None:
    store.add([TaskSpec(f"t{i}", str(project)) for i in range(12)])
    result = fleet("ls", "-n", "5")
    assert result.code == 0
    assert len([line for line in result.out.splitlines() if line.startswith("fl-")]) == 5
    assert "7 more tasks not shown (--limit 0 shows all" in result.err
    result = fleet("ls", "--limit", "0")
    assert len([line for line in result.out.splitlines() if line.startswith("fl-")]) == 12
    assert result.err == ""
    assert len(json.loads(fleet.ok("ls", "--json"))) == 12  # JSON is never cut short by default
    assert len(json.loads(fleet.ok("ls", "--json", "-n", "3"))) == 3


def test_status_refuses_watch_with_json(fleet: Fleet) -> None:
    result = fleet("status", "--json", "--watch")
    assert result.code == 2 and "fleet: error: --watch draws for a person" in result.err


# ---------------------------------------------------------------------- --watch, in tmux


class Tmux:
    """A tmux server of our own (its own socket) with one window."""

    def __init__(self, socket: Path, env: dict[str, str]) -> None:
        self.socket = socket
        self.env = env

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "watch")


@pytest.fixture
def tmux(tmp_path: Path, home: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (.ci/run installs it)")
    env = {**os.environ, "FLEET_HOME": str(home), "TERM": "xterm-256color"}
    t = Tmux(tmp_path / "tmux.sock", env)
    t("new-session", "-d", "-s", "watch", "-x", "160", "-y", "50", "sh")
    yield t
    subprocess.run(["tmux", "-S", str(t.socket), "kill-server"], check=False, timeout=30)


def test_watch_redraws_on_change_and_ends_cleanly_on_ctrl_c(
    tmux: Tmux, fleet: Fleet, tmp_path: Path
) -> None:
    fleet.add("first", "--coder", "command", "-d", "true")
    marker = tmp_path / "exit-status"
    command = f"{shlex.quote(fleet_exe())} status --watch; echo $? > {shlex.quote(str(marker))}"
    tmux("send-keys", "-t", "watch", command, "Enter")
    wait_for(lambda: "running 0/4 · ready 1" in tmux.screen(), 30, "the first drawing")
    assert "(Ctrl-C ends)" in tmux.screen()
    # A change in the store from another process is drawn in place, at once.
    fleet.ok("pause", "--reason", "seen in tmux")
    wait_for(lambda: "seen in tmux" in tmux.screen(), 10, "the pause drawn")
    screen = tmux.screen()
    assert "held 1" in screen and screen.count("fleet status ·") == 1  # redrawn, not appended
    fleet.ok("resume")
    wait_for(lambda: "seen in tmux" not in tmux.screen(), 10, "the pause lifted")
    tmux("send-keys", "-t", "watch", "C-c")
    # The shell creates the file before echo writes to it: wait for what it says.
    wait_for(lambda: marker.exists() and marker.read_text().strip() != "", 10, "the exit status")
    assert marker.read_text().strip() == "0"
    assert "Traceback" not in tmux.screen() and "interrupted" not in tmux.screen()
