"""A scripted OpenAI Responses API server (`POST {base_url}/responses`, SSE) for the codex CLI.

codex reaches it through a custom model provider (`wire_api = "responses"`, `base_url` this
server's URL ending in `/v1`, `env_key` naming a variable with any key). The scenario is chosen
by a marker in the prompt, `FLEET-SCENARIO:<name>` (put it in the task's description):

* `shell`: a shell call that writes `fleet_out.txt`, a shell call that runs
  `fleet close "$FLEET_TASK_ID" --reason done`, then a text answer.
* `quota-N`: every request of the scenario's first codex session (`session-id` header) gets
  HTTP 429 `usage_limit_reached` with codex's `x-codex-*` rate-limit headers, the window
  resetting N seconds ahead (default `RESET_IN`; codex then reports the reset time); later
  sessions get `shell`, so a task retried after the reset finishes.
* `toomany-N`: the same with a plain 429 (`rate_limit_error`, `retry-after: N`), for which codex
  reports no reset time.
* `context`: a shell call (`sleep 60`) whose usage reports `CONTEXT_TOKENS` input tokens, near
  the window of any current model; then a text answer.
* `hang-N`: a shell call running `sleep N` in a shell deaf to SIGHUP (so the hangup of its
  terminal does not end it when codex dies); every later request is held open, unanswered,
  until the server stops.
* `pause`: a shell call running `sleep 300` for the test to stop codex in the middle of (a
  person's suspend); once the history carries that call's output (the thread was resumed), a
  shell call that closes the task, then a text answer.
* `ask`: a call of fleet's MCP tool `ask_human` with the approval question `ASK_ARGS` (codex
  offers an MCP server's tools as one namespace tool, `mcp__<server>`, and the model names both:
  `"namespace": "mcp__fleet", "name": "ask_human"`); once codex sends that call's output, a
  call of `task_done` with the summary `answer: <the output>` (`done_summary`); then a text
  answer. Without the namespace among the request's tools, a text answer naming the tools.

Every answer reports usage (`USAGE`, or the huge one) and rate-limit headers (`WINDOWS`), so
token totals and rate-limit gauges are checkable. A request without tools is codex compacting
its history: it gets a short summary.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tests.servers.base import Handler, Log, serve

MARKER = re.compile(r"FLEET-SCENARIO:([a-z]+)(?:-(\d+))?")
USAGE = {"input": 1200, "cached": 500, "output": 30, "reasoning": 7}
CONTEXT_TOKENS = 250_000
RESET_IN = 3.0
WINDOWS = {"primary": (42.0, 300), "secondary": (10.0, 10080)}  # used %, window minutes
WRITE_FILE = "echo hello from codex > fleet_out.txt"
CLOSE = 'fleet close "$FLEET_TASK_ID" --reason done'
PAUSE_COMMAND = "sleep 300 && echo slept"
NAMESPACE = "mcp__fleet"
ASK_ARGS = {"question": "May I delete the old build cache (2 GB)?", "kind": "approval"}


@dataclass
class State:
    """What the scenarios remember across requests (one per running server)."""

    refused: dict[str, str] = field(default_factory=dict)  # scenario -> its refused session
    resets_at: int | None = None  # of the last refusal, epoch seconds
    stop: threading.Event = field(default_factory=threading.Event)
    ids: Iterator[int] = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_id(self) -> int:
        with self.lock:
            return next(self.ids)

    def refuses(self, name: str, session: str) -> bool:
        """Whether this request is of the first session of scenario `name` (the refused one)."""
        with self.lock:
            return self.refused.setdefault(name, session) == session


def scenario(body: Any) -> tuple[str, int]:
    """The marker's scenario and number in the request's input (the prompt), else ("", 0)."""
    items = body.get("input", []) if isinstance(body, dict) else []
    found = MARKER.search(json.dumps(items))
    return (found.group(1), int(found.group(2) or 0)) if found else ("", 0)


def outputs(body: dict[str, Any]) -> list[str]:
    """The tool outputs codex sent back, in order."""
    items = body.get("input", [])
    return [_text(i.get("output", "")) for i in items if i.get("type") == "function_call_output"]


def _text(output: Any) -> str:
    """An output as text: a string, or a list of content parts (codex sends an MCP tool's text
    result as its "Wall time: ...\nOutput:" frame and the text, as two input_text parts)."""
    if isinstance(output, list):
        return "\n".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return str(output)


def done_summary(output: str) -> str:
    """The `task_done` summary of the `ask` scenario after `ask_human` returned `output`."""
    return f"answer: {output}"


def namespaces(body: dict[str, Any]) -> dict[str, list[str]]:
    """The namespace tools of the request: name -> the names of its functions."""
    return {
        str(t.get("name")): [str(f.get("name")) for f in t.get("tools") or []]
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "namespace"
    }


def usage(input_tokens: int | None = None) -> dict[str, Any]:
    n = USAGE["input"] if input_tokens is None else input_tokens
    return {
        "input_tokens": n,
        "input_tokens_details": {"cached_tokens": USAGE["cached"]},
        "output_tokens": USAGE["output"],
        "output_tokens_details": {"reasoning_tokens": USAGE["reasoning"]},
        "total_tokens": n + USAGE["output"],
    }


def limit_headers(primary_used: float | None = None, resets_in: float = 3600) -> dict[str, str]:
    """codex's rate-limit headers; codex copies them into its session file, not its stdout."""
    reset = int(time.time() + resets_in)
    headers = {}
    for role, (used, minutes) in WINDOWS.items():
        if role == "primary" and primary_used is not None:
            used = primary_used
        headers[f"x-codex-{role}-used-percent"] = f"{used:.1f}"
        headers[f"x-codex-{role}-window-minutes"] = str(minutes)
        headers[f"x-codex-{role}-reset-at"] = str(reset if role == "primary" else reset + 86400)
    return headers


class ResponsesHandler(Handler):
    state: ClassVar[State]

    def do_GET(self) -> None:  # e.g. a model list; codex works without one
        self.log.add("GET", self.path, None)
        self.send_json(404, {"error": {"message": "not here", "type": "not_found"}})

    def do_POST(self) -> None:
        body = self.body()
        self.log.add("POST", self.path, body)
        if not self.path.rstrip("/").endswith("/responses") or not isinstance(body, dict):
            self.send_json(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})
            return
        if not body.get("tools"):  # codex compacting its history
            self.answer(body, "Summary: the work so far.")
            return
        name, number = scenario(body)
        done = outputs(body)
        if name in ("quota", "toomany"):
            session = self.headers.get("session-id") or self.headers.get("thread-id") or "?"
            if self.state.refuses(name, session):
                self.refuse(name == "quota", float(number) if number else RESET_IN)
                return
            name = "shell"
        if name == "shell":
            if not done:
                self.call(body, WRITE_FILE)
            elif len(done) == 1:
                self.call(body, CLOSE)
            else:
                self.answer(body, f"Done: wrote fleet_out.txt and closed the task. {done[-1]}")
        elif name == "context":
            if not done:
                self.call(body, "sleep 60", usage(CONTEXT_TOKENS))
            else:
                self.answer(body, "Done.", usage(CONTEXT_TOKENS + 1000))
        elif name == "hang":
            if not done:
                # Deaf to the hangup its terminal gets when codex dies: only a kill ends it.
                self.call(body, f"trap '' HUP; sleep {number or 300}; echo slept")
            else:
                self.state.stop.wait(600)  # the agent waits on us until it is stopped
        elif name == "pause":
            if not done:
                self.call(body, PAUSE_COMMAND)
            elif len(done) == 1:
                self.call(body, CLOSE)
            else:
                self.answer(body, "Resumed, and done.")
        elif name == "ask":
            if "ask_human" not in namespaces(body).get(NAMESPACE, []):
                offered = [t.get("name") for t in body["tools"] if isinstance(t, dict)]
                self.answer(body, f"No {NAMESPACE} ask_human among the tools: {offered}")
            elif not done:
                self.call(body, "", tool=("ask_human", ASK_ARGS))
            elif len(done) == 1:
                self.call(body, "", tool=("task_done", {"summary": done_summary(done[0])}))
            else:
                self.answer(body, f"Done, as the person answered. {done[-1]}")
        else:
            self.answer(body, "Nothing to do (no FLEET-SCENARIO marker).")

    def refuse(self, usage_limit: bool, resets_in: float) -> None:
        resets = int(time.time() + resets_in)
        self.state.resets_at = resets
        headers = {"retry-after": str(int(resets_in)), **limit_headers(100.0, resets_in)}
        if usage_limit:
            error = {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached (scripted)",
                "plan_type": "plus",
                "resets_at": resets,
                "resets_in_seconds": int(resets_in),
            }
        else:
            error = {"type": "rate_limit_error", "message": "Rate limit reached (scripted)"}
        self.send_json(429, {"error": error}, headers)

    def call(
        self,
        body: dict[str, Any],
        command: str,
        used: dict[str, Any] | None = None,
        tool: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """A shell call running `command`, or with `tool` (name, arguments) a call of that
        tool of fleet's MCP server."""
        n = self.state.next_id()
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": "exec_command",
            "arguments": json.dumps({"cmd": command}),
            "status": "completed",
        }
        if tool is not None:
            item.update(namespace=NAMESPACE, name=tool[0], arguments=json.dumps(tool[1]))
        self.respond(body, item, used or usage())

    def answer(self, body: dict[str, Any], text: str, used: dict[str, Any] | None = None) -> None:
        n = self.state.next_id()
        item = {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        self.respond(body, item, used or usage(), text)

    def respond(
        self, body: dict[str, Any], item: dict[str, Any], used: dict[str, Any], text: str = ""
    ) -> None:
        base = {
            "id": f"resp_{self.state.next_id()}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model", "gpt-fake"),
        }
        added = {**item, "status": "in_progress"}
        if item["type"] == "message":
            added["content"] = []
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {**base, "output": []}},
            {"type": "response.in_progress", "response": base},
            {"type": "response.output_item.added", "output_index": 0, "item": added},
        ]
        if text:
            part = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            events.append({"type": "response.output_text.delta", **part, "delta": text})
            events.append({"type": "response.output_text.done", **part, "text": text})
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {
                "type": "response.completed",
                "response": {**base, "status": "completed", "output": [item], "usage": used},
            },
        ]
        self.send_sse([(e["type"], e) for e in events], limit_headers())


@contextmanager
def scripted() -> Iterator[tuple[str, Log, State]]:
    """A fresh server: (base URL for codex's provider, ending in /v1; request log; state)."""
    state = State()
    handler = type("ScriptedResponses", (ResponsesHandler,), {"state": state})
    with serve(handler) as (url, log):
        try:
            yield f"{url}/v1", log, state
        finally:
            state.stop.set()


def responses(log: Log) -> list[dict[str, Any]]:
    """The bodies codex POSTed to /responses, in order (compaction requests included)."""
    return [b for b in log.bodies("/responses") if isinstance(b, dict)]
