"""A scripted Gemini API (v1beta) for the real Gemini CLI: `:streamGenerateContent?alt=sse`,
`:generateContent` and `:countTokens` under `/v1beta/models/<model>`.

The scenario is chosen by a marker in the task's text, `FLEET-SCENARIO=<name>`, which the
server finds in any user text part of the request:

* `shell`: a `run_shell_command` call that writes `fleet_out.txt`, then one that runs
  `fleet close "$FLEET_TASK_ID" --reason done`, then a text answer;
* `429`: every request gets HTTP 429 with a real-looking `RESOURCE_EXHAUSTED` body whose
  `RetryInfo` asks for a retry in `RETRY_SECONDS` (the CLI shows it as "Suggested retry after");
* `429-once`: the first request of this marker gets that 429, later ones play `shell`;
* `huge`: a text answer whose usage says the prompt was `HUGE_PROMPT` tokens;
* `hang`: a `run_shell_command` call running `sleep HANG_SECONDS` (then a text answer, if the
  tool ever returns);
* `ask`: a call of fleet's MCP tool `ask_human` (the declared function named
  `<prefix>ask_human`: the CLI names MCP tools `mcp_<server>_<tool>`) with the multiple-choice
  question `ASK_ARGS`; once the request holds its response, a `run_shell_command` call of
  `close_command(<the response's text>)`, which closes the task with the reason `answer: …`;
  then a text answer. Without such a function, a text answer naming the declared ones;
* anything else: a text answer.

Every model answer reports usage: `promptTokenCount` PROMPT + STEP_GROWTH per tool result so far
(cached CACHED of them), `candidatesTokenCount` OUTPUT, `thoughtsTokenCount` THOUGHTS.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tests.servers.base import Handler, Log, serve

MARKER = re.compile(r"FLEET-SCENARIO=([A-Za-z0-9_-]+)")
PROMPT = 1200
STEP_GROWTH = 100
CACHED = 500
OUTPUT = 30
THOUGHTS = 7
HUGE_PROMPT = 1_000_000
RETRY_SECONDS = 3
HANG_SECONDS = 4747
OUT_FILE = "fleet_out.txt"
WRITE_COMMAND = f"echo written by the scripted gemini > {OUT_FILE}"
CLOSE_COMMAND = 'fleet close "$FLEET_TASK_ID" --reason done'
FINAL_TEXT = "All done: the file is written and the task is closed."
ASK_ARGS = {
    "question": "Which checks should run before the release?",
    "kind": "choice",
    "options": ["unit tests", "lint", "benchmarks"],
    "multi_select": True,
}


@dataclass
class State:
    """Per-server settings and memory: the retry delay its 429s ask for, and how many requests
    each 429 marker has had."""

    retry_seconds: int = RETRY_SECONDS
    rejected: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first(self, scenario: str) -> bool:
        with self.lock:
            n = self.rejected.get(scenario, 0)
            self.rejected[scenario] = n + 1
            return n == 0


def usage(prompt: int) -> dict[str, int]:
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": OUTPUT,
        "cachedContentTokenCount": min(CACHED, prompt),
        "thoughtsTokenCount": THOUGHTS,
        "totalTokenCount": prompt + OUTPUT + THOUGHTS,
    }


def scenario_of(body: Any) -> str:
    for content in _contents(body):
        if content.get("role", "user") != "user":
            continue
        for part in content.get("parts") or []:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and (m := MARKER.search(text)):
                return m.group(1)
    return ""


def tool_results(body: Any) -> int:
    return sum(
        1
        for content in _contents(body)
        for part in content.get("parts") or []
        if isinstance(part, dict) and "functionResponse" in part
    )


def declared(body: Any) -> list[str]:
    """The names of the functions the request declares."""
    tools = body.get("tools") if isinstance(body, dict) else None
    return [
        str(f.get("name"))
        for tool in tools or []
        if isinstance(tool, dict)
        for f in tool.get("functionDeclarations") or []
        if isinstance(f, dict)
    ]


def last_response(body: Any) -> str:
    """The text of the history's last function response: its `output`, else its JSON."""
    responses = [
        part["functionResponse"]
        for content in _contents(body)
        for part in content.get("parts") or []
        if isinstance(part, dict) and isinstance(part.get("functionResponse"), dict)
    ]
    response = responses[-1].get("response") if responses else None
    if isinstance(response, dict) and isinstance(response.get("output"), str):
        return str(response["output"])
    return json.dumps(response)


def close_command(result: str) -> str:
    """The shell command of the `ask` scenario's second step, after ask_human gave `result`."""
    return f'fleet close "$FLEET_TASK_ID" --reason {shlex.quote(f"answer: {result}")}'


def _contents(body: Any) -> list[dict[str, Any]]:
    contents = body.get("contents") if isinstance(body, dict) else None
    return [c for c in contents or [] if isinstance(c, dict)]


def shell_call(command: str, description: str) -> dict[str, Any]:
    return {
        "functionCall": {
            "name": "run_shell_command",
            "args": {"command": command, "description": description},
        }
    }


def answer(parts: list[dict[str, Any]], prompt: int, model: str) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": usage(prompt),
        "modelVersion": model,
        "responseId": "scripted",
    }


def quota_error(retry_seconds: int) -> dict[str, Any]:
    return {
        "error": {
            "code": 429,
            "message": f"Resource has been exhausted (scripted). Please retry in {retry_seconds}s.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                        }
                    ],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": f"{retry_seconds}s",
                },
            ],
        }
    }


class GeminiHandler(Handler):
    state: ClassVar[State]

    def do_POST(self) -> None:
        body = self.body()
        self.log.add("POST", self.path, body)
        path = self.path.split("?", 1)[0]
        model = path.rsplit("/", 1)[-1].split(":", 1)[0]
        if path.endswith(":countTokens"):
            self.send_json(200, {"totalTokens": PROMPT})
            return
        scenario = scenario_of(body)
        step = tool_results(body)
        if scenario == "429" or (scenario == "429-once" and self.state.first(scenario)):
            delay = self.state.retry_seconds
            self.send_json(429, quota_error(delay), {"Retry-After": str(delay)})
            return
        prompt = PROMPT + STEP_GROWTH * step
        parts: list[dict[str, Any]]
        config = body.get("generationConfig") if isinstance(body, dict) else None
        if isinstance(config, dict) and (
            "responseJsonSchema" in config or "responseSchema" in config
        ):
            # A utility call (model routing, …) that wants JSON back, not a turn of the task.
            parts = [{"text": json.dumps({"reasoning": "scripted", "model_choice": "flash"})}]
        elif scenario in ("shell", "429-once") and step == 0:
            parts = [shell_call(WRITE_COMMAND, "write the file")]
        elif scenario in ("shell", "429-once") and step == 1:
            parts = [shell_call(CLOSE_COMMAND, "close the task")]
        elif scenario == "hang" and step == 0:
            parts = [shell_call(f"sleep {HANG_SECONDS}", "wait a long time")]
        elif scenario == "ask" and step == 0:
            tools = [n for n in declared(body) if n.endswith("ask_human")]
            if tools:
                parts = [{"functionCall": {"name": tools[0], "args": ASK_ARGS}}]
            else:
                parts = [{"text": f"no ask_human among {declared(body)}"}]
        elif scenario == "ask" and step == 1:
            parts = [shell_call(close_command(last_response(body)), "close the task")]
        elif scenario == "huge":
            prompt = HUGE_PROMPT
            parts = [{"text": "That was a lot of context."}]
        else:
            parts = [{"text": FINAL_TEXT}]
        reply = answer(parts, prompt, model)
        if path.endswith(":streamGenerateContent"):
            self.send_sse([(None, reply)])
        else:
            self.send_json(200, reply)


@contextmanager
def serve_gemini(retry_seconds: int = RETRY_SECONDS) -> Iterator[tuple[str, Log]]:
    """A fresh server (its own 429 memory): yields (base URL, request log)."""
    handler = type("Gemini", (GeminiHandler,), {"state": State(retry_seconds)})
    with serve(handler) as (url, log):
        yield url, log
