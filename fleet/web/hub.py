"""One watch of the queue for every open page: inotify, never a timer.

Invariants:
- one inotify instance watches the state directory (fleet.lock, which every commit touches,
  and claim.last) and the live figures of running attempts (live/*.json),
  read by the event loop itself (`add_reader`): no thread and no polling;
- a burst of changes becomes one new `version` after SETTLE seconds of quiet (or at the
  latest MAX_DELAY after the first), so fifty pages cost one wake-up, not fifty;
- what a version shows (the status snapshot, rendered fragments) is computed once per
  version, in a worker thread, whoever asks: pages that wait share it;
- `close()` (the server is stopping) wakes every waiter for good, so that no stream holds
  the server's shutdown up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from fleet.paths import Paths, ensure_dir

# The names in the state directory whose change means the picture may have changed: every
# commit touches fleet.lock (fleet.store.litestore), and fleet-claim rewrites claim.last. Not the
# database files themselves: closing the last connection checkpoints the WAL, so the server's
# own reads would wake it again, forever.
WATCHED = frozenset({"fleet.lock", "claim.last"})
SETTLE = 0.05
MAX_DELAY = 0.25
MAX_CACHED = 256  # pictures kept, one per view (a task's panel is one per task)


class Hub:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.version = 0
        self.closed = False
        self._event = asyncio.Event()
        self._closing = asyncio.Event()
        self._inotify: Any = None
        self._live = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._first: float | None = None
        self._cache: dict[str, tuple[int, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def start(self) -> None:
        from inotify_simple import INotify
        from inotify_simple import flags as iflags

        from fleet import live

        self._loop = asyncio.get_running_loop()
        inotify = INotify()
        changes = (
            iflags.MODIFY | iflags.ATTRIB | iflags.CLOSE_WRITE | iflags.MOVED_TO | iflags.CREATE
        )
        # Not CLOSE_WRITE in the state directory: every store opened (ours too) closes
        # fleet.lock, opened for writing; a commit touches it (ATTRIB).
        inotify.add_watch(ensure_dir(self.paths.home), iflags.ATTRIB | iflags.MOVED_TO)
        self._live = inotify.add_watch(
            ensure_dir(live.directory(self.paths)), changes | iflags.DELETE
        )
        self._inotify = inotify
        self._loop.add_reader(inotify.fileno(), self._readable)

    def _readable(self) -> None:
        assert self._loop is not None
        relevant = False
        for event in self._inotify.read(timeout=0):
            if event.name.endswith(".json") if event.wd == self._live else event.name in WATCHED:
                relevant = True
        if not relevant:
            return
        now = self._loop.time()
        if self._first is None:
            self._first = now
        if self._pending is not None:
            self._pending.cancel()
        delay = max(0.0, min(SETTLE, self._first + MAX_DELAY - now))
        self._pending = self._loop.call_later(delay, self.bump)

    def bump(self) -> None:
        """A new version: wake everyone who waits for a change."""
        self._pending = None
        self._first = None
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, seen: int) -> int:
        """The version after `seen` once there is one (at once if there already is); -1 when
        the server is stopping."""
        while self.version == seen and not self.closed:
            event = self._event
            closing = asyncio.ensure_future(self._closing.wait())
            changed = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait({closing, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closing.cancel()
                changed.cancel()
        return -1 if self.closed else self.version

    async def closing(self) -> None:
        await self._closing.wait()

    async def shared(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()` (run in a worker thread) for the current version, once per version."""
        import anyio.to_thread

        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            version = self.version
            cached = self._cache.get(key)
            if cached is not None and cached[0] == version:
                return cached[1]
            value = await anyio.to_thread.run_sync(compute)
            if len(self._cache) >= MAX_CACHED:  # pages of tasks nobody watches any more
                for old in [k for k, (v, _) in self._cache.items() if v < version]:
                    del self._cache[old]
                    self._locks.pop(old, None)
            self._cache[key] = (version, value)
            return value

    def close(self) -> None:
        """The server stops: every stream ends now (safe from a signal handler)."""
        self.closed = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        self._closing.set()
        self._event.set()
        if self._inotify is not None:
            with contextlib.suppress(ValueError, OSError):
                assert self._loop is not None
                self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
