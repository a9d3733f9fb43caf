"""What reaches systemd's notify socket: exactly the assignments fleet means (issue 11, item 5).

A status line quotes text the agent chose (the name of its last tool); with a line feed in it,
that text would be read by systemd as assignments of its own, `WATCHDOG=trigger` (the unit is
killed as hung) or `EXTEND_TIMEOUT_USEC=…` (its time limits pushed out). Checked twice: with a real
datagram socket standing in for systemd's (the runner by hand, NOTIFY_SOCKET pointing at it),
which shows every line sent; and in a unit of a sandboxed systemd, which shows what systemd
makes of them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.notify import MAX_VALUE, Notifier, assignment
from tests import sandbox
from tests.conftest import Fleet, fleet_exe
from tests.sandbox import Sandbox, wait_for

systemd = sandbox.systemd

HOSTILE = "Bash\nWATCHDOG=trigger\nEXTEND_TIMEOUT_USEC=1\r\x1b[2J\x85"
# Every line the runner may send: fleet's own assignments, with fleet's own values.
FLEET_LINE = re.compile(
    r"READY=1|STOPPING=1|WATCHDOG=1|STATUS=[^\n]*|(EXTEND_TIMEOUT_USEC|WATCHDOG_USEC)=[0-9]{6,}"
)


class Socket:
    """A notify socket in a temporary directory, with every datagram it received."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.datagrams: list[str] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.receive, daemon=True)
        self.thread.start()

    def receive(self) -> None:
        while not self.done.is_set():
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            with self.lock:
                self.datagrams.append(data.decode("utf-8"))

    def lines(self) -> list[str]:
        with self.lock:
            return [line for d in self.datagrams for line in d.split("\n")]

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[Socket]:
    found = Socket(tmp_path / "notify")
    yield found
    found.close()


def test_a_value_is_one_line_without_controls_and_clipped(notify_socket: Socket) -> None:
    notifier = Notifier(str(notify_socket.path))
    notifier.status(HOSTILE + "x" * 5000)
    notifier.send(extend_timeout_usec=300_000_000, status="ok")
    # systemd reads a backslash as escaping the next character: one that ended a value would
    # swallow the line feed, and the assignment after it with it.
    notifier.send(status="ends in \\", stopping=1)
    notifier.status("\\" * 5000)
    wait_for(lambda: len(notify_socket.datagrams) == 4, 30, "four datagrams")
    first, second, third, fourth = notify_socket.datagrams
    assert "\n" not in first and first.startswith(r"STATUS=Bash\\x0aWATCHDOG=trigger\\x0a")
    assert "\r" not in first and "\x1b" not in first and "\x85" not in first
    assert len(first) <= len("STATUS=") + MAX_VALUE and first.endswith("x…")
    assert second == "EXTEND_TIMEOUT_USEC=300000000\nSTATUS=ok"
    assert third == "STATUS=ends in " + "\\" * 2 + "\nSTOPPING=1"
    assert len(fourth) <= len("STATUS=") + MAX_VALUE and fourth.endswith("\\…")
    assert (len(fourth) - len("STATUS=…")) % 2 == 0  # never half of a doubled backslash
    with pytest.raises(ValueError, match="not a notify variable"):
        assignment("STATUS=x\nWATCHDOG", "trigger")  # a name is fleet's, never the agent's


def test_an_agents_tool_name_cannot_speak_to_systemd(
    fleet: Fleet, project: Path, home: Path, notify_socket: Socket
) -> None:
    items = [
        {"event": "session", "session": "s-1"},
        {"event": "tool_call", "tool": HOSTILE, "text": "ls"},
        {"sleep": 600},
    ]
    (project / "s.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    tid = fleet.add("hostile tool name", "--coder", "replay", "-d", "s.jsonl")
    env = {"FLEET_HOME": str(home), "NOTIFY_SOCKET": str(notify_socket.path)}
    proc = subprocess.Popen(
        [fleet_exe("fleet-run"), tid],
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        wait_for(
            lambda: any("last tool Bash" in line for line in notify_socket.lines()),
            60,
            "a status line naming the tool",
        )
        (home / "tasks" / tid / ".kill").touch()
        assert proc.wait(timeout=60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = notify_socket.lines()
    assert "READY=1" in lines and "STOPPING=1" in lines
    assert [line for line in lines if not FLEET_LINE.fullmatch(line)] == []
    named = [line for line in lines if "last tool" in line]
    assert named and all(
        r"last tool Bash\\x0aWATCHDOG=trigger\\x0aEXTEND_TIMEOUT_USEC=1\\x0d" in line
        for line in named
    )


def test_in_a_unit_a_tool_name_neither_triggers_the_watchdog_nor_extends_a_limit(
    systemd: Sandbox, tmp_path: Path
) -> None:
    home, project, go = tmp_path / "home", tmp_path / "project", tmp_path / "go"
    project.mkdir()
    env = {"FLEET_HOME": str(home)}

    def fleet(*args: str) -> subprocess.CompletedProcess[str]:
        return systemd.run(fleet_exe(), *args, env=env, check=False)

    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    items = [
        {"event": "session", "session": "s-1"},
        {"event": "tool_call", "tool": HOSTILE, "text": "ls"},
        {"run": [sys.executable, "-c", wait]},
        {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "told systemd nothing"]},
    ]
    (project / "s.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    assert (
        fleet("config", "set", "default_coder=replay", "task_timeout_seconds=600").returncode == 0
    )
    assert fleet("setup", "--system").returncode == 0
    tid = fleet("add", "hostile tool name", "--cwd", str(project), "-d", "s.jsonl").stdout.strip()
    unit = f"fleet-task@{tid}"

    def shown() -> str:
        return systemd.systemctl(
            "show", "-p", "StatusText", "-p", "Result", "-p", "ActiveState", unit, check=False
        ).stdout

    try:
        systemd.wait_for(lambda: "last tool Bash" in shown(), 60, "the status naming the tool")
        state = shown()
        # WATCHDOG=trigger would have ended the unit as a watchdog timeout by now (the same
        # datagram as the status line).
        assert "Result=success" in state and "ActiveState=active" in state, state
        # As systemd 252 reads it: each doubled backslash is one.
        assert r"last tool Bash\x0aWATCHDOG=trigger\x0aEXTEND_TIMEOUT_USEC=1" in state, state
        go.touch()
        assert fleet("wait", tid, "--timeout", "60").returncode == 0
        task = json.loads(fleet("show", tid, "--json").stdout)
        assert [a["outcome"] for a in task["attempt_log"]] == ["success"]
        assert task["reason"] == "told systemd nothing"
    finally:
        go.touch()
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", unit, check=False)
        systemd.systemctl("reset-failed", check=False)
