"""Where the dashboard listens, and running it there with uvicorn until it is told to stop.

Invariants:
- one listening socket: the one systemd passes (socket activation: LISTEN_FDS for this
  process, fd 3), else a Unix socket path, else ADDRESS:PORT (default web_listen,
  127.0.0.1:8768); an address that is not loopback is refused unless web_allow_remote is set;
- the server answers only Host names of that socket (fleet.web.access.allowed_hosts);
- SIGTERM or SIGINT first closes the hub, which ends every open stream, so uvicorn's graceful
  shutdown never waits on a browser that keeps a page open; under systemd the service says
  READY=1 once it serves and STOPPING=1 when it stops.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any, NamedTuple

from fleet.errors import ConfigError, FleetError, InputError

SD_LISTEN_FDS_START = 3
GRACE_S = 3  # how long open requests may take to finish once the server stops


class Listen(NamedTuple):
    host: str | None = None  # an address or name, IPv6 without brackets
    port: int | None = None
    path: str | None = None  # a Unix socket

    @property
    def url(self) -> str:
        if self.path is not None:
            return "http://localhost"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def text(self) -> str:
        return self.path if self.path is not None else self.url.removeprefix("http://")


def parse(text: str, where: str = "web_listen") -> Listen:
    """ADDRESS:PORT, [IPV6]:PORT or an absolute path; InputError otherwise."""
    text = text.strip()
    if text.startswith("/"):
        return Listen(path=text)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise InputError(
            f"{where}: {text!r} is not ADDRESS:PORT or the path of a Unix socket",
            hint="for example 127.0.0.1:8768, [::1]:8768 or /run/fleet/web.sock",
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Listen(host=host, port=int(port))


def check(listen: Listen, allow_remote: bool) -> None:
    from fleet.web.access import is_loopback

    if listen.host is not None and not is_loopback(listen.host) and not allow_remote:
        raise ConfigError(
            f"fleet web would listen on {listen.host}, which other hosts can reach",
            hint="set web_allow_remote=true (and serve it behind a TLS proxy), or listen on"
            " 127.0.0.1",
        )


def activated() -> socket.socket | None:
    """The listening socket systemd passed to this process, if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = os.environ.get("LISTEN_FDS", "")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for the helpers this process starts
    if count != "1":
        raise FleetError(f"systemd passed {count or 'no'} sockets; fleet-web.socket has one")
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    os.set_inheritable(sock.fileno(), False)
    return sock


def bind(listen: Listen) -> socket.socket:
    """A listening socket of our own at `listen`."""
    try:
        if listen.path is not None:
            path = Path(listen.path)
            try:
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()  # a socket left by an earlier server
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # only the owner may connect
            try:
                sock.bind(listen.path)
            finally:
                os.umask(old)
        else:
            infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, address = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise FleetError(
            f"cannot listen on {listen.text()}: {e.strerror}",
            hint="another fleet web (or fleet-web.socket) may be there: fleet web url",
        ) from None
    return sock


def where(sock: socket.socket) -> Listen:
    """What a listening socket (ours or systemd's) listens on."""
    name: Any = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return Listen(path=name if isinstance(name, str) else "(unnamed)")
    return Listen(host=name[0], port=name[1])


def run(app: Any, sock: socket.socket, on_stop: Any, ready: str) -> None:
    """Serve `app` on `sock` until SIGTERM or SIGINT; `on_stop()` runs first thing then."""
    import uvicorn

    from fleet.notify import Notifier

    notifier = Notifier()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            notifier.send(stopping=1)
            on_stop()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            notifier.ready(ready)

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACE_S,
        proxy_headers=False,
        server_header=False,
    )
    Server(config).run(sockets=[sock])
