"""fleet-listen: from a commit on one host to the local file another host's units wait on.

Why: with a PostgreSQL store, what a person does on host A (add a task, answer a question,
kill a task) reaches host B only through NOTIFY and B's listener; this is that hop, which the
end-to-end figures (add on A -> coder started on B, answer on A -> agent unblocked on B, goal
300 ms each) contain. Also how long a listener whose connection the server ends takes to
listen again (backoff 0.5 s, then LISTEN and the catch-up), and how many connections an idle
host holds (goal: 1).

A cluster of this benchmark's own (tests/pg.py), a real `fleet-listen` for host B's
FLEET_HOME, and this process as host A, writing through the store (a PGStore). Each run
starts the clock just before the commit and stops it when inotify reports the file: the wake
poke for an add, the task's `.question` for an answer, its `.kill` for a kill request.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

from tests.bench.common import Options, figure, fleet_env, note, report, scratch_dir

NAME = "listen"
RUNS = 20
RECONNECTS = 5


def _program() -> str:
    from tests.bench.common import fleet_exe

    return os.path.join(os.path.dirname(fleet_exe()), "fleet-listen")


def _timed(directory: Path, name: str, act: Callable[[], object]) -> float:
    """Milliseconds from `act` (a commit) to inotify reporting `name` in `directory`."""
    from inotify_simple import INotify
    from inotify_simple import flags as iflags

    (directory / name).unlink(missing_ok=True)
    inotify = INotify()
    try:
        inotify.add_watch(directory, iflags.CREATE | iflags.CLOSE_WRITE)
        start = perf_counter()
        act()
        while True:
            events = inotify.read(timeout=10_000)
            if not events:
                raise RuntimeError(f"{name} was not rung within 10 s")
            if any(e.name == name for e in events):
                return (perf_counter() - start) * 1000
    finally:
        inotify.close()


def _backends(url: str) -> list[tuple[int, str]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _measure(opts: Options, tmp: Path, url: str, store: Any) -> None:
    import psycopg

    from fleet.host import owner
    from fleet.model import AttemptEnd, QuestionKind, TaskSpec
    from fleet.timeutil import iso

    home = tmp / "b-home"
    env = {**fleet_env(home), "FLEET_STORE": url}
    with (tmp / "listen.err").open("wb") as err:
        listener = subprocess.Popen([_program()], env=env, stderr=err)
    try:
        _until(lambda: any(a == "fleet-listen" for _, a in _backends(url)), "the listener")
        _until(lambda: (home / "wake").is_dir(), "the catch-up's poke")
        runs = opts.runs(RUNS)
        project = str(tmp)
        report(
            "task added on A -> wake poke on B",
            [
                _timed(home / "wake", "poke", lambda: store.add([TaskSpec(title="t", cwd=project)]))
                for _ in range(runs)
            ],
            "ms",
        )
        me = owner()
        answers, kills = [], []
        for _ in range(runs):
            (task,) = store.add([TaskSpec(title="asks", cwd=project)])
            claimed = store.claim_task(task.id, me, 60, "command", None)
            directory = home / "tasks" / task.id
            directory.mkdir(parents=True)
            q = store.ask(task.id, QuestionKind.INPUT, "Go?", (), False, iso(time.time() + 600))
            answers.append(_timed(directory, ".question", partial(store.answer, q.id, "p", "go")))
            kills.append(_timed(directory, ".kill", partial(store.request_kill, [task.id])))
            store.release(task.id, me, AttemptEnd("killed"), attempt=claimed.attempts)
        report("answer on A -> .question rung on B", answers, "ms")
        report("kill on A -> .kill rung on B", kills, "ms")
        idle = [a for _, a in _backends(url) if a != "bench"]
        figure("connections an idle host holds", f"{len(idle)} (target 1): {', '.join(idle)}")
        back = []
        log = tmp / "listen.err"

        def listening() -> int:
            return log.read_text().count("fleet-listen: listening to")

        for _ in range(opts.runs(RECONNECTS)):
            (pid,) = [p for p, a in _backends(url) if a == "fleet-listen"]
            heard = listening()
            start = perf_counter()
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            _until(partial(lambda before: listening() > before, heard), "listening again")
            back.append((perf_counter() - start) * 1000)
        report("listener's connection ended -> listening again", back, "ms")
    except RuntimeError as e:  # what the listener said is what tells why it did not ring
        said = (tmp / "listen.err").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{e}; fleet-listen said: {said or '(nothing)'}") from None
    finally:
        listener.terminate()
        listener.wait(timeout=30)


def main(opts: Options) -> None:
    from fleet.audit import Actor
    from fleet.store.pgstore import PGStore
    from tests.pg import Cluster

    cluster = Cluster()
    with scratch_dir(NAME) as tmp:
        try:
            cluster.start()
            cluster.make_template()
            url = cluster.new_database()
            store = PGStore.connect(url, None, Actor("bench", "bench"))
            try:
                _measure(opts, tmp, url, store)
            finally:
                store.close()
            note("host A is this process (a PGStore); host B a fleet-listen on the same machine")
        finally:
            cluster.stop()
