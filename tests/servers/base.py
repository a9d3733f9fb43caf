"""The common part of every scripted model server: a threaded HTTP server on 127.0.0.1.

A protocol module subclasses `Handler` (one per wire protocol: Anthropic Messages, OpenAI
Responses, OpenAI Chat Completions, Gemini) and decides each answer from the request; the
server records every request body so a test can check what the CLI sent (tool results, the
human's answer, resumed history). Servers listen on an ephemeral port of 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar


@dataclass
class Log:
    """Requests seen, in order: (method, path, parsed JSON body or None)."""

    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, path: str, body: Any) -> None:
        with self.lock:
            self.requests.append((method, path, body))

    def bodies(self, path_part: str = "") -> list[Any]:
        with self.lock:
            return [b for _, p, b in self.requests if path_part in p]


class Handler(BaseHTTPRequestHandler):
    log: ClassVar[Log]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_sse(
        self, events: list[tuple[str | None, Any]], headers: dict[str, str] | None = None
    ) -> None:
        """Server-sent events: (event name or None, JSON data) pairs, then close."""
        chunks = []
        for name, data in events:
            prefix = f"event: {name}\n" if name else ""
            payload = data if isinstance(data, str) else json.dumps(data)
            chunks.append(f"{prefix}data: {payload}\n\n")
        raw = "".join(chunks).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)


@contextmanager
def serve(handler: type[Handler]) -> Iterator[tuple[str, Log]]:
    """Run `handler` on 127.0.0.1:<ephemeral>; yields (base URL, request log)."""
    log = Log()
    bound = type(handler.__name__, (handler,), {"log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
