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
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.events import MSG_ENDED
from tests import sandbox
from tests.conftest import fleet_exe
from tests.journalrig import UPLOAD, Remote, free_port, in_central, make_journal_readable
from tests.sandbox import PATH, Sandbox, wait_for
from tests.test_journal import CLOSE, Fleet, replay

systemd = sandbox.systemd

FLEET = fleet_exe()


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
        60,
        "the attempt's end in the central journal",
    )

    # This host's own journal has none of it: without journal_dir, fleet logs says where it is.
    alone = elsewhere(fleet, "logs", task_id, journal_dir=None, check=False)
    assert (alone.returncode, alone.stdout) == (3, ""), alone
    assert alone.stderr.splitlines()[0] == (
        f"fleet: error: this host's journal holds no entries of task {task_id}: it ran on host-a"
    )
    # With journal_dir, the same transcript as on the host that ran it, entry for entry.
    here = fleet("logs", task_id, "--json").stdout.splitlines()
    there = elsewhere(fleet, "logs", task_id, "--json", journal_dir=remote.output)
    assert there.stdout.splitlines() == here
    records = [json.loads(line) for line in there.stdout.splitlines()]
    assert [r["message"] for r in records if r["event"] == "tool_call"] == ["→ Bash: make test"]
    assert {r["attempt"] for r in records if "attempt" in r} == {1}
    # The unit's journal too, PID 1's lines about it included, as `journalctl -u` reads it.
    unit = f"fleet-task@{task_id}.service"
    central = sandbox.run(
        ["journalctl", f"--directory={remote.output}", "--no-pager", "-o", "cat", "-u", unit]
    ).stdout.splitlines()
    # (PID 1 may write its last lines about the unit after the upload: compared up to there.)
    assert central == fleet.unit_lines(task_id)[: len(central)]
    assert f"Started {unit} - fleet task {task_id}." in central
    reaped = f"{task_id}: success → done"  # fleet-reap's line, written before the task settled
    assert any(line.startswith(reaped) for line in central), central
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
    rows = json.loads(fleet("doctor", "--system", "--json", check=False).stdout)
    [row] = [r for r in rows if r["check"] == "journal-upload"]
    assert row["ok"], row
    assert row["detail"] == f"systemd-journal-upload.service active, sending to {remote.url}"

    project = fleet.project("live")
    lines = ({"event": "text", "text": f"live line {n}"} for n in range(1, 201))
    task_id = fleet.add(project, replay(project / "live.jsonl", *lines, CLOSE))
    env = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(fleet.home)}
    env["FLEET_JOURNAL_DIR"] = str(remote.output)
    with subprocess.Popen(
        [FLEET, "logs", "-f", task_id], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
    ) as follow:
        try:
            got = read_until(follow, "attempt 1 ended: success", 120)
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
        120,
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


sandbox_factory = sandbox.sandbox_factory


def test_one_task_run_on_two_hosts_reads_as_one_transcript(
    remote: Remote, sandbox_factory: Any, pg_cluster: Any, tmp_path: Path
) -> None:
    """Two hosts on one PostgreSQL queue, both uploading: attempt 1 of a task on host-b,
    attempt 2 on host-c, and `fleet logs` on a third host shows both, in order, by attempt."""
    url = pg_cluster.new_database()
    hosts = {}
    for name in ("host-b", "host-c"):
        box = sandbox_factory()
        box.run("hostname", name)
        make_journal_readable(box)
        home = tmp_path / name
        env = {"FLEET_HOME": str(home)}
        box.run(FLEET, "config", "set", f"store={url}", "default_coder=replay", env=env)
        hosts[name] = (box, env)
    b, b_env = hosts["host-b"]
    c, c_env = hosts["host-c"]
    b.run(FLEET, "setup", "--system", "--journal-upload", remote.url, env=b_env)

    project = tmp_path / "project"
    project.mkdir()
    # Blocked where it first runs (host-b), closed on host-c.
    script = (
        'echo "working on $(hostname)"; if [ "$(hostname)" = host-c ];'
        ' then fleet close "$FLEET_TASK_ID"; else fleet block "$FLEET_TASK_ID" -r "not here"; fi'
    )
    name = replay(project / "s.jsonl", {"run": ["sh", "-c", script]})
    add = ("add", "t", "--cwd", str(project), "-d", name)
    task_id = b.run(FLEET, *add, env=b_env).stdout.strip()

    def status() -> tuple[str, int]:
        shown = json.loads(b.run(FLEET, "show", task_id, "--json", env=b_env).stdout)
        return shown["status"] if shown["claimed_by"] is None else "claimed", shown["attempts"]

    wait_for(lambda: status() == ("blocked", 1), 120, "attempt 1 on host-b to block the task")
    wait_for(lambda: in_central(remote, task_id, f"MESSAGE_ID={MSG_ENDED}") == 1, 120, "upload")
    # host-b claims no more (its fleet-listen runs dispatch passes too, so it stops as well);
    # host-c joins and takes the task up again.
    b.systemctl(
        "stop", "fleet-claim.path", "fleet-claim.timer", "fleet-claim.service", "fleet-listen"
    )
    c.run(FLEET, "setup", "--system", "--journal-upload", remote.url, env=c_env)
    c.run(FLEET, "retry", task_id, env=c_env)
    wait_for(lambda: status() == ("done", 2), 120, "attempt 2 on host-c to close the task")
    wait_for(lambda: in_central(remote, task_id, f"MESSAGE_ID={MSG_ENDED}") == 2, 120, "upload")

    reader = tmp_path / "host-d"  # a host of its own: the same store, none of the journals
    env = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(reader), "FLEET_STORE": url}
    env["FLEET_JOURNAL_DIR"] = str(remote.output)
    out = sandbox.run([FLEET, "logs", task_id, "--json"], env=env).stdout
    records = [json.loads(line) for line in out.splitlines()]
    worked = [(r["attempt"], r["message"]) for r in records if r["message"].startswith("working")]
    assert worked == [(1, "working on host-b"), (2, "working on host-c")]
    ends = [r["message"] for r in records if r["message"].startswith("attempt ")]
    assert [e.split(":")[0] for e in ends] == [
        "attempt 1 started",
        "attempt 1 ended",
        "attempt 2 started",
        "attempt 2 ended",
    ]
    second = sandbox.run([FLEET, "logs", task_id, "--attempt", "2"], env=env).stdout
    assert "working on host-c" in second and "host-b" not in second
