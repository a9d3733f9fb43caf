"""The per-task programs systemd runs (fleet-claim, fleet-run, fleet-reap, fleet-ask): what
they do, and a start-up path that does not load click or the `fleet` command line.

Every task runs three Python programs one after another (a dispatch pass, the runner, the
reaper), so their start-up decides how fast a queued task starts and how many tasks a small
machine finishes per second. The usual invocation (`fleet-run ID`, `fleet-claim --quiet`) is
parsed here by hand; anything else (`--help`, a wrong argument) goes to the click commands in
fleet.commands, which also give the man pages. Errors print the same one line either way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fleet.errors import guard

if TYPE_CHECKING:
    from fleet.reap import Service


def claim(quiet: bool) -> None:
    from fleet.claim import dispatch
    from fleet.config import load_or_last_good
    from fleet.paths import resolve
    from fleet.store import Actor, open_store
    from fleet.systemd import current_scope

    paths = resolve()
    store = open_store(paths, Actor("fleet-claim", "fleet-claim"))
    try:
        config = load_or_last_good(paths)
        result = dispatch(paths, store, config, current_scope())
        # After the units are started, so a slow merge never delays them; only here and not
        # in `fleet add`'s own pass, which should return at once.
        from fleet import merge

        merge.claim_pass(paths, store, config)
    finally:
        store.close()
    if result.started or result.recovered or not quiet:
        sys.stdout.write(
            f"started {len(result.started)}"
            + (f": {' '.join(result.started)}" if result.started else "")
            + f"; recovered {len(result.recovered)}; running {result.running}\n"
        )


def settle(task_id: str, service: Service | None = None) -> tuple[str | None, str]:
    """Reap the last attempt of `task_id`: (outcome or None, a line saying what happened)."""
    from fleet.config import load_or_last_good
    from fleet.paths import resolve
    from fleet.reap import settle as reap_settle
    from fleet.store import Actor, open_store

    paths = resolve()
    store = open_store(paths, Actor("fleet-reap", "fleet-reap"))
    try:
        kind = reap_settle(paths, store, load_or_last_good(paths), task_id, service)
        task = store.get(task_id)
    finally:
        store.close()
    if not kind:
        return None, f"{task_id}: no attempt of this unit to reap"
    return kind, f"{task_id}: {kind} → {task.status}" + (f" ({task.reason})" if task.reason else "")


def run(task_id: str) -> int:
    from fleet.run import attempt, full_id

    task_id = full_id(task_id)
    code = attempt(task_id)
    invocation = os.environ.get("INVOCATION_ID", "")
    if not invocation:  # by hand: nobody else will reap it
        kind, line = settle(task_id)
        if kind:
            from fleet.output import emit_text

            emit_text(f"fleet-run: {line}", err=True)
        return code
    # Under systemd, an attempt that ended on its own is settled here, sparing each task the
    # start-up of fleet-reap; the marker tells ExecStopPost so. A runner that is killed (OOM,
    # watchdog, SIGKILL) never gets here, and fleet-reap classifies it as before.
    from fleet import outcome, taskdir
    from fleet.paths import resolve
    from fleet.reap import Service, oom_kills

    directory = taskdir.task_dir(resolve(), task_id)
    found = outcome.read(directory)
    if (
        found is None
        or (found.stopped_by or "").startswith("signal")
        or (found.signal and not found.stopped_by)
    ):
        # Stopped by systemd (a kill, the time limit, a shutdown): only fleet-reap, with
        # $SERVICE_RESULT, can tell which. The agent may die of systemd's SIGTERM to the
        # cgroup before the runner reads its own, so a signal we did not send counts too.
        return code
    ended = Service("", "exited", str(code), invocation, oom_kills())
    # Settling may merge a worktree's branch back, which takes as long as git takes on the
    # repository: meanwhile neither the watchdog nor RuntimeMaxSec= may end the unit.
    from fleet.notify import Notifier
    from fleet.run import GIT_GRACE_USEC

    notifier = Notifier()
    notifier.send(watchdog=1, watchdog_usec=GIT_GRACE_USEC, extend_timeout_usec=GIT_GRACE_USEC)
    # The store may be away (a PostgreSQL outage): the attempt is settled once it is back;
    # after a while the outcome file waits for the next dispatch pass instead (fleet.outage).
    import time

    from fleet.outage import SETTLE_WAIT_S, settled

    def wait(seconds: float) -> None:
        notifier.send(watchdog=1)
        time.sleep(seconds)

    kind, line = settled(lambda: settle(task_id, ended), time.monotonic() + SETTLE_WAIT_S, wait)
    sys.stdout.write(line + "\n")
    taskdir.ring(directory, taskdir.SETTLED + invocation)
    return code


def reap(task_id: str) -> None:
    from fleet.run import full_id

    _, line = settle(full_id(task_id))
    sys.stdout.write(line + "\n")


def ask() -> None:
    from fleet.ask import serve

    serve()


def deliver() -> None:
    """fleet-ask --deliver: the messages waiting for $FLEET_TASK_ID, as a Claude Code
    PostToolUse hook prints them (nothing if none, or off a task)."""
    import json
    import os
    import sys

    from fleet import coordination
    from fleet.paths import resolve

    task_id = os.environ.get("FLEET_TASK_ID", "")
    try:
        event = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        event = {}
    if not task_id:
        return
    text = coordination.hook(resolve(), task_id, event if isinstance(event, dict) else {})
    if text:
        out = {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


def telegram() -> None:
    from fleet.telegram.poller import main as poll

    poll()


def listen() -> None:
    from fleet.listen import serve

    serve()


def _fast(prog: str, argv: Sequence[str]) -> Callable[[], object] | None:
    """The common invocations, or None for anything click should parse."""
    if prog in ("fleet-run", "fleet-reap") and len(argv) == 1 and not argv[0].startswith("-"):
        return (lambda: run(argv[0])) if prog == "fleet-run" else (lambda: reap(argv[0]))
    if prog == "fleet-claim" and all(a in ("-q", "--quiet") for a in argv):
        return lambda: claim(bool(argv))
    if prog == "fleet-ask" and not argv:
        return ask
    if prog == "fleet-ask" and list(argv) == ["--deliver"]:
        return deliver
    if prog == "fleet-telegram" and not argv:
        return telegram
    if prog == "fleet-listen" and not argv:
        return listen
    return None


def main(prog: str, argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    action = _fast(prog, args)
    if action is None:
        from fleet.cli.app import run as run_click
        from fleet.commands import PROGRAMS

        return run_click(PROGRAMS[prog], prog, args)
    return guard(prog, action)


def claim_main() -> int:
    return main("fleet-claim")


def run_main() -> int:
    return main("fleet-run")


def reap_main() -> int:
    return main("fleet-reap")


def ask_main() -> int:
    return main("fleet-ask")


def telegram_main() -> int:
    return main("fleet-telegram")


def listen_main() -> int:
    return main("fleet-listen")
