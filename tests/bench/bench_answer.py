"""Answer latency: from a person's `fleet answer` to the agent's `ask_human` call returning.

Why: an agent blocked on a question costs a person's time; the Python supervisor this replaces
polls for answers once a second (0.5 s on average, 1 s at worst, on top of its own work).
Target from the issue: median <= 200 ms.

One FLEET_HOME with a running task (claimed through the store, as fleet-run would), and the
real `fleet-ask` started over stdio by the MCP SDK's client, as a coder CLI starts it. Each run:
the client calls ask_human; once the question is pending in fleet.db (seen through inotify on
the store's commit file), the clock starts and `fleet answer Q TEXT` is spawned as a fresh
process, as a person's shell would; the clock stops when the tool result arrives. The time
`fleet answer` itself takes (process start to exit) is printed beside it, since it is most of
the figure; the rest is inotify, one read of fleet.db and the MCP reply.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, TextIO

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
    from mcp.client.stdio import StdioServerParameters

NAME = "answer"
RUNS = 20
TARGET_MS = 200.0


async def _pending(home: Path, task_id: str) -> str:
    """The id of the task's pending question, waiting on commits of the store (inotify)."""
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    from fleet.paths import resolve
    from fleet.store import open_store

    inotify = INotify()
    inotify.add_watch(home / "fleet.lock", iflags.ATTRIB)
    store = open_store(resolve())
    try:
        while True:
            found = store.get(task_id).question
            if found:
                return found
            await asyncio.to_thread(inotify.read, 10_000)
    finally:
        store.close()
        inotify.close()


async def _measure(home: Path, task_id: str, env: dict[str, str], runs: int) -> None:
    from mcp.client.stdio import StdioServerParameters

    ask = os.path.join(os.path.dirname(fleet_exe()), "fleet-ask")
    params = StdioServerParameters(command=ask, env={**env, "FLEET_TASK_ID": task_id})
    started = perf_counter()
    with open(os.devnull, "w") as quiet:  # fleet-ask logs each question on stderr off systemd
        await _session(params, home, task_id, env, runs, quiet, started)


async def _session(
    params: StdioServerParameters,
    home: Path,
    task_id: str,
    env: dict[str, str],
    runs: int,
    errlog: TextIO,
    started: float,
) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    latencies: list[float] = []
    answer_cmd: list[float] = []
    async with stdio_client(params, errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        note(f"fleet-ask started and initialized in {perf_counter() - started:.2f} s")
        for n in range(runs + 1):  # the first is a warm-up
            call = asyncio.ensure_future(
                session.call_tool("ask_human", {"question": f"Question {n}?"})
            )
            qid = await _pending(home, task_id)
            t0 = perf_counter()
            proc = await asyncio.create_subprocess_exec(
                fleet_exe(),
                "answer",
                qid,
                f"answer {n}",
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            result = await call
            t1 = perf_counter()
            _, err = await proc.communicate()
            t2 = perf_counter()
            text = "".join(getattr(block, "text", "") for block in result.content)
            if proc.returncode != 0 or f"answer {n}" not in text:
                raise RuntimeError(f"fleet answer failed ({proc.returncode}): {err!r} / {text!r}")
            if n:
                latencies.append((t1 - t0) * 1000)
                answer_cmd.append((t2 - t0) * 1000)
    report("answer -> ask_human returns", latencies, "ms", target=TARGET_MS)
    report("fleet answer process, start to exit", answer_cmd, "ms")


def main(opts: Options) -> None:
    with scratch_dir(NAME) as root:
        home = root / "home"
        env = fleet_env(home)
        os.environ["FLEET_HOME"] = str(home)  # for this process's own store reads
        task_id = running_task(root)
        runs = opts.runs(RUNS)
        asyncio.run(_measure(home, task_id, env, runs))
        figure("answer runs", f"{runs} answers to one fleet-ask, one question at a time")
