"""A scripted Telegram Bot API on 127.0.0.1, for fleet's outbound messages and fleet-telegram.

It speaks the methods fleet uses, at `/bot<TOKEN>/<method>` with JSON bodies, as the real API
answers them: getMe; getUpdates with long-poll semantics (updates below `offset` are confirmed
and forgotten, a call with nothing to return waits up to `timeout` seconds, and a second poller
makes the first one's call fail with 409 Conflict); sendMessage and editMessageText, which check
the HTML parse mode's markup and the 4096-character limit of the visible text (400 otherwise)
and keep each chat's messages; answerCallbackQuery. A wrong token gets 401.

A test plays the people: `say` (a message, maybe replying to one), `press` (an inline button),
each queued as an update; `fail` scripts the next answers of a method (a status such as 500,
or 429 with `retry_after`). Every call is recorded (`calls`), and `wait` blocks on a condition
over the server's state until a deadline.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BOT_ID = 7000001
TOKEN = f"{BOT_ID}:AAFakeTokenForFleetTests-0123456789ab"
LIMIT = 4096
TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a",
        "tg-spoiler", "span", "blockquote"}  # fmt: skip


class MarkupError(ValueError):
    pass


class _Visible(HTMLParser):
    """The visible text of Telegram HTML; MarkupError for a tag Telegram does not know or an
    element left open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TAGS:
            raise MarkupError(f'Unsupported start tag "{tag}"')
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            raise MarkupError(f'Unexpected end tag "{tag}"')

    def handle_data(self, data: str) -> None:
        self.text.append(data)


_TAG = re.compile(r"</?([a-z-]+)(\s[^<>]*)?>")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|#[0-9]+|#x[0-9a-fA-F]+);")


def visible(text: str, parse_mode: str | None) -> str:
    """The text a reader sees; MarkupError where Telegram would refuse the HTML."""
    if parse_mode != "HTML":
        return text
    for i, c in enumerate(text):
        if c == "<" and not _TAG.match(text, i):
            raise MarkupError(f"unescaped < at byte offset {i}")
        if c == "&" and not _ENTITY.match(text, i):
            raise MarkupError(f"unescaped & at byte offset {i}")
    parser = _Visible()
    parser.feed(text)
    parser.close()
    if parser.open:
        raise MarkupError(f'Can\'t find end tag corresponding to start tag "{parser.open[-1]}"')
    return "".join(parser.text)


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float  # time.monotonic()
    wall: float = 0.0  # time.time(), to compare with timestamps of other processes


@dataclass
class State:
    token: str = TOKEN
    updates: list[dict[str, Any]] = field(default_factory=list)  # not yet confirmed
    next_update: int = 1000
    next_message: int = 1
    messages: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    failures: dict[str, list[tuple[int, float | None]]] = field(default_factory=dict)
    answers: list[dict[str, Any]] = field(default_factory=list)  # answerCallbackQuery
    poll_generation: int = 0
    polling: int = 0  # getUpdates calls in flight
    changed: threading.Condition = field(default_factory=threading.Condition)


class TelegramServer:
    """The server and the test's handles on it."""

    def __init__(self, token: str = TOKEN) -> None:
        self.state = State(token=token)
        state = self.state

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    params = json.loads(raw) if raw else {}
                except ValueError:
                    params = {}
                status, obj = serve_call(state, self.path, params)
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a poller stopped mid-call)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        with self.state.changed:
            self.state.poll_generation += 1
            self.state.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    # -- what people do ------------------------------------------------------------------

    def _update(self, kind: str, obj: dict[str, Any]) -> int:
        with self.state.changed:
            self.state.next_update += 1
            uid = self.state.next_update
            self.state.updates.append({"update_id": uid, kind: obj})
            self.state.changed.notify_all()
            return uid

    def say(
        self, chat: int, user: int, text: str, reply_to: int | None = None, name: str = "alice"
    ) -> int:
        """A person writes `text` in `chat` (replying to message `reply_to`); the update id."""
        with self.state.changed:
            self.state.next_message += 1
            mid = self.state.next_message
        message: dict[str, Any] = {
            "message_id": mid,
            "date": int(time.time()),
            "chat": {"id": chat, "type": "private" if chat > 0 else "group"},
            "from": {"id": user, "is_bot": False, "first_name": name, "username": name},
            "text": text,
        }
        if text.startswith("/"):
            command = text.split()[0]
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(command)}]
        if reply_to is not None:
            replied = self.state.messages.get((chat, reply_to))
            message["reply_to_message"] = replied or {"message_id": reply_to, "chat": {"id": chat}}
        return self._update("message", message)

    def press(self, chat: int, user: int, message_id: int, data: str, name: str = "alice") -> int:
        """A person presses the button with `data` under message `message_id`."""
        message = self.state.messages[(chat, message_id)]
        query = {
            "id": f"cq{time.monotonic_ns()}",
            "from": {"id": user, "is_bot": False, "first_name": name, "username": name},
            "message": message,
            "chat_instance": str(chat),
            "data": data,
        }
        return self._update("callback_query", query)

    def fail(self, method: str, *answers: tuple[int, float | None]) -> None:
        """The next calls of `method` get these (status, retry_after) answers, in order."""
        with self.state.changed:
            self.state.failures.setdefault(method, []).extend(answers)

    # -- what a test reads -----------------------------------------------------------------

    def wait(self, predicate: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        with self.state.changed:
            while True:
                found = predicate()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    recent = [(c.method, c.params) for c in self.state.calls[-8:]]
                    raise TimeoutError(f"timed out waiting for {what or predicate}: {recent}")
                self.state.changed.wait(left)

    def calls(self, method: str) -> list[Call]:
        with self.state.changed:
            return [c for c in self.state.calls if c.method == method]

    def sent(self, chat: int | None = None) -> list[dict[str, Any]]:
        """The messages sent (as they are now, after any edit), oldest first."""
        with self.state.changed:
            found = [
                m for (c, _), m in sorted(self.state.messages.items(), key=lambda kv: kv[0][1])
            ]
            return [
                m
                for m in found
                if m.get("from", {}).get("is_bot") and (chat is None or m["chat"]["id"] == chat)
            ]

    def pending_updates(self) -> int:
        with self.state.changed:
            return len(self.state.updates)


def serve_call(state: State, path: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    parts = path.strip("/").split("/")
    if len(parts) != 2 or parts[0] != f"bot{state.token}":
        return 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
    method = parts[1]
    with state.changed:
        state.calls.append(Call(method, params, time.monotonic(), time.time()))
        state.changed.notify_all()
        queued = state.failures.get(method)
        if queued:
            status, after = queued.pop(0)
            obj: dict[str, Any] = {"ok": False, "error_code": status}
            if status == 429:
                obj["description"] = f"Too Many Requests: retry after {after}"
                obj["parameters"] = {"retry_after": after}
            else:
                obj["description"] = "Internal Server Error" if status >= 500 else "Bad Request"
            return status, obj
    handler = METHODS.get(method)
    if handler is None:
        return 404, {"ok": False, "error_code": 404, "description": "Not Found: method not found"}
    try:
        return 200, {"ok": True, "result": handler(state, params)}
    except BadRequest as e:
        return e.status, {"ok": False, "error_code": e.status, "description": e.description}


class BadRequest(Exception):
    def __init__(self, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.description = description
        self.status = status


def _get_me(state: State, params: dict[str, Any]) -> Any:
    return {"id": BOT_ID, "is_bot": True, "first_name": "fleet", "username": "fleet_test_bot"}


def _get_updates(state: State, params: dict[str, Any]) -> Any:
    offset = int(params.get("offset") or 0)
    timeout = float(params.get("timeout") or 0)
    limit = int(params.get("limit") or 100)
    deadline = time.monotonic() + timeout
    with state.changed:
        state.poll_generation += 1
        mine = state.poll_generation
        state.polling += 1
        try:
            if offset:
                state.updates = [u for u in state.updates if u["update_id"] >= offset]
            while True:
                if state.poll_generation != mine:
                    raise BadRequest(
                        "Conflict: terminated by other getUpdates request; make sure that only"
                        " one bot instance is running",
                        409,
                    )
                if state.updates:
                    return state.updates[:limit]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                state.changed.wait(left)
        finally:
            state.polling -= 1
            state.changed.notify_all()


def _check_text(params: dict[str, Any]) -> str:
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("Bad Request: message text is empty")
    try:
        shown = visible(text, params.get("parse_mode"))
    except MarkupError as e:
        raise BadRequest(f"Bad Request: can't parse entities: {e}") from None
    if units(shown) > LIMIT:
        raise BadRequest("Bad Request: message is too long")
    markup = params.get("reply_markup")
    if markup:
        for row in markup.get("inline_keyboard", []):
            for button in row:
                if len(str(button.get("callback_data", "")).encode()) > 64:
                    raise BadRequest("Bad Request: BUTTON_DATA_INVALID")
    return shown


def _send_message(state: State, params: dict[str, Any]) -> Any:
    shown = _check_text(params)
    chat = int(params["chat_id"])
    with state.changed:
        state.next_message += 1
        message = {
            "message_id": state.next_message,
            "date": int(time.time()),
            "chat": {"id": chat, "type": "private" if chat > 0 else "group"},
            "from": {"id": BOT_ID, "is_bot": True, "first_name": "fleet"},
            "text": shown,
            "html": params["text"],
            "reply_markup": params.get("reply_markup"),
        }
        state.messages[(chat, message["message_id"])] = message
        state.changed.notify_all()
        return {k: v for k, v in message.items() if k != "html"}


def _edit_message_text(state: State, params: dict[str, Any]) -> Any:
    shown = _check_text(params)
    key = (int(params["chat_id"]), int(params["message_id"]))
    with state.changed:
        message = state.messages.get(key)
        if message is None:
            raise BadRequest("Bad Request: message to edit not found")
        markup = params.get("reply_markup")
        if markup == {"inline_keyboard": []}:
            markup = None
        if message["html"] == params["text"] and message.get("reply_markup") == markup:
            raise BadRequest(
                "Bad Request: message is not modified: specified new message content and reply"
                " markup are exactly the same as a current content and reply markup of the"
                " message"
            )
        message.update(text=shown, html=params["text"], reply_markup=markup, edited=True)
        state.changed.notify_all()
        return {k: v for k, v in message.items() if k != "html"}


def _answer_callback_query(state: State, params: dict[str, Any]) -> Any:
    with state.changed:
        state.answers.append(params)
        state.changed.notify_all()
    return True


METHODS: dict[str, Callable[[State, dict[str, Any]], Any]] = {
    "getMe": _get_me,
    "getUpdates": _get_updates,
    "sendMessage": _send_message,
    "editMessageText": _edit_message_text,
    "answerCallbackQuery": _answer_callback_query,
}


@contextmanager
def serve(token: str = TOKEN) -> Iterator[TelegramServer]:
    server = TelegramServer(token)
    try:
        yield server
    finally:
        server.close()
