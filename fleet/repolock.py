"""One lock per git repository, so that two merge-backs (or a merge-back and a sweep) into the
same repository never interleave.

Invariant: the lock is an exclusive flock on `$FLEET_HOME/locks/repo-KEY.lock`, KEY derived from
the real path of the repository's common git directory, which every worktree of the repository
shares; the kernel drops it when its holder dies, so a killed merge never leaves it held.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet.errors import FleetError
from fleet.fsutil import locked
from fleet.paths import Paths, ensure_dir
from fleet.proc import run


def common_dir(path: str | Path) -> str:
    """The real path of the common git directory of the repository holding `path`."""
    result = run(
        ["git", "-C", str(path), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        check=False,
    )
    found = result.stdout.strip()
    if result.returncode != 0 or not found:
        raise FleetError(f"{path} is not in a git repository")
    return os.path.realpath(found)


def lock_path(paths: Paths, common: str) -> Path:
    key = hashlib.sha256(common.encode()).hexdigest()[:20]
    return paths.home / "locks" / f"repo-{key}.lock"


@contextmanager
def hold(paths: Paths, common: str, wait: bool = True) -> Iterator[bool]:
    """Hold the lock of the repository whose common git directory is `common`; yields False
    (without the lock) if `wait` is false and someone else holds it."""
    path = lock_path(paths, common)
    ensure_dir(path.parent)
    with locked(path, wait) as held:
        yield held
