"""Wake-ups across hosts on one PostgreSQL store: fleet-listen and the store's NOTIFY triggers.

Host B is a sandboxed systemd with a node name of its own, running fleet's units (and
fleet-listen.service) on a PostgreSQL database of the test cluster; host A is this process's
side, another FLEET_HOME on the same store, with no units at all. What A does reaches B only
through the database: its NOTIFY, B's listener, and the local files B's units wait on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet.store import pgnotify
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox, wait_for
from tests.test_systemd import Fleet as UnitFleet

HOST_B = "fleet-host-b"
AGENT = Path(__file__).parent / "fixtures" / "ask_agent.py"
LISTEN = "fleet-listen.service"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox.boot(tmp_path_factory.mktemp("host-b"), hostname=HOST_B) as booted:
        yield booted


@dataclass
class Hosts:
    b: UnitFleet  # the sandbox
    a_home: Path
    url: str

    def a(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`fleet ARGS` on host A."""
        env = {**os.environ, "FLEET_HOME": str(self.a_home), "FLEET_STORE": self.url}
        done = subprocess.run(
            [fleet_exe(), *args], env=env, capture_output=True, text=True, timeout=120
        )
        if check and done.returncode != 0:
            raise AssertionError(f"fleet {' '.join(args)}: {done.returncode} {done.stderr}")
        return done

    def add(self, script: str) -> str:
        return self.a("add", script[:40], "--cwd", str(self.b.project), "-d", script).stdout.strip()

    def listener_pid(self) -> int | None:
        """The server process of B's listener's connection."""
        with psycopg.connect(self.url, autocommit=True) as admin:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'fleet-listen'"
                " AND datname = current_database()"
            ).fetchone()
        return int(row[0]) if row else None

    def pending(self, task_id: str) -> dict[str, Any]:
        """The question B's agent asks, as host A lists it once it is pending."""
        found: list[dict[str, Any]] = []

        def asked() -> bool:
            found[:] = json.loads(self.a("questions", "--json", "--task", task_id).stdout)
            return bool(found)

        wait_for(asked, 60, f"a question of {task_id}")
        return found[0]


@pytest.fixture
def hosts(box: Sandbox, pg_cluster: Any, tmp_path: Path) -> Iterator[Hosts]:
    url = str(pg_cluster.new_database())
    project = tmp_path / "project"
    project.mkdir()
    b = UnitFleet(box, tmp_path / "b-home", project)
    b.setup(f"store={url}", "default_coder=command", "lease_seconds=10", "stop_grace_seconds=2")
    found = Hosts(b, tmp_path / "a-home", url)
    wait_for(lambda: found.listener_pid() is not None, 30, "B's listener connected")
    yield found
    box.systemctl(
        "stop", LISTEN, "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False
    )
    box.systemctl("reset-failed", check=False)


def test_a_task_added_on_another_host_starts_here_without_the_timer(hosts: Hosts) -> None:
    b = hosts.b
    b.box.systemctl("stop", "fleet-claim.timer")
    b.idle()
    task_id = hosts.add("echo started on B")
    assert b.wait(task_id) == 0
    (attempt,) = b.show(task_id)["attempt_log"]
    assert attempt["owner"] == HOST_B and attempt["outcome"] == "success"
    assert b.box.systemctl("is-active", "fleet-claim.timer", check=False).stdout.strip() in (
        "inactive",
        "failed",
    )


def test_an_answer_on_another_host_unblocks_the_agent_here(hosts: Hosts) -> None:
    task_id = hosts.add(f"{sys.executable} {AGENT} 'Ship it?'")
    q = hosts.pending(task_id)
    hosts.a("answer", q["id"], "yes, ship it")
    assert hosts.b.wait(task_id) == 0
    assert "answered: yes, ship it" in hosts.b.show(task_id)["reason"]


def test_an_answer_given_while_the_listener_was_cut_off_arrives_when_it_reconnects(
    hosts: Hosts,
) -> None:
    """The listener's connection is ended by the server while the listener cannot act (it is
    stopped); the answer given meanwhile notifies nobody, and arrives by the catch-up."""
    b = hosts.b
    task_id = hosts.add(f"{sys.executable} {AGENT} 'Still there?'")
    q = hosts.pending(task_id)
    before = hosts.listener_pid()
    b.box.systemctl("kill", "--signal=SIGSTOP", LISTEN)
    try:
        with psycopg.connect(hosts.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (before,))
        wait_for(lambda: hosts.listener_pid() is None, 30, "the listener's connection gone")
        hosts.a("answer", q["id"], "yes")
    finally:
        b.box.systemctl("kill", "--signal=SIGCONT", LISTEN)
    assert b.wait(task_id) == 0
    assert "answered: yes" in b.show(task_id)["reason"]
    after = hosts.listener_pid()
    assert after is not None and after != before
    said = [e["MESSAGE"] for e in b.box.journal("-u", LISTEN)]
    assert any("not listening to" in line for line in said), said


def test_the_triggers_notify_what_another_host_acts_on_and_only_once_committed(
    hosts: Hosts,
) -> None:
    with psycopg.connect(hosts.url, autocommit=True) as ear:
        ear.execute(f"LISTEN {pgnotify.CHANNEL}".encode())

        def heard() -> list[str]:
            return [n.payload for n in ear.notifies(timeout=2, stop_after=1)]

        with psycopg.connect(hosts.url) as writer:
            writer.execute(
                "INSERT INTO tasks (id, title, cwd, created_at, updated_at)"
                " VALUES ('fl-zzzzzz', 'never', '/', '', '')"
            )
            writer.rollback()
        assert heard() == []
        hosts.a("pause")
        assert heard() == []  # a gate that closes makes nothing startable
        hosts.a("resume")
        assert heard() == ["ready"]


def unit_empty(box: Sandbox, task_id: str) -> bool:
    """The task's unit has ended and its cgroup holds no process."""
    unit = f"fleet-task@{task_id}.service"
    state = box.systemctl("is-active", unit, check=False).stdout.strip()
    group = box.systemctl("show", "-p", "ControlGroup", "--value", unit).stdout.strip()
    return state in ("inactive", "failed") and not group


def running_on_b(hosts: Hosts, marker: str) -> str:
    """A task added on A whose agent (a sleep named by `marker`) runs on B."""
    task_id = hosts.add(f"sleep {marker}")
    hosts.b.wait_running(task_id)
    hosts.b.box.wait_for(
        lambda: hosts.b.box.run("pgrep", "-f", f"sleep {marker}", check=False).returncode == 0,
        what="the agent started",
    )
    return task_id


def assert_killed(hosts: Hosts, task_id: str, marker: str) -> None:
    b = hosts.b
    assert b.wait(task_id) == 1
    shown = b.show(task_id)
    assert shown["status"] == "blocked" and "stopped by a person (kill-request)" in shown["reason"]
    assert b.outcomes(task_id) == ["killed"]
    assert b.box.run("pgrep", "-f", f"sleep {marker}", check=False).stdout == ""
    b.box.wait_for(lambda: unit_empty(b.box, task_id), what=f"{task_id}'s cgroup empty")


def test_a_kill_on_another_host_stops_the_agent_here(hosts: Hosts) -> None:
    task_id = running_on_b(hosts, "7101")
    killed = hosts.a("kill", task_id)  # blocking: returns once the attempt has ended
    assert killed.returncode == 0 and killed.stderr == ""
    assert hosts.b.show(task_id)["claimed_by"] is None
    assert_killed(hosts, task_id, "7101")
    trail = [json.loads(line) for line in hosts.a("history", task_id, "--nl").stdout.splitlines()]
    (asked,) = [e for e in trail if e["action"] == "kill-requested"]
    assert asked["detail"]["host"] == HOST_B


def test_a_kill_requested_while_the_listener_is_down_is_kept_until_it_is_back(
    hosts: Hosts,
) -> None:
    b = hosts.b
    task_id = running_on_b(hosts, "7102")
    b.box.systemctl("stop", LISTEN)
    timed_out = hosts.a("kill", "--timeout", "1.5", task_id, check=False)
    assert timed_out.returncode == 124, timed_out.stderr
    first = timed_out.stderr.splitlines()[0]
    assert first == f"fleet: error: still running after 1.5 s: {task_id} (on {HOST_B})"
    assert b.show(task_id)["status"] == "running"
    assert hosts.a("kill", "--no-block", task_id).returncode == 0  # asked again: still kept
    b.box.systemctl("start", LISTEN)
    assert_killed(hosts, task_id, "7102")


def test_poll_only_mode_has_no_listener_and_renewals_bring_answers_and_kills(
    hosts: Hosts,
) -> None:
    b = hosts.b
    b.setup("wakeups=poll")  # lease_seconds=10: a renewal every 3.3 s
    assert not (b.box.units / LISTEN).exists()
    assert b.box.systemctl("is-active", LISTEN, check=False).stdout.strip() != "active"
    assert hosts.listener_pid() is None
    # Added on B itself: new work from another host waits for fleet-claim.timer here.
    asking = b.add(f"{sys.executable} {AGENT} 'Poll?'")
    q = hosts.pending(asking)
    hosts.a("answer", q["id"], "by renewal")
    assert b.wait(asking) == 0
    assert "answered: by renewal" in b.show(asking)["reason"]
    sleeping = b.add("sleep 7103")
    b.wait_running(sleeping)
    assert hosts.a("kill", sleeping).returncode == 0
    assert_killed(hosts, sleeping, "7103")
