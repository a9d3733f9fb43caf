"""`fleet add --batch FILE` of 10,000 tasks, each run into a fresh FLEET_HOME.

Why: planners (people or agents) queue whole backlogs at once; a batch add is one transaction
and must not make them wait. Target from the issue: <= 2 s median wall time (5 runs) for a file
of 10,000 JSON lines `{"title": ..., "cwd": ...}`.

Each timed run gets a FLEET_HOME that does not exist yet, so it includes creating the store
(a few milliseconds) as a first `fleet add` would. One untimed warm-up run, whose printed ids are
counted, checks the command really adds every line. For comparison the same 10,000 specs are
added in this process through `Store.add()` (no process start, no JSON parsing or validation),
and the ratio says how much of the command's time is spent outside the store.
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
    note,
    ratio,
    report,
    run_fleet,
    scratch_dir,
)

NAME = "add"
TASKS = 10_000
RUNS = 5
TARGET_S = 2.0


def write_batch(path: Path, n: int, cwd: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"title": f"bench task {i}: tidy module {i % 97}", "cwd": cwd}))
            f.write("\n")


def store_add(home: Path, n: int, cwd: str) -> float:
    """Seconds to open a new store in `home` and add `n` tasks through the Store API."""
    specs = [TaskSpec(title=f"bench task {i}: tidy module {i % 97}", cwd=cwd) for i in range(n)]
    start = perf_counter()
    store = open_store(resolve(env=fleet_env(home)))
    try:
        store.add(specs)
    finally:
        store.close()
    return perf_counter() - start


def main(opts: Options) -> None:
    n = opts.size(TASKS)
    runs = opts.runs(RUNS)
    with scratch_dir(NAME) as tmp:
        project = tmp / "project"
        project.mkdir()
        batch = tmp / "batch.jsonl"
        write_batch(batch, n, str(project))
        note(f"batch file: {n} lines, {batch.stat().st_size} bytes")

        _, out = run_fleet(["add", "--batch", str(batch)], fleet_env(tmp / "warmup"), capture=True)
        added = len(out.split())
        if added != n:
            raise RuntimeError(f"fleet add --batch printed {added} ids, not {n}")

        samples = [
            run_fleet(["add", "--batch", str(batch)], fleet_env(tmp / f"run-{i}"))[0]
            for i in range(runs)
        ]
        cli = report(f"add --batch, {n} tasks", samples, "s", TARGET_S)
        api = [store_add(tmp / f"api-{i}", n, str(project)) for i in range(runs)]
        direct = report(f"Store.add() in-process, {n} tasks", api, "s")
        ratio(f"add --batch vs Store.add(), {n} tasks", cli, direct, "command / store alone")
