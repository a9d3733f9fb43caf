"""Talking to systemd's notify socket (READY=1, STATUS=, WATCHDOG=1), and nothing else.

Off systemd (no NOTIFY_SOCKET) every call is a no-op, so the same runner works in a terminal.
A send that fails is logged once on stderr rather than raised or silently dropped: a lost
WATCHDOG=1 would otherwise surface only as a mysterious watchdog kill.
"""

from __future__ import annotations

import os
import socket
import sys


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
        text = "\n".join(f"{k.upper()}={v}" for k, v in fields.items())
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
