"""Writing structured entries to journald over its native protocol (standard library only).

One datagram per entry to /run/systemd/journal/socket; an entry too large for a datagram goes
through a sealed memfd passed with SCM_RIGHTS, so no field is ever truncated or dropped. Field
names are upper-case `[A-Z0-9_]` not starting with `_` (journald silently drops others, so
`field_name` enforces it). Sends block rather than drop when journald is busy.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import os
import re
import socket
import struct
from collections.abc import Mapping

SOCKET = "/run/systemd/journal/socket"
_KEY = re.compile(r"[A-Z0-9][A-Z0-9_]*")

Value = str | bytes | int | float


def field_name(name: str) -> str:
    key = re.sub(r"[^A-Z0-9_]", "_", name.upper()).lstrip("_")
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a journal field name: {name!r}")
    return key


def encode(fields: Mapping[str, Value], head: bytes = b"") -> bytes:
    """The entry as journald's native protocol has it, after `head` (fields already encoded
    here: what every entry of a sender shares is encoded once, not once per entry)."""
    # Most fields are one-line text: they are joined as one string and encoded once, which is
    # several times cheaper per entry than encoding field by field. Field order means nothing
    # to journald, so multi-line and binary fields (length-prefixed) simply follow.
    text: list[str] = []
    binary: list[bytes] = [head, b""]
    for key, value in fields.items():
        if isinstance(value, str):
            if "\n" not in value:
                text.append(f"{key}={value}\n")
                continue
            data = value.encode("utf-8", "replace")
        elif isinstance(value, bytes):
            data = value
            if b"\n" not in data:
                binary.append(key.encode("ascii") + b"=" + data + b"\n")
                continue
        else:
            text.append(f"{key}={value}\n")
            continue
        binary.append(key.encode("ascii") + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
    binary[1] = "".join(text).encode("utf-8", "replace")
    return b"".join(binary)


def under_journald() -> bool:
    """Whether stdout or stderr is connected to journald ($JOURNAL_STREAM is `dev:inode`)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in stream:
        return False
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if f"{st.st_dev}:{st.st_ino}" == stream:
            return True
    return False


class Journal:
    def __init__(self, path: str = SOCKET) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # A large buffer absorbs bursts; when it is full, send blocks instead of dropping.
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        self._connected = False

    def send(self, fields: Mapping[str, Value], head: bytes = b"") -> None:
        """One entry: `fields` after `head`, fields encoded beforehand by `encode`."""
        data = encode(fields, head)
        try:
            self._send(data)
        except OSError as e:
            if e.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(data)

    def _send(self, data: bytes) -> None:
        # Connected once, a send skips the path lookup that a sendto makes every time (about
        # a tenth of the runner's CPU per line). journald's socket normally outlives journald
        # (systemd holds it); if it was replaced anyway, the send is refused and goes again to
        # whatever socket the path names now.
        if not self._connected:
            self._sock.connect(self._path)
            self._connected = True
        try:
            self._sock.send(data)
        except ConnectionRefusedError:
            self._connected = False
            self._sock.connect(self._path)
            self._connected = True
            self._sock.send(data)

    def _send_memfd(self, data: bytes) -> None:
        fd = os.memfd_create("fleet-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = array.array("i", [fd])
            self._sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, self._path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()
