"""A scripted OpenAI Chat Completions server (`POST /v1/chat/completions`, SSE) for OpenCode.

The scenario is chosen by a marker in the conversation's user messages (fleet puts the task's
description in the prompt): `FLEET_SCENARIO=<name>`.

* `shell`: calls the `bash` tool twice (writes `fleet_out.txt` in the cwd, then
  `fleet close $FLEET_TASK_ID --reason done`), then answers with text.
* `ratelimit`: HTTP 429 with OpenAI's `x-ratelimit-*` headers (both windows exhausted, reset in
  RESET_S seconds, or in N with a `FLEET_RESET_S=N` marker) and `retry-after-ms: RETRY_MS`,
  which OpenCode's own five retries honour, so that its six attempts take about a second.
* `ratelimit-first`: 429 like `ratelimit` while the prompt says "(attempt 1)", then `shell`.
* `huge`: every answer calls `bash` and reports HUGE_PROMPT prompt tokens, near a 200k window.
* `hang`: calls `bash` with `sleep HANG_SECONDS` (a command `pgrep` can find), once.
* `ask`: calls fleet's MCP tool `ask_human` (whichever offered tool is named `<server>_ask_human`:
  OpenCode names MCP tools `<server>_<tool>`) with the free-text question `ASK_ARGS`; once the
  conversation holds its result, calls `bash` with `close_command(result)`, which closes the
  task with the reason `answer: <the result's text>`; then answers with text. Without such a
  tool it answers with a text naming the tools it was offered.

Requests without tools (OpenCode's title generator) get a short plain answer. Every answer
reports usage (PROMPT prompt tokens of which CACHED cached, OUTPUT completion tokens) so the
token accounting of a run can be checked exactly.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from itertools import count
from typing import Any

from tests.servers.base import Handler

PATH = "/v1/chat/completions"
MODEL = "fake-model"
PROMPT, CACHED, OUTPUT = 1200, 500, 30
HUGE_PROMPT = 190_000
RESET_S = 3
RETRY_MS = 200  # OpenCode's own retries (6 attempts) wait this long: quick tests
HANG_SECONDS = 3001
SHELL_COMMANDS = (
    "echo written by the fake model > fleet_out.txt",
    'fleet close "$FLEET_TASK_ID" --reason done',
)
ASK_ARGS = {"question": "What should the greeting in hello.txt say?", "kind": "input"}
RATE_LIMIT_BODY = {
    "error": {
        "message": "fake 429 from scripted server",
        "type": "rate_limit_exceeded",
        "code": "rate_limit_exceeded",
    }
}
FINAL_TEXT = "Done: fleet_out.txt written and the task closed."
_ids = count(1)


def marker(body: Any, name: str) -> str:
    """The value of the `NAME=value` marker in the request's user messages ("" if none)."""
    for text in user_texts(body):
        found = re.search(rf"\b{name}=([\w-]+)", text)
        if found:
            return found.group(1)
    return ""


def user_texts(body: Any) -> list[str]:
    texts: list[str] = []
    for message in body.get("messages", []) if isinstance(body, dict) else []:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return texts


def tool_results(body: Any) -> int:
    """How many tool results the conversation holds: the step the model is at."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")


def last_tool_result(body: Any) -> str:
    """The text of the conversation's last tool result ("" if none)."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    results = [m for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
    content = results[-1].get("content") if results else ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def offered_tool(body: Any, suffix: str) -> str | None:
    """The name of the offered tool that ends with `suffix`, if there is one."""
    for tool in body.get("tools") or [] if isinstance(body, dict) else []:
        name = tool.get("function", {}).get("name", "") if isinstance(tool, dict) else ""
        if isinstance(name, str) and name.endswith(suffix):
            return name
    return None


def close_command(result: str) -> str:
    """The shell command of the `ask` scenario's second step, after ask_human gave `result`."""
    return f'fleet close "$FLEET_TASK_ID" --reason {shlex.quote(f"answer: {result}")}'


def usage(prompt: int = PROMPT, cached: int = CACHED, output: int = OUTPUT) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def text_answer(text: str, use: dict[str, Any]) -> list[tuple[str | None, Any]]:
    return [
        (None, chunk({"role": "assistant", "content": ""})),
        (None, chunk({"content": text})),
        (None, chunk({}, "stop")),
        (None, {**chunk({}), "choices": [], "usage": use}),
        (None, "[DONE]"),
    ]


def tool_answer(command: str, use: dict[str, Any]) -> list[tuple[str | None, Any]]:
    return call_answer("bash", {"command": command, "description": "run a command"}, use)


def call_answer(
    name: str, arguments: dict[str, Any], use: dict[str, Any]
) -> list[tuple[str | None, Any]]:
    call = {
        "index": 0,
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return [
        (None, chunk({"role": "assistant", "content": None, "tool_calls": [call]})),
        (None, chunk({}, "tool_calls")),
        (None, {**chunk({}), "choices": [], "usage": use}),
        (None, "[DONE]"),
    ]


def rate_limit_headers(reset_s: int) -> dict[str, str]:
    return {
        "retry-after-ms": str(RETRY_MS),
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": f"{reset_s}s",
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": f"{reset_s}s",
    }


class ChatHandler(Handler):
    def do_POST(self) -> None:
        body = self.body()
        self.log.add("POST", self.path, body)
        if not self.path.split("?")[0].endswith(PATH) or not isinstance(body, dict):
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if not body.get("tools"):
            self.send_sse(text_answer("Fleet task", usage(100, 0, 5)))
            return
        name = marker(body, "FLEET_SCENARIO")
        step = tool_results(body)
        if name == "ratelimit-first" and any("(attempt 1)" in t for t in user_texts(body)):
            name = "ratelimit"
        elif name == "ratelimit-first":
            name = "shell"
        if name == "ratelimit":
            reset = marker(body, "FLEET_RESET_S")
            seconds = int(reset) if reset.isdigit() else RESET_S
            self.send_json(429, RATE_LIMIT_BODY, rate_limit_headers(seconds))
        elif name == "shell" and step < len(SHELL_COMMANDS):
            self.send_sse(tool_answer(SHELL_COMMANDS[step], usage()))
        elif name == "huge":
            self.send_sse(tool_answer("echo a big context", usage(HUGE_PROMPT, 0)))
        elif name == "hang" and step == 0:
            self.send_sse(tool_answer(f"sleep {HANG_SECONDS}", usage()))
        elif name == "ask" and step == 0:
            tool = offered_tool(body, "_ask_human")
            if tool is None:
                names = [t.get("function", {}).get("name") for t in body["tools"]]
                self.send_sse(text_answer(f"no ask_human tool among {names}", usage()))
            else:
                self.send_sse(call_answer(tool, ASK_ARGS, usage()))
        elif name == "ask" and step == 1:
            self.send_sse(tool_answer(close_command(last_tool_result(body)), usage()))
        else:
            self.send_sse(text_answer(FINAL_TEXT, usage()))
