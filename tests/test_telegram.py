"""Telegram: notifications with buttons, answers and commands from chats, the spool, apprise.

Everything runs for real against the scripted Bot API of tests/servers/telegram.py on
127.0.0.1 (pointed at through telegram_api_url): the delivery process that `fire` detaches,
the real `fleet-telegram` program long-polling it, the real `fleet-ask` MCP server asked by the
MCP SDK's client as a coder CLI would ask it; and, under a sandboxed systemd, the real Claude
Code CLI against the scripted Anthropic server, with fleet-telegram.service installed by
`fleet setup --telegram`. apprise posts to a JSON receiver on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet import alerts
from fleet.config import load
from fleet.errors import ConfigError
from fleet.model import QuestionKind, TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from fleet.telegram import text
from fleet.telegram.token import read as read_token
from tests import test_listen
from tests.conftest import Fleet, fleet_exe, run_fleet
from tests.sandbox import wait_for
from tests.servers import telegram
from tests.servers.telegram import TelegramServer
from tests.test_questions import agent, ask, running

CHAT = USER = 4242  # a person's private chat with the bot has the person's id
GROUP = -1001234
STRANGER = 666
DEADLINE = 30.0


# ---------------------------------------------------------------------- fixtures


@pytest.fixture
def bot() -> Iterator[TelegramServer]:
    with telegram.serve() as server:
        yield server


def token_file(directory: Path, mode: int = 0o600, content: str = telegram.TOKEN) -> Path:
    path = directory / "telegram-token"
    path.write_text(content + "\n")
    path.chmod(mode)
    return path


@pytest.fixture
def tg(
    fleet: Fleet,
    bot: TelegramServer,
    tmp_path: Path,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Fleet:
    """A queue whose notifications go to CHAT (and only there), answered by USER."""
    monkeypatch.delenv("INVOCATION_ID", raising=False)  # deliveries detach, as in a shell
    fleet.ok(
        "config",
        "set",
        f"telegram_token_file={token_file(tmp_path)}",
        f"telegram_chats=[{CHAT}]",
        f"telegram_users=[{USER}]",
        f"telegram_api_url={bot.url}",
        "telegram_poll_seconds=2",
        f"telegram_cwd={project}",
        "telegram_coder=command",
        "notify_desktop=false",
        "notify_retries=2",
        "notify_timeout_seconds=5",
    )
    return fleet


@dataclass
class Poller:
    proc: subprocess.Popen[bytes]
    log: Path

    def said(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE)


def start_poller(bot: TelegramServer, log: Path, *prefix: str) -> Poller:
    before = len(bot.calls("getUpdates"))
    with log.open("ab") as sink:
        proc = subprocess.Popen([*prefix, fleet_exe("fleet-telegram")], stderr=sink)
    poller = Poller(proc, log)
    wait_for(
        lambda: len(bot.calls("getUpdates")) > before or proc.poll() is not None,
        DEADLINE,
        "the poller's first getUpdates",
    )
    return poller


@pytest.fixture
def poller(tg: Fleet, bot: TelegramServer, tmp_path: Path) -> Iterator[Poller]:
    found = start_poller(bot, tmp_path / "poller.log")
    assert found.proc.poll() is None, found.said()
    yield found
    found.stop()


def messages_to(bot: TelegramServer, chat: int, *needles: str) -> list[dict[str, Any]]:
    return [m for m in bot.sent(chat) if all(n in m["text"] for n in needles)]


def one_message(bot: TelegramServer, chat: int, *needles: str) -> dict[str, Any]:
    found = bot.wait(lambda: messages_to(bot, chat, *needles), DEADLINE, f"a message {needles}")
    assert len(found) == 1, found
    return dict(found[0])


def buttons(message: dict[str, Any]) -> list[tuple[str, str]]:
    markup = message.get("reply_markup") or {}
    return [
        (b["text"], b["callback_data"]) for row in markup.get("inline_keyboard", []) for b in row
    ]


def toasted(bot: TelegramServer, seen: int) -> None:
    """Until a button press after the first `seen` has been answered."""
    bot.wait(lambda: len(bot.state.answers) > seen, DEADLINE, "the press answered")


def audit_by(task_id: str) -> list[tuple[str, str]]:
    store = open_store(resolve())
    try:
        return [(e.action, e.by) for e in store.history(task_id)]
    finally:
        store.close()


def stored_offset() -> int:
    db = sqlite3.connect(resolve().db)
    try:
        (value,) = db.execute("SELECT value FROM leases").fetchone()
        return int(value)
    finally:
        db.close()


def spooled() -> int:
    return alerts.undelivered(resolve())


# ---------------------------------------------------------------------- the token


def test_the_token_comes_only_from_a_private_file(tmp_path: Path) -> None:
    good = token_file(tmp_path)
    assert read_token(str(good), False) == telegram.TOKEN
    good.chmod(0o640)
    with pytest.raises(ConfigError, match="may be read by others") as refused:
        read_token(str(good), False)
    assert refused.value.hint == f"chmod 600 {good}"
    good.chmod(0o400)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(ConfigError, match="symlink"):
        read_token(str(link), False)
    with pytest.raises(ConfigError, match="does not hold a Telegram bot token"):
        read_token(str(token_file(tmp_path / "..", content="hunter2")), False)
    with pytest.raises(ConfigError, match="telegram_token_file is not set"):
        read_token("", False)


def test_a_credential_is_read_from_the_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ConfigError, match="systemd passed no credential"):
        read_token("/root/telegram-token", True)
    (tmp_path / "fleet-telegram-token").write_text(telegram.TOKEN)
    (tmp_path / "fleet-telegram-token").chmod(0o440)  # as systemd passes it: not ours to check
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_token("/root/telegram-token", True) == telegram.TOKEN


def test_a_readable_token_file_stops_the_bot_with_a_clear_line(
    tg: Fleet, bot: TelegramServer, tmp_path: Path
) -> None:
    (tmp_path / "telegram-token").chmod(0o644)
    failed = tg("setup", "--telegram", "--dry-run")
    assert failed.code == 5 and "may be read by others (mode 644)" in failed.err
    assert "fleet: hint: chmod 600" in failed.err
    assert telegram.TOKEN not in tg.ok("config", "show")


# ---------------------------------------------------------------------- outbound


def test_every_kind_of_notification_reads_well_and_is_escaped_and_clipped(
    tg: Fleet, bot: TelegramServer, project: Path
) -> None:
    paths = resolve()
    config = load(paths)
    task_id = tg.add("deploy <staging> & prod", "-d", "true")
    store = open_store(paths)
    try:
        task = store.get(task_id)
    finally:
        store.close()
    huge = "why & <how> " * 1000
    notifiers = alerts.Notifiers.from_config(config)
    for kind, message in (
        ("blocked", f"{task_id} is blocked: {huge}"),
        ("failed", f"{task_id} failed for good"),
        ("notice", f"{task_id}: half done <ok>"),
    ):
        alerts.deliver(alerts.make_event(kind, message, task), notifiers)
    alerts.deliver(
        alerts.make_event("finished", "2 tasks finished: 2 done", tasks=[task_id]), notifiers
    )
    sent = bot.sent(CHAT)
    assert [m["text"].split("\n")[0] for m in sent] == [
        "⛔ deploy <staging> & prod",
        "❌ deploy <staging> & prod",
        "💬 deploy <staging> & prod",
        "🏁 2 tasks finished: 2 done",
    ]
    blocked, failed, notice, finished = sent
    assert blocked["text"].startswith(f"⛔ deploy <staging> & prod\n{task_id} is blocked:\n\n")
    assert telegram.units(blocked["text"]) <= telegram.LIMIT and blocked["text"].endswith("…")
    assert "<b>deploy &lt;staging&gt; &amp; prod</b>" in blocked["html"]
    assert f"{task_id} failed for good" in failed["text"]
    assert notice["text"].endswith(f"{task_id} says:\n\nhalf done <ok>")
    assert finished["text"].endswith(task_id)
    assert spooled() == 0


def test_clipping_counts_what_telegram_counts() -> None:
    emoji = "🙂" * 3000  # two UTF-16 units each: 6000
    html = text.render([("b", "t"), ("", emoji)], 1)
    assert telegram.units(telegram.visible(html, "HTML")) <= telegram.LIMIT
    assert text.clip("abc", 3) == "abc" and text.clip("abcd", 3) == "ab…"
    listing = text.pre("x" * 5000 + "</pre><b>")
    assert listing.startswith("<pre>x") and listing.endswith("…</pre>")
    assert telegram.units(telegram.visible(listing, "HTML")) == telegram.LIMIT


def test_terminal_escapes_in_an_agents_text_are_shown_not_sent() -> None:
    html = text.render([("", "red \x1b[31malert\x1b[0m\x00 done\tok\nnext")], 0)
    assert html == "red \ufffd[31malert\ufffd[0m\ufffd done\tok\nnext"


def test_a_send_that_failed_three_times_is_delivered_by_the_next_delivery(
    tg: Fleet, bot: TelegramServer
) -> None:
    task_id = tg.add("a task", "-d", "true")
    config = load(resolve())
    store = open_store(resolve())
    task = store.get(task_id)
    store.close()
    notifiers = alerts.Notifiers.from_config(config)
    bot.fail("sendMessage", (500, None), (502, None), (503, None))
    alerts.deliver(alerts.make_event("notice", f"{task_id}: first", task), notifiers)
    assert len(bot.calls("sendMessage")) == 3  # notify_retries=2: three tries
    assert bot.sent(CHAT) == [] and spooled() == 1
    doctor = tg("doctor", "--json")
    (row,) = [r for r in json.loads(doctor.out) if r["check"] == "notify"]
    assert not row["ok"] and row["detail"] == "1 undelivered notification in the spool"
    alerts.deliver(alerts.make_event("notice", f"{task_id}: second", task), notifiers)
    assert [m["text"].rsplit("\n", 1)[-1] for m in bot.sent(CHAT)] == ["second", "first"]
    assert spooled() == 0


def test_a_429_is_waited_out_as_telegram_asks(tg: Fleet, bot: TelegramServer) -> None:
    config = load(resolve())
    notifiers = alerts.Notifiers.from_config(config)
    bot.fail("sendMessage", (429, 1))
    alerts.deliver(alerts.make_event("notice", "over the limit"), notifiers)
    first, second = bot.calls("sendMessage")
    assert second.at - first.at >= 1.0  # retry_after, not our shorter first pause
    assert messages_to(bot, CHAT, "over the limit") and spooled() == 0


def test_a_delivery_that_cannot_read_the_token_leaves_the_message_spooled(
    tg: Fleet, bot: TelegramServer, tmp_path: Path
) -> None:
    config = load(resolve())
    (tmp_path / "telegram-token").chmod(0o604)
    alerts.deliver(
        alerts.make_event("notice", "nobody hears this yet"), alerts.Notifiers.from_config(config)
    )
    assert "may be read by others" in tg.capsys.readouterr().err
    assert bot.calls("sendMessage") == [] and spooled() == 1
    (tmp_path / "telegram-token").chmod(0o600)
    alerts.deliver(alerts.make_event("notice", "now it can"), alerts.Notifiers.from_config(config))
    assert len(bot.sent(CHAT)) == 2 and spooled() == 0


# ---------------------------------------------------------------------- questions


def test_a_choice_question_arrives_with_buttons_and_a_press_unblocks_the_agent(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            options = ["red", "green <light>", "blue"]
            call = asyncio.ensure_future(
                ask(session, question="Which colour?", kind="choice", options=options)
            )
            message = await asyncio.to_thread(one_message, bot, CHAT, "Which colour?")
            qid = json.loads(tg.ok("questions", "--json"))[0]["id"]
            assert message["text"].startswith(f"❓ needs a decision\n{task_id} asks ({qid}):")
            assert "1. red\n2. green <light>\n3. blue" in message["text"]
            assert buttons(message) == [
                ("1. red", f"c:{qid}:1"),
                ("2. green <light>", f"c:{qid}:2"),
                ("3. blue", f"c:{qid}:3"),
            ]
            bot.press(CHAT, USER, message["message_id"], f"c:{qid}:2")
            answer, error = await asyncio.wait_for(call, DEADLINE)
            assert not error and answer == f"The person (telegram:{USER}) chose: green <light>"
            edited = await asyncio.to_thread(
                bot.wait, lambda: [m for m in bot.sent(CHAT) if m.get("edited")], DEADLINE
            )
            assert edited[0]["reply_markup"] is None
            assert edited[0]["text"].endswith(f"✅ Answered by telegram:{USER}: green <light>")
            toast = bot.wait(lambda: bot.state.answers, DEADLINE)[0]
            assert toast["text"] == "Answered: green <light>" and not toast["show_alert"]
            # A second press, here or in another chat, is told who answered first.
            bot.press(CHAT, USER, message["message_id"], f"c:{qid}:1")
            late = await asyncio.to_thread(
                bot.wait, lambda: bot.state.answers[1:], DEADLINE, "the late press's answer"
            )
            assert (
                late[0]["show_alert"] and f"already answered by telegram:{USER}" in late[0]["text"]
            )

    asyncio.run(scenario())
    (q,) = json.loads(tg.ok("questions", "--all", "--json"))
    assert (q["answer"], q["answered_by"]) == ("green <light>", f"telegram:{USER}")
    assert ("answered", f"telegram:{USER}") in audit_by(task_id)


def test_a_reply_answers_free_text_and_a_late_reply_is_refused(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Which port?"))
            message = await asyncio.to_thread(one_message, bot, CHAT, "Which port?")
            assert buttons(message) == []
            assert message["text"].endswith("Reply to this message with your answer.")
            bot.say(CHAT, USER, "8080 & not 80", reply_to=message["message_id"])
            answer, error = await asyncio.wait_for(call, DEADLINE)
            assert not error and answer == f"The person (telegram:{USER}) answered: 8080 & not 80"
            one_message(bot, CHAT, "answered;", f"{task_id} goes on")
            bot.say(CHAT, USER, "no, 9090", reply_to=message["message_id"])
            refused = await asyncio.to_thread(one_message, bot, CHAT, "already answered by")
            assert f"already answered by telegram:{USER}" in refused["text"]
            assert "8080 & not 80" in refused["text"]

    asyncio.run(scenario())
    (q,) = json.loads(tg.ok("questions", "--all", "--json"))
    assert q["answer"] == "8080 & not 80"


def test_an_answer_given_elsewhere_edits_the_message_in_every_chat(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    tg.ok("config", "set", f"telegram_chats=[{CHAT}, {GROUP}]")
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Ship it?", kind="approval"))
            for chat in (CHAT, GROUP):
                message = await asyncio.to_thread(one_message, bot, chat, "Ship it?")
                assert [b[0] for b in buttons(message)] == ["✅ Approve", "❌ Deny"]
            done = await asyncio.to_thread(run_fleet, "answer", task_id, "--deny", "not today")
            assert done.code == 0, done.err
            answer, _ = await asyncio.wait_for(call, DEADLINE)
            assert "DENIED" in answer

    asyncio.run(scenario())

    def both_edited() -> bool:
        return all(m.get("edited") for m in bot.sent()) and len(bot.sent()) == 2

    bot.wait(both_edited, DEADLINE, "both messages edited")
    for m in bot.sent():
        assert m["reply_markup"] is None and "Denied by " in m["text"] and "not today" in m["text"]


def test_several_options_are_toggled_then_sent(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(
                ask(
                    session,
                    question="Which checks?",
                    kind="choice",
                    options=["lint", "types", "tests"],
                    multi_select=True,
                )
            )
            message = await asyncio.to_thread(one_message, bot, CHAT, "Which checks?")
            qid = buttons(message)[0][1].split(":")[1]
            assert buttons(message)[-1] == ("📨 Send (0)", f"s:{qid}:")
            mid = message["message_id"]
            bot.press(CHAT, USER, mid, f"s:{qid}:")  # nothing picked yet
            refused = bot.wait(lambda: bot.state.answers, DEADLINE)[0]
            assert refused["show_alert"] and "pick at least one" in refused["text"]
            for n in ("3", "1", "3", "2", "3"):
                seen = len(bot.state.answers)
                bot.press(CHAT, USER, mid, f"t:{qid}:{n}")
                toasted(bot, seen)
            redrawn = bot.sent(CHAT)[0]
            assert [b[0] for b in buttons(redrawn)] == [
                "☑ 1. lint",
                "☑ 2. types",
                "☑ 3. tests",
                "📨 Send (3)",
            ]
            bot.press(CHAT, USER, mid, f"s:{qid}:")
            answer, _ = await asyncio.wait_for(call, DEADLINE)
            assert answer == f"The person (telegram:{USER}) chose: lint, types, tests"

    asyncio.run(scenario())


def test_approval_by_reply_takes_a_comment(tg: Fleet, bot: TelegramServer, poller: Poller) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Drop the table?", kind="approval"))
            message = await asyncio.to_thread(one_message, bot, CHAT, "Drop the table?")
            bot.say(CHAT, USER, "maybe later", reply_to=message["message_id"])
            one_message(bot, CHAT, "asks for approval", "reply yes or no")
            bot.say(CHAT, USER, "Yes, after the backup", reply_to=message["message_id"])
            answer, _ = await asyncio.wait_for(call, DEADLINE)
            assert "APPROVED" in answer and "Their comment: after the backup" in answer

    asyncio.run(scenario())


# ---------------------------------------------------------------------- commands


def test_commands_act_as_the_cli_does_and_name_the_person(
    tg: Fleet, bot: TelegramServer, poller: Poller, project: Path
) -> None:
    bot.say(CHAT, USER, "/new fix the <flaky> test\nIt fails one run in ten.")
    added = one_message(bot, CHAT, "Added ")
    task_id = added["text"].split()[1].rstrip(":")
    shown = tg.show(task_id)
    assert (shown["title"], shown["description"], shown["cwd"], shown["coder"]) == (
        "fix the <flaky> test",
        "It fails one run in ten.",
        str(project),
        "command",
    )
    assert audit_by(task_id)[0] == ("added", f"telegram:{USER}")
    bot.say(CHAT, USER, "/tasks")
    assert task_id in one_message(bot, CHAT, task_id, "fix the <flaky> test")["text"]
    bot.say(CHAT, USER, f"/task {task_id[3:]}")
    detail = one_message(bot, CHAT, f"in {project}")
    assert detail["html"].startswith("<pre>") and "fix the <flaky> test" in detail["text"]
    bot.say(CHAT, USER, f"/kill {task_id}")
    assert "not running" in one_message(bot, CHAT, "not running")["text"]
    bot.say(CHAT, USER, "/pause lunch")
    one_message(bot, CHAT, "Paused")
    bot.say(CHAT, USER, "/status")
    status = one_message(bot, CHAT, "fleet on ")
    assert "1 ready" in status["text"] and "paused: lunch" in status["text"]
    bot.say(CHAT, USER, "/resume")
    one_message(bot, CHAT, "Resumed")
    assert "pause" not in open_store(resolve()).gates()
    tg.ok("block", task_id, "--reason", "wait")
    bot.say(CHAT, USER, f"/retry {task_id}")
    one_message(bot, CHAT, f"{task_id} is ready again")
    assert audit_by(task_id)[-1] == ("retried", f"telegram:{USER}")
    bot.say(CHAT, USER, "/answer q-zzzz yes")
    assert "no question q-zzzz" in one_message(bot, CHAT, "no question")["text"]
    bot.say(CHAT, USER, "/help")
    one_message(bot, CHAT, "/new TITLE")
    bot.say(CHAT, USER, "/frobnicate")
    one_message(bot, CHAT, "unknown command /frobnicate")


# On a store that several hosts share: the `url` (FLEET_STORE) and `ear` of test_listen.
url = test_listen.url
ear = test_listen.ear


def test_a_kill_and_an_answer_for_another_hosts_task_go_to_that_host(
    url: str,
    ear: Callable[[], list[str]],
    tg: Fleet,
    bot: TelegramServer,
    poller: Poller,
    project: Path,
) -> None:
    """fleet-telegram's own store connection asks the host that runs the task (a kill
    request, fleet.stopping) and notifies the host whose agent waits for the answer."""
    store = open_store(resolve())
    try:
        (task,) = store.add([TaskSpec("far away", str(project), coder="command")])
        claimed = store.claim_task(task.id, "test-host", 60, "command", None)
        assert claimed is not None
        q = store.ask(
            task.id, QuestionKind.INPUT, "Which branch?", (), False, "2099-01-01T00:00:00Z"
        )
        ear()
        bot.say(CHAT, USER, f"/answer {q.id} main")
        one_message(bot, CHAT, f"{q.id} answered")
        assert ear() == [f"answer test-host {task.id}"]
        bot.say(CHAT, USER, f"/kill {task.id}")
        one_message(bot, CHAT, f"Stopping {task.id}")
        assert ear() == [f"kill test-host {task.id}"]
        assert store.kill_requested(task.id, claimed.attempts)
    finally:
        store.close()


def test_new_without_a_directory_is_refused_with_the_fix(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    tg.ok("config", "set", "telegram_cwd=")  # read again on the next update: no restart
    bot.say(CHAT, USER, "/new something")
    refused = one_message(bot, CHAT, "/new needs a directory")
    assert "fleet config set telegram_cwd=DIR" in refused["text"]
    assert json.loads(tg.ok("ls", "--json")) == []


def test_strangers_get_no_answer_and_a_journal_line(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    bot.say(STRANGER, STRANGER, "/status", name="mallory")
    bot.say(CHAT, STRANGER, "/new take over", name="mallory")  # the right chat, not a user
    bot.say(CHAT, USER, "/status")
    one_message(bot, CHAT, "fleet on ")
    assert bot.sent(STRANGER) == [] and len(bot.sent(CHAT)) == 1
    assert json.loads(tg.ok("ls", "--json")) == []
    log = poller.said()
    assert f"ignored an update from user {STRANGER} (@mallory) in chat {STRANGER}" in log
    assert f"ignored an update from user {STRANGER} (@mallory) in chat {CHAT}" in log
    # Allowed chats and users are read again on every update: no restart.
    tg.ok(
        "config",
        "set",
        f"telegram_chats=[{CHAT}, {STRANGER}]",
        f"telegram_users=[{USER}, {STRANGER}]",
    )
    bot.say(STRANGER, STRANGER, "/status")
    one_message(bot, STRANGER, "fleet on ")


def test_a_restart_repeats_no_update_and_loses_none(
    tg: Fleet, bot: TelegramServer, poller: Poller, tmp_path: Path
) -> None:
    bot.say(CHAT, USER, "/new first")
    one_message(bot, CHAT, "Added ")
    assert poller.stop() == 0
    # Sent while no poller runs: the next one gets it, once.
    bot.say(CHAT, USER, "/new second")
    again = start_poller(bot, tmp_path / "poller.log")
    try:
        one_message(bot, CHAT, "Added ", ": second")
        bot.say(CHAT, USER, "/status")
        one_message(bot, CHAT, "fleet on ")
        titles = sorted(t["title"] for t in json.loads(tg.ok("ls", "--json")))
        assert titles == ["first", "second"]
        assert len(messages_to(bot, CHAT, "Added ")) == 2
        # The store keeps the offset after the last update handled, and the poller asks on.
        after = bot.state.next_update + 1
        wait_for(lambda: stored_offset() == after, DEADLINE, "the offset stored")
        bot.wait(lambda: any(c.params.get("offset") == after for c in bot.calls("getUpdates")))
    finally:
        assert again.stop() == 0


def test_a_second_poller_refuses_instead_of_fighting(
    tg: Fleet, bot: TelegramServer, poller: Poller, tmp_path: Path
) -> None:
    here = start_poller(bot, tmp_path / "here.log")
    assert here.proc.wait(timeout=DEADLINE) == 75
    assert "another fleet-telegram runs on this host" in here.said()
    # On another host (another node name), the store's lease says who polls.
    other = start_poller(
        bot,
        tmp_path / "other.log",
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname elsewhere && exec "$@"',
        "sh",
    )
    assert other.proc.wait(timeout=DEADLINE) == 75
    assert f"another fleet-telegram ({os.uname().nodename}) polls this bot until" in other.said()
    bot.say(CHAT, USER, "/status")
    one_message(bot, CHAT, "fleet on ")  # the first one never stopped


def test_a_poller_outside_fleet_is_not_fought(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    stop = threading.Event()

    def stranger_bot() -> None:  # another program polling the same token
        while not stop.is_set():
            telegram.serve_call(bot.state, f"/bot{telegram.TOKEN}/getUpdates", {"timeout": 1})

    thief = threading.Thread(target=stranger_bot, daemon=True)
    thief.start()
    try:
        wait_for(lambda: "409 Conflict" in poller.said(), DEADLINE, "the 409 said")
    finally:
        stop.set()
        thief.join()
    assert poller.said().count("409 Conflict") == 1  # said once, not every try
    bot.say(CHAT, USER, "/status")
    one_message(bot, CHAT, "fleet on ")
    assert "polling again" in poller.said()


# ---------------------------------------------------------------------- apprise


class JsonReceiver:
    """What apprise's json:// posts, received on 127.0.0.1 (500 for the first `fail` posts)."""

    def __init__(self, fail: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = fail
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.bodies.append(json.loads(body))
                status = 500 if len(receiver.bodies) <= receiver.fail else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, secret: str = "s3cret") -> str:
        return f"json://user:{secret}@127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    found = JsonReceiver(fail=2)
    yield found
    found.close()


def test_notify_urls_post_through_apprise_and_retry(fleet: Fleet, receiver: JsonReceiver) -> None:
    fleet.ok(
        "config",
        "set",
        f'notify_urls=["{receiver.url()}"]',
        "notify_desktop=false",
        "notify_retries=2",
    )
    notifiers = alerts.Notifiers.from_config(load(resolve()))
    alerts.deliver(alerts.make_event("notice", "fl-abcdef: half done"), notifiers)
    assert len(receiver.bodies) == 3  # two 500s, then delivered
    assert receiver.bodies[-1]["message"] == "fl-abcdef: half done"
    assert receiver.bodies[-1]["title"] == "fleet: notice"
    assert fleet.capsys.readouterr().err == ""


def test_a_failing_notify_url_is_one_line_without_its_secret(
    fleet: Fleet, receiver: JsonReceiver
) -> None:
    receiver.fail = 100
    fleet.ok(
        "config",
        "set",
        f'notify_urls=["{receiver.url("t0ps3cret")}", "nosuchservice://x"]',
        "notify_desktop=false",
        "notify_retries=1",
    )
    alerts.deliver(
        alerts.make_event("notice", "hello"), alerts.Notifiers.from_config(load(resolve()))
    )
    lines = fleet.capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    failed = next(line for line in lines if "json://" in line)
    assert failed.startswith("fleet: notify: notify_urls (json://") and "(2 tries)" in failed
    assert "t0ps3cret" not in failed and "500" in failed
    unknown = next(line for line in lines if "nosuchservice" in line)
    assert "not a URL apprise knows" in unknown
    assert len(receiver.bodies) == 2


def test_apprise_is_imported_by_the_delivery_only() -> None:
    probe = "import sys; import fleet.cli, fleet.alerts; print('apprise' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# ---------------------------------------------------------------------- the store's side


def test_a_lease_has_one_holder_and_keeps_its_value(home: Path) -> None:
    store = open_store(resolve())
    try:
        mine = store.take_lease("telegram:1", "host-a", 60)
        assert (mine.owner, mine.value) == ("host-a", None)
        assert store.set_lease_value("telegram:1", "host-a", "1001")
        theirs = store.take_lease("telegram:1", "host-b", 60)
        assert (theirs.owner, theirs.value) == ("host-a", "1001")  # refused: a's is in force
        assert not store.set_lease_value("telegram:1", "host-b", "5")
        store.take_lease("telegram:1", "host-a", -1)  # a's runs out
        taken = store.take_lease("telegram:1", "host-b", 60)
        assert (taken.owner, taken.value) == ("host-b", "1001")
        store.drop_lease("telegram:1", "host-b")
        assert store.take_lease("telegram:1", "host-c", 60).owner == "host-c"
    finally:
        store.close()


def test_a_spooled_message_is_taken_by_one_deliverer_at_a_time(home: Path) -> None:
    from fleet.store.base import OutgoingSpec

    store = open_store(resolve())
    try:
        (first, second) = store.spool(
            [OutgoingSpec("telegram", "1", "notice", {"parts": []}) for _ in range(2)]
        )
        assert [m.id for m in store.take_spooled("telegram", "a", 60, 10)] == [first.id, second.id]
        assert store.take_spooled("telegram", "b", 60, 10) == []
        store.spool_failed(first.id, "a", "HTTP 500", 4e9)  # due again far later
        assert store.take_spooled("telegram", "b", 60, 10) == []
        # A later delivery takes what was spooled before its own message, due or not.
        (third,) = store.spool([OutgoingSpec("telegram", "1", "notice", {"parts": []})])
        taken = store.take_spooled("telegram", "b", 60, 10, before=third.id)
        assert [(m.id, m.tries, m.error) for m in taken] == [
            (first.id, 1, "HTTP 500"),
            (third.id, 0, None),
        ]
        store.spool_sent(first.id, "b", "77")
        store.spool_sent(second.id, "a", "78")
        store.spool_sent(third.id, "a", "79")  # not a's claim any more: stays spooled
        assert store.spooled() == 1 and store.sent_message("telegram", "1", "77") is None
    finally:
        store.close()


def test_a_question_settled_while_its_message_waited_is_sent_settled(
    tg: Fleet, bot: TelegramServer
) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            bot.fail("sendMessage", *[(503, None)] * 3)
            call = asyncio.ensure_future(ask(session, question="Which port?"))
            await asyncio.to_thread(
                bot.wait, lambda: len(bot.calls("sendMessage")) >= 3, DEADLINE, "three tries"
            )
            await asyncio.to_thread(wait_for, lambda: spooled() == 1, DEADLINE, "the spool")
            done = await asyncio.to_thread(run_fleet, "answer", task_id, "8080")
            assert done.code == 0, done.err
            await asyncio.wait_for(call, DEADLINE)

    asyncio.run(scenario())
    config = load(resolve())
    alerts.deliver(alerts.make_event("notice", "next"), alerts.Notifiers.from_config(config))
    question = one_message(bot, CHAT, "Which port?")
    assert question["reply_markup"] is None and "✅ Answered by " in question["text"]
    assert "Reply to this message" not in question["text"] and not question.get("edited")


def test_deny_by_button_and_answer_by_command(
    tg: Fleet, bot: TelegramServer, poller: Poller
) -> None:
    task_id = running(tg)

    async def scenario() -> None:
        async with agent(task_id) as session:
            call = asyncio.ensure_future(ask(session, question="Force-push?", kind="approval"))
            message = await asyncio.to_thread(one_message, bot, CHAT, "Force-push?")
            (deny,) = [data for label, data in buttons(message) if label == "❌ Deny"]
            bot.press(CHAT, USER, message["message_id"], deny)
            answer, _ = await asyncio.wait_for(call, DEADLINE)
            assert answer == f"The person (telegram:{USER}) DENIED it."
            call = asyncio.ensure_future(ask(session, question="Then which branch?"))
            await asyncio.to_thread(one_message, bot, CHAT, "Then which branch?")
            bot.say(CHAT, USER, f"/answer {task_id} release/2.1 please")
            answer, _ = await asyncio.wait_for(call, DEADLINE)
            assert answer == f"The person (telegram:{USER}) answered: release/2.1 please"

    asyncio.run(scenario())
    denied = bot.wait(lambda: messages_to(bot, CHAT, "Force-push?", "Denied by"), DEADLINE)
    assert denied[0]["reply_markup"] is None
    bot.say(CHAT, USER, "/tasks running")
    listed = one_message(bot, CHAT, f"{task_id} running")
    assert listed["text"].splitlines() == [f"{task_id} running   needs a decision"]
    bot.say(CHAT, USER, "/tasks sleeping")
    one_message(bot, CHAT, "no status 'sleeping'")


def test_a_network_failure_leaves_the_message_spooled_for_later(
    tg: Fleet, bot: TelegramServer
) -> None:
    import socket

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    tg.ok("config", "set", f"telegram_api_url={nobody}", "notify_retries=1")
    config = load(resolve())
    alerts.deliver(
        alerts.make_event("notice", "while offline"), alerts.Notifiers.from_config(config)
    )
    err = tg.capsys.readouterr().err
    assert "Connection refused" in err and "stays spooled for the next delivery" in err
    assert spooled() == 1
    tg.ok("config", "set", f"telegram_api_url={bot.url}")
    config = load(resolve())
    alerts.deliver(alerts.make_event("notice", "back online"), alerts.Notifiers.from_config(config))
    assert [m["text"].rsplit("\n", 1)[-1] for m in bot.sent(CHAT)] == [
        "back online",
        "while offline",
    ]
    assert spooled() == 0


def test_the_unit_in_either_scope(home: Path) -> None:
    from fleet.config import defaults
    from fleet.units import TELEGRAM, Install, render

    paths = resolve()
    for scope in ("user", "system"):
        inst = Install(scope, paths, Path("/opt/fleet/bin"), None, True)
        unit = render(inst, defaults(paths.config_file))[TELEGRAM]
        assert "ExecStart=/opt/fleet/bin/fleet-telegram" in unit
        assert "RestartPreventExitStatus=75" in unit and "Type=notify" in unit
        assert ("network-online.target" in unit) == (scope == "system")
    assert TELEGRAM not in render(Install("user", paths, Path("/x")), defaults(paths.config_file))
