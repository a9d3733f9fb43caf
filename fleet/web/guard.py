"""The dashboard's door: every request passes here before any page or action sees it.

Invariants, in the order they are checked:
- a Host header that is not one of the allowed names (fleet.web.access.allowed_hosts) gets
  421 and nothing else: a page of another site that resolves its own name to 127.0.0.1 (DNS
  rebinding) reaches no page and no action;
- `/login?token=…` with the right token sets the session cookie and redirects to `/`; the
  static files are public (they hold nothing of the queue); anything else without the
  session cookie gets 401 and a page saying how to log in (a fragment or a stream gets a
  line of text);
- a request that may change something (any method but GET and HEAD) needs the CSRF token in
  the X-CSRF-Token header and, when the browser sends an Origin, an Origin of this very host:
  403 otherwise, before the action runs;
- every response carries a strict Content-Security-Policy (scripts and styles from this
  origin only, no inline script, no frames, no images from elsewhere), no-referrer (the login
  URL's token never leaves in a Referer) and nosniff; pages are not cached.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from fleet.web.access import COOKIE, CSRF_HEADER, Keys

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; font-src 'self'; object-src 'none'; frame-ancestors 'none';"
    " base-uri 'none'; form-action 'self'"
)
SAFE_METHODS = ("GET", "HEAD")
PUBLIC = ("/static/",)
MONTH = 30 * 86400


class Guard:
    def __init__(self, app: ASGIApp, keys: Keys, hosts: frozenset[str]) -> None:
        self.app = app
        self.keys = keys
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").strip().lower()
        if host not in self.hosts:
            await _plain(send, 421, f"fleet web does not answer to the host {host!r}\n")
            return
        path: str = scope["path"]
        if path == "/login":
            await self._login(scope, send, headers.get("x-forwarded-proto") == "https")
            return
        if not path.startswith(PUBLIC) and not self.keys.is_session(_cookie(headers, COOKIE)):
            await _unauthorized(send, "hx-request" in headers or path.startswith("/events"))
            return
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get("origin")
            if origin is not None and origin.split("://", 1)[-1].lower() != host:
                await _plain(send, 403, "refused: the request comes from another site\n")
                return
            if not self.keys.is_csrf(headers.get(CSRF_HEADER)):
                await _plain(send, 403, "refused: a change needs the page's CSRF token\n")
                return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"content-security-policy", POLICY.encode()),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                ]
                if not path.startswith(PUBLIC):
                    extra.append((b"cache-control", b"no-store"))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, secured)

    async def _login(self, scope: Scope, send: Send, tls: bool) -> None:
        """The login link: the cookie (Secure when a TLS proxy says it serves https), then
        the dashboard, at an address without the token."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = (query.get("token") or [None])[0]
        if not self.keys.is_token(given):
            await _unauthorized(send, False, "That login link is not (or no longer) valid.")
            return
        cookie = f"{COOKIE}={self.keys.session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={MONTH}"
        if tls:
            cookie += "; Secure"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", b"/"),
                    (b"set-cookie", cookie.encode()),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})


def _cookie(headers: dict[str, str], name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fleet · log in</title><link rel="stylesheet" href="/static/fleet.css"></head>
<body class="login"><main class="card narrow"><h1>fleet</h1><p>{said}</p>
<p>Run <code>fleet web url</code> on the machine that runs fleet, and open the link it
prints: it logs this browser in.</p></main></body></html>
"""


async def _unauthorized(send: Send, fragment: bool, said: str = "You are not logged in.") -> None:
    if fragment:
        await _plain(send, 401, "not logged in: run `fleet web url` and open its link\n")
        return
    body = LOGIN_PAGE.format(said=said).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"content-security-policy", POLICY.encode()),
                (b"referrer-policy", b"no-referrer"),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
