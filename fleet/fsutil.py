"""File writes that a crash cannot leave half-done: write a temporary file, fsync, rename.

A reader sees either the old content or the new, never a mix; the directory is fsynced so the
rename itself survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` with `data`; `durable=False` skips the fsyncs (survives a crash of the
    process, not of the machine) for files rewritten very often, such as a journal cursor."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
