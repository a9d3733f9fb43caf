"""Who holds a claim: this host's name, the same for fleet-claim, fleet-run and fleet-reap; and
which boot of it the claim was made in (no process of an earlier boot is still running); and
which machine it is (two machines under one name would take each other's claims for theirs)."""

from __future__ import annotations

import functools
import os

# The kernel makes a new random id at every boot; it is the same for every process of a boot.
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# systemd's (and D-Bus's) id of the installation, the same across its boots: machine-id(5).
MACHINE_ID = "/etc/machine-id"


def owner() -> str:
    # The kernel's node name is what socket.gethostname() returns, without importing socket
    # (a few milliseconds of every dispatch pass).
    return os.uname().nodename or "localhost"


@functools.cache
def boot_id() -> str | None:
    """This boot's id, or None where the kernel does not say (no /proc): claims made then can
    only be recovered when their lease runs out."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            found = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return found or None


@functools.cache
def machine_id() -> str | None:
    """This machine's id, or None where it has none (an image not yet booted)."""
    try:
        with open(MACHINE_ID, encoding="ascii") as f:
            found = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return found if found and found != "uninitialized" else None
