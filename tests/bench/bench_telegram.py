"""Telegram latencies: a question reaching the chat, and a button press reaching the agent.

Why: a person answers from a phone only as fast as the question gets there, and an agent waits
for the press as long as the bot takes to pass it on. Targets from the issue: median <= 500 ms
for each.

One FLEET_HOME with a running task (claimed through the store, as fleet-run would), Telegram
configured against the scripted Bot API of tests/servers/telegram.py on 127.0.0.1, the real
`fleet-telegram` long-polling it, and the real `fleet-ask` started over stdio by the MCP SDK's
client, as a coder CLI starts it. Each run: the client calls ask_human with a choice question
and the clock starts; it stops when the Bot API receives the sendMessage of that question
(fleet-ask stores the question and starts the delivery process, detached as in a terminal;
under systemd it is a transient unit instead). Then the bench presses the first button: the
second clock runs from the callback update being queued (the poller's long poll returns at
once) to the tool result arriving at the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

from fleet.timeutil import parse
from tests.bench.common import (
    Options,
    figure,
    fleet_env,
    fleet_exe,
    note,
    report,
    running_task,
    scratch_dir,
)

if TYPE_CHECKING:
    from tests.servers.telegram import TelegramServer

NAME = "telegram"
UNITS_NAME = "telegram-units"
RUNS = 20
TARGET_MS = 500.0
CHAT = 4242


def _new_message(bot: TelegramServer, seen: int, needle: str) -> list[dict[str, Any]]:
    """The messages after the first `seen` that hold `needle`, once there is one."""

    def found() -> list[dict[str, Any]]:
        return [m for m in bot.sent(CHAT)[seen:] if needle in m["text"]]

    messages: list[dict[str, Any]] = bot.wait(found, 30, "the question")
    return messages


async def _measure(
    home: Path, task_id: str, env: dict[str, str], runs: int, bot: TelegramServer, poller: bool
) -> None:
    """With `poller`, each question is answered by a press; without, by `fleet answer`."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    ask = os.path.join(os.path.dirname(fleet_exe()), "fleet-ask")
    params = StdioServerParameters(command=ask, env={**env, "FLEET_TASK_ID": task_id})
    sent_ms: list[float] = []
    pressed_ms: list[float] = []
    with open(os.devnull, "w") as quiet:
        async with (
            stdio_client(params, quiet) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for n in range(runs + 1):  # the first is a warm-up
                seen = len(bot.sent(CHAT))
                t0 = perf_counter()
                call = asyncio.ensure_future(
                    session.call_tool(
                        "ask_human",
                        {"question": f"Question {n}?", "kind": "choice", "options": ["a", "b"]},
                    )
                )
                message = await asyncio.to_thread(_new_message, bot, seen, f"Question {n}?")
                t1 = t2 = perf_counter()
                if poller:
                    data = message[0]["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
                    t2 = perf_counter()
                    bot.press(CHAT, CHAT, message[0]["message_id"], data)
                else:
                    qid = message[0]["text"].split("(", 1)[1].split(")", 1)[0]
                    answer = [fleet_exe(), "answer", qid, "--choice", "a"]
                    await asyncio.to_thread(
                        subprocess.run, answer, env=env, check=True, stdout=subprocess.DEVNULL
                    )
                result = await asyncio.wait_for(call, 30)
                t3 = perf_counter()
                text = "".join(getattr(block, "text", "") for block in result.content)
                if "chose: a" not in text:
                    raise RuntimeError(f"the answer did not reach the agent: {text!r}")
                if n:
                    sent_ms.append((t1 - t0) * 1000)
                    pressed_ms.append((t3 - t2) * 1000)
    if not poller:
        label = "question asked -> Telegram message sent, by the delivery process alone"
        report(label, sent_ms, "ms", target=TARGET_MS)
        return
    label = "question asked -> Telegram message sent, fleet-telegram running"
    report(label, sent_ms, "ms", target=TARGET_MS)
    report("button press -> ask_human returns", pressed_ms, "ms", target=TARGET_MS)


def configured(root: Path, bot: TelegramServer) -> tuple[dict[str, str], str]:
    """A FLEET_HOME under `root` that notifies CHAT through `bot`: its environment, and the
    id of a running task."""
    from tests.servers import telegram

    home = root / "home"
    env = fleet_env(home)
    os.environ["FLEET_HOME"] = str(home)  # for this process's own store and config
    token = root / "token"
    token.write_text(telegram.TOKEN)
    token.chmod(0o600)
    settings = [
        f"telegram_token_file={token}",
        f"telegram_chats=[{CHAT}]",
        f"telegram_api_url={bot.url}",
        "notify_desktop=false",
    ]
    command = [fleet_exe(), "config", "set", *settings]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return env, running_task(root)


def main(opts: Options) -> None:
    from tests.servers import telegram

    runs = opts.runs(RUNS)
    with scratch_dir(NAME) as root, telegram.serve() as bot:
        env, task_id = configured(root, bot)
        home = root / "home"
        asyncio.run(_measure(home, task_id, env, runs, bot, poller=False))
        poller = subprocess.Popen(
            [os.path.join(os.path.dirname(fleet_exe()), "fleet-telegram")],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            bot.wait(lambda: bot.calls("getUpdates"), 30, "the poller")
            asyncio.run(_measure(home, task_id, env, runs, bot, poller=True))
        finally:
            poller.terminate()
            poller.wait(timeout=30)
    note("the delivery process is detached as from a terminal; under a unit, a transient unit")
    figure("telegram runs", f"{runs} questions to one fleet-ask, without and with fleet-telegram")


def main_units(opts: Options) -> None:
    from tests.servers import telegram

    with telegram.serve() as bot:
        under_systemd(opts, bot)


UNIT_RUNS = 10
AGENT = Path(__file__).resolve().parent.parent / "fixtures" / "ask_agent.py"


def under_systemd(opts: Options, bot: TelegramServer) -> None:
    """The same two figures with fleet installed by `fleet setup --system --telegram` in a
    systemd sandbox: the agent is a command-coder task (tests/fixtures/ask_agent.py) whose
    fleet-ask fires from inside its fleet-task@ unit, so the delivery is a transient unit.
    The clocks: the question's asked_at in the store (ms) to the sendMessage's arrival, and
    the press to fleet-ask's journal entry of the answer (it is written as the call returns).
    """
    from tests.sandbox import Sandbox
    from tests.servers import telegram

    if os.geteuid() != 0:
        note("under systemd: skipped, booting a systemd sandbox needs root")
        return
    root = Path(tempfile.mkdtemp(prefix="fleet-bench-tg-", dir="/tmp"))  # the sandbox sees it
    home, project, token = root / "home", root / "project", root / "token"
    project.mkdir()
    token.write_text(telegram.TOKEN)
    token.chmod(0o600)
    box = Sandbox.boot(root / "sandbox")
    try:

        def fleet(*args: str) -> str:
            return box.run(fleet_exe(), *args, env={"FLEET_HOME": str(home)}).stdout

        fleet(
            "config", "set", "default_coder=command", "notify_desktop=false",
            f"telegram_token_file={token}", f"telegram_chats=[{CHAT}]",
            f"telegram_api_url={bot.url}", "telegram_poll_seconds=5",
        )  # fmt: skip
        fleet("setup", "--system", "--telegram")
        sent_ms: list[float] = []
        pressed_ms: list[float] = []
        for n in range(opts.runs(UNIT_RUNS) + 1):  # the first is a warm-up
            seen = len(bot.sent(CHAT))
            script = f"{sys.executable} {AGENT} 'Question {n}?' yes no"
            task_id = fleet("add", f"q{n}", "--cwd", str(project), "-d", script).strip()
            message = _new_message(bot, seen, f"Question {n}?")[0]
            (q,) = json.loads(fleet("questions", "--json"))
            arrived = next(c for c in bot.calls("sendMessage") if q["id"] in c.params["text"])
            data = message["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
            pressed = time.time()  # the journal's clock
            bot.press(CHAT, CHAT, message["message_id"], data)
            fleet("wait", task_id, "--timeout", "60")
            (entry,) = box.journal(f"FLEET_QUESTION={q['id']}", "FLEET_QUESTION_STATUS=answered")
            if n:
                sent_ms.append((arrived.wall - parse(q["asked_at"])) * 1000)
                pressed_ms.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6 - pressed) * 1000)
        report("under systemd: question asked -> message sent", sent_ms, "ms", target=TARGET_MS)
        report("under systemd: button press -> agent unblocked", pressed_ms, "ms", target=TARGET_MS)
    finally:
        box.stop()
        shutil.rmtree(root, ignore_errors=True)
