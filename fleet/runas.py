"""A state directory that another user runs: `fleet setup --system --run-as USER`.

Invariant: everything in such a state directory belongs to USER (the directory itself mode
0700), so that USER's agents, their fleet-reap and USER's own `fleet` commands can use it.
`fleet setup` hands it over. Root's fleet processes that use it afterwards — fleet-claim,
which must be root to start units, and a person's `sudo fleet …` — read and create files in it
with USER's file-system identity (setfsuid(2)): they never leave a file there that USER cannot
open, and their children (systemctl) still run with root's rights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from fleet.errors import StoreError
from fleet.paths import Paths


def hand_over(paths: Paths, user: str) -> None:
    """Give the state directory (and the configuration's directory, when it is elsewhere, as
    /etc/fleet is) to `user`: every file and directory in them, not following links."""
    import pwd

    account = pwd.getpwnam(user)
    trees = [paths.home]
    if paths.home not in paths.config_file.parents and paths.config_file.parent.is_dir():
        trees.append(paths.config_file.parent)
    for tree in trees:
        os.chown(tree, account.pw_uid, account.pw_gid, follow_symlinks=False)
        tree.chmod(0o700)
        for parent, dirs, files in os.walk(tree):
            for name in (*dirs, *files):
                os.chown(
                    os.path.join(parent, name),
                    account.pw_uid,
                    account.pw_gid,
                    follow_symlinks=False,
                )


def act_as_owner(home: Path, found: os.stat_result) -> None:
    """When root uses a state directory that another user owns, go on with that user's
    file-system identity (this thread, as setfsuid(2) does; threads started later inherit
    it). Anyone else is left as they are: the directory's mode lets them in or not."""
    if found.st_uid == 0 or os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsgid(found.st_gid)
    libc.setfsuid(found.st_uid)
    # setfsuid reports no error, only the identity before the call: ask with an invalid one.
    if libc.setfsuid(-1) != found.st_uid:
        raise StoreError(
            f"cannot act as the owner (uid {found.st_uid}) of the state directory {home}",
            hint="run fleet as that user",
        )


@contextlib.contextmanager
def own_identity() -> Iterator[None]:
    """Root's own file-system identity for a moment, after act_as_owner: for what belongs to
    the system, not to the state directory (a unit's drop-in in /run/systemd/system)."""
    if os.geteuid() != 0:
        yield
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = libc.setfsuid(-1), libc.setfsgid(-1)  # an invalid id only reports the current
    if uid == 0 and gid == 0:
        yield
        return
    libc.setfsgid(0)
    libc.setfsuid(0)
    try:
        yield
    finally:
        libc.setfsgid(gid)
        libc.setfsuid(uid)
