"""Who holds a claim: this host's name, the same for fleet-claim, fleet-run and fleet-reap."""

from __future__ import annotations

import os


def owner() -> str:
    # The kernel's node name is what socket.gethostname() returns, without importing socket
    # (a few milliseconds of every dispatch pass).
    return os.uname().nodename or "localhost"
