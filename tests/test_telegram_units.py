"""fleet-telegram.service under a real systemd: a real agent's question, /new, restarts.

The sandbox of tests/sandbox.py boots systemd; `fleet setup --system --telegram` installs the
units, and the Bot API is the scripted server of tests/servers/telegram.py on 127.0.0.1 (the
sandbox shares the network). The agent is the real Claude Code CLI from tests/clis against the
scripted Anthropic server, asking through fleet-ask; its question reaches Telegram through the
delivery process that fleet-ask's notification starts as a transient unit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox
from tests.servers import anthropic, telegram
from tests.servers.base import Log, serve
from tests.servers.telegram import TelegramServer
from tests.test_coder_claude import CLAUDE, env_table
from tests.test_telegram import CHAT, DEADLINE, STRANGER, USER, buttons, one_message, token_file

systemd = sandbox.systemd
BIN = str(Path(fleet_exe()).parent)
UNIT = "fleet-telegram.service"


@dataclass
class Model:
    url: str
    log: Log
    runtime: Path


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    runtime = Path(tempfile.mkdtemp(prefix="fleet-tg-", dir="/tmp"))
    try:
        with serve(anthropic.handler()) as (url, log):
            yield Model(url, log, runtime)
    finally:
        shutil.rmtree(runtime)


@pytest.fixture
def bot() -> Iterator[TelegramServer]:
    with telegram.serve() as server:
        yield server


@dataclass
class Box:
    box: Sandbox
    home: Path
    project: Path
    bot: TelegramServer
    cursor: str  # the journal before this test

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def wait(self, task_id: str, timeout: int = 90) -> int:
        done = self("wait", task_id, "--timeout", str(timeout), check=False)
        if done.returncode == 124:
            journal = self.box.run("journalctl", "-n", "80", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return done.returncode

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(obj, dict)
        return obj

    def journal(self) -> str:
        """What fleet-telegram.service logged during this test."""
        # Filtered here: journalctl 252 given --after-cursor and a match can skip an entry.
        entries = self.box.journal(f"--after-cursor={self.cursor}")
        return "".join(f"{e.get('MESSAGE')}\n" for e in entries if e.get("_SYSTEMD_UNIT") == UNIT)

    def polls(self) -> int:
        return len(self.bot.calls("getUpdates"))


@pytest.fixture
def unit(systemd: Sandbox, tmp_path: Path, model: Model, bot: TelegramServer) -> Iterator[Box]:
    project = tmp_path / "project"
    project.mkdir()
    box = Box(systemd, tmp_path / "home", project, bot, systemd.journal("-n", "1")[0]["__CURSOR"])
    box(
        "config",
        "set",
        "default_coder=command",
        "lease_seconds=10",
        "stop_grace_seconds=2",
        "notify_desktop=false",
        f"coders.claude.binary={CLAUDE}",
        env_table(model.url, tmp_path / "claude-home", model.runtime),
        f"telegram_token_file={token_file(tmp_path)}",
        f"telegram_chats=[{CHAT}]",
        f"telegram_api_url={bot.url}",
        "telegram_poll_seconds=2",
        f"telegram_cwd={project}",
        "telegram_coder=command",
    )
    box("setup", "--system", "--telegram")
    bot.wait(lambda: box.polls() > 0, DEADLINE, "fleet-telegram's first getUpdates")
    yield box
    systemd.systemctl(
        "stop", UNIT, "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False
    )
    systemd.systemctl("reset-failed", check=False)


def test_a_real_agents_question_arrives_with_buttons_and_a_press_unblocks_it(unit: Box) -> None:
    key = uuid.uuid4().hex
    task_id = unit(
        "add", "pick a colour", "--coder", "claude", "--cwd", str(unit.project),
        "-d", f"FLEET-SCENARIO:ask:{key}",
    ).stdout.strip()  # fmt: skip
    message = one_message(unit.bot, CHAT, str(anthropic.ASK_INPUT["question"]))
    (q,) = json.loads(unit("questions", "--json").stdout)
    assert message["text"].startswith(f"❓ pick a colour\n{task_id} asks ({q['id']}):")
    assert buttons(message) == [
        ("1. red", f"c:{q['id']}:1"),
        ("2. green", f"c:{q['id']}:2"),
        ("3. blue", f"c:{q['id']}:3"),
    ]
    unit.bot.press(CHAT, USER, message["message_id"], f"c:{q['id']}:3")
    assert unit.wait(task_id) == 0
    task = unit.show(task_id)
    assert task["reason"] == f"answer: The person (telegram:{USER}) chose: blue"
    edited = unit.bot.wait(lambda: [m for m in unit.bot.sent(CHAT) if m.get("edited")], DEADLINE)
    assert edited[0]["text"].endswith(f"✅ Answered by telegram:{USER}: blue")
    unit.bot.say(CHAT, USER, f"/task {task_id}")
    shown = one_message(unit.bot, CHAT, f"{task_id} done: pick a colour")
    transcript = shown["text"].split("\n\n", 1)[1].splitlines()  # its last ten lines
    assert len(transcript) == 10 and "attempt 1 ended: success" in shown["text"]
    history = json.loads(unit("history", task_id, "--json").stdout)
    assert {"action": "answered", "by": f"telegram:{USER}"}.items() <= next(
        h for h in history if h["action"] == "answered"
    ).items()


def test_new_adds_a_task_that_runs_and_strangers_are_ignored(unit: Box) -> None:
    unit.bot.say(STRANGER, STRANGER, "/new rm -rf", name="mallory")
    unit.bot.say(CHAT, USER, "/new write the greeting\necho hello from telegram > greeting.txt")
    added = one_message(unit.bot, CHAT, "Added ")
    task_id = added["text"].split()[1].rstrip(":")
    assert unit.wait(task_id) == 0
    assert (unit.project / "greeting.txt").read_text() == "hello from telegram\n"
    assert unit.show(task_id)["coder"] == "command"
    assert unit.bot.sent(STRANGER) == []
    assert [t["id"] for t in json.loads(unit("ls", "--all", "--json").stdout)] == [task_id]
    assert f"ignored an update from user {STRANGER} (@mallory)" in unit.journal()


def test_kill_stops_a_running_task(unit: Box) -> None:
    unit.bot.say(CHAT, USER, "/new sleepy\nsleep 300")
    task_id = one_message(unit.bot, CHAT, "Added ")["text"].split()[1].rstrip(":")
    unit.box.wait_for(
        lambda: (
            unit.box.systemctl("is-active", f"fleet-task@{task_id}", check=False).stdout.strip()
            == "active"
        ),
        what="the task running",
    )
    unit.bot.say(CHAT, USER, f"/kill {task_id}")
    one_message(unit.bot, CHAT, f"Stopping {task_id}")
    assert unit.wait(task_id) == 1
    task = unit.show(task_id)
    assert task["status"] == "blocked" and [a["outcome"] for a in task["attempt_log"]] == ["killed"]


def test_a_restart_of_the_unit_repeats_no_update(unit: Box) -> None:
    unit.bot.say(CHAT, USER, "/new first\ntrue")
    one_message(unit.bot, CHAT, "Added ", ": first")
    unit.box.systemctl("restart", UNIT)
    assert unit.box.systemctl("is-active", UNIT).stdout.strip() == "active"
    unit.bot.say(CHAT, USER, "/new second\ntrue")
    one_message(unit.bot, CHAT, "Added ", ": second")
    titles = sorted(t["title"] for t in json.loads(unit("ls", "--all", "--json").stdout))
    assert titles == ["first", "second"]
    assert len([m for m in unit.bot.sent(CHAT) if m["text"].startswith("Added ")]) == 2
    assert unit.journal().count("polling as @fleet_test_bot") == 2


def test_the_token_can_be_a_systemd_credential(unit: Box, tmp_path: Path) -> None:
    # systemd 252 mounts a unit's credentials under /run/credentials and moves the mount out
    # of the unit's own namespace: that needs /run shared, as it is on a booted machine (the
    # sandbox makes its /run private; with it private, every unit sees an empty directory).
    unit.box.run("mount", "--make-shared", "/run")
    unit("config", "set", "telegram_credential=true")
    unit("setup", "--system", "--telegram")
    rendered = (Path("/proc") / str(unit.box.pid) / "root/etc/systemd/system" / UNIT).read_text()
    assert f"LoadCredential=fleet-telegram-token:{tmp_path / 'telegram-token'}" in rendered
    unit.bot.say(CHAT, USER, "/status")
    one_message(unit.bot, CHAT, "fleet on ")
    # A notification from a unit is delivered by a transient unit that gets the credential.
    unit("config", "set", "retry_limit=0")
    task_id = unit("add", "a notice", "--cwd", str(unit.project), "-d", "exit 3").stdout.strip()
    unit.wait(task_id)
    failed = one_message(unit.bot, CHAT, "failed for good")
    assert failed["text"].startswith(f"❌ a notice\n{task_id} failed for good:")
    doctor = json.loads(unit("doctor", "--system", "--json", check=False).stdout)
    rows = {
        (r["check"], r["detail"]): r["ok"] for r in doctor if r["check"] in ("telegram", "notify")
    }
    assert (
        rows[("telegram", f"{UNIT}: active")]
        and rows[("notify", "0 undelivered notifications in the spool")]
    )
