"""Who holds a claim: this host's name, the same for fleet-claim, fleet-run and fleet-reap."""

from __future__ import annotations

import socket


def owner() -> str:
    return socket.gethostname() or "localhost"
