"""`fleet ls --json` on a big queue: 100,000 tasks, all of them listed.

Why: scripts and dashboards poll `fleet ls --json`; it must stay interactive on a queue that
has grown for months. Target from the issue: <= 1 s median wall time (5 runs) with 100,000 tasks
in the store.

The store is filled through the Store API (`add()` in chunks of 5,000, which is how
`fleet add --batch` writes too, minus the JSON-lines parsing) in a temporary FLEET_HOME. Every
task is ready, so the default filter lists all of them: the worst case for the default command.
The tasks look like real ones: a title, a short description, two labels, and every tenth task
depends on the one before it, so the `after`/`waiting_on` columns are not all empty.

Output goes to /dev/null (the figure is fleet's cost, not a reader's); one extra untimed run
checks that the output parses and holds every task. It also times the same listing as a table
(`fleet ls`, what a person types: target <= 1 s too, which it meets by showing the first 1000
tasks and saying how many it left out), the whole table (`fleet ls --limit 0`, asked for
explicitly; no target: tabulate lays out every row), and prints the ratio to --json.
"""

from __future__ import annotations

import json
from pathlib import Path
from time import perf_counter

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from tests.bench.common import (
    Options,
    fleet_env,
    fleet_exe,
    note,
    ratio,
    report,
    run_fleet,
    scratch_dir,
    time_runs,
)

NAME = "ls"
TASKS = 100_000
RUNS = 5
TABLE_RUNS = 3
CHUNK = 5_000
TARGET_S = 1.0
DESCRIPTION = (
    "Replace the hand-written retry loop with the shared helper, keep the log messages as they"
    " are, and add a test for the timeout path."
)


def spec(i: int, cwd: str) -> TaskSpec:
    """The i-th benchmark task; every tenth depends (by batch ref) on the one before it."""
    after: tuple[str, ...] = ()
    ref = None
    if i % 10 == 0:
        ref = f"r{i}"
    elif i % 10 == 1:
        after = (f"ref:r{i - 1}",)
    return TaskSpec(
        title=f"bench task {i}: tidy module {i % 97}",
        cwd=cwd,
        description=DESCRIPTION,
        labels=("bench", f"group-{i % 10}"),
        after=after,
        ref=ref,
    )


def fill(home: Path, n: int, cwd: str) -> float:
    """Add `n` tasks to the store in `home`; return the seconds it took."""
    start = perf_counter()
    store = open_store(resolve(env=fleet_env(home)))
    try:
        for first in range(0, n, CHUNK):
            # Refs only resolve within one add(), so a chunk never splits a ref from its user.
            store.add([spec(i, cwd) for i in range(first, min(n, first + CHUNK))])
    finally:
        store.close()
    return perf_counter() - start


def main(opts: Options) -> None:
    n = opts.size(TASKS)
    exe = fleet_exe()
    with scratch_dir(NAME) as tmp:
        home = tmp / "home"
        project = tmp / "project"
        project.mkdir()
        took = fill(home, n, str(project))
        note(f"set-up: {n} tasks added through Store.add() in {took:.1f} s")
        env = fleet_env(home)

        _, out = run_fleet(["ls", "--json"], env, capture=True)
        listed = json.loads(out)
        if len(listed) != n:
            raise RuntimeError(f"fleet ls --json listed {len(listed)} tasks, not {n}")

        samples = time_runs([exe, "ls", "--json"], env, opts.runs(RUNS), warmup=0)
        mid = report(f"ls --json, {n} tasks", samples, "s", TARGET_S)
        tables = time_runs([exe, "ls"], env, opts.runs(TABLE_RUNS), warmup=0)
        table = report(f"ls (table), {n} tasks", tables, "s", TARGET_S)
        ratio(f"ls table vs --json, {n} tasks", table, mid, "time of the table / time of --json")
        whole = time_runs([exe, "ls", "--limit", "0"], env, 1, warmup=0)
        report(f"ls --limit 0 (the whole table), {n} tasks", whole, "s")
