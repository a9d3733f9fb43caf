"""Who is at the other end of a loopback connection: an agent must not answer through the
dashboard what `fleet answer` refuses it (agents run as the user, and can read the token).

Invariant: for a TCP connection from a loopback address, the process holding its client end
is found through /proc (the connection's socket inode in /proc/net/tcp{,6}, then the process
with that inode among its open files); it is an agent if it runs in a fleet-task@ unit's
cgroup or has FLEET_TASK_ID set, as fleet.audit.agent_task decides for the process itself.
Anything that cannot be told (another user's processes, another host, a Unix socket) is
not an agent as far as this module knows: the door's token still stands in front of it.
"""

from __future__ import annotations

import contextlib
import os

NETS = ("/proc/net/tcp", "/proc/net/tcp6")


def _inode(client_port: int, server_port: int) -> str | None:
    """The socket inode of the connection from `client_port` to `server_port`, on this host."""
    for table in NETS:
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10:
                continue
            local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
            if int(local, 16) == client_port and int(remote, 16) == server_port:
                return fields[9]
    return None


def _holder(inode: str) -> int | None:
    target = f"socket:[{inode}]"
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{name}/fd/{fd}") == target:
                        return int(name)
    return None


def task_of(pid: int) -> str | None:
    """The task whose agent process `pid` is, or None."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            groups = f.read()
        start = groups.find("/fleet-task@")
        if start >= 0:
            unit = groups[start + len("/fleet-task@") :].split("\n", 1)[0].split("/", 1)[0]
            return unit.removesuffix(".service") or None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
        for item in f.read().split(b"\0"):
            if item.startswith(b"FLEET_TASK_ID=") and len(item) > len(b"FLEET_TASK_ID="):
                return item.split(b"=", 1)[1].decode("utf-8", "replace")
    return None


def agent_at(client: tuple[str, int] | None, server: tuple[str, int] | None) -> str | None:
    """The task whose agent made this connection, if it came over loopback TCP from one."""
    from fleet.web.access import is_loopback

    if not client or not server or not is_loopback(str(client[0])):
        return None
    inode = _inode(int(client[1]), int(server[1]))
    holder = _holder(inode) if inode and inode != "0" else None
    return task_of(holder) if holder is not None else None
