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
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet.listen import PING_TIMEOUT_S
from fleet.model import AttemptEnd, QuestionKind, TaskSpec
from fleet.store import pgnotify
from fleet.timeutil import iso
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


def test_an_idle_host_holds_one_connection_its_listener_under_a_watchdog(hosts: Hosts) -> None:
    b = hosts.b
    b.idle()
    with psycopg.connect(hosts.url, autocommit=True) as admin:
        held = admin.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    assert held == [("fleet-listen",)]
    doctor = b("doctor", "--system", check=False).stdout
    assert f"{LISTEN}: active" in doctor, doctor
    shown = b.box.systemctl("show", "-p", "WatchdogUSec,StatusText,Type", LISTEN).stdout
    assert "WatchdogUSec=30s" in shown and "Type=notify" in shown
    b.box.wait_for(
        lambda: (
            f"StatusText=listening to {hosts.url.split('host=')[1]}"
            in b.box.systemctl("show", "-p", "StatusText", LISTEN).stdout
        ),
        what="the listener's status",
    )


def test_a_task_added_on_another_host_starts_here_without_the_timer(hosts: Hosts) -> None:
    b = hosts.b
    b.box.systemctl("stop", "fleet-claim.timer")
    b.idle()
    task_id = hosts.add("echo started on B")
    assert b.wait(task_id) == 0
    (attempt,) = b.show(task_id)["attempt_log"]
    assert attempt["owner"] == HOST_B and attempt["outcome"] == "success"
    # The listener ran the pass that claimed it itself (no fleet-claim.service start first).
    (claimed,) = b.box.journal(f"FLEET_TASK_ID={task_id}", "FLEET_ACTION=claimed")
    assert claimed["_SYSTEMD_UNIT"] == LISTEN and claimed["SYSLOG_IDENTIFIER"] == "fleet-claim"
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


def inotify_open(pid: int) -> bool:
    """Whether process `pid` has an inotify instance open (it sleeps on a watch from now on)."""
    with suppress(OSError):
        fds = os.listdir(f"/proc/{pid}/fd")
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify" for fd in fds)
    return False


def test_waiting_on_another_hosts_work_wakes_through_this_hosts_listener(hosts: Hosts) -> None:
    """Host A runs a listener of its own (outside any systemd): its `fleet wait` sleeps on A's
    fleet.lock, which only A's listener touches when B's attempt ends."""
    env = {**os.environ, "FLEET_HOME": str(hosts.a_home), "FLEET_STORE": hosts.url}
    go = hosts.b.project / "go"
    task_id = hosts.add(f"while [ ! -e {go} ]; do sleep 0.1; done")  # creates A's fleet.lock
    hosts.b.wait_running(task_id)
    with (hosts.a_home / "listen.err").open("wb") as err:
        listener = subprocess.Popen([fleet_exe("fleet-listen")], env=env, stderr=err)
    waiter = subprocess.Popen([fleet_exe(), "wait", task_id, "--timeout", "60"], env=env)
    try:
        wait_for(
            lambda: "listening to" in (hosts.a_home / "listen.err").read_text(),
            30,
            "A's listener listening",
        )
        wait_for(lambda: inotify_open(waiter.pid), 30, "fleet wait asleep on A")
        go.touch()
        assert waiter.wait(timeout=60) == 0
        assert hosts.b.show(task_id)["status"] == "done"
    finally:
        go.touch()
        for process in (waiter, listener):
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=30)


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


def test_a_cancel_on_another_host_stops_the_agent_here_too(hosts: Hosts) -> None:
    b = hosts.b
    task_id = running_on_b(hosts, "7104")
    hosts.a("cancel", task_id, "--reason", "not needed")
    assert b.wait(task_id) == 1
    assert b.show(task_id)["status"] == "cancelled"
    assert b.box.run("pgrep", "-f", "sleep 7104", check=False).stdout == ""
    b.box.wait_for(lambda: unit_empty(b.box, task_id), what=f"{task_id}'s cgroup empty")


def test_a_suspend_on_another_host_stops_the_agent_here_and_keeps_it_suspended(
    hosts: Hosts,
) -> None:
    b = hosts.b
    task_id = running_on_b(hosts, "7105")
    assert hosts.a("suspend", task_id, "--summary", "later").stdout.strip() == "1"
    assert b.show(task_id)["claimed_by"] is None  # waited for: the attempt has ended
    assert b.show(task_id)["status"] == "suspended"
    assert b.box.run("pgrep", "-f", "sleep 7105", check=False).stdout == ""
    b.box.wait_for(lambda: unit_empty(b.box, task_id), what=f"{task_id}'s cgroup empty")


def test_a_message_from_another_host_rings_the_agents_mail_here(hosts: Hosts) -> None:
    """Claude Code's hook hands an agent its messages between tool calls only once `.mail`
    is there (fleet.coordination): the sender's host cannot make it, B's listener does,
    and a message sent while the listener was down is rung when it is back."""
    b = hosts.b
    task_id = running_on_b(hosts, "7106")
    mail = b.home / "tasks" / task_id / ".mail"
    hosts.a("message", task_id, "look at the logs first")
    b.box.wait_for(mail.exists, what="the message's .mail on B")
    mail.unlink()  # as the hook does before it delivers
    b.box.systemctl("stop", LISTEN)
    hosts.a("message", task_id, "and at the config")
    assert not mail.exists()
    b.box.systemctl("start", LISTEN)
    b.box.wait_for(mail.exists, what="the catch-up's .mail on B")
    assert [m["text"] for m in json.loads(hosts.a("messages", task_id, "--json").stdout)] == [
        "look at the logs first",
        "and at the config",
    ]
    hosts.a("kill", task_id)


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
    hosts.a("message", sleeping, "from afar")
    mail = b.home / "tasks" / sleeping / ".mail"
    b.box.wait_for(mail.exists, what="the message's .mail, rung by a renewal")
    assert hosts.a("kill", sleeping).returncode == 0
    assert_killed(hosts, sleeping, "7103")


# ---------------------------------------------------------------------- without systemd


@pytest.fixture
def url(pg_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    found = str(pg_cluster.new_database())
    monkeypatch.setenv("FLEET_STORE", found)
    return found


def backends(url: str, application: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database()",
            (application,),
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_listener_whose_server_goes_silent_reconnects_and_catches_up(
    url: str, home: Path, tmp_path: Path
) -> None:
    """The server process of the listener's connection is frozen (SIGSTOP): no error, no
    notification, the socket open. The keepalive's echo does not come back, the listener
    cuts the connection and reconnects, and an answer given meanwhile reaches the task."""
    import signal

    from fleet.audit import Actor
    from fleet.host import owner
    from fleet.paths import resolve
    from fleet.store import open_store

    store = open_store(resolve(), Actor("test", "test"))
    (task,) = store.add([TaskSpec(title="asks", cwd=str(tmp_path))])
    claimed = store.claim_task(task.id, owner(), 60, "command", None)
    assert claimed is not None
    q = store.ask(task.id, QuestionKind.INPUT, "Still there?", (), False, iso(time.time() + 600))
    sentinel = home / "tasks" / task.id / ".question"
    sentinel.parent.mkdir(parents=True)
    log = tmp_path / "listen.err"
    with log.open("wb") as err:
        listener = subprocess.Popen([fleet_exe("fleet-listen")], stderr=err)
    try:
        wait_for(lambda: len(backends(url, "fleet-listen")) == 1, 30, "the listener connected")
        wait_for(lambda: "listening to" in log.read_text(), 30, "the listener listening")
        (frozen,) = backends(url, "fleet-listen")
        os.kill(frozen, signal.SIGSTOP)
        try:
            store.answer(q.id, "person", "yes")  # notifies a connection that cannot hear it
            wait_for(
                lambda: any(p != frozen for p in backends(url, "fleet-listen")),
                30,
                "a new connection",
            )
        finally:
            os.kill(frozen, signal.SIGCONT)
        wait_for(sentinel.exists, 30, "the answer rung by the catch-up")
        said = log.read_text()
        assert f"no answer from the server within {PING_TIMEOUT_S:g} s" in said, said
    finally:
        listener.terminate()
        listener.wait(timeout=30)
        store.close()


@pytest.fixture
def ear(url: str) -> Iterator[Callable[[], list[str]]]:
    """What the store's channel carries: every payload sent since the last call, in order."""
    with (
        psycopg.connect(url, autocommit=True) as listening,
        psycopg.connect(url, autocommit=True) as marker,
    ):
        listening.execute(f"LISTEN {pgnotify.CHANNEL}".encode())

        def heard() -> list[str]:
            # Notifications arrive in commit order: whatever came before was sent before it.
            marker.execute(b"SELECT pg_notify(%s, 'end')", (pgnotify.CHANNEL,))
            got: list[str] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for n in listening.notifies(timeout=deadline - time.monotonic(), stop_after=1):
                    if n.payload == "end":
                        return got
                    got.append(n.payload)
            raise AssertionError(f"no end marker; heard {got}")

        yield heard


def test_the_triggers_notify_what_another_host_acts_on_and_only_once_committed(
    url: str, tmp_path: Path, ear: Callable[[], list[str]]
) -> None:
    from fleet.audit import Actor
    from fleet.paths import resolve
    from fleet.store import open_store

    with psycopg.connect(url) as writer:
        writer.execute(
            "INSERT INTO tasks (id, title, cwd, created_at, updated_at)"
            " VALUES ('fl-zzzzzz', 'never', '/', '', '')"
        )
        writer.rollback()
    assert ear() == []
    store = open_store(resolve(), Actor("test", "test"))
    try:
        added = store.add([TaskSpec(title=f"t{n}", cwd=str(tmp_path)) for n in range(3)])
        assert ear() == ["ready"]  # one transaction: one notification for all three
        first, second = store.claim(2, "host-1", 60, "command", None)
        store.renew(first.id, "host-1", 60, first.attempts)
        assert ear() == []  # the hot paths send nothing
        store.set_gate("pause", None, "lunch")
        assert ear() == []  # a gate that closes makes nothing startable
        store.clear_gate("pause")
        assert ear() == ["ready"]
        q = store.ask(first.id, QuestionKind.INPUT, "Go?", (), False, iso(time.time() + 600))
        assert ear() == ["changed"]  # watchers everywhere look again
        store.answer(q.id, "person", "go")
        assert ear() == [f"answer host-1 {first.id}"]
        store.send_messages([second.id, first.id], "look at the logs", "person", None)
        assert ear() == [f"mail host-1 {second.id}", f"mail host-1 {first.id}"]
        unclaimed = next(t for t in added if t.id not in (first.id, second.id))
        asked = store.request_kill([second.id, unclaimed.id, first.id])
        assert asked == sorted([(first.id, "host-1"), (second.id, "host-1")])
        assert ear() == [f"kill host-1 {' '.join(sorted([first.id, second.id]))}"]
        assert store.kill_requested(first.id, first.attempts)
        assert not store.kill_requested(unclaimed.id, 0)
        store.release(first.id, "host-1", AttemptEnd("killed"), attempt=first.attempts)
        assert ear() == ["ready", "changed"]
        store.block(second.id, "a person says so")
        assert ear() == ["changed"]
    finally:
        store.close()


def test_many_ids_go_in_several_payloads_each_below_the_bound(
    url: str, ear: Callable[[], list[str]]
) -> None:
    ids = [f"fl-{n:06d}" for n in range(2000)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT fleet_notify('kill', 'host-1', %s)", (ids,))
    payloads = ear()
    assert len(payloads) > 1
    assert all(len(p.encode()) <= pgnotify.BATCH_BYTES for p in payloads)
    notes = [pgnotify.parse(p) for p in payloads]
    assert all(n is not None and (n.kind, n.host) == ("kill", "host-1") for n in notes)
    assert [i for n in notes if n is not None for i in n.ids] == ids


def test_the_listener_rings_only_well_formed_ids_of_its_own_host(home: Path, url: str) -> None:
    from fleet.host import owner
    from fleet.listen import Listener
    from fleet.paths import resolve

    paths = resolve()
    mine, other = home / "tasks" / "fl-aaaaaa", home / "tasks" / "fl-bbbbbb"
    mine.mkdir(parents=True)
    other.mkdir(parents=True)
    (home / "tasks" / "fl-aaaaaa" / "x").mkdir()
    listener = Listener(paths, url)
    me = owner()
    listener.act(
        [
            f"kill {me} fl-aaaaaa/x ../fl-bbbbbb fl-a",  # no file but a task's own
            "kill another-host fl-bbbbbb",  # not ours to stop
            "hello",  # not fleet's
            f"answer {me} fl-aaaaaa",
            f"mail {me} fl-aaaaaa",
            "mail another-host fl-bbbbbb",  # its agent is not here
        ]
    )
    assert not (mine / ".kill").exists() and not (mine / "x" / ".kill").exists()
    assert not (other / ".kill").exists()
    assert (mine / ".question").exists()
    assert (mine / ".mail").exists() and not (other / ".mail").exists()
    assert not (home / "wake" / "poke").exists()
    listener.act([f"kill {me} fl-aaaaaa", "ready"])
    assert (mine / ".kill").exists() and (home / "wake" / "poke").exists()
