"""Talking to systemd's notify socket (READY=1, STATUS=, WATCHDOG=1), and nothing else.

Off systemd (no NOTIFY_SOCKET) every call is a no-op, so the same runner works in a terminal.
A send that fails is logged once on stderr rather than raised or silently dropped: a lost
WATCHDOG=1 would otherwise surface only as a mysterious watchdog kill.

Invariant: every datagram holds exactly the assignments its caller named. systemd reads one
assignment per line, so a value (a status line quoting a tool name the agent chose) with a line
feed in it could add its own (`WATCHDOG=trigger`, `EXTEND_TIMEOUT_USEC=…`); and it reads a
backslash as escaping the next character, so a value ending in one would swallow the line feed
and the next assignment with it. So every backslash of a value is sent doubled and every
control character spelled out behind one (`\\x0a`, which systemd shows as `\x0a`), and a value
is clipped to MAX_VALUE characters as sent.
"""

from __future__ import annotations

import os
import re
import socket
import sys

from fleet import chars

MAX_VALUE = 1024  # characters of one value; a status line is read by people, in one line
_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def assignment(name: str, value: str | int) -> str:
    """`NAME=value` as one line of a notify datagram, whatever `value` holds."""
    key = name.upper()
    if not _NAME.fullmatch(key):
        raise ValueError(f"not a notify variable: {name!r}")
    text = str(value)
    pieces: list[str] = []  # whole escapes only: a lone backslash left at the end would escape
    size = 0
    clipped = len(text) > MAX_VALUE
    for char in text[:MAX_VALUE]:  # escapes only lengthen it
        if char == "\\":
            piece = "\\\\"
        elif chars.LINE.match(char):
            piece = "\\" + chars.spelled(char)
        else:
            piece = char
        if size + len(piece) > MAX_VALUE:
            clipped = True
            break
        pieces.append(piece)
        size += len(piece)
    if clipped:
        while pieces and size >= MAX_VALUE:
            size -= len(pieces.pop())
        pieces.append("…")
    return f"{key}=" + "".join(pieces)


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self._address: str | None = None
        self._sock: socket.socket | None = None
        self._warned = False
        if address:
            # An abstract socket is written with a leading @ in the variable.
            self._address = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def active(self) -> bool:
        return self._sock is not None

    def watchdog_interval(self) -> float | None:
        """Half the watchdog period in seconds, if systemd asked for pings."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        if not usec.isdigit() or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 2e6

    def send(self, **fields: str | int) -> None:
        if self._sock is None or self._address is None:
            return
        text = "\n".join(assignment(k, v) for k, v in fields.items())
        try:
            self._sock.sendto(text.encode("utf-8", "replace"), self._address)
        except OSError as e:
            if not self._warned:
                sys.stderr.write(f"fleet: warning: cannot notify systemd: {e}\n")
                self._warned = True

    def ready(self, status: str) -> None:
        self.send(ready=1, status=status)

    def status(self, status: str) -> None:
        self.send(status=status)

    def ping(self) -> None:
        self.send(watchdog=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
