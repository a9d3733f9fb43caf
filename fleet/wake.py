"""Waking the dispatcher: one `wake/poke` file that fleet-claim.path watches.

The path unit is level-triggered (DirectoryNotEmpty=), and fleet-claim removes the file before
it reads the queue, so a poke that arrives during a pass starts another pass: no wake is lost,
and a burst of pokes costs one pass.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fleet.paths import Paths, ensure_dir


def wake_dir(paths: Paths) -> Path:
    return paths.home / "wake"


def poke(paths: Paths) -> None:
    path = ensure_dir(wake_dir(paths)) / "poke"
    with contextlib.suppress(FileExistsError):  # a pass is already pending
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def consume(paths: Paths) -> None:
    (wake_dir(paths) / "poke").unlink(missing_ok=True)
