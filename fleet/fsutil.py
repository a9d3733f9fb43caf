"""Files fleet writes: private (0600, whatever the umask), and never half-done.

A replaced file is written to a temporary file, fsynced and renamed: a reader sees either the
old content or the new, never a mix; the directory is fsynced so the rename itself survives a
power cut. Marker files that only need to exist (`touch`) are created 0600 too, and a symlink
planted in their place is not followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

_serial = itertools.count()


def _create_beside(path: Path) -> tuple[int, str]:
    """A new file next to `path`, only ours (O_EXCL): a name no other process uses, since it
    holds our pid, and none of ours, since the serial grows; a crashed writer's leftover under
    a reused pid is stepped over."""
    while True:
        tmp = f"{path.parent}/.{path.name}.{os.getpid()}.{next(_serial)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue


def write_atomic(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` with `data`; `durable=False` skips the fsyncs (survives a crash of the
    process, not of the machine) for files rewritten very often, such as a journal cursor."""
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # a failed write names no file: name the one replaced
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def touch(path: Path) -> None:
    """Create `path` empty (mode 0600) or update its time, not following a symlink there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def nearly_full(directory: str) -> bool:
    """Whether the file system holding `directory` has (almost) no room or inodes left: what
    an I/O error that names no cause most likely means there."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20 or (st.f_files > 0 and st.f_favail == 0)


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (created 0600); yields False, without the lock, if
    `wait` is false and another process holds it. The kernel drops it when its holder dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
