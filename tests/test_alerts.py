"""Notifications: the command hook, the webhook, notify-send, and where fleet fires them.

Everything runs for real: hooks are shell commands, the webhook receiver is an HTTP server on
127.0.0.1 in a thread, notify-send talks to a private session bus (dbus-daemon) on which a small
receiver owns org.freedesktop.Notifications, and the "failed" notification of a task under a
real systemd (tests/sandbox.py) is delivered after the task's unit is gone.
`deliver` is exercised in-process where a test needs to know that the delivery has ended;
`fire` (detached delivery) where it matters that the caller does not wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet import alerts, reap
from fleet.config import Config, load
from fleet.model import Status, Task, TaskSpec
from fleet.paths import Paths, resolve
from fleet.store import open_store
from tests import sandbox
from tests.conftest import Fleet, fleet_run
from tests.sandbox import Sandbox, wait_for
from tests.test_systemd import Fleet as UnitFleet

systemd = sandbox.systemd
HANG = 0  # an answer that never comes
DEBIAN_PYTHON = "/usr/bin/python3"  # has python3-dbus and python3-gi (see .ci/run)


# ---------------------------------------------------------------------- helpers


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        obj = json.loads(self.body)
        assert isinstance(obj, dict)
        return obj


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every POST and answers each with the next
    status of `answers` (the last one repeats); HANG never answers."""

    def __init__(self, answers: Sequence[int]) -> None:
        self.answers = list(answers)
        self.seen: list[Seen] = []
        self.changed = threading.Condition()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.changed:
                    n = len(receiver.seen)
                    receiver.seen.append(Seen(self.path, dict(self.headers.items()), body))
                    receiver.changed.notify_all()
                answer = receiver.answers[min(n, len(receiver.answers) - 1)]
                if answer == HANG:
                    receiver.release.wait()
                    return
                self.send_response(answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook/s3cret-token"

    def wait(self, count: int, timeout: float = 30) -> list[Seen]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.seen) >= count, timeout):
                raise TimeoutError(f"{len(self.seen)} of {count} requests after {timeout} s")
            return list(self.seen)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*answers: int) -> Receiver:
        made.append(Receiver(answers or (200,)))
        return made[-1]

    yield make
    for r in made:
        r.close()


def configured(*settings: str) -> tuple[Paths, Config]:
    paths = resolve()
    return paths, load(paths, settings)


def a_task(project: Path, title: str = "fix the flaky test") -> Task:
    store = open_store(resolve())
    try:
        (task,) = store.add([TaskSpec(title, str(project))])
        return task
    finally:
        store.close()


def notifiers(
    command: str = "", webhook: str = "", desktop: bool = False, timeout: int = 5, retries: int = 0
) -> alerts.Notifiers:
    return alerts.Notifiers(command, webhook, desktop, timeout, retries)


@contextlib.contextmanager
def stderr_into(path: Path) -> Iterator[None]:
    """Our file descriptor 2 is `path` meanwhile: what a detached delivery inherits."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def deliveries(home: Path) -> list[int]:
    """Processes delivering a notification of this FLEET_HOME (their argv names its spool)."""
    spool = str(home / alerts.SPOOL).encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if spool in Path(f"/proc/{name}/cmdline").read_bytes() and alive(int(name)):
                    found.append(int(name))
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def hook_writing(directory: Path, prefix: str = "") -> str:
    """A notify_command that saves its FLEET_NOTIFY_* variables and its standard input as
    DIR/EVENT.env and DIR/EVENT.json (each written whole: temp file, then rename)."""
    d = shlex.quote(str(directory))
    return (
        f"{prefix}"
        f'e={d}/"$FLEET_NOTIFY_EVENT"; env | grep ^FLEET_NOTIFY_ | sort > "$e.env.tmp"; '
        f'cat > "$e.json.tmp"; mv "$e.env.tmp" "$e.env"; mv "$e.json.tmp" "$e.json"'
    )


def saved(directory: Path, event: str, timeout: float = 30) -> tuple[dict[str, Any], str]:
    path = directory / f"{event}.json"
    wait_for(path.exists, timeout, f"the hook to save {path}")
    obj = json.loads(path.read_text())
    assert isinstance(obj, dict)
    return obj, (directory / f"{event}.env").read_text()


# ---------------------------------------------------------------------- the event


def test_the_event_has_the_task_and_the_extras_clipped_and_redacted(project: Path) -> None:
    task = a_task(project)
    key = "sk-ant-api03-" + "x" * 40
    obj = alerts.make_event(
        "question", f"asks with {key}", task, question="q" * 9000, options=["a", "b"]
    )
    assert obj["event"] == "question" and obj["message"] == "asks with [REDACTED]"
    assert (obj["task"], obj["title"], obj["status"]) == (task.id, task.title, "ready")
    assert obj["reason"] is None and obj["options"] == ["a", "b"] and obj["host"]
    assert len(obj["question"]) == alerts.MAX_TEXT and obj["question"].endswith("…")
    assert obj["time"].endswith("Z")
    assert alerts.summary(obj) == f"fleet: question on {task.id}: fix the flaky test"


# ---------------------------------------------------------------------- fire


def test_the_command_hook_gets_variables_and_json(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    task = a_task(project)
    paths, config = configured(f"notify_command={hook_writing(out)}", "notify_desktop=false")
    alerts.fire(
        paths,
        config,
        "question",
        f"{task.id} asks: which database?",
        task=task,
        question="which database?",
        kind="choice",
        options=["postgres", "sqlite"],
    )
    obj, env = saved(out, "question")
    assert obj == {
        **obj,
        "event": "question",
        "message": f"{task.id} asks: which database?",
        "task": task.id,
        "title": "fix the flaky test",
        "status": "ready",
        "question": "which database?",
        "kind": "choice",
        "options": ["postgres", "sqlite"],
    }
    assert env.splitlines() == [
        "FLEET_NOTIFY_EVENT=question",
        f"FLEET_NOTIFY_MESSAGE={task.id} asks: which database?",
        "FLEET_NOTIFY_QUESTION=which database?",
        f"FLEET_NOTIFY_TASK={task.id}",
        "FLEET_NOTIFY_TITLE=fix the flaky test",
    ]
    wait_for(lambda: not deliveries(paths.home), 30, "the delivery to end")
    assert not list((paths.home / alerts.SPOOL).iterdir())  # the event file was consumed


def test_the_webhook_receives_the_event_json(
    project: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    hook = receiver(200)
    task = a_task(project)
    paths, config = configured(f"notify_webhook={hook.url}", "notify_desktop=false")
    alerts.fire(paths, config, "blocked", f"{task.id} is blocked", task=task, outcome="noclose")
    (seen,) = hook.wait(1)
    assert seen.path == "/hook/s3cret-token"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["User-Agent"].startswith("fleet/")
    assert seen.event == {
        **seen.event,
        "event": "blocked",
        "task": task.id,
        "message": f"{task.id} is blocked",
        "outcome": "noclose",
    }


def test_a_hung_command_is_killed_after_the_timeout_and_fire_does_not_wait(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # The hook's child sleeps in the hook's process group: only a group kill ends it. The hook
    # cannot write its pid before the test opens the FIFO, which it does after fire returned.
    command = f"sleep 1000 & echo $! > {fifo}; wait"
    paths, config = configured(
        f"notify_command={command}", "notify_timeout_seconds=2", "notify_desktop=false"
    )
    task = a_task(project)
    log = tmp_path / "stderr"
    with stderr_into(log):
        alerts.fire(paths, config, "failed", "it failed", task=task)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = b""

    def pid_written() -> bool:
        nonlocal got
        with contextlib.suppress(BlockingIOError):
            got += os.read(reader, 64)
        return got.endswith(b"\n")

    try:
        wait_for(pid_written, 30, "the hook to write its child's pid")
    finally:
        os.close(reader)
    sleeper = int(got)  # so the hook ran on after fire had returned
    wait_for(lambda: not alive(sleeper), 30, "the hook's process group to be killed")
    wait_for(lambda: not deliveries(paths.home), 30, "the delivery to end")
    assert log.read_text().splitlines() == [
        'fleet: notify: notify_command did not deliver the "failed" notification for'
        f" {task.id}: still running after 2 s; its process group was killed"
    ]


def test_no_notifier_configured_starts_no_process(tmp_path: Path, home: Path) -> None:
    # An audit hook in a fresh interpreter sees every process fleet would start.
    program = (
        "import json, sys\n"
        "started = []\n"
        "kinds = ('subprocess.Popen', 'os.posix_spawn', 'os.fork', 'os.exec', 'os.system')\n"
        "sys.addaudithook(lambda e, a: started.append(e) if e in kinds else None)\n"
        "from fleet import alerts\n"
        "from fleet.config import load\n"
        "from fleet.paths import resolve\n"
        "paths = resolve()\n"
        "alerts.fire(paths, load(paths, sys.argv[1:]), 'finished', 'all done', tasks=[])\n"
        "print(json.dumps(started))\n"
    )

    def started(*settings: str, **env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "XDG_"))}
        done = subprocess.run(
            [sys.executable, "-c", program, *settings],
            env={**base, "FLEET_HOME": str(home), **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stderr == ""
        result = json.loads(done.stdout)
        assert isinstance(result, list)
        return result

    assert alerts.desktop_available({"PATH": os.environ["PATH"], "DBUS_SESSION_BUS_ADDRESS": "x"})
    assert started() == []  # the defaults: notify-send is there, but no session bus
    assert started("notify_desktop=false", DBUS_SESSION_BUS_ADDRESS="unix:path=/nowhere") == []
    assert not (home / alerts.SPOOL).exists()
    # The same probe does see a delivery start once a notifier is configured.
    assert started("notify_command=true", "notify_desktop=false") == ["subprocess.Popen"]


def test_a_failure_to_start_the_delivery_is_logged_not_raised(
    project: Path, tmp_path: Path, home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    task = a_task(project)
    (home / alerts.SPOOL).write_text("a file where the spool directory belongs")
    paths, config = configured("notify_command=true")
    alerts.fire(paths, config, "blocked", "blocked", task=task)
    err = capfd.readouterr().err
    assert err.startswith('fleet: notify: cannot start delivering the "blocked" notification:')
    assert f"{home / alerts.SPOOL} exists and is not a directory" in err


# ---------------------------------------------------------------------- deliver


def test_a_webhook_answering_500_twice_then_200_gets_three_requests(
    receiver: Callable[..., Receiver], capfd: pytest.CaptureFixture[str]
) -> None:
    hook = receiver(500, 500, 200)
    alerts.deliver(alerts.make_event("finished", "done"), notifiers(webhook=hook.url, retries=3))
    assert [s.event["message"] for s in hook.seen] == ["done"] * 3
    assert capfd.readouterr().err == ""  # delivered in the end: nothing to report


def test_a_webhook_refusing_with_4xx_is_not_tried_again(
    receiver: Callable[..., Receiver], capfd: pytest.CaptureFixture[str]
) -> None:
    hook = receiver(404)
    alerts.deliver(alerts.make_event("finished", "done"), notifiers(webhook=hook.url, retries=3))
    assert len(hook.seen) == 1
    port = hook.url.split(":")[2].split("/")[0]
    assert capfd.readouterr().err == (
        f"fleet: notify: notify_webhook (http://127.0.0.1:{port}) did not deliver the"
        ' "finished" notification: HTTP 404 Not Found, not tried again\n'
    )  # the URL's path (often a secret) is not logged


def test_a_webhook_that_never_answers_is_given_up_after_the_timeout(
    receiver: Callable[..., Receiver], capfd: pytest.CaptureFixture[str]
) -> None:
    hook = receiver(HANG)
    event = alerts.make_event("finished", "done")
    alerts.deliver(event, notifiers(webhook=hook.url, timeout=1, retries=1))
    assert len(hook.seen) == 2
    err = capfd.readouterr().err
    assert err.endswith('"finished" notification: no answer within 1 s (2 tries)\n'), err


def test_a_webhook_nobody_listens_on_is_retried_then_logged(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    alerts.deliver(alerts.make_event("finished", "x"), notifiers(webhook=url, retries=2))
    assert capfd.readouterr().err.endswith(": Connection refused (3 tries)\n")


def test_a_failing_command_is_logged_and_the_webhook_still_runs(
    project: Path, receiver: Callable[..., Receiver], capfd: pytest.CaptureFixture[str]
) -> None:
    hook = receiver(200)
    task = a_task(project)
    event = alerts.make_event("failed", "it failed", task)
    alerts.deliver(event, notifiers(command="echo from the hook >&2; exit 3", webhook=hook.url))
    assert len(hook.seen) == 1
    assert capfd.readouterr().err.splitlines() == [
        "from the hook",  # the hook's own output goes where the delivery logs
        f'fleet: notify: notify_command did not deliver the "failed" notification for {task.id}:'
        " exited with status 3",
    ]


def test_the_delivery_program_exits_0_when_notifiers_fail(tmp_path: Path) -> None:
    payload = {
        "event": alerts.make_event("finished", "done"),
        "notifiers": {
            "command": "exit 7",
            "webhook": "ftp://example.invalid/",
            "desktop": False,
            "timeout": 5,
            "retries": 0,
        },
    }
    done = subprocess.run(
        [sys.executable, "-m", "fleet.alerts", "-"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert sorted(done.stderr.splitlines()) == [
        'fleet: notify: notify_command did not deliver the "finished" notification:'
        " exited with status 7",
        'fleet: notify: notify_webhook (ftp://example.invalid) did not deliver the "finished"'
        " notification: not an http:// or https:// URL",
    ]


# ---------------------------------------------------------------------- notify-send

NOTIFICATION_SERVER = """
import json, sys
import dbus, dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

out, ready = sys.argv[1], sys.argv[2]
DBusGMainLoop(set_as_default=True)
bus = dbus.SessionBus()
name = dbus.service.BusName("org.freedesktop.Notifications", bus)
IFACE = "org.freedesktop.Notifications"

class Server(dbus.service.Object):
    @dbus.service.method(IFACE, in_signature="susssasa{sv}i", out_signature="u")
    def Notify(self, app, replaces, icon, summary, body, actions, hints, expire):
        with open(out, "a") as f:
            urgency = int(hints.get("urgency", -1))
            f.write(json.dumps([str(app), str(summary), str(body), urgency]) + "\\n")
        return 1

    @dbus.service.method(IFACE, out_signature="as")
    def GetCapabilities(self):
        return ["body"]

    @dbus.service.method(IFACE, out_signature="ssss")
    def GetServerInformation(self):
        return ("fleet-test", "fleet", "1", "1.2")

Server(bus, "/org/freedesktop/Notifications")
open(ready, "w").close()
GLib.MainLoop().run()
"""


@pytest.fixture
def session_bus(tmp_path: Path) -> Iterator[str]:
    """A private D-Bus session bus; its address."""
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        address = daemon.stdout.readline().strip()  # printed once it listens
        assert address.startswith("unix:"), address
        yield address
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


@pytest.fixture
def notification_server(
    session_bus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A notification server on the private bus, which is now our session bus; the file it
    appends each notification to as [app, summary, body, urgency]."""
    script, out, ready = tmp_path / "server.py", tmp_path / "notifications", tmp_path / "ready"
    script.write_text(NOTIFICATION_SERVER)
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", session_bus)
    server = subprocess.Popen(
        [DEBIAN_PYTHON, str(script), str(out), str(ready)], stdin=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: ready.exists() or server.poll() is not None, 30, "the notification server")
        assert server.poll() is None, "the notification server did not start"
        yield out
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_notify_send_delivers_to_the_session_bus(
    project: Path, notification_server: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    task = a_task(project)
    assert alerts.desktop_available()
    event = alerts.make_event("question", f"{task.id} asks: which database?", task)
    alerts.deliver(event, notifiers(desktop=True))
    (line,) = notification_server.read_text().splitlines()
    summary = f"fleet: question on {task.id}: fix the flaky test"
    assert json.loads(line) == ["fleet", summary, f"{task.id} asks: which database?", 2]
    assert capfd.readouterr().err == ""


def test_fire_reaches_the_desktop_through_a_detached_delivery(
    project: Path, notification_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    task = a_task(project)
    paths, config = configured()  # notify_desktop is on by default
    alerts.fire(paths, config, "blocked", f"{task.id} is blocked", task=task)
    wait_for(notification_server.exists, 30, "the notification")
    wait_for(lambda: not deliveries(paths.home), 30, "the delivery to end")
    app, summary, body, urgency = json.loads(notification_server.read_text())
    assert (app, summary, body, urgency) == (
        "fleet",
        f"fleet: blocked on {task.id}: fix the flaky test",
        f"{task.id} is blocked",
        1,
    )


def test_a_notify_send_failure_is_logged_and_the_others_still_run(
    project: Path,
    tmp_path: Path,
    session_bus: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A bus with no notification server on it: the real notify-send fails.
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", session_bus)
    out = tmp_path / "out"
    out.mkdir()
    task = a_task(project)
    event = alerts.make_event("failed", "it failed", task)
    alerts.deliver(event, notifiers(command=hook_writing(out), desktop=True))
    assert saved(out, "failed", timeout=1)[0]["task"] == task.id  # already there
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(
        f'fleet: notify: notify-send did not deliver the "failed" notification for {task.id}:'
        " exited with status 1: "
    )


# ---------------------------------------------------------------------- where fleet fires


def test_which_ends_of_an_attempt_notify(project: Path) -> None:
    running = a_task(project)._replace(status=Status.RUNNING)
    blocked = running._replace(status=Status.BLOCKED)
    ready = running._replace(status=Status.READY)
    assert reap.alert_event(running, blocked, "failure") == "failed"
    assert reap.alert_event(running, blocked, "timeout") == "failed"
    assert reap.alert_event(running, blocked, "noclose") == "blocked"
    assert reap.alert_event(running, blocked, "killed") is None  # a person stopped it
    assert reap.alert_event(running, ready, "failure") is None  # tried again
    assert reap.alert_event(blocked, blocked, "blocked") == "blocked"  # the agent blocked it
    assert reap.alert_event(blocked, blocked, "failure") == "blocked"
    assert reap.alert_event(running, running._replace(status=Status.DONE), "success") is None


def test_fleet_run_notifies_a_failure_for_good_and_an_agents_block(
    fleet: Fleet, project: Path, receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    hook = receiver(200)
    fleet.ok("config", "set", f"notify_webhook={hook.url}", "retry_limit=1")
    failing = fleet.add("fails", "--coder", "command", "-d", "exit 1")
    assert fleet_run(failing, project).returncode == 1
    (failed,) = hook.wait(1)
    blocks = 'fleet block "$FLEET_TASK_ID" --reason "needs the staging password"'
    blocking = fleet.add("blocks itself", "--coder", "command", "-d", blocks)
    assert fleet_run(blocking, project).returncode == 0
    blocked = hook.wait(2)[1]
    assert failed.event == {
        **failed.event,
        "event": "failed",
        "task": failing,
        "title": "fails",
        "status": "blocked",
        "reason": "failure: exit status 1 (after 1 failed attempts)",
        "outcome": "failure",
        "message": f"{failing} (fails) failed for good: failure: exit status 1"
        " (after 1 failed attempts)",
    }
    assert blocked.event == {
        **blocked.event,
        "event": "blocked",
        "task": blocking,
        "status": "blocked",
        "reason": "needs the staging password",
        "outcome": "blocked",  # its agent blocked it, then exited 0
    }


def test_fleet_wait_notifies_when_the_batch_finishes_not_on_timeout(
    fleet: Fleet, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    every = f'echo "$FLEET_NOTIFY_MESSAGE" >> {out}/every.log; '
    fleet.ok("config", "set", f"notify_command={hook_writing(out, every)}", "notify_desktop=false")
    first, second, third = (fleet.add(f"task {i}") for i in range(3))
    assert fleet("wait", first, "--timeout", "0").code == 124
    fleet.ok("close", first)
    fleet.ok("block", second, "--reason", "needs a person")
    fleet.ok("cancel", third)
    assert fleet("wait", first, second, third).code == 1
    obj, env = saved(out, "finished")
    message = "3 tasks finished: 1 done, 1 blocked, 1 cancelled"
    assert obj == {**obj, "event": "finished", "message": message, "task": None}
    assert obj["tasks"] == [first, second, third]
    assert f"FLEET_NOTIFY_TASKS={first} {second} {third}" in env.splitlines()
    wait_for(lambda: not deliveries(home), 30, "every delivery to end")
    assert (out / "every.log").read_text() == message + "\n"  # none from the timeout


@pytest.mark.parametrize(
    ("script", "outcome", "settings"),
    [
        ("echo trying; exit 1", "failure", ()),  # fleet-run settles it, in the unit
        # fleet-reap, as ExecStopPost. The agent ignores SIGTERM, so that fleet-run (which
        # leaves a stop by systemd to fleet-reap) sees its own SIGTERM before the agent's end.
        (
            'trap "" TERM; sleep 600',
            "timeout",
            ("task_timeout_seconds=1", "stop_grace_seconds=1"),
        ),
    ],
    ids=["settled-by-fleet-run", "settled-by-fleet-reap"],
)
def test_a_unit_that_fails_for_good_notifies_after_it_is_gone(
    systemd: Sandbox,
    tmp_path: Path,
    receiver: Callable[..., Receiver],
    script: str,
    outcome: str,
    settings: tuple[str, ...],
) -> None:
    hook = receiver(200)
    project = tmp_path / "project"
    project.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    # The hook waits for the task's unit to end, then records what it saw: only a delivery
    # outside that unit's cgroup lives to do so.
    outlive = (
        'u="fleet-task@$FLEET_NOTIFY_TASK"; n=0; '
        'while [ -n "$FLEET_NOTIFY_TASK" ] && [ $n -lt 200 ]; do '
        'case "$(systemctl is-active "$u")" in active|activating|deactivating|reloading) '
        "n=$((n+1)); sleep 0.05;; *) break;; esac; done; "
        '{ systemctl is-active "$u"; cat /proc/self/cgroup; } '
        f'> {out}/"$FLEET_NOTIFY_EVENT".seen; '
    )
    f = UnitFleet(systemd, tmp_path / "home", project)
    f.setup(
        "default_coder=command",
        "retry_limit=1",
        f"notify_command={hook_writing(out, outlive)}",
        f"notify_webhook={hook.url}",
        "notify_timeout_seconds=30",
        *settings,
    )
    try:
        task_id = f.add(script)
        assert f.wait(task_id) == 1
        try:
            obj, env = saved(out, "failed")
        except TimeoutError as e:  # say why in the failure
            journal = systemd.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"{e}\n{f.show(task_id)}\n{journal}") from None
        assert (obj["event"], obj["task"], obj["status"]) == ("failed", task_id, "blocked")
        assert obj["outcome"] == outcome
        assert f"FLEET_NOTIFY_TASK={task_id}" in env.splitlines()
        state, *cgroups = (out / "failed.seen").read_text().splitlines()
        assert state in ("inactive", "failed")  # the unit had ended, the hook went on
        assert any("/fleet-notify-" in line for line in cgroups), cgroups
        events = {s.event["event"]: s.event for s in hook.wait(2)}
        assert events["failed"]["task"] == task_id
        assert events["finished"]["tasks"] == [task_id]  # from `fleet wait`
        warnings = systemd.run("journalctl", "-t", alerts.IDENTIFIER, "-o", "cat").stdout
        assert warnings == ""  # every notifier delivered
    finally:
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*")
        systemd.systemctl("reset-failed", check=False)
