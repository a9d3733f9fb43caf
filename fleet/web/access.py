"""Who may use the dashboard: one secret token per queue, a session cookie derived from it, a
CSRF token derived from it, and the Host names it answers to.

Invariants:
- the token is 32 random bytes in `$FLEET_HOME/web.token`, mode 0600 like everything there;
  it is made the first time it is needed and is never printed except inside the login URL of
  `fleet web url` / `fleet web --open`;
- the login URL carries the token once: the server checks it in constant time, sets the
  session cookie (HttpOnly, SameSite=Strict) and redirects to a URL without it; every other
  request needs that cookie, and every state-changing one also the CSRF token;
- the cookie and the CSRF token are HMACs of the token, so a new token (`fleet web url
  --new-token`) ends every session at once and nothing but the token file is kept;
- a request whose Host header is not the listening address, localhost, or a name in
  web_hosts is refused before anything else (DNS rebinding).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from fleet.errors import StoreError
from fleet.fsutil import write_atomic
from fleet.paths import Paths, state_dir

TOKEN_FILE = "web.token"
COOKIE = "fleet_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def token_path(paths: Paths) -> Path:
    return paths.home / TOKEN_FILE


def load_token(paths: Paths, new: bool = False) -> str:
    """The queue's dashboard token, made (or with `new` replaced) if need be."""
    path = token_path(paths)
    if not new:
        try:
            found = _read(path)
        except FileNotFoundError:
            found = ""
        if found:
            return found
    state_dir(paths.home)
    token = secrets.token_urlsafe(32)
    try:
        if new:
            write_atomic(path, (token + "\n").encode())
            return token
        # The first to make it wins (`fleet web` and `fleet web url` may start together):
        # written beside it, then linked into place, which fails if it is there already.
        spare = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        write_atomic(spare, (token + "\n").encode())
        try:
            os.link(spare, path)
        except FileExistsError:
            token = _read(path)
        finally:
            spare.unlink(missing_ok=True)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror}") from e
    return token


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read(200).decode("ascii", "replace").strip()


class Keys:
    """What the server derives from the token: the session cookie's value and the CSRF
    token, each compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.session = self._derive("session")
        self.csrf = self._derive("csrf")

    def _derive(self, purpose: str) -> str:
        return hmac.new(self._token, purpose.encode(), hashlib.sha256).hexdigest()

    def is_token(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def is_session(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.session)

    def is_csrf(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, or a name) only ever means this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(
    listen_host: str | None, port: int | None, extra: Iterable[str]
) -> frozenset[str]:
    """The Host header values the server answers: the address it listens on and the loopback
    names (each with and without the port), and the names of web_hosts as given."""
    names = set(LOOPBACK_NAMES)
    if listen_host and listen_host not in ("0.0.0.0", "[::]", "::"):
        names.add(
            listen_host if ":" not in listen_host.strip("[]") else f"[{listen_host.strip('[]')}]"
        )
    found = set()
    for name in names:
        found.add(name.lower())
        if port is not None:
            found.add(f"{name.lower()}:{port}")
    for name in extra:
        found.add(name.strip().lower())
    return frozenset(found)


def login_url(base: str, token: str) -> str:
    from urllib.parse import quote

    return f"{base.rstrip('/')}/login?token={quote(token)}"
