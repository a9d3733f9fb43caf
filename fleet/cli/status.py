"""`fleet status`: the fleet at a glance (fleet.status), once, as JSON, or redrawn on change.

`--watch` never polls: it sleeps in select() on inotify watches of the state directory (the
store's fleet.db, its -wal and fleet.lock, which every commit touches, and the dispatcher's
record of its last pass) and of the live figures of running attempts (fleet.live), and on
SIGWINCH; it also wakes when a gate or question it shows expires, and, while it shows
questions, once a minute for their ages. Ctrl-C ends it with exit status 0 and the terminal
as it was.
"""

from __future__ import annotations

import selectors
import shutil
import signal
import socket
import sys
import time
from typing import Any

import click

from fleet.cli.app import App, cli, pass_app

# The names in FLEET_HOME whose change means the picture may have changed.
WATCHED = frozenset({"fleet.db", "fleet.db-wal", "fleet.lock", "claim.last"})
SETTLE = 0.05  # a burst of commits is drawn once: wait this long for quiet
MINUTE = 60.0


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as one JSON object.")
@click.option(
    "-w", "--watch", is_flag=True, help="Redraw in place whenever something changes (Ctrl-C ends)."
)
@pass_app
def status(app: App, as_json: bool, watch: bool) -> int:
    """Show the fleet at a glance: counts, the pause, gates, rate-limit gauges, daily budgets,
    questions waiting, every running task's live figures and the dispatcher's health.

    A ready task whose coder is rate-limited or over its daily budget, or that the pause holds,
    counts as held, not ready. The JSON object's fields are in fleet(1) under JSON OUTPUT.
    """
    from fleet import status as fleet_status
    from fleet.errors import InputError
    from fleet.output import emit_object

    if watch and as_json:
        raise InputError("--watch draws for a person; --json prints once", hint="pick one")
    if as_json:
        emit_object(fleet_status.snapshot(app.paths, app.store, app.config))
        return 0
    if not watch:
        snap = fleet_status.snapshot(app.paths, app.store, app.config)
        sys.stdout.write(fleet_status.text(snap))
        return 0
    return _watch(app)


def _draw(text: str) -> None:
    """Replace the screen's content from the top without clearing it first (no flicker):
    each line is cut to the terminal's width and cleared to its end, then the rest."""
    width = max(20, shutil.get_terminal_size().columns)
    rows = [line[:width] + "\x1b[K" for line in text.rstrip("\n").split("\n")]
    sys.stdout.write("\x1b[H" + "\n".join(rows) + "\n\x1b[J")
    sys.stdout.flush()


def _next_wake(snap: dict[str, Any], now: float) -> float | None:
    """Seconds until something shown changes by itself (a gate or a question expires, a day's
    budget starts anew, a question's age shown in minutes moves on), or None: nothing will."""
    from fleet.timeutil import parse

    times = [g["until"] for g in snap["gates"] if g["until"]]
    times += [q["expires_at"] for q in snap["questions"]]
    times += [b["resets_at"] for b in snap["budgets"]]
    later = [parse(t) - now + 0.05 for t in times if t and parse(t) > now]
    if snap["questions"]:
        later.append(MINUTE)
    return max(0.05, min(later)) if later else None


def _watch(app: App) -> int:
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    from fleet import live
    from fleet import status as fleet_status
    from fleet.paths import ensure_dir

    inotify = INotify()
    changes = iflags.MODIFY | iflags.ATTRIB | iflags.CLOSE_WRITE | iflags.MOVED_TO | iflags.CREATE
    inotify.add_watch(app.paths.home, changes | iflags.DELETE)
    inotify.add_watch(ensure_dir(live.directory(app.paths)), changes | iflags.DELETE)
    sel = selectors.DefaultSelector()
    sel.register(inotify.fileno(), selectors.EVENT_READ, "inotify")
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    old_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: None)
    sel.register(wake_r.fileno(), selectors.EVENT_READ, "signal")
    sys.stdout.write("\x1b[?25l\x1b[H\x1b[2J")  # hide the cursor, start on a clean screen
    try:
        while True:
            snap = fleet_status.snapshot(app.paths, app.store, app.config)
            stamp = time.strftime("%H:%M:%S", time.localtime())
            _draw(
                f"fleet status · {app.paths.home} · {stamp} (Ctrl-C ends)\n\n"
                + fleet_status.text(snap)
            )
            timeout = _next_wake(snap, time.time())
            if not _changed(sel, inotify, wake_r, timeout):
                continue  # something shown expired, or a minute passed
            deadline = time.monotonic() + 5 * SETTLE
            while time.monotonic() < deadline and _changed(sel, inotify, wake_r, SETTLE):
                pass
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.write("\x1b[?25h\n")
        sys.stdout.flush()
        signal.signal(signal.SIGWINCH, old_winch)
        signal.set_wakeup_fd(old_fd)
        sel.close()
        inotify.close()
        wake_r.close()
        wake_w.close()


def _changed(
    sel: selectors.BaseSelector, inotify: Any, wake: socket.socket, timeout: float | None
) -> bool:
    """Wait up to `timeout` seconds; whether something worth a redraw happened."""
    found = False
    for key, _ in sel.select(timeout):
        if key.data == "signal":
            data = wake.recv(64)
            if signal.SIGINT in data:
                raise KeyboardInterrupt
            found = True
        else:
            for event in inotify.read(timeout=0):
                if event.name in WATCHED or event.name.endswith(".json"):
                    found = True
    return found
