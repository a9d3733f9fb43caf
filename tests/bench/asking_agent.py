"""The agent of bench_hosts' answer figure, for the `command` coder: starts fleet-ask as a coder
CLI would (an MCP client over stdio), asks argv[2] questions one after the other, and right
as each ask_human call returns appends `N SECONDS` (time.time(), the realtime clock, the same
on every sandboxed host of the machine) to the file argv[1]; then closes its task.

    python asking_agent.py STAMPS COUNT
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main(stamps: str, count: int) -> None:
    ask = shutil.which("fleet-ask")  # fleet-run puts its own directory first on PATH
    assert ask is not None
    params = StdioServerParameters(command=ask, env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for n in range(count):
            await session.call_tool("ask_human", {"question": f"question {n}: go on?"})
            answered = time.time()
            with open(stamps, "a", encoding="ascii") as out:
                out.write(f"{n} {answered:.6f}\n")
        await session.call_tool("task_done", {"summary": f"{count} questions answered"})


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
