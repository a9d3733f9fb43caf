"""A scripted Anthropic Messages API (`POST /v1/messages`, SSE) for the real Claude Code CLI.

The scenario comes from a marker in the prompt, `FLEET-SCENARIO:NAME` or `FLEET-SCENARIO:NAME:KEY`
(put it in the task's description); the step within it from how many assistant turns the
request's history already holds. Requests without tools (the CLI's side calls, such as titles)
get a short text answer, `count_tokens` a fixed count, and every answer reports usage: input
1200, cache creation 100, cache read 500 and output 30 per call (1 at `message_start`, as the
real API reports it provisionally), so a test can check how the coder adds tokens up.

Scenarios:

* ``shell``: write `fleet_out.txt` with the shell tool, run `fleet close $FLEET_TASK_ID --reason
  done` with it, then answer with text.
* ``ratelimit``: HTTP 429 on every call, with the unified rate-limit headers (status rejected,
  reset `RESET_IN` seconds from now, five-hour window) that the CLI reads under OAuth, and
  `retry-after` (`RETRY_AFTER`), which it honours between its own retries with an API key.
* ``ratelimit-once``: that 429 on the first call for each KEY, then ``shell``.
* ``context``: a first answer whose usage says the context is nearly full (`HUGE_INPUT` input
  tokens) and that starts a long shell command, so the runner has a live agent to stop.
* ``hang``: a shell command that runs for 300 s (`HANG_COMMAND`).
* ``ask``: call fleet's MCP tool `ask_human` (`ASK_TOOL`) with the choice question `ASK_INPUT`;
  once the request carries that call's result, call `task_done` (`DONE_TOOL`) with the summary
  `answer: <the result's text>` (see `done_summary`), so the task's reason shows what the model
  received; then answer with text. Claude Code defers MCP tools (the request names them, the
  `tools` list has only `ToolSearch`), so first, as a real model must, load both with
  `ToolSearch` (`SEARCH_INPUT`) unless `tools` already defines them. The step follows from the
  tool calls the history holds.

* ``suspend``: a session that is suspended and resumed. First, as a model that works and
  checkpoints: load fleet's `checkpoint` tool with `ToolSearch` (as in ``ask``), write
  `suspended_out.txt` (`SUSPEND_WRITE`), call `checkpoint` with `CHECKPOINT_SUMMARY`, then start
  `HANG_COMMAND` for the test to suspend the task. Once fleet's resumed message
  (`RESUMED_MARK`) is in the history, the session was resumed: close the task with the reason
  `resumed-history-ok` if the history re-sent holds the earlier turns (the write and the
  checkpoint call), `resumed-history-missing` otherwise. A fresh session started from the
  checkpoint (`FRESH_MARK` in its prompt, no earlier turns) closes with `fresh-summary-ok` if
  its prompt carries the summary, `fresh-summary-missing` otherwise. Then answer with text.

* ``lease-first`` and ``lease-second``: two agents in one directory and one resource
  (`LEASED`). The first loads fleet's coordination tools with `ToolSearch`, sets its focus
  (`FOCUS_TEXT`), claims `LEASED` with `FIRST_NOTE`, waits in the shell for the file
  `RELEASE_FILE` (`WAIT_RELEASE`), releases it, and closes with task_done. The second claims
  `LEASED`, waits for `RETRY_FILE` (`WAIT_RETRY`), claims it again and closes with the first
  line of each claim's result as its summary (`lease_summary`). A test reads what each
  tool returned from the next request's history.

The long commands sleep in Python: Claude Code 2.1.332 refuses a Bash command that is a plain
`sleep N` or starts with one ("Blocked: standalone sleep 300").

Calls that succeed carry the unified headers too (allowed, 5-hour utilization 0.2).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, ClassVar

from tests.servers.base import Handler

MARKER = re.compile(r"FLEET-SCENARIO:([a-z-]+)(?::([A-Za-z0-9_-]+))?")
USAGE = {"input_tokens": 1200, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 500}
OUTPUT_TOKENS = 30
HUGE_INPUT = 190_000
RESET_IN = 3.0
RETRY_AFTER = 1  # seconds; the CLI waits about that long before each of its own retries
WRITE_COMMAND = "echo fleet > fleet_out.txt && ls"
CLOSE_COMMAND = 'fleet close "$FLEET_TASK_ID" --reason done'
CONTEXT_COMMAND = "python3 -c 'import time; time.sleep(299)'"
HANG_COMMAND = "python3 -c 'import time; time.sleep(300)'"
FINAL_TEXT = "Done. All good."
ASK_TOOL = "mcp__fleet__ask_human"  # Claude Code names MCP tools mcp__<server>__<tool>
DONE_TOOL = "mcp__fleet__task_done"
SEARCH_TOOL = "ToolSearch"
SEARCH_INPUT = {"query": f"select:{ASK_TOOL},{DONE_TOOL}"}
CHECKPOINT_TOOL = "mcp__fleet__checkpoint"
CHECKPOINT_SEARCH = {"query": f"select:{CHECKPOINT_TOOL}"}
CHECKPOINT_SUMMARY = "Wrote suspended_out.txt with the shell; next: close the task."
SUSPEND_WRITE = "echo before > suspended_out.txt"
RESUMED_MARK = "is now resumed from checkpoint"  # fleet's message to a resumed session
FRESH_MARK = "taken in an earlier session"  # fleet's note in a fresh session's prompt
CLAIM_TOOL = "mcp__fleet__claim"
RELEASE_TOOL = "mcp__fleet__release"
FOCUS_TOOL = "mcp__fleet__set_focus"
LEASE_SEARCH = {"query": f"select:{CLAIM_TOOL},{RELEASE_TOOL},{FOCUS_TOOL},{DONE_TOOL}"}
LEASED = "src/parser.py"
FOCUS_TEXT = "rewriting the parser"
FIRST_NOTE = "rewriting the tokenizer"
RELEASE_FILE, RETRY_FILE = "release.go", "retry.go"


def wait_for_file(name: str) -> str:
    """A shell command that returns once `name` exists in the working directory (at most 120 s:
    the test creates it)."""
    return (
        "python3 -c 'import os, time\nend = time.time() + 120\n"
        f'while not os.path.exists("{name}") and time.time() < end: time.sleep(0.02)\''
    )


WAIT_RELEASE, WAIT_RETRY = wait_for_file(RELEASE_FILE), wait_for_file(RETRY_FILE)
ASK_INPUT = {
    "question": "Which colour should the new button be?",
    "kind": "choice",
    "options": ["red", "green", "blue"],
}


def scenario(body: Any) -> tuple[str, str]:
    """(name, key) from the first marker in the request's messages; ("", "") if none."""
    found = MARKER.search(json.dumps(body.get("messages", [])) if isinstance(body, dict) else "")
    return (found.group(1), found.group(2) or "") if found else ("", "")


def turns(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    return sum(1 for m in messages or [] if isinstance(m, dict) and m.get("role") == "assistant")


def blocks(body: dict[str, Any], role: str, kind: str) -> list[dict[str, Any]]:
    """The content blocks of type `kind` in the history's `role` messages, in order."""
    found = []
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == role:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == kind:
                    found.append(block)
    return found


def called(body: dict[str, Any]) -> list[str]:
    """The names of the tools the history's assistant turns called, in order."""
    return [str(b.get("name")) for b in blocks(body, "assistant", "tool_use")]


def tool_result_text(body: dict[str, Any], tool: str | None = None) -> str:
    """The text of the history's last result of `tool` (of any tool if None); "" if none."""
    ids = {b.get("id") for b in blocks(body, "assistant", "tool_use") if b.get("name") == tool}
    for block in reversed(blocks(body, "user", "tool_result")):
        if tool is None or block.get("tool_use_id") in ids:
            inner = block.get("content")
            if isinstance(inner, str):
                return inner
            parts = inner if isinstance(inner, list) else []
            return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return ""


def defines(body: dict[str, Any], tool: str) -> bool:
    """Whether the request's `tools` holds `tool` with its schema."""
    return any(isinstance(t, dict) and t.get("name") == tool for t in body.get("tools") or [])


def done_summary(result: str) -> str:
    """The `task_done` summary the `ask` scenario sends after `ask_human` returned `result`."""
    return f"answer: {result}"


def unified(status: str, reset: float, utilization: float) -> dict[str, str]:
    """The `anthropic-ratelimit-unified-*` headers of a five-hour window."""
    at = str(int(reset))
    return {
        "anthropic-ratelimit-unified-status": status,
        "anthropic-ratelimit-unified-reset": at,
        "anthropic-ratelimit-unified-representative-claim": "five_hour",
        "anthropic-ratelimit-unified-5h-status": status,
        "anthropic-ratelimit-unified-5h-utilization": str(utilization),
        "anthropic-ratelimit-unified-5h-reset": at,
    }


class AnthropicHandler(Handler):
    rejected: ClassVar[set[str]]  # keys of `ratelimit-once` that had their 429
    resets: ClassVar[dict[str, float]]  # key -> the reset time of its last 429
    lock: ClassVar[threading.Lock]

    def do_GET(self) -> None:
        self.send_json(404, {"type": "error", "error": {"type": "not_found_error"}})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.body()
        self.log.add("POST", self.path, body)
        if not isinstance(body, dict):
            self.send_json(400, {"type": "error", "error": {"type": "invalid_request_error"}})
        elif "count_tokens" in self.path:
            self.send_json(200, {"input_tokens": USAGE["input_tokens"]})
        elif not self.path.startswith("/v1/messages"):
            self.send_json(404, {"type": "error", "error": {"type": "not_found_error"}})
        else:
            self.messages(body)

    def messages(self, body: dict[str, Any]) -> None:
        name, key = scenario(body)
        if not body.get("tools"):
            self.answer(body, [text_block("A title")])
            return
        if name == "ratelimit" or (name == "ratelimit-once" and self.first_time(key)):
            self.too_many(key)
            return
        step = turns(body)
        if name in ("shell", "ratelimit-once"):
            commands = [WRITE_COMMAND, CLOSE_COMMAND]
            blocks = [bash(commands[step])] if step < len(commands) else [text_block(FINAL_TEXT)]
            self.answer(body, blocks)
        elif name == "context":
            self.answer(body, [bash(CONTEXT_COMMAND)], input_tokens=HUGE_INPUT)
        elif name == "hang":
            self.answer(body, [bash(HANG_COMMAND)] if step == 0 else [text_block(FINAL_TEXT)])
        elif name == "ask":
            self.answer(body, [ask_step(body)])
        elif name == "suspend":
            self.answer(body, [suspend_step(body)])
        elif name in ("lease-first", "lease-second"):
            self.answer(body, [lease_step(body, name == "lease-first")])
        else:
            self.answer(body, [text_block(f"no scenario marker: {name or 'none'}")])

    def first_time(self, key: str) -> bool:
        with self.lock:
            if key in self.rejected:
                return False
            self.rejected.add(key)
            return True

    def too_many(self, key: str) -> None:
        reset = time.time() + RESET_IN
        with self.lock:
            self.resets[key] = reset
        headers = {"retry-after": str(RETRY_AFTER), **unified("rejected", reset, 1.0)}
        error = {"type": "rate_limit_error", "message": "fake 429 from the scripted server"}
        self.send_json(429, {"type": "error", "error": error}, headers)

    def answer(
        self, body: dict[str, Any], blocks: list[dict[str, Any]], input_tokens: int | None = None
    ) -> None:
        usage = {**USAGE, "output_tokens": 1}
        if input_tokens is not None:
            usage["input_tokens"] = input_tokens
        uses_tool = any(b["type"] == "tool_use" for b in blocks)
        message = {
            "id": f"msg_fake_{turns(body)}_{time.monotonic_ns()}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-test"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": message})
        ]
        for index, block in enumerate(blocks):
            events += block_events(index, block)
        delta = {"stop_reason": "tool_use" if uses_tool else "end_turn", "stop_sequence": None}
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": OUTPUT_TOKENS},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        self.send_sse(events, unified("allowed", time.time() + 4 * 3600, 0.2))


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def ask_step(body: dict[str, Any]) -> dict[str, Any]:
    """The next block of the `ask` scenario, from the calls the history holds."""
    done = called(body)
    if ASK_TOOL not in done:
        if SEARCH_TOOL in done or defines(body, ASK_TOOL) or not defines(body, SEARCH_TOOL):
            return tool_use(ASK_TOOL, ASK_INPUT)
        return tool_use(SEARCH_TOOL, SEARCH_INPUT)
    if DONE_TOOL not in done:
        summary = done_summary(tool_result_text(body, ASK_TOOL))
        return tool_use(DONE_TOOL, {"summary": summary})
    return text_block(FINAL_TEXT)


def user_text(body: dict[str, Any]) -> str:
    """All the text of the history's user messages (prompts, not tool results), joined."""
    parts = []
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def commands(body: dict[str, Any]) -> list[str]:
    """The shell commands the history's assistant turns ran, in order."""
    uses = blocks(body, "assistant", "tool_use")
    return [str(b.get("input", {}).get("command")) for b in uses if b.get("name") == "Bash"]


def close(reason: str) -> dict[str, Any]:
    return bash(f'fleet close "$FLEET_TASK_ID" --reason {reason}')


def suspend_step(body: dict[str, Any]) -> dict[str, Any]:
    """The next block of the `suspend` scenario (see the module docstring)."""
    done, ran, prompt = called(body), commands(body), user_text(body)
    closed = any(c.startswith("fleet close") for c in ran)
    if closed:
        return text_block(FINAL_TEXT)
    if RESUMED_MARK in prompt:
        earlier = SUSPEND_WRITE in ran and CHECKPOINT_TOOL in done
        return close("resumed-history-ok" if earlier else "resumed-history-missing")
    if FRESH_MARK in prompt:
        carried = CHECKPOINT_SUMMARY in prompt and not ran
        return close("fresh-summary-ok" if carried else "fresh-summary-missing")
    deferred = defines(body, SEARCH_TOOL) and not defines(body, CHECKPOINT_TOOL)
    if SEARCH_TOOL not in done and deferred:
        return tool_use(SEARCH_TOOL, CHECKPOINT_SEARCH)
    if SUSPEND_WRITE not in ran:
        return bash(SUSPEND_WRITE)
    if CHECKPOINT_TOOL not in done:
        return tool_use(CHECKPOINT_TOOL, {"summary": CHECKPOINT_SUMMARY})
    return bash(HANG_COMMAND)


def results(body: dict[str, Any], tool: str) -> list[str]:
    """The texts of every result of `tool` in the history, in order."""
    ids = [b.get("id") for b in blocks(body, "assistant", "tool_use") if b.get("name") == tool]
    found = []
    for block in blocks(body, "user", "tool_result"):
        if block.get("tool_use_id") in ids:
            inner = block.get("content")
            parts = inner if isinstance(inner, list) else [{"text": inner}]
            found.append("".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)))
    return found


def lease_summary(claimed: list[str]) -> str:
    """The second agent's task_done summary: the first line of each claim's result."""
    return " | ".join(text.split(". ")[0] for text in claimed)


def lease_step(body: dict[str, Any], first: bool) -> dict[str, Any]:
    """The next block of `lease-first` or `lease-second` (see the module docstring)."""
    done, ran = called(body), commands(body)
    if DONE_TOOL in done:
        return text_block(FINAL_TEXT)
    deferred = defines(body, SEARCH_TOOL) and not defines(body, CLAIM_TOOL)
    if SEARCH_TOOL not in done and deferred:
        return tool_use(SEARCH_TOOL, LEASE_SEARCH)
    if first:
        if FOCUS_TOOL not in done:
            return tool_use(FOCUS_TOOL, {"text": FOCUS_TEXT})
        if CLAIM_TOOL not in done:
            return tool_use(
                CLAIM_TOOL, {"resource": LEASED, "ttl_seconds": 600, "note": FIRST_NOTE}
            )
        if WAIT_RELEASE not in ran:
            return bash(WAIT_RELEASE)
        if RELEASE_TOOL not in done:
            return tool_use(RELEASE_TOOL, {"resource": LEASED})
        return tool_use(DONE_TOOL, {"summary": "released"})
    claims = done.count(CLAIM_TOOL)
    if claims == 0:
        return tool_use(CLAIM_TOOL, {"resource": LEASED, "note": "second"})
    if WAIT_RETRY not in ran:
        return bash(WAIT_RETRY)
    if claims == 1:
        return tool_use(CLAIM_TOOL, {"resource": LEASED, "note": "second"})
    return tool_use(DONE_TOOL, {"summary": lease_summary(results(body, CLAIM_TOOL))})


def tool_use(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{time.monotonic_ns()}",
        "name": name,
        "input": arguments,
    }


def bash(command: str) -> dict[str, Any]:
    return tool_use("Bash", {"command": command, "description": "run a command"})


def block_events(index: int, block: dict[str, Any]) -> list[tuple[str | None, Any]]:
    start: dict[str, Any]
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def handler() -> type[AnthropicHandler]:
    """A fresh handler class, so that each server keeps its own `ratelimit-once` memory."""
    return type(
        "Anthropic",
        (AnthropicHandler,),
        {"rejected": set(), "resets": {}, "lock": threading.Lock()},
    )
