"""Transcripts across hosts: a task runs in a sandbox (one host), its journal goes to a real
systemd-journal-remote on 127.0.0.1 by systemd-journal-upload, and `fleet logs` outside the
sandbox (another host, whose own journal never saw the task) reads it from journal_dir.

The central server is systemd 252's own journal-remote, over plain HTTP on a free port, with
its --output in a temporary directory: what fleet(1) documents, less TLS.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet.events import MSG_ENDED
from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import PATH, Sandbox, wait_for
from tests.test_journal import CLOSE, Fleet, replay

systemd = sandbox.systemd

REMOTE = "/lib/systemd/systemd-journal-remote"
UPLOAD = "/lib/systemd/systemd-journal-upload"
FLEET = fleet_exe()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Remote:
    """A running systemd-journal-remote: where it listens, and where it writes."""

    port: int
    output: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [REMOTE, f"--listen-http=127.0.0.1:{self.port}", f"--output={self.output}/"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc
        wait_for(lambda: listening(self.port) or proc.poll() is not None, 30, "journal-remote")
        assert proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    base = tmp_path_factory.mktemp("remote")
    (base / "journal").mkdir()
    server = Remote(free_port(), base / "journal", base / "remote.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(systemd: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    base = tmp_path_factory.mktemp("host-a")
    # Its own name, as another machine has (the sandbox's UTS namespace is its own).
    systemd.run("hostname", "host-a")
    installed = Fleet(systemd, base / "home", base)
    installed("config", "set", "default_coder=replay")
    installed("setup", "--system")
    return installed


def elsewhere(
    fleet: Fleet, *args: str, journal_dir: Path | None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`fleet ARGS` on another host: outside the sandbox, whose journal is not this one."""
    env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root", "FLEET_HOME": str(fleet.home)}
    if journal_dir is not None:
        env["FLEET_JOURNAL_DIR"] = str(journal_dir)
    return sandbox.run([FLEET, *args], env=env, check=check)


def dashboard_backlog(fleet: Fleet, task_id: str, journal_dir: Path) -> list[dict[str, object]]:
    """What the dashboard's task panel shows first, from a dashboard on another host."""
    code = (
        "import json, sys\n"
        "from fleet.paths import resolve\n"
        "from fleet.web.transcript import backlog\n"
        "records, _, _ = backlog(resolve(), sys.argv[1])\n"
        "for r in records:\n"
        "    r.pop('cursor', None)\n"
        "    print(json.dumps(r, ensure_ascii=False))\n"
    )
    env = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(fleet.home)}
    env["FLEET_JOURNAL_DIR"] = str(journal_dir)
    out = sandbox.run([sys.executable, "-c", code, task_id], env=env).stdout
    return [json.loads(line) for line in out.splitlines()]


def upload_once(box: Sandbox, remote: Remote) -> None:
    """What the host's journal holds, sent to the server once (--follow=no: then it exits)."""
    box.run(UPLOAD, f"--url={remote.url}", "--follow=no")


def in_central(remote: Remote, task_id: str, *matches: str) -> int:
    out = sandbox.run(
        ["journalctl", f"--directory={remote.output}", "-o", "json", "--no-pager",
         f"FLEET_TASK_ID={task_id}", *matches],
    ).stdout  # fmt: skip
    return len(out.splitlines())


def test_fleet_logs_on_another_host_reads_the_uploaded_transcript(
    fleet: Fleet, remote: Remote
) -> None:
    project = fleet.project("uploaded")
    name = replay(
        project / "session.jsonl",
        {"event": "text", "text": "reading the code on host A"},
        {"event": "tool_call", "tool": "Bash", "text": "make test"},
        {"event": "tool_result", "text": "42 passed"},
        CLOSE,
        {"event": "result", "text": "done on host A"},
    )
    task_id = fleet.add(project, name)
    fleet.finish(task_id)
    upload_once(fleet.box, remote)
    wait_for(
        lambda: in_central(remote, task_id, f"MESSAGE_ID={MSG_ENDED}") == 1,
        30,
        "the attempt's end in the central journal",
    )

    # This host's own journal has none of it: without journal_dir there is nothing to show.
    assert (
        "reading the code on host A"
        not in elsewhere(fleet, "logs", task_id, journal_dir=None, check=False).stdout
    )
    # With journal_dir, the same transcript as on the host that ran it, entry for entry.
    here = fleet("logs", task_id, "--json").stdout.splitlines()
    there = elsewhere(fleet, "logs", task_id, "--json", journal_dir=remote.output)
    assert there.stdout.splitlines() == here
    records = [json.loads(line) for line in there.stdout.splitlines()]
    assert [r["message"] for r in records if r["event"] == "tool_call"] == ["→ Bash: make test"]
    assert {r["attempt"] for r in records if "attempt" in r} == {1}
    # The dashboard's task panel reads the same files.
    panel = dashboard_backlog(fleet, task_id, remote.output)
    assert [json.dumps(r, ensure_ascii=False) for r in panel] == here
    # The task's matches work against the remote files too: an attempt, the last lines.
    assert (
        elsewhere(
            fleet, "logs", task_id, "--attempt", "1", journal_dir=remote.output
        ).stdout.splitlines()
        == fleet("logs", task_id, "--attempt", "1").stdout.splitlines()
    )
    last = elsewhere(fleet, "logs", task_id, "-n", "1", journal_dir=remote.output).stdout
    assert last.splitlines() == fleet("logs", task_id, "-n", "1").stdout.splitlines()
    assert len(last.splitlines()) == 1


def test_fleet_logs_says_when_journal_dir_has_nothing_for_the_task(
    fleet: Fleet, remote: Remote, tmp_path: Path
) -> None:
    project = fleet.project("not-uploaded")
    task_id = fleet.add(project, replay(project / "s.jsonl", {"event": "text", "text": "x"}, CLOSE))
    fleet.finish(task_id)  # and never uploaded
    done = elsewhere(fleet, "logs", task_id, journal_dir=remote.output, check=False)
    assert done.returncode == 3, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"fleet: error: journal_dir {remote.output} holds no entries of task {task_id},"
        " which ran on host-a"
    ), done.stderr
    assert lines[1].startswith("fleet: hint: the host that ran it uploads its journal")
    assert len(lines) == 2

    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (("logs", task_id), ("logs", "-f", task_id)):
        done = elsewhere(fleet, *args, journal_dir=empty, check=False)
        assert done.returncode == 3, done
        assert done.stderr.splitlines()[0] == (
            f"fleet: error: journal_dir {empty} holds no journal files: no host has uploaded"
            " to it yet"
        )

    missing = tmp_path / "nowhere"
    done = elsewhere(fleet, "logs", task_id, journal_dir=missing, check=False)
    assert done.returncode == 5, done
    assert done.stderr.splitlines()[0] == f"fleet: error: journal_dir {missing} is not a directory"


def read_until(proc: subprocess.Popen[bytes], wanted: str, timeout: float) -> list[str]:
    """Lines of a running `fleet logs -f` until one contains `wanted` (or the deadline)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer = b""
    while True:
        lines = buffer.decode(errors="replace").splitlines()
        if any(wanted in line for line in lines):
            return lines
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sel.select(remaining):
            raise TimeoutError(f"no {wanted!r} in `fleet logs -f` after {timeout:g} s: {lines}")
        chunk = os.read(proc.stdout.fileno(), 1 << 16)
        if not chunk:
            raise AssertionError(f"fleet logs -f ended before {wanted!r}: {lines}")
        buffer += chunk


def make_journal_readable(box: Sandbox) -> None:
    """What systemd-tmpfiles does at a real boot and the sandbox skips: the journal's files
    belong to group systemd-journal, whose members (the uploader) may read them."""
    box.run(
        "sh", "-c",
        "chgrp -R systemd-journal /run/log/journal"
        " && find /run/log/journal -type d -exec chmod g+rxs {} +",
    )  # fmt: skip


def test_setup_journal_upload_streams_a_running_task_to_fleet_logs_follow(
    fleet: Fleet, remote: Remote
) -> None:
    make_journal_readable(fleet.box)
    out = fleet("setup", "--system", "--journal-upload", remote.url).stdout
    assert f"systemd-journal-upload.service sends this host's journal to {remote.url}" in out
    shown = fleet.box.systemctl(
        "show", "-p", "Restart,ActiveState", "systemd-journal-upload.service"
    ).stdout
    assert shown.split() == ["Restart=always", "ActiveState=active"], shown
    conf = fleet.box.run("cat", "/etc/systemd/journal-upload.conf.d/fleet.conf").stdout
    assert f"URL={remote.url}\n" in conf
    # A later run without the option keeps it.
    fleet("setup", "--system")
    assert fleet.box.systemctl("is-active", "systemd-journal-upload.service").stdout == "active\n"

    project = fleet.project("live")
    lines = ({"event": "text", "text": f"live line {n}"} for n in range(1, 201))
    task_id = fleet.add(project, replay(project / "live.jsonl", *lines, CLOSE))
    env = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(fleet.home)}
    env["FLEET_JOURNAL_DIR"] = str(remote.output)
    with subprocess.Popen(
        [FLEET, "logs", "-f", task_id], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
    ) as follow:
        try:
            got = read_until(follow, "attempt 1 ended: success", 60)
        finally:
            follow.terminate()
    texts = [line.split(None, 3)[-1] for line in got]
    assert [t for t in texts if t.startswith("live line")] == [
        f"live line {n}" for n in range(1, 201)
    ]
    fleet.finish(task_id)

    # The uploader exits when the server is gone (systemd#2877); fleet's drop-in starts it
    # again, and it goes on from its saved cursor once the server is back.
    remote.stop()
    later = fleet.project("after-outage")
    second = fleet.add(later, replay(later / "s.jsonl", {"event": "text", "text": "later"}, CLOSE))
    fleet.finish(second)
    remote.start()
    wait_for(
        lambda: in_central(remote, second, f"MESSAGE_ID={MSG_ENDED}") == 1,
        60,
        "the upload to resume after journal-remote came back",
    )
    assert in_central(remote, task_id, "FLEET_EVENT=text") == 200  # nothing sent twice
    assert "later" in elsewhere(fleet, "logs", second, journal_dir=remote.output).stdout

    # Uninstalled with fleet's units: the uploader stops, and both files go.
    fleet("setup", "--system", "--uninstall")
    state = fleet.box.systemctl("is-active", "systemd-journal-upload.service", check=False)
    assert state.stdout.strip() == "inactive"
    for path in (
        "/etc/systemd/journal-upload.conf.d/fleet.conf",
        "/etc/systemd/system/systemd-journal-upload.service.d/fleet.conf",
    ):
        assert fleet.box.run("test", "-e", path, check=False).returncode == 1, path


def test_journal_upload_needs_system_scope_and_a_url(tmp_path: Path) -> None:
    env = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(tmp_path / "home")}
    shown = sandbox.run(
        [FLEET, "setup", "--system", "--dry-run", "--journal-upload", "https://central:19532"],
        env=env,
    ).stdout
    assert "# /etc/systemd/journal-upload.conf.d/fleet.conf\n" in shown
    assert "[Upload]\nURL=https://central:19532\n" in shown
    assert "[Service]\nRestart=always\nRestartSec=10s\n" in shown
    user = sandbox.run(
        [FLEET, "setup", "--user", "--journal-upload", "http://central:19532"], env=env, check=False
    )
    assert user.returncode == 2
    assert user.stderr.splitlines()[0] == (
        "fleet: error: --journal-upload needs --system: systemd-journal-upload is a system service"
    )
    bad = sandbox.run(
        [FLEET, "setup", "--system", "--journal-upload", "central:19532"], env=env, check=False
    )
    assert bad.returncode == 2
    assert "is not the URL of a systemd-journal-remote" in bad.stderr.splitlines()[0]
    assert not (tmp_path / "home" / "setup.json").exists()  # nothing was set up
