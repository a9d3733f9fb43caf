"""Journal entries for what a person or an agent did to a task (checkpointed, suspended, resumed).

Invariant: every such entry carries a MESSAGE_ID that systemd/fleet.catalog explains, the task's
id (FLEET_TASK_ID, so `fleet logs ID` and `journalctl FLEET_TASK_ID=ID` show it next to the
attempts' events), FLEET_ACTION and who did it (FLEET_BY). The store's rows are the record; the
entry is the trail, so a host without journald (no socket) simply gets none, and a journal that
cannot take the entry never fails the action itself.
"""

from __future__ import annotations

import contextlib
import os

from fleet.journal import SOCKET, Journal, Value

MSG_CHECKPOINTED = "ec5777e0babb47078a6721a402479b6c"
MSG_SUSPENDED = "1da9762d8594425c9bf1bae62c0761b0"
MSG_RESUMED = "ca4f1926b7a742adb7aef743b1f4e99f"
ACTIONS = {
    MSG_CHECKPOINTED: "checkpointed",
    MSG_SUSPENDED: "suspended",
    MSG_RESUMED: "resumed",
}


def record(
    message_id: str,
    text: str,
    task_id: str,
    by: str,
    identifier: str = "fleet",
    **fields: Value,
) -> None:
    if not os.path.exists(SOCKET):
        return
    entry: dict[str, Value] = {
        "MESSAGE": text,
        "MESSAGE_ID": message_id,
        "PRIORITY": 5,
        "SYSLOG_IDENTIFIER": identifier,
        "FLEET_TASK_ID": task_id,
        "FLEET_EVENT": "audit",
        "FLEET_ACTION": ACTIONS[message_id],
        "FLEET_BY": by,
        **fields,
    }
    journal = Journal()
    try:
        with contextlib.suppress(OSError):
            journal.send(entry)
    finally:
        journal.close()


def person() -> str:
    """Who runs this command: user@host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname() or 'localhost'}"
