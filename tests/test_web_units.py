"""fleet-web.socket and fleet-web.service under a real systemd, driven from a real browser.

The sandbox of tests/sandbox.py boots systemd (sharing the network, so the host's Chromium
reaches the socket on 127.0.0.1); `fleet setup --system --web` installs the units. The agent
that asks is the real Claude Code CLI from tests/clis against the scripted Anthropic server
(tests/servers/anthropic.py), asking through fleet-ask; the one killed is the command coder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox
from tests.servers import anthropic
from tests.servers.base import serve
from tests.test_coder_claude import CLAUDE, env_table
from tests.webrig import browser, free_port, listening, logged_in, shoot

systemd = sandbox.systemd
BIN = str(Path(fleet_exe()).parent)
SOCKET, SERVICE = "fleet-web.socket", "fleet-web.service"
DEADLINE_MS = 60_000


@pytest.fixture(scope="module")
def model() -> Iterator[str]:
    runtime = Path(tempfile.mkdtemp(prefix="fleet-web-", dir="/tmp"))
    try:
        with serve(anthropic.handler()) as (url, _log):
            yield f"{url}|{runtime}"
    finally:
        shutil.rmtree(runtime)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as found:
        yield found


@dataclass
class Box:
    box: Sandbox
    home: Path
    project: Path
    port: int

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def login(self) -> str:
        return self("web", "url").stdout.strip()

    def active(self, unit: str) -> str:
        return self.box.systemctl("is-active", unit, check=False).stdout.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def wait(self, task_id: str, timeout: int = 120) -> int:
        done = self("wait", task_id, "--timeout", str(timeout), check=False)
        if done.returncode == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return done.returncode


@pytest.fixture
def unit(systemd: Sandbox, tmp_path: Path, model: str) -> Iterator[Box]:
    url, runtime = model.split("|")
    project = tmp_path / "project"
    project.mkdir()
    box = Box(systemd, tmp_path / "home", project, free_port())
    box(
        "config",
        "set",
        "default_coder=command",
        "lease_seconds=10",
        "stop_grace_seconds=2",
        "notify_desktop=false",
        f"web_listen=127.0.0.1:{box.port}",
        f"coders.claude.binary={CLAUDE}",
        env_table(url, tmp_path / "claude-home", Path(runtime)),
    )
    box("setup", "--system", "--web")
    yield box
    systemd.systemctl(
        "stop", SERVICE, SOCKET, "fleet-claim.path", "fleet-claim.timer", "fleet-task@*",
        check=False,
    )  # fmt: skip
    systemd.systemctl("disable", SOCKET, check=False)
    systemd.systemctl("reset-failed", check=False)


def test_the_socket_starts_the_dashboard_on_the_first_request(unit: Box, chromium: Any) -> None:
    assert unit.active(SOCKET) == "active"
    assert unit.active(SERVICE) == "inactive"  # nothing runs until someone asks
    assert listening(unit.port)
    started = time.monotonic()
    page = logged_in(chromium, unit.login())
    took = time.monotonic() - started
    assert page.locator("h1").inner_text() == "Overview"
    assert unit.active(SERVICE) == "active"
    print(f"first page after socket activation: {took * 1000:.0f} ms (login and redirect)")
    unit.box.systemctl("stop", SERVICE)
    assert unit.active(SOCKET) == "active" and listening(unit.port)
    page.reload()  # the socket starts it again
    assert page.locator("h1").inner_text() == "Overview" and unit.active(SERVICE) == "active"


def test_a_real_agents_question_is_answered_from_the_browser(unit: Box, chromium: Any) -> None:
    key = uuid.uuid4().hex
    task_id = unit(
        "add", "pick a colour", "--coder", "claude", "--cwd", str(unit.project),
        "-d", f"FLEET-SCENARIO:ask:{key}",
    ).stdout.strip()  # fmt: skip
    page = logged_in(chromium, unit.login())
    page.goto(f"{unit.base}/questions")
    card = page.locator("article.question")
    card.wait_for(timeout=DEADLINE_MS)  # it arrives without a reload
    assert str(anthropic.ASK_INPUT["question"]) in card.inner_text()
    assert page.locator("nav .badge").inner_text() == "1"
    shoot(page, "units-questions")
    card.locator("label.option", has_text="blue").click()
    card.locator("button", has_text="Send").click()
    page.locator(".flash.ok").wait_for(timeout=DEADLINE_MS)
    assert unit.wait(task_id) == 0
    task = unit.show(task_id)
    assert task["reason"] == "answer: The person (web:root) chose: blue"
    history = json.loads(unit("history", task_id, "--json").stdout)
    answered = next(h for h in history if h["action"] == "answered")
    assert answered["by"] == "web:root"
    # A late answer from the command line is told who answered first.
    (q,) = json.loads(unit("questions", "--all", "--json").stdout)
    late = unit("answer", q["id"], "--choice", "1", check=False)
    assert late.returncode == 4 and "already answered by web:root" in late.stderr


def test_kill_from_the_browser_ends_the_unit(unit: Box, chromium: Any) -> None:
    added = unit("add", "sleepy", "--cwd", str(unit.project), "-d", "echo zzz-asleep; sleep 300")
    task_id = added.stdout.strip()
    name = f"fleet-task@{task_id}.service"
    unit.box.wait_for(lambda: unit.active(name) == "active", 60, "the task running")
    page = logged_in(chromium, unit.login())
    page.goto(f"{unit.base}/tasks/{task_id}")
    page.locator("#transcript .msg", has_text="zzz-asleep").wait_for(timeout=DEADLINE_MS)
    # The stream's position is a journal cursor (and no event log: the journal has it all).
    journal, file = str(page.locator("#transcript").get_attribute("data-last")).split()
    assert journal.startswith("s=") and ";i=" in journal and file == "-"
    page.on("dialog", lambda dialog: dialog.accept())  # "Stop fl-…? Its whole process tree ends."
    page.locator("#panel button", has_text="Kill").click()
    page.locator(".flash.ok").wait_for(timeout=DEADLINE_MS)
    assert unit.wait(task_id) == 1
    # The task settles in the unit's ExecStopPost=, which may still be finishing.
    unit.box.wait_for(lambda: unit.active(name) in ("inactive", "failed"), 30, "the unit's end")
    task = unit.show(task_id)
    assert task["status"] == "blocked"
    assert [a["outcome"] for a in task["attempt_log"]] == ["killed"]
    page.locator("#panel .pill", has_text="blocked").wait_for(timeout=DEADLINE_MS)  # live
