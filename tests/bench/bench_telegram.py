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
import os
import subprocess
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

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
RUNS = 20
TARGET_MS = 500.0
CHAT = 4242


def _new_message(bot: TelegramServer, seen: int) -> list[dict[str, Any]]:
    """The messages after the first `seen`, once there is one."""
    found: list[dict[str, Any]] = bot.wait(lambda: bot.sent(CHAT)[seen:], 30, "the question")
    return found


async def _measure(
    home: Path, task_id: str, env: dict[str, str], runs: int, bot: TelegramServer
) -> None:
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
                message = await asyncio.to_thread(_new_message, bot, seen)
                t1 = perf_counter()
                mid = message[0]["message_id"]
                data = message[0]["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
                t2 = perf_counter()
                bot.press(CHAT, CHAT, mid, data)
                result = await asyncio.wait_for(call, 30)
                t3 = perf_counter()
                text = "".join(getattr(block, "text", "") for block in result.content)
                if "chose: a" not in text:
                    raise RuntimeError(f"the press did not answer: {text!r}")
                if n:
                    sent_ms.append((t1 - t0) * 1000)
                    pressed_ms.append((t3 - t2) * 1000)
    report("question asked -> Telegram message sent", sent_ms, "ms", target=TARGET_MS)
    report("button press -> ask_human returns", pressed_ms, "ms", target=TARGET_MS)


def main(opts: Options) -> None:
    from tests.servers import telegram

    with scratch_dir(NAME) as root, telegram.serve() as bot:
        home = root / "home"
        env = fleet_env(home)
        os.environ["FLEET_HOME"] = str(home)  # for this process's own store and config
        token = root / "token"
        token.write_text(telegram.TOKEN)
        token.chmod(0o600)
        subprocess.run(
            [
                fleet_exe(),
                "config",
                "set",
                f"telegram_token_file={token}",
                f"telegram_chats=[{CHAT}]",
                f"telegram_api_url={bot.url}",
                "notify_desktop=false",
            ],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        task_id = running_task(root)
        poller = subprocess.Popen(
            [os.path.join(os.path.dirname(fleet_exe()), "fleet-telegram")],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            bot.wait(lambda: bot.calls("getUpdates"), 30, "the poller")
            runs = opts.runs(RUNS)
            asyncio.run(_measure(home, task_id, env, runs, bot))
        finally:
            poller.terminate()
            poller.wait(timeout=30)
        note("the delivery is detached as from a terminal; under a unit it is a transient unit")
        figure("telegram runs", f"{runs} questions to one fleet-ask, each answered by a press")
