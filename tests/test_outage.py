"""An outage of the PostgreSQL store while agents run, in a real systemd (tests/sandbox.py)
against a real cluster (tests/pg.py) that the test stops for 15 s and starts again.

What must hold (issue 14): a running agent runs on through the outage, its runner retrying its
renewals; an agent whose lease ends meanwhile is stopped by its own runner, and its task is
recovered once afterwards; the dispatch pass and the reaper fail in one line meanwhile and
the timer runs them again; after it every task finished exactly once, each attempt recorded
once, and no task ran twice but the one whose lease ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox

systemd = sandbox.systemd
BIN = os.path.dirname(fleet_exe())
OUTAGE_S = 15.0
DEADLINE = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A cluster of this module's own: stopping it must not touch other tests' databases."""
    from tests.pg import Cluster

    c = Cluster()
    try:
        c.start()
        c.make_template()
        yield c
    finally:
        c.stop()


class Host:
    def __init__(self, box: Sandbox, home: Path) -> None:
        self.box = box
        self.home = home

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def program(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/{name}", *args, env={"FLEET_HOME": str(self.home)}, check=False)

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def active(self, task_id: str) -> bool:
        state = self.box.systemctl("is-active", f"fleet-task@{task_id}", check=False).stdout
        return state.strip() == "active"


def runs(marks: Path, task_id: str) -> int:
    """How many times the agent of `task_id` started."""
    path = marks / task_id
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_agents_run_through_an_outage_of_the_store_and_nothing_is_lost_or_doubled(
    systemd: Sandbox, cluster: Any, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    marks = tmp_path / "marks"
    project.mkdir()
    marks.mkdir()
    go = tmp_path / "go"
    host = Host(systemd, home)
    # A lease of 60 s outlives the outage; the fourth task's runner starts with one of 10 s,
    # which runs out during it.
    host("config", "set", "default_coder=command", "lease_seconds=60", "stop_grace_seconds=2",
         "max_concurrent=5",
         f"store={cluster.new_database()}")  # fmt: skip
    host("setup", "--system")

    def add(title: str, until: Path = go) -> str:
        script = (
            f'echo started >> {marks}/"$FLEET_TASK_ID"; while [ ! -e {until} ]; do sleep 0.1;'
            " done; [ -e " + str(go) + ' ] && fleet close "$FLEET_TASK_ID"; exit 0'
        )
        return host("add", title, "--cwd", str(project), "-d", script).stdout.strip()

    end = tmp_path / "end"
    try:
        riders = [add(f"rides it out {i}") for i in range(3)]
        # Its agent ends during the outage (a command that exits 0 closes its task).
        ender = add("ends in the outage", until=end)
        riders.append(ender)
        systemd.wait_for(
            lambda: all(runs(marks, t) == 1 for t in riders), DEADLINE, "the agents to start"
        )
        host("config", "set", "lease_seconds=10")
        short = add("its lease ends")
        systemd.wait_for(lambda: runs(marks, short) == 1, DEADLINE, f"{short} started")

        cluster.halt()
        down = time.monotonic()
        try:
            # The dispatch pass and the reaper say so in one line (and a hint), and fail.
            for name, args in (("fleet-claim", ()), ("fleet-reap", (short,))):
                ran = host.program(name, *args)
                errors = [line for line in ran.stderr.splitlines() if ": error: " in line]
                assert ran.returncode != 0 and "Traceback" not in ran.stderr, ran.stderr
                assert len(errors) == 1 and "cannot reach the task store" in errors[0], errors
            end.touch()
            for tid in (short, ender):
                outcome = home / "tasks" / tid / "outcome.json"
                systemd.wait_for(outcome.exists, DEADLINE, f"the outcome of {tid}")
            outcome = json.loads((home / "tasks" / short / "outcome.json").read_text())
            assert outcome["stopped_by"] == "lease-lost", outcome
            while time.monotonic() < down + OUTAGE_S:  # the rest of the outage
                assert all(host.active(t) for t in riders[:3]), "an agent stopped in the outage"
                time.sleep(0.5)
        finally:
            cluster.resume()
        assert all(host.active(t) for t in riders[:3])

        # The short one's attempt is settled as lost, and its task run once more.
        systemd.wait_for(lambda: runs(marks, short) == 2, DEADLINE, f"{short} re-run")
        go.touch()
        everyone = [*riders, short]
        waited = host("wait", *everyone, "--timeout", str(DEADLINE), check=False)
        assert waited.returncode == 0, waited.stdout + waited.stderr
    finally:
        go.touch()
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*",
                          check=False)  # fmt: skip
        systemd.systemctl("reset-failed", check=False)

    for tid in riders:
        shown = host.show(tid)
        assert shown["status"] == "done" and shown["attempts"] == 1, shown
        assert [a["outcome"] for a in shown["attempt_log"]] == ["success"], shown["attempt_log"]
        assert runs(marks, tid) == 1
    shown = host.show(short)
    assert shown["status"] == "done" and shown["attempts"] == 2, shown
    assert [a["outcome"] for a in shown["attempt_log"]] == ["lost", "success"]
    assert runs(marks, short) == 2
    for tid in everyone:
        ended = [h for h in json.loads(host("history", tid, "--json").stdout)
                 if h["action"] == "ended"]  # fmt: skip
        assert [h["detail"]["attempt"] for h in ended] == list(
            range(1, host.show(tid)["attempts"] + 1)
        ), ended


def test_a_runners_writes_wait_for_the_store_and_the_newest_of_each_kind_is_made_once(
    cluster: Any, home: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.model import TaskSpec
    from fleet.outage import Kept
    from fleet.paths import resolve
    from fleet.store import open_store
    from tests.sandbox import wait_for

    monkeypatch.setenv("FLEET_STORE", cluster.new_database())
    store = open_store(resolve())
    try:
        (task,) = store.add([TaskSpec("t", str(project))])
        claimed = store.claim_task(task.id, "me", 60, "command", None)
        assert claimed is not None
        said: list[str] = []
        kept = Kept(said.append)
        made: list[str] = []

        def record(session: str) -> None:
            store.record_session(task.id, "me", claimed.attempts, session)
            made.append(session)

        cluster.halt()
        try:
            kept.do("the session id", lambda: record("s-1"))
            kept.do("the session id", lambda: record("s-2"))  # replaces the one kept
            kept.retry()
            assert kept.left() == ["the session id"] and made == []
        finally:
            cluster.resume()

        def retried() -> bool:
            kept.retry()
            return not kept.left()

        wait_for(retried, DEADLINE, "the kept write to be made")
        assert made == ["s-2"]
        assert [a.session_id for a in store.attempts(task.id)] == ["s-2"]
        assert len(said) == 2 and "unreachable" in said[0] and "back" in said[1], said
    finally:
        store.close()
